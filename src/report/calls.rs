//! What this run's calls got back: a count per HTTP status (and per kind of
//! transport failure), and their latencies, for the summary.
//!
//! Latencies go into a fixed histogram of logarithmic buckets rather than a
//! list, so a million-item run keeps them in a few kilobytes; a percentile
//! read from it is within one bucket's width (3%) of the true value.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::transport::FailureKind;

/// Each bucket is this much wider than the one before.
const GROWTH: f64 = 1.03;
/// Buckets: 1 µs up to about 1.03^800 µs, 6 hours; longer ones share the last.
const BUCKETS: usize = 800;

/// What one call got back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// An HTTP response with this status.
    Status(u16),
    /// A 429 that says the credits are gone (a credit header at 0), not a
    /// rate limit: counted apart so it is never taken for one.
    CreditsExhausted(u16),
    /// No response.
    Failure(FailureKind),
}

impl Answer {
    /// The key it is counted under in `status_counts`: the status code, or
    /// the kind of failure.
    pub fn key(self) -> String {
        match self {
            Answer::Status(s) => s.to_string(),
            Answer::CreditsExhausted(s) => format!("{s}_credits_exhausted"),
            Answer::Failure(FailureKind::Timeout) => "timeout".into(),
            Answer::Failure(FailureKind::Connect) => "connect".into(),
            Answer::Failure(FailureKind::Body) => "connection_lost".into(),
            Answer::Failure(FailureKind::Resources) => "out_of_handles".into(),
            Answer::Failure(FailureKind::Other) => "transport_error".into(),
            Answer::Failure(FailureKind::Unreadable) => "unreadable".into(),
        }
    }
}

/// Which call this was: the item's line and the call's attempt for it
/// (1 for the first).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallId {
    /// The item's line in the input.
    pub line: u64,
    /// The attempt, from 1.
    pub attempt: u32,
}

/// Counts and latencies of the calls of one run.
#[derive(Debug, Clone)]
pub struct CallStats {
    counts: BTreeMap<String, u64>,
    buckets: Vec<u64>,
    calls: u64,
    /// Answers the API replayed from its record of an earlier call under
    /// the same Idempotency-Key (`Idempotent-Replayed: true`).
    replayed: u64,
    /// The lines (a batch's first) whose last call may have run without an
    /// answer (a timeout, a lost connection), until their item finishes.
    unsure: std::collections::HashSet<u64>,
    /// The shortest and longest latency seen (µs): a percentile is never
    /// outside them (a bucket's middle may be).
    span_us: Option<(u64, u64)>,
}

impl Default for CallStats {
    fn default() -> Self {
        CallStats {
            counts: BTreeMap::new(),
            buckets: vec![0; BUCKETS],
            calls: 0,
            replayed: 0,
            unsure: Default::default(),
            span_us: None,
        }
    }
}

fn bucket(latency: Duration) -> usize {
    let us = latency.as_micros().max(1) as f64;
    ((us.ln() / GROWTH.ln()) as usize).min(BUCKETS - 1)
}

impl CallStats {
    /// Counts one call: what it got and how long it took. A call that never
    /// left (no connection, no file handle) counts, but has no latency.
    pub fn add(&mut self, answer: Answer, latency: Option<Duration>) {
        *self.counts.entry(answer.key()).or_default() += 1;
        if let Some(l) = latency {
            self.buckets[bucket(l)] += 1;
            self.calls += 1;
            let us = u64::try_from(l.as_micros()).unwrap_or(u64::MAX);
            let (lo, hi) = self.span_us.unwrap_or((us, us));
            self.span_us = Some((lo.min(us), hi.max(us)));
        }
    }

    /// Calls per status (or failure kind).
    pub fn status_counts(&self) -> BTreeMap<String, u64> {
        self.counts.clone()
    }

    /// An answer was the API's replay of an earlier call's.
    pub fn add_replayed(&mut self) {
        self.replayed += 1;
    }

    /// How many answers the API replayed from earlier calls.
    pub fn replayed(&self) -> u64 {
        self.replayed
    }

    /// The call of `line`'s item (a batch's first item) got `answer`: one
    /// that may have run without an answer leaves the item unsure until it
    /// finishes ([`Self::finished`]).
    pub fn note_outcome(&mut self, line: u64, answer: Answer) {
        match answer {
            Answer::Failure(k) if k.may_have_run() => {
                self.unsure.insert(line);
            }
            _ => {}
        }
    }

    /// `line`'s item is done or failed: whatever its calls did is settled.
    pub fn finished(&mut self, line: u64) {
        self.unsure.remove(&line);
    }

    /// Items whose last call may have run without an answer, not finished:
    /// still pending, their calls' outcome unknown.
    pub fn unsure_pending(&self) -> u64 {
        self.unsure.len() as u64
    }

    /// Calls that came to an outcome: a status, or a failure to get one.
    pub fn answered(&self) -> u64 {
        self.counts.values().sum()
    }

    /// The latency below which a fraction `q` (0..=1) of the calls came
    /// back, in milliseconds rounded to 0.1; None when no call was timed.
    pub fn percentile_ms(&self, q: f64) -> Option<f64> {
        if self.calls == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.calls as f64).ceil() as u64).max(1);
        let mut seen = 0;
        let at = self
            .buckets
            .iter()
            .position(|n| {
                seen += n;
                seen >= rank
            })
            .unwrap_or(BUCKETS - 1);
        // The middle of the bucket, in geometric terms, within what was seen.
        let mut us = GROWTH.powf(at as f64 + 0.5);
        if let Some((lo, hi)) = self.span_us {
            us = us.clamp(lo as f64, hi as f64);
        }
        Some((us / 100.0).round() / 10.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn statuses_and_failures_are_counted_by_name() {
        let mut c = CallStats::default();
        let ms = |n| Some(Duration::from_millis(n));
        c.add(Answer::Status(200), ms(10));
        c.add(Answer::Status(200), ms(12));
        c.add(Answer::Status(429), ms(1));
        c.add(Answer::Failure(FailureKind::Timeout), ms(30_000));
        c.add(Answer::Failure(FailureKind::Connect), None);
        let counts = c.status_counts();
        assert_eq!(counts["200"], 2);
        assert_eq!(counts["429"], 1);
        assert_eq!(counts["timeout"], 1);
        assert_eq!(counts["connect"], 1);
        assert_eq!(counts.len(), 4);
    }

    #[test]
    fn no_timed_call_no_percentile() {
        let mut c = CallStats::default();
        assert_eq!(c.percentile_ms(0.5), None);
        c.add(Answer::Failure(FailureKind::Connect), None);
        assert_eq!(c.percentile_ms(0.99), None);
    }

    #[test]
    fn calls_all_alike_give_their_own_latency() {
        let mut c = CallStats::default();
        for _ in 0..10 {
            c.add(Answer::Status(200), Some(Duration::from_millis(3003)));
        }
        assert_eq!(c.percentile_ms(0.5), Some(3003.0));
        assert_eq!(c.percentile_ms(0.99), Some(3003.0));
    }

    #[test]
    fn p50_and_p99_of_a_known_spread() {
        let mut c = CallStats::default();
        // 1..=1000 ms: p50 is 500 ms, p99 990 ms.
        for ms in 1..=1000 {
            c.add(Answer::Status(200), Some(Duration::from_millis(ms)));
        }
        let p50 = c.percentile_ms(0.5).unwrap();
        let p99 = c.percentile_ms(0.99).unwrap();
        assert!((p50 / 500.0 - 1.0).abs() < 0.03, "{p50}");
        assert!((p99 / 990.0 - 1.0).abs() < 0.03, "{p99}");
    }

    proptest! {
        #[test]
        fn a_percentile_is_within_one_bucket_of_the_truth(
            mut us in proptest::collection::vec(1u64..50_000_000, 1..300),
            q in 0.01f64..=1.0,
        ) {
            let mut c = CallStats::default();
            for &u in &us {
                c.add(Answer::Status(200), Some(Duration::from_micros(u)));
            }
            us.sort();
            let rank = ((q * us.len() as f64).ceil() as usize).max(1);
            let truth_ms = us[rank - 1] as f64 / 1000.0;
            let got = c.percentile_ms(q).unwrap();
            // One bucket's width, and the rounding to 0.1 ms.
            prop_assert!(
                (got - truth_ms).abs() <= truth_ms * (GROWTH - 1.0) + 0.051,
                "got {} want {}", got, truth_ms
            );
        }
    }
}
