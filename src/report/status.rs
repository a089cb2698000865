//! Read-only views: the plan table and a job's status from its checkpoint.

use std::fmt::Write as _;
use std::time::Duration;

use anyhow::Context as _;

use crate::checkpoint::Store;
use crate::cli::StatusArgs;
use crate::credits::describe_renewal;
use crate::rate::bucket::TokenBucket;
use crate::rate::{Limit, Plan};

/// `batchrun plans`: the seed's table with the bucket batchrun derives from it.
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

/// `batchrun status INPUT`: progress from the checkpoint; no API call.
pub fn status(args: &StatusArgs) -> anyhow::Result<String> {
    let abs = std::fs::canonicalize(&args.input)
        .with_context(|| format!("{}: cannot read", args.input.display()))?;
    let abs = abs.to_string_lossy().into_owned();
    if !args.state_dir.join("checkpoint").exists() {
        anyhow::bail!(
            "no checkpoint in {} (was the job run with another --state-dir?)",
            args.state_dir.display()
        );
    }
    let store = Store::open(&args.state_dir)?;
    let jobs = store.jobs_for_input(&abs)?;
    if jobs.is_empty() {
        anyhow::bail!(
            "no job for {} in {}",
            args.input.display(),
            args.state_dir.display()
        );
    }
    let mut out = String::new();
    let mut json = Vec::new();
    for meta in jobs {
        let c = store.counts(&meta)?;
        let pending = meta.total.saturating_sub(c.done + c.failed);
        let last = meta.meter.last;
        if args.json {
            json.push(serde_json::json!({
                "job": meta.id, "input": meta.input, "total": meta.total,
                "done": c.done, "failed": c.failed, "pending": pending,
                "credits_remaining": last.map(|s| s.remaining),
                "renewal": last.and_then(|s| s.renewal),
                "alerts_fired": meta.meter.fired,
                "last_state": meta.last_state, "halt_reason": meta.halt_reason,
                "requests": meta.requests, "rate_limited": meta.rate_limited,
            }));
            continue;
        }
        let _ = writeln!(out, "job {}  ({})", meta.id, meta.input);
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
    }
    if args.json {
        let v = if json.len() == 1 {
            json.remove(0)
        } else {
            serde_json::Value::Array(json)
        };
        out = format!("{v}\n");
    }
    Ok(out)
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
