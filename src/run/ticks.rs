//! What the recording loop shows on each tick: the progress display, and
//! the progress file `batchrun status` reads while the run holds the
//! checkpoint. Read from the counters and the pool's shared parts; the
//! pool itself is never held, so the event channel closes when it ends.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::events::Stats;
use super::gate::Gate;
use crate::credits::Ledger;
use crate::pace::Pacer;
use crate::report::{Reporter, View};

/// How often the progress for `batchrun status` is rewritten.
const PUBLISH_EVERY: Duration = Duration::from_secs(2);

/// The pool's shared parts a tick reads.
pub struct Gauges {
    /// The calls in flight: their pace bounds the run's when the limit's
    /// needs more of them.
    pub slots: Arc<super::slots::Slots>,
    /// The pacer: its pause, its pace, the limit it learnt.
    pub pacer: Arc<dyn Pacer>,
    /// The gate: when the next probe for credits goes.
    pub gate: Arc<Gate>,
    /// The balance.
    pub ledger: Arc<Ledger>,
}

/// What `batchrun status` is told about the job while it runs.
pub struct Publish {
    /// Where the progress file goes.
    pub state_dir: PathBuf,
    /// The job's id.
    pub job: String,
    /// The job's input, as the job record names it.
    pub input: String,
    /// Items in the input.
    pub total: u64,
    /// When the run started (unix ms).
    pub started_unix_ms: u64,
    /// Calls and rate-limit 429s of the job's earlier runs.
    pub before: (u64, u64),
}

/// The progress display and the progress file, redrawn every tick.
pub struct Ticks {
    /// What a tick reads besides the counters.
    pub gauges: Gauges,
    /// What the progress file says.
    pub publish: Publish,
    /// When the run started.
    pub started: Instant,
    /// The pace the limit allows, items per minute, unless the pacer knows
    /// better.
    pub steady_per_min: Option<f64>,
    /// When the progress file was last written.
    published: Option<Instant>,
}

impl Ticks {
    /// Ticks over these; nothing is written before [`Ticks::tick`].
    pub fn new(gauges: Gauges, publish: Publish, started: Instant, steady: Option<f64>) -> Ticks {
        Ticks {
            gauges,
            publish,
            started,
            steady_per_min: steady,
            published: None,
        }
    }

    /// One tick: the display redrawn (not on the first tick, which only
    /// publishes), and the progress file rewritten every [`PUBLISH_EVERY`].
    pub fn tick(&mut self, stats: &Stats, reporter: &Reporter) {
        let now = Instant::now();
        let Some(published) = self.published else {
            self.write(stats);
            self.published = Some(now);
            return;
        };
        if now - published >= PUBLISH_EVERY {
            self.write(stats);
            self.published = Some(now);
        }
        let g = &self.gauges;
        reporter.update(&View {
            done: Stats::get(&stats.done),
            failed: Stats::get(&stats.failed),
            done_this_run: Stats::get(&stats.done_this_run),
            elapsed: now - self.started,
            rate_limited: Stats::get(&stats.rate_limited),
            credits: g.ledger.last().map(|s| s.remaining),
            paused_for: g.pacer.paused_until().map(|u| u - now),
            held_for: g.pacer.held_until().map(|u| u - now),
            waiting_probe_in: g.gate.waiting_probe_in(now),
            steady_per_min: steady(
                g.pacer.steady_per_min().or(self.steady_per_min),
                g.slots.pace_per_min(),
            ),
            recent_per_min: None,
        });
    }

    /// What the run's timeline reads besides the events: the pause, the
    /// wait for credits, the learnt limit and the balance.
    pub fn moment(&self) -> crate::report::timeline::Moment {
        let (g, now) = (&self.gauges, Instant::now());
        crate::report::timeline::Moment {
            paused: g.pacer.paused_until().is_some_and(|u| u > now),
            waiting_credits: g.gate.waiting_probe_in(now).is_some(),
            learnt: g.pacer.learnt().map(|l| l.limit),
            credits: g.ledger.last().map(|s| s.remaining),
            policies: g.pacer.occupancy(),
            projection: None,
        }
    }

    /// The run no longer holds the checkpoint: `batchrun status` reads it.
    pub fn end(&self) {
        let path =
            crate::report::published::progress_path(&self.publish.state_dir, &self.publish.job);
        let _ = std::fs::remove_file(path);
    }

    fn write(&self, stats: &Stats) {
        let p = &self.publish;
        let now = crate::util::unix_now();
        let progress = crate::report::published::Progress {
            job: p.job.clone(),
            input: p.input.clone(),
            total: p.total,
            done: Stats::get(&stats.done),
            failed: Stats::get(&stats.failed),
            requests: Stats::get(&stats.requests),
            rate_limited: Stats::get(&stats.rate_limited),
            credits_remaining: self.gauges.ledger.last().map(|s| s.remaining),
            pid: std::process::id(),
            updated_unix: now.as_secs(),
            updated_unix_ms: u64::try_from(now.as_millis()).unwrap_or(u64::MAX),
            started_unix_ms: p.started_unix_ms,
            done_this_run: Stats::get(&stats.done_this_run),
            requests_before: p.before.0,
            rate_limited_before: p.before.1,
            waiting_for_credits: self.gauges.gate.waiting_probe_in(Instant::now()).is_some(),
            renewal: self.gauges.ledger.last().and_then(|s| s.renewal),
        };
        // Best effort: a full disk must not stop the run over a status file.
        let _ = progress.publish(&p.state_dir);
    }
}

/// The pace the rest of the run goes at: the limit's, unless the calls in
/// flight at the measured latency allow less (or there is no limit).
fn steady(limit: Option<f64>, concurrency: Option<f64>) -> Option<f64> {
    match (limit, concurrency) {
        (Some(l), Some(c)) => Some(l.min(c)),
        (l, c) => l.or(c),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_eta_pace_is_the_slower_of_the_limit_and_the_calls_in_flight() {
        use super::steady;
        // 600/6s is 6000/min; one call in flight at 200 ms makes 300/min.
        assert_eq!(steady(Some(6000.0), Some(300.0)), Some(300.0));
        assert_eq!(steady(Some(60.0), Some(300.0)), Some(60.0));
        assert_eq!(steady(None, Some(300.0)), Some(300.0));
        assert_eq!(steady(Some(60.0), None), Some(60.0));
        assert_eq!(steady(None, None), None);
    }
}
