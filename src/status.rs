//! The read-only commands: `batchrun plans` (the plan table) and
//! `batchrun status` (a job's progress from its checkpoint, or from what a
//! running job publishes).

use std::fmt::Write as _;
use std::time::Duration;

use serde::Serialize;

use std::path::{Path, PathBuf};

use crate::checkpoint::{CheckpointError, JobMeta, ReadStore, Store};
use crate::cli::StatusArgs;
use crate::credits::{describe_renewal, CreditSnapshot};
use crate::fleet::Shard;
use crate::rate::bucket::TokenBucket;
use crate::rate::{Limit, Plan};
use crate::report::published::Progress;

/// `batchrun plans`: the published plans with the bucket batchrun derives from them.
pub fn plans_table() -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<8} {:>9} {:>12} {:>7} {:>13}",
        "plan", "limit", "concurrency", "burst", "refill/s"
    );
    for p in Plan::ALL {
        let (limit, burst, rate) = match p.limit() {
            Limit::Rate(r) => {
                let b = TokenBucket::for_limit(r, None, false, std::time::Instant::now());
                match b {
                    Ok(b) => (
                        format!("{}/min", r.count),
                        b.capacity().to_string(),
                        format!("{:.3}", b.rate_per_sec()),
                    ),
                    Err(_) => (format!("{}/min", r.count), "-".into(), "-".into()),
                }
            }
            Limit::Unlimited => ("none".into(), "-".into(), "unpaced".into()),
        };
        let _ = writeln!(
            out,
            "{:<8} {:>9} {:>12} {:>7} {:>13}",
            p.name(),
            limit,
            p.concurrency(),
            burst,
            rate
        );
    }
    let _ = writeln!(
        out,
        "\nburst = max(1, limit/10); refill = (limit - burst) / (60 s + {} ms skew allowance),\nso burst + refill x window never exceeds the limit in any sliding window.",
        crate::rate::bucket::skew_allowance(Duration::from_secs(60)).as_millis()
    );
    out
}

/// Every checkpoint under a state directory: its own, then one per shard
/// (`shard-I-of-N/`), in shard order.
fn checkpoints(dir: &Path) -> Vec<(Option<Shard>, PathBuf)> {
    let mut out = Vec::new();
    if crate::checkpoint::held(dir) {
        out.push((None, dir.to_path_buf()));
    }
    let shards = crate::settings::shard_checkpoints(dir);
    out.extend(shards.into_iter().map(|(s, p)| (Some(s), p)));
    // The default state dirs of several inputs sit side by side under
    // .batchrun/: with no input named, show them all, a sharded job's
    // shards (`<input>/shard-I-of-N/`) included.
    let mut others: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.is_dir()
                && Shard::from_tag(&p.file_name().unwrap_or_default().to_string_lossy()).is_none()
        })
        .collect();
    others.sort();
    for p in others {
        if crate::checkpoint::held(&p) {
            out.push((None, p.clone()));
        }
        let shards = crate::settings::shard_checkpoints(&p);
        out.extend(shards.into_iter().map(|(s, p)| (Some(s), p)));
    }
    out
}

impl Progress {
    fn running_in(dir: &Path, input: Option<&str>) -> Vec<Progress> {
        std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| {
                let n = e.file_name().to_string_lossy().into_owned();
                n.starts_with("running-") && n.ends_with(".json")
            })
            .filter_map(|e| serde_json::from_slice::<Progress>(&std::fs::read(e.path()).ok()?).ok())
            .filter(|p| input.map_or(true, |i| p.input == i))
            .collect()
    }

    fn describe(
        &self,
        shard: Option<Shard>,
        as_json: bool,
        out: &mut String,
        json: &mut Vec<serde_json::Value>,
    ) {
        let st = JobStatus::running(self, shard);
        if as_json {
            json.push(serde_json::to_value(&st).unwrap_or_default());
            return;
        }
        let age = crate::util::unix_now()
            .as_secs()
            .saturating_sub(self.updated_unix);
        let who = shard.map(|s| format!("shard {s}, ")).unwrap_or_default();
        let _ = writeln!(
            out,
            "job {} ({who}running, pid {}; as of {age}s ago): {} done, {} failed, {} pending of {}; {} requests, {} rate-limited{}",
            self.job,
            self.pid,
            self.done,
            self.failed,
            st.pending,
            self.total,
            self.requests,
            self.rate_limited,
            self.credits_remaining.map(|c| format!("; credits {c}")).unwrap_or_default(),
        );
        if let Some(run) = &st.last_run {
            let _ = writeln!(
                out,
                "  started {}, running for {}{}{}",
                when(Some(run.started_unix_ms)),
                took(run.duration_s),
                st.rate_per_min
                    .map(|r| format!("; {r:.1} items/min"))
                    .unwrap_or_default(),
                match (st.eta_s, self.waiting_for_credits) {
                    (_, true) => ", waiting for credits (a top-up)".to_string(),
                    (Some(e), false) => format!(", about {} to go", took(e)),
                    (None, false) => String::new(),
                }
            );
        }
    }
}

/// One job as `status --json` shows it: a running job (from what it
/// publishes) and a stopped one (from its checkpoint) in the same shape,
/// what one of them cannot know left null.
#[derive(Debug, Serialize)]
struct JobStatus {
    job: String,
    input: String,
    shard: Option<String>,
    running: bool,
    /// The running process.
    pid: Option<u32>,
    total: u64,
    done: u64,
    failed: u64,
    pending: u64,
    /// Over every run of the job.
    requests: u64,
    /// Over every run of the job.
    rate_limited: u64,
    credits_remaining: Option<i64>,
    renewal: Option<u64>,
    alerts_fired: Vec<String>,
    last_state: Option<String>,
    halt_reason: Option<String>,
    /// The run going on, or the last one.
    last_run: Option<RunStatus>,
    /// A running job's pace so far (items per minute).
    rate_per_min: Option<f64>,
    /// A running job's time to go at that pace, in seconds.
    eta_s: Option<f64>,
}

/// One run in `status`.
#[derive(Debug, Serialize)]
struct RunStatus {
    started_unix_ms: u64,
    ended_unix_ms: Option<u64>,
    duration_s: f64,
    /// running, done, halted, interrupted, failed; null for a run killed
    /// before it could say, `killed` once the next run found it so.
    state: Option<String>,
    exit_code: Option<i32>,
    done: u64,
    failed: u64,
    requests: u64,
    rate_limited: u64,
}

impl JobStatus {
    fn running(p: &Progress, shard: Option<Shard>) -> JobStatus {
        let pending = p.total.saturating_sub(p.done + p.failed);
        // A progress file of an older build has whole seconds only.
        let now_ms = match p.updated_unix_ms {
            0 => p.updated_unix.saturating_mul(1000),
            ms => ms,
        };
        let last_run = (p.started_unix_ms > 0).then(|| RunStatus {
            started_unix_ms: p.started_unix_ms,
            ended_unix_ms: None,
            duration_s: now_ms.saturating_sub(p.started_unix_ms) as f64 / 1000.0,
            state: Some("running".into()),
            exit_code: None,
            done: p.done_this_run,
            failed: 0,
            requests: p.requests,
            rate_limited: p.rate_limited,
        });
        let rate_per_min = last_run
            .as_ref()
            .filter(|r| r.duration_s > 0.0 && r.done > 0)
            .map(|r| (r.done as f64 * 60.0 / r.duration_s * 10.0).round() / 10.0);
        JobStatus {
            job: p.job.clone(),
            input: p.input.clone(),
            shard: shard.map(|s| s.to_string()),
            running: true,
            pid: Some(p.pid),
            total: p.total,
            done: p.done,
            failed: p.failed,
            pending,
            requests: p.requests_before + p.requests,
            rate_limited: p.rate_limited_before + p.rate_limited,
            credits_remaining: p.credits_remaining,
            renewal: p.renewal,
            alerts_fired: Vec::new(),
            last_state: None,
            halt_reason: None,
            last_run,
            // Waiting for a top-up, the rest waits on the account.
            eta_s: rate_per_min
                .filter(|_| !p.waiting_for_credits)
                .map(|r| (pending as f64 * 60.0 / r).round()),
            rate_per_min,
        }
    }

    fn stopped(meta: &JobMeta, shard: Option<Shard>) -> JobStatus {
        let c = meta.counts();
        let last = meta.meter.last;
        let now_ms = crate::util::unix_now().as_millis() as u64;
        // A run not ended (killed, or another process's) as far as the
        // checkpoint has it: its record lags by up to a second.
        let last_run = meta.last_run().map(|r| r.caught_up(c.done, c.failed));
        let unclosed = last_run.as_ref().filter(|r| r.ended_unix_ms.is_none());
        JobStatus {
            job: meta.id.clone(),
            input: shown_input(meta),
            shard: shard.map(|s| s.to_string()),
            running: false,
            pid: None,
            total: meta.total,
            done: c.done,
            failed: c.failed,
            pending: meta.total.saturating_sub(c.done + c.failed),
            // A killed run's calls join the totals when the next run opens
            // the job; until then, its record has them.
            requests: meta.requests + unclosed.map_or(0, |r| r.requests),
            rate_limited: meta.rate_limited + unclosed.map_or(0, |r| r.rate_limited),
            credits_remaining: last.map(|s| s.remaining),
            renewal: last.and_then(|s| s.renewal),
            alerts_fired: meta.meter.fired.clone(),
            last_state: meta.last_state.clone(),
            halt_reason: meta.halt_reason.clone(),
            last_run: last_run.as_ref().map(|r| RunStatus {
                started_unix_ms: r.started_unix_ms,
                ended_unix_ms: r.ended_unix_ms,
                // A killed run: until it last saved its record or sent.
                duration_s: r.duration_s(
                    now_ms.min(
                        r.seen_unix_ms
                            .unwrap_or(0)
                            .max(meta.last_active_unix_ms)
                            .max(r.started_unix_ms),
                    ),
                ),
                state: r.state.clone(),
                exit_code: r.exit_code,
                done: r.done,
                failed: r.failed,
                requests: r.requests,
                rate_limited: r.rate_limited,
            }),
            rate_per_min: None,
            eta_s: None,
        }
    }
}

/// The last run's line in the text of a stopped job.
fn last_run_lines(st: &JobStatus, out: &mut String) {
    if let Some(r) = &st.last_run {
        let ended = match r.ended_unix_ms {
            Some(_) => format!("ended {}", when(r.ended_unix_ms)),
            None => "never ended (killed, or still running)".to_string(),
        };
        let code = r
            .exit_code
            .map(|c| format!(", exit code {c}"))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "            started {}, {ended}, {}{code}; {} done, {} failed, {} requests, {} rate-limited",
            when(Some(r.started_unix_ms)),
            took(r.duration_s),
            r.done,
            r.failed,
            r.requests,
            r.rate_limited
        );
    }
}

/// A unix time in ms, as RFC 3339 (UTC, to the second).
fn when(ms: Option<u64>) -> String {
    match ms {
        Some(ms) => {
            crate::util::rfc3339(ms / 1000).unwrap_or_else(|| format!("unix time {}", ms / 1000))
        }
        None => "-".into(),
    }
}

/// Seconds, as a person reads them (`0.4s`, `1m 12s`).
fn took(s: f64) -> String {
    if s < 60.0 {
        return format!("{s:.1}s");
    }
    humantime::format_duration(Duration::from_secs(s.round() as u64)).to_string()
}

/// `batchrun status INPUT --prune`: forgets every job of INPUT but the one
/// that ran last (jobs made by earlier requests), with their results and
/// timelines.
fn prune(store: &Store, dir: &Path, input: &str, out: &mut String) -> anyhow::Result<()> {
    let mut jobs = store.jobs_for_input(input)?;
    let last_ran = |m: &JobMeta| {
        m.last_run()
            .map_or(0, |r| r.started_unix_ms)
            .max(m.last_active_unix_ms)
            .max(m.created_unix * 1000)
    };
    jobs.sort_by_key(last_ran);
    let Some(kept) = jobs.pop() else {
        return Ok(());
    };
    for m in &jobs {
        store.discard_job(&m.id)?;
        // Its timeline goes with it (a file that is not there is fine).
        let _ = std::fs::remove_file(crate::report::timeline::path(dir, &m.id));
        let _ = writeln!(
            out,
            "forgot job {} (last ran {}; {} done, {} failed of {})",
            m.id,
            when(Some(last_ran(m))),
            m.done,
            m.failed,
            m.total
        );
    }
    store.flush()?;
    let _ = writeln!(
        out,
        "kept job {} ({} older job(s) forgotten)",
        kept.id,
        jobs.len()
    );
    Ok(())
}

/// A checkpoint `status` cannot open (but for a run holding it): damage is
/// said with the way forward, once (sled's words were said twice).
fn unreadable(dir: &Path, e: CheckpointError) -> anyhow::Error {
    match crate::checkpoint::is_damage(&e) {
        true => anyhow::anyhow!(
            "{}",
            crate::checkpoint::damage_advice(dir, &e, "Nothing was changed")
        ),
        false => e.into(),
    }
}

/// `--prune` while a run holds the checkpoint: said, not done.
fn not_pruned(shard: Option<Shard>, out: &mut String) {
    let who = shard.map(|s| format!("shard {s}: ")).unwrap_or_default();
    let _ = writeln!(
        out,
        "{who}not pruned: a run holds the checkpoint; prune once it has ended"
    );
}

/// How a job's input is named: a pipe's by what it was (its spooled copy,
/// `spool/<sha256>` in the state dir, was removed when its run ended).
fn shown_input(meta: &JobMeta) -> String {
    match crate::input::is_spooled_copy(Path::new(&meta.input)) {
        true => format!("the piped input ({})", meta.input_name),
        false => meta.input.clone(),
    }
}

/// `batchrun status INPUT`: progress from the checkpoint (and every shard's);
/// no API call.
pub fn status(args: &StatusArgs) -> anyhow::Result<String> {
    // A pipe (`-`, `<(cmd)`) has no file to match its jobs by: every job
    // in its state dir (`.batchrun/stdin`) is shown.
    let abs = match &args.input {
        Some(i) => crate::settings::recorded_input(i)?,
        None => None,
    };
    let state_dir = match (&args.input, &args.state_dir) {
        (Some(i), given) => crate::settings::state_dir_for(i, given.as_deref()),
        (None, Some(d)) => d.clone(),
        (None, None) => std::path::PathBuf::from(".batchrun"),
    };
    let found = checkpoints(&state_dir);
    if found.is_empty() {
        anyhow::bail!(
            "no checkpoint in {} (was the job run with another --state-dir?)",
            state_dir.display()
        );
    }
    let mut out = String::new();
    let mut json = Vec::new();
    let mut not_pruned_any = false;
    for (shard, dir) in found {
        // Pruning writes; looking does not, and reads a copy of a
        // checkpoint that cannot be written (an archive, a full disk).
        let opened = match args.prune {
            true => Store::open(&dir).map(ReadStore::from),
            false => Store::open_to_read(&dir),
        };
        let store = match opened {
            Ok(s) => s,
            // A shard running right now holds its checkpoint.
            // A run in progress holds its checkpoint: show what it publishes.
            Err(CheckpointError::Locked(_)) => {
                let running = Progress::running_in(&dir, abs.as_deref());
                for p in &running {
                    p.describe(shard, args.json, &mut out, &mut json);
                }
                if args.prune {
                    not_pruned(shard, &mut out);
                    not_pruned_any = true;
                }
                if running.is_empty() {
                    let who = shard.map(|s| format!("shard {s}: ")).unwrap_or_default();
                    if args.json {
                        json.push(serde_json::json!({"shard": shard.map(|s| s.to_string()), "running": true}));
                    } else {
                        let _ = writeln!(out, "{who}running (its checkpoint is in use)");
                    }
                }
                continue;
            }
            Err(e) => return Err(unreadable(&dir, e)),
        };
        if let (true, Some(a)) = (args.prune, &abs) {
            prune(&store, &dir, a, &mut out)?;
            continue;
        }
        let jobs = match &abs {
            Some(a) => store.jobs_for_input(a),
            None => store.jobs(),
        }
        .map_err(|e| unreadable(&dir, e))?;
        for meta in jobs {
            describe_job(&meta, shard, abs.as_deref(), args.json, &mut out, &mut json)?;
        }
    }
    if json.is_empty() && out.is_empty() {
        let what = args
            .input
            .as_ref()
            .map_or("any input".to_string(), |i| i.display().to_string());
        anyhow::bail!("no job for {what} in {}", state_dir.display());
    }
    // Asked to prune and not done: no success to a script that asked.
    if not_pruned_any {
        anyhow::bail!("{}", out.trim_end());
    }
    if args.json && !args.prune {
        // Always an array, whatever the number of jobs: a script reads one shape.
        out = format!("{}\n", serde_json::Value::Array(json));
    }
    Ok(out)
}

/// One job's status, as text into `out` or as JSON into `json`; `input`
/// is where the job's input is now, when it was named.
fn describe_job(
    meta: &JobMeta,
    shard: Option<Shard>,
    input: Option<&str>,
    as_json: bool,
    out: &mut String,
    json: &mut Vec<serde_json::Value>,
) -> anyhow::Result<()> {
    let c = meta.counts();
    let pending = meta.total.saturating_sub(c.done + c.failed);
    let last = meta.meter.last;
    let st = JobStatus::stopped(meta, shard);
    if as_json {
        json.push(serde_json::to_value(&st)?);
        return Ok(());
    }
    match input.filter(|now| *now != meta.input) {
        // Found by its file name after a move: the path the user gave is
        // the one that is true now.
        Some(now) => {
            let _ = writeln!(out, "job {}  ({now})", meta.id);
            let _ = writeln!(
                out,
                "  moved:    from {} (the next run records the move)",
                meta.input
            );
        }
        None => {
            let _ = writeln!(out, "job {}  ({})", meta.id, st.input);
        }
    }
    if let Some(s) = shard {
        let _ = writeln!(out, "  shard:    {s}");
    }
    let _ = writeln!(
        out,
        "  request:  {}",
        meta.template.replace('\n', "\n            ")
    );
    let _ = writeln!(
        out,
        "  items:    {} done, {} failed, {} pending of {}",
        c.done, c.failed, pending, meta.total
    );
    let _ = writeln!(
        out,
        "  last run: {}{}",
        meta.last_state
            .as_deref()
            .unwrap_or("never finished (crashed or still running)"),
        meta.halt_reason
            .as_deref()
            .map(|r| format!(" ({r})"))
            .unwrap_or_default()
    );
    last_run_lines(&st, out);
    credit_lines(last, c.done, out);
    let fired = if meta.meter.fired.is_empty() {
        "none".to_string()
    } else {
        meta.meter.fired.join(", ")
    };
    let _ = writeln!(out, "  alerts fired this cycle: {fired}");
    // As `--json`: a killed run's calls are in its record until closed.
    let _ = writeln!(
        out,
        "  totals:   {} requests, {} rate-limited, {} retries",
        st.requests, st.rate_limited, meta.retries
    );
    Ok(())
}

/// The credits line of a job: the balance last seen, or why there is none.
fn credit_lines(last: Option<CreditSnapshot>, done: u64, out: &mut String) {
    match last {
        Some(s) => {
            let _ = writeln!(
                out,
                "  credits:  {} remaining of {} (last seen), {}",
                s.remaining,
                s.max,
                describe_renewal(s.renewal)
            );
        }
        // Items done and no balance: the API states none (not every API
        // meters credits), which "no response yet" would belie.
        None if done > 0 => {
            let _ = writeln!(
                out,
                "  credits:  not stated by this API (its responses carry no credit headers)"
            );
        }
        None => {
            let _ = writeln!(out, "  credits:  unknown (no metered response yet)");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_run_keeps_its_tenths_and_a_long_one_its_minutes() {
        assert_eq!(took(0.44), "0.4s");
        assert_eq!(took(72.4), "1m 12s");
    }

    /// A run looked at within the second it started (2 items done 300 ms
    /// in) has a rate and an ETA; whole seconds had read its duration as
    /// nothing there. A progress file of an older build (seconds only)
    /// still reads.
    #[test]
    fn a_run_seen_within_its_first_second_has_a_rate() {
        let started = 1_700_000_000_900;
        let mut p = Progress {
            job: "j".into(),
            input: "/in.jsonl".into(),
            total: 24,
            done: 2,
            failed: 0,
            requests: 2,
            rate_limited: 0,
            credits_remaining: None,
            pid: 1,
            updated_unix: (started + 300) / 1000,
            updated_unix_ms: started + 300,
            started_unix_ms: started,
            done_this_run: 2,
            requests_before: 0,
            rate_limited_before: 0,
            waiting_for_credits: false,
            renewal: None,
        };
        let st = serde_json::to_value(JobStatus::running(&p, None)).unwrap();
        assert_eq!(st["rate_per_min"], 400.0, "{st}");
        assert_eq!(st["eta_s"], 3.0, "{st}");
        // Waiting for a top-up: no time to go at a pace that waits.
        let waiting = Progress {
            waiting_for_credits: true,
            ..p.clone()
        };
        let st = serde_json::to_value(JobStatus::running(&waiting, None)).unwrap();
        assert!(st["eta_s"].is_null(), "{st}");
        let old: Progress = serde_json::from_value({
            p.updated_unix = (started + 2300) / 1000;
            let mut v = serde_json::to_value(&p).unwrap();
            v.as_object_mut().unwrap().remove("updated_unix_ms");
            v
        })
        .unwrap();
        let st = serde_json::to_value(JobStatus::running(&old, None)).unwrap();
        assert_eq!(st["last_run"]["duration_s"], 2.1, "{st}");
    }

    #[test]
    fn plans_table_shows_the_derived_bucket() {
        let t = plans_table();
        let starter = t.lines().find(|l| l.starts_with("starter")).unwrap();
        let cols: Vec<_> = starter.split_whitespace().collect();
        assert_eq!(cols, ["starter", "60/min", "5", "6", "0.897"]);
        assert!(t
            .lines()
            .any(|l| l.starts_with("mega") && l.contains("unpaced")));
    }
}
