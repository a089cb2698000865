//! Progress while the run goes, and the summary when it ends.
//!
//! The reporter only consumes what the run tells it: it never decides
//! anything. [`progress`] draws the live display; [`published`] is what a
//! running job leaves for `batchrun status`.

use std::io::Write;

use serde::Serialize;

use crate::credits::Alert;
use crate::exit::RunState;

pub mod calls;
pub mod charts;
pub mod html;
pub mod joblog;
pub mod metrics;
pub mod progress;
pub mod published;
pub mod sinks;
pub mod timeline;

pub use progress::{Reporter, View};

/// The machine summary printed by `--json`, and the basis of the human one.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// done, halted, interrupted or failed.
    pub state: RunState,
    /// Items in the input.
    pub total: u64,
    /// Items done (over every run of the job).
    pub done: u64,
    /// Items recorded as failed.
    pub failed: u64,
    /// Items neither done nor failed.
    pub pending: u64,
    /// Requests sent by this run.
    pub requests: u64,
    /// Rate-limit 429s this run received.
    pub rate_limited: u64,
    /// Retries of transient failures this run made.
    pub retries: u64,
    /// The last credit balance the API reported.
    pub credits_remaining: Option<i64>,
    /// Wall time of this run, in seconds.
    pub elapsed_s: f64,
    /// Items done by this run per minute.
    pub achieved_per_min: f64,
    /// The process exit code.
    pub exit_code: i32,
    /// Why the run halted or failed, if it did.
    pub halt_reason: Option<String>,
    /// When the credit allowance renews (unix seconds), if known.
    pub renewal: Option<u64>,
    /// Alerts raised during this run.
    pub alerts: Vec<Alert>,
    /// Where the results are.
    pub out: String,
    /// Where the failures are.
    pub failures: String,
    /// This run's calls by what they got back: the HTTP status, or
    /// `timeout`, `connect`, `connection_lost`, `out_of_handles`,
    /// `unreadable`, `transport_error`.
    pub status_counts: std::collections::BTreeMap<String, u64>,
    /// Median latency of this run's calls, in milliseconds.
    pub latency_p50_ms: Option<f64>,
    /// 99th-percentile latency of this run's calls, in milliseconds.
    pub latency_p99_ms: Option<f64>,
    /// Answers of this run the API replayed from its record of an earlier
    /// call under the same Idempotency-Key (`Idempotent-Replayed: true`):
    /// those calls did not run again.
    pub replayed: u64,
}

/// Writes a line to stderr, ignoring a closed or broken stderr: losing a
/// progress line must never take the run (and its checkpoint) down with it.
pub fn err_line(line: &str) {
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// The short human summary printed on stderr at the end.
pub fn human_summary(s: &Summary) -> String {
    let head = match s.state {
        RunState::Done if s.failed == 0 => "done".to_string(),
        RunState::Done => format!("done with {} failed item(s)", s.failed),
        RunState::Halted => "halted (resumable: run the same command again)".to_string(),
        RunState::Interrupted => {
            "interrupted (checkpoint saved: run the same command to resume)".to_string()
        }
        RunState::Failed => "failed".to_string(),
        RunState::Checked => "dry run: the input is valid; nothing was sent".to_string(),
    };
    let mut out = format!(
        "batchrun: {head}\n  items: {} done, {} failed, {} pending of {}\n  this run: {} requests, {} rate-limited, {} retries in {:.1}s ({:.1} items/min)",
        s.done, s.failed, s.pending, s.total, s.requests, s.rate_limited, s.retries, s.elapsed_s, s.achieved_per_min
    );
    if !s.status_counts.is_empty() {
        let counts: Vec<String> = s
            .status_counts
            .iter()
            .map(|(k, n)| format!("{k} x{n}"))
            .collect();
        out.push_str(&format!("\n  responses: {}", counts.join(", ")));
        if let (Some(p50), Some(p99)) = (s.latency_p50_ms, s.latency_p99_ms) {
            out.push_str(&format!("; latency p50 {p50} ms, p99 {p99} ms"));
        }
    }
    if s.replayed > 0 {
        out.push_str(&format!(
            "\n  replayed: {} call(s) were answered from the API's record of earlier calls under \
             the same Idempotency-Keys (Idempotent-Replayed): they did not run again",
            s.replayed
        ));
    }
    if let Some(c) = s.credits_remaining {
        out.push_str(&format!("\n  credits remaining: {c}"));
    }
    if let Some(r) = &s.halt_reason {
        out.push_str(&format!("\n  reason: {r}"));
    }
    out.push_str(&format!("\n  results: {}", s.out));
    if s.failed > 0 {
        out.push_str(&format!("\n  failures: {}", s.failures));
    }
    out
}
