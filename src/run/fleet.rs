//! The run's side of a fleet (`--redis`, `--shard`): join it before any
//! call.

use crate::exit::RunError;
use crate::fleet::told::Told;
use crate::fleet::{Fleet, FleetError};
use crate::pace::PacerKind;
use crate::report::err_line;
use crate::settings::Settings;

/// Connects to the fleet's Redis, if the run is part of a fleet, and runs
/// the fleet's script once. Redis out of reach, or refusing the script, is
/// an error before any request is sent. The run tells the fleet of itself
/// later, once it is sure to go ([`enter`]).
pub async fn join(settings: &Settings) -> Result<Option<Fleet>, RunError> {
    let shard = settings.shard;
    let Some(f) = settings.fleet.as_ref() else {
        if let Some(s) = shard {
            err_line(&format!(
                "batchrun: shard {s} without --redis: this process paces to the whole limit by itself; \
                 give each shard its part of it (--limit) or share it (--redis)"
            ));
        }
        return Ok(None);
    };
    let fleet = Fleet::connect(f)
        .await
        .map_err(|e| RunError::Fatal(anyhow::Error::new(e)))?;
    crate::fleet::script::probe(&fleet)
        .await
        .map_err(|e| match e {
            // Resumable: running the same command later cures it.
            FleetError::Unable { .. } => RunError::Unable(anyhow::Error::new(e)),
            e => RunError::Fatal(anyhow::Error::new(e)),
        })?;
    if let Some(policy) = fleet.eviction_policy().await {
        err_line(&format!(
            "batchrun: fleet: warning: Redis at {} may evict keys (maxmemory-policy {policy}); \
             should it evict the fleet's, the fleet notices, holds one window and puts its calls \
             back, but a Redis of its own with noeviction keeps the pace steady",
            fleet.at()
        ));
    }
    Ok(Some(fleet))
}

/// Tells the fleet this run is in it and what it paces to, and warns of
/// any process told otherwise. Only once nothing more can refuse the run
/// before its first call: a run refused at start would stand in the fleet
/// for [`STANDS_FOR`](crate::fleet::told::STANDS_FOR) and set the next run
/// warning of a limit nobody keeps.
pub async fn enter(settings: &Settings, fleet: &Fleet) -> Told {
    let share = if fleet.headroom() < 1.0 {
        format!(" ({:.0}% of it)", fleet.headroom() * 100.0)
    } else {
        String::new()
    };
    err_line(&format!(
        "batchrun: fleet: sharing the limit{share} (every --limit, token windows included), the concurrency ceiling and the alerts of this key \
         with every process on {} (keys {}:*)",
        fleet.at(),
        fleet.keys().prefix()
    ));
    let here = told(settings);
    let mark = build_mark();
    let (told, others) = Told::join(fleet, &format!("{mark} | {here}")).await;
    let mut other_build = false;
    for other in others {
        // A build before the mark said only what it paces to.
        let (theirs_mark, theirs) = other.split_once(" | ").unwrap_or(("", &other));
        other_build |= theirs_mark != mark;
        if theirs == here {
            continue;
        }
        err_line(&format!(
            "batchrun: fleet: warning: another process of this fleet (running, or ended less than \
             {} ago) paces to {theirs}, this one to {here}: each keeps its own, so the fleet keeps \
             neither as a whole: the fleet may go past the lower, or (windows of other lengths \
             filling each other) crawl far under both; give every process the same --pacer \
             and --limit",
            humantime::format_duration(crate::fleet::told::STANDS_FOR)
        ));
    }
    if other_build {
        err_line(&format!(
            "batchrun: fleet: warning: another process of this fleet (running, or ended less than \
             {} ago) runs another batchrun build (this one's fleet {mark}): builds may keep the \
             fleet's state under other keys and in other forms, so the fleet may go past a limit \
             or stall; run one build in every process",
            humantime::format_duration(crate::fleet::told::STANDS_FOR)
        ));
    }
    told
}

/// What marks this build in the fleet: its script's hash. Builds with
/// other scripts may name and fill the fleet's keys otherwise (a window of
/// input tokens, a call's weights).
fn build_mark() -> String {
    let hash = redis::Script::new(crate::fleet::script::SCRIPT)
        .get_hash()
        .to_string();
    format!("script {}", hash.get(..8).unwrap_or(&hash))
}

/// What this process paces to, as the fleet's processes compare it: its
/// pacer and every limit, with a bucket's burst.
fn told(settings: &Settings) -> String {
    let pacer = match settings.pacer {
        PacerKind::Window => "window",
        PacerKind::Bucket => "bucket",
        PacerKind::Spike => "spike",
    };
    let mut s = format!("--pacer {pacer}");
    // A burst sizes the bucket pacer alone.
    if let (PacerKind::Bucket, Some(b)) = (settings.pacer, settings.burst) {
        s.push_str(&format!(" --burst {b}"));
    }
    if settings.policies.is_empty() {
        s.push_str(&format!(" --limit {}", settings.limit));
    }
    for p in &settings.policies {
        s.push_str(&format!(" --limit {p}"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a process run with `args` (on the sim) says it paces to.
    fn told_by(args: &[&str]) -> String {
        let argv = ["batchrun", "items.jsonl", "--sim"]
            .iter()
            .chain(args)
            .map(std::ffi::OsString::from);
        let crate::cli::Command::Run(a) = crate::cli::Cli::parse_with_default(argv).command else {
            panic!("not a run")
        };
        told(&Settings::from_cli(&a, Some("http://127.0.0.1:9")).unwrap())
    }

    #[test]
    fn processes_differing_in_a_buckets_burst_are_told_apart_and_in_a_windows_not() {
        let bucket = |b: &str| told_by(&["--pacer", "bucket", "--burst", b, "-l", "30/1s"]);
        assert_ne!(bucket("5"), bucket("2"), "{}", bucket("5"));
        assert!(bucket("5").contains("--burst 5"), "{}", bucket("5"));
        // The window pacer sends no burst of its own: the flag is no
        // difference between two such processes.
        let window = |b: &str| told_by(&["--pacer", "window", "--burst", b, "-l", "30/1s"]);
        assert_eq!(window("5"), window("2"));
        assert_ne!(told_by(&["-l", "30/1s"]), told_by(&["-l", "40/1s"]));
    }
}
