//! What workers tell the one loop that records: typed events, never
//! strings to be routed by id.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::credits::{Alert, CreditSnapshot};
use crate::pace::PaceNote;
use crate::report::calls::{Answer, CallId};

/// One thing that happened in the pool.
#[derive(Debug, PartialEq)]
pub enum Event {
    /// A call went out.
    Sent,
    /// An item is done.
    Done {
        /// Its line.
        line: u64,
        /// The response's status.
        status: u16,
        /// The response's body, as received: it is stored as is, and only
        /// the outputs look at whether it is JSON.
        body: Vec<u8>,
        /// Calls it took.
        attempts: u32,
        /// The item's digest, recorded with its result.
        digest: u64,
    },
    /// An item failed for good.
    Failed {
        /// Its line.
        line: u64,
        /// The last status, if a response came.
        status: Option<u16>,
        /// Why.
        reason: String,
        /// Calls it took.
        attempts: u32,
        /// The last call may have run (no verdict came back): the item
        /// keeps its Idempotency-Key through `--retry-failed`.
        unknown: bool,
        /// The item's digest, recorded with its result.
        digest: u64,
    },
    /// The items a batch call settled, done or failed: recorded together,
    /// in one commit, so that a crash leaves the whole batch pending or
    /// none of it (a resend then forms the same batch under the same key).
    Settled(Vec<Event>),
    /// A 429: for the window (everyone paused) or for concurrency.
    RateLimited {
        /// How long.
        pause: Duration,
        /// True for a concurrency 429, which delays only its worker.
        concurrency: bool,
        /// What the server said about it, if anything.
        message: Option<String>,
    },
    /// A call came back (or failed to), after this long; no latency for a
    /// call that never left; which call it was.
    Answered(Answer, Option<Duration>, CallId),
    /// The API answered a call from its record of an earlier one under the
    /// same Idempotency-Key (`Idempotent-Replayed: true`): it did not run
    /// again.
    Replayed,
    /// A transient failure will be retried.
    Retry,
    /// A newer credit balance.
    Credits(CreditSnapshot),
    /// The pacer changed what it does.
    Pace(PaceNote),
    /// A line for the operator.
    Note(String),
    /// A billing alert; those about a waiting spell go out every time, the
    /// others once per billing cycle.
    Alert(Alert),
}

/// Counters shared between the recording loop, the progress ticker and the
/// summary.
#[derive(Debug, Default)]
pub struct Stats {
    /// Items done (all runs).
    pub done: AtomicU64,
    /// Items failed (all runs).
    pub failed: AtomicU64,
    /// Items done by this run.
    pub done_this_run: AtomicU64,
    /// Calls sent by this run.
    pub requests: AtomicU64,
    /// Rate-limit 429s this run.
    pub rate_limited: AtomicU64,
    /// Retries this run.
    pub retries: AtomicU64,
}

impl Stats {
    /// Counters that start from the items earlier runs finished.
    pub fn resumed(finished: crate::checkpoint::Counts) -> Stats {
        let stats = Stats::default();
        stats.done.store(finished.done, Ordering::Relaxed);
        stats.failed.store(finished.failed, Ordering::Relaxed);
        stats
    }

    /// Reads one counter.
    pub fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }

    /// Adds one to a counter.
    pub fn bump(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// Writes this run's counts into its record: as it goes (what a kill
    /// leaves) and when it ends.
    pub fn count_in(&self, run: &mut crate::checkpoint::RunRecord) {
        run.done = Self::get(&self.done_this_run);
        run.requests = Self::get(&self.requests);
        run.rate_limited = Self::get(&self.rate_limited);
    }
}
