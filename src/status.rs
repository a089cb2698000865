//! The read-only commands: `batchrun plans` (the plan table) and
//! `batchrun status` (a job's progress from its checkpoint, or from what a
//! running job publishes).

use std::fmt::Write as _;
use std::time::Duration;

use anyhow::Context as _;

use std::path::{Path, PathBuf};

use crate::checkpoint::{CheckpointError, JobMeta, Store};
use crate::cli::StatusArgs;
use crate::credits::describe_renewal;
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
    if dir.join("checkpoint").exists() {
        out.push((None, dir.to_path_buf()));
    }
    let mut shards: Vec<(Shard, PathBuf)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let shard = Shard::from_tag(&e.file_name().to_string_lossy())?;
            let p = e.path();
            p.join("checkpoint").exists().then_some((shard, p))
        })
        .collect();
    shards.sort_by_key(|(s, _)| (s.count, s.index));
    out.extend(shards.into_iter().map(|(s, p)| (Some(s), p)));
    // The default state dirs of several inputs sit side by side under
    // .batchrun/: with no input named, show them all.
    let mut others: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.join("checkpoint").exists()
                && Shard::from_tag(&p.file_name().unwrap_or_default().to_string_lossy()).is_none()
        })
        .collect();
    others.sort();
    out.extend(others.into_iter().map(|p| (None, p)));
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
        let age = crate::util::unix_now()
            .as_secs()
            .saturating_sub(self.updated_unix);
        let pending = self.total.saturating_sub(self.done + self.failed);
        if as_json {
            let mut v = serde_json::to_value(self).unwrap_or_default();
            v["running"] = serde_json::Value::Bool(true);
            v["pending"] = pending.into();
            v["shard"] = shard.map(|s| s.to_string()).into();
            json.push(v);
            return;
        }
        let who = shard.map(|s| format!("shard {s}, ")).unwrap_or_default();
        let _ = writeln!(
            out,
            "job {} ({who}running, pid {}; as of {age}s ago): {} done, {} failed, {pending} pending of {}; {} requests, {} rate-limited{}",
            self.job,
            self.pid,
            self.done,
            self.failed,
            self.total,
            self.requests,
            self.rate_limited,
            self.credits_remaining.map(|c| format!("; credits {c}")).unwrap_or_default(),
        );
    }
}

/// `batchrun status INPUT`: progress from the checkpoint (and every shard's);
/// no API call.
pub fn status(args: &StatusArgs) -> anyhow::Result<String> {
    let abs = match &args.input {
        Some(i) => Some(
            std::fs::canonicalize(i)
                .with_context(|| format!("{}: cannot read", i.display()))?
                .to_string_lossy()
                .into_owned(),
        ),
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
    for (shard, dir) in found {
        let store = match Store::open(&dir) {
            Ok(s) => s,
            // A shard running right now holds its checkpoint.
            // A run in progress holds its checkpoint: show what it publishes.
            Err(CheckpointError::Locked(_)) => {
                let running = Progress::running_in(&dir, abs.as_deref());
                for p in &running {
                    p.describe(shard, args.json, &mut out, &mut json);
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
            Err(e) => return Err(e.into()),
        };
        let jobs = match &abs {
            Some(a) => store.jobs_for_input(a)?,
            None => store.jobs()?,
        };
        for meta in jobs {
            describe_job(&meta, shard, args.json, &mut out, &mut json)?;
        }
    }
    if json.is_empty() && out.is_empty() {
        let what = args
            .input
            .as_ref()
            .map_or("any input".to_string(), |i| i.display().to_string());
        anyhow::bail!("no job for {what} in {}", state_dir.display());
    }
    if args.json {
        // Always an array, whatever the number of jobs: a script reads one shape.
        out = format!("{}\n", serde_json::Value::Array(json));
    }
    Ok(out)
}

/// One job's status, as text into `out` or as JSON into `json`.
fn describe_job(
    meta: &JobMeta,
    shard: Option<Shard>,
    as_json: bool,
    out: &mut String,
    json: &mut Vec<serde_json::Value>,
) -> anyhow::Result<()> {
    let c = meta.counts();
    let pending = meta.total.saturating_sub(c.done + c.failed);
    let last = meta.meter.last;
    if as_json {
        let mut v = serde_json::json!({
            "job": meta.id, "input": meta.input, "total": meta.total,
            "done": c.done, "failed": c.failed, "pending": pending,
            "credits_remaining": last.map(|s| s.remaining),
            "renewal": last.and_then(|s| s.renewal),
            "alerts_fired": meta.meter.fired,
            "last_state": meta.last_state, "halt_reason": meta.halt_reason,
            "requests": meta.requests, "rate_limited": meta.rate_limited,
        });
        if let Some(s) = shard {
            v["shard"] = serde_json::Value::String(s.to_string());
        }
        json.push(v);
        return Ok(());
    }
    let _ = writeln!(out, "job {}  ({})", meta.id, meta.input);
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
        None => {
            let _ = writeln!(out, "  credits:  unknown (no metered response yet)");
        }
    }
    let fired = if meta.meter.fired.is_empty() {
        "none".to_string()
    } else {
        meta.meter.fired.join(", ")
    };
    let _ = writeln!(out, "  alerts fired this cycle: {fired}");
    let _ = writeln!(
        out,
        "  totals:   {} requests, {} rate-limited, {} retries",
        meta.requests, meta.rate_limited, meta.retries
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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
