//! A job's runs, kept in its record: when each started and ended, how it
//! ended and what it did, for `status` and the report. A record of a run
//! that was killed has a start and no end. The field is new: an older job
//! record has none and opens as a job with no runs recorded.

use serde::{Deserialize, Serialize};

use super::JobMeta;

/// The most runs a job keeps: the oldest go first. A nightly job keeps
/// three months of them in about 15 KB of its record.
pub const RUNS_KEPT: usize = 100;

/// One run of a job.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    /// When it started (unix ms).
    pub started_unix_ms: u64,
    /// When it ended (unix ms); None for a run still going or killed.
    #[serde(default)]
    pub ended_unix_ms: Option<u64>,
    /// How it ended: done, halted, interrupted, failed.
    #[serde(default)]
    pub state: Option<String>,
    /// Its exit code.
    #[serde(default)]
    pub exit_code: Option<i32>,
    /// Items it finished.
    #[serde(default)]
    pub done: u64,
    /// Items it recorded as failed.
    #[serde(default)]
    pub failed: u64,
    /// Calls it sent.
    #[serde(default)]
    pub requests: u64,
    /// Rate-limit 429s it received.
    #[serde(default)]
    pub rate_limited: u64,
    /// The job's failed items when it started, to count its own at the end.
    #[serde(default)]
    pub failed_before: u64,
    /// The job's done items when it started (none in a record of an older
    /// build, whose `failed_before` was not kept either): a killed run's
    /// own are read from the checkpoint, which records each item as it
    /// ends, where its record lags by up to a second.
    #[serde(default)]
    pub done_before: Option<u64>,
    /// When the run last saved its record (unix ms; about once a second):
    /// a killed run ended about then, with the counts saved with it.
    #[serde(default)]
    pub seen_unix_ms: Option<u64>,
}

impl RunRecord {
    /// The record of a run that has not ended, its items caught up with a
    /// checkpoint holding `done` and `failed`: those it finished since it
    /// last saved its record. Its calls stay as saved: a batch settles
    /// many items, and an item may fail unsent.
    pub fn caught_up(&self, done: u64, failed: u64) -> RunRecord {
        let mut r = self.clone();
        if let (None, Some(before)) = (r.ended_unix_ms, r.done_before) {
            r.done = r.done.max(done.saturating_sub(before));
            r.failed = r.failed.max(failed.saturating_sub(r.failed_before));
        }
        r
    }

    /// How long it ran (until `now_ms` if it has not ended), in seconds.
    pub fn duration_s(&self, now_ms: u64) -> f64 {
        let end = self.ended_unix_ms.unwrap_or(now_ms);
        end.saturating_sub(self.started_unix_ms) as f64 / 1000.0
    }
}

impl JobMeta {
    /// A run starts now: its record goes at the end (the oldest one past
    /// [`RUNS_KEPT`] is dropped).
    pub fn start_run(&mut self, now_unix_ms: u64) {
        self.runs.push(RunRecord {
            started_unix_ms: now_unix_ms,
            failed_before: self.failed,
            done_before: Some(self.done),
            ..RunRecord::default()
        });
        let over = self.runs.len().saturating_sub(RUNS_KEPT);
        self.runs.drain(..over);
    }

    /// A last run with no end was killed (a running one holds the
    /// checkpoint): it is closed as `killed` where it last saved its
    /// record, and what it sent joins the job's totals. True if it was.
    pub fn close_killed_run(&mut self) -> bool {
        let (done, failed) = (self.done, self.failed);
        let Some(run) = self.runs.last_mut().filter(|r| r.ended_unix_ms.is_none()) else {
            return false;
        };
        *run = run.caught_up(done, failed);
        run.ended_unix_ms = Some(run.seen_unix_ms.unwrap_or(run.started_unix_ms));
        run.state = Some("killed".into());
        self.unsettled |= self.done + self.failed < self.total;
        let (requests, limited) = (run.requests, run.rate_limited);
        self.requests += requests;
        self.rate_limited += limited;
        true
    }

    /// The last run's record, if any was kept.
    pub fn last_run(&self) -> Option<&RunRecord> {
        self.runs.last()
    }

    /// The current run's record, to close it.
    pub fn last_run_mut(&mut self) -> Option<&mut RunRecord> {
        self.runs.last_mut()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_killed_run_is_closed_where_it_last_saved_and_joins_the_totals() {
        let mut meta = JobMeta {
            requests: 5,
            ..JobMeta::default()
        };
        meta.start_run(1_000);
        if let Some(r) = meta.last_run_mut() {
            r.requests = 100;
            r.rate_limited = 2;
            r.seen_unix_ms = Some(3_500);
        }
        meta.total = 10;
        assert!(meta.close_killed_run());
        assert!(meta.unsettled, "killed with items pending");
        // A later run that ends cleanly with items still pending does not
        // settle what the killed one had in flight.
        meta.start_run(5_000);
        if let Some(r) = meta.last_run_mut() {
            r.ended_unix_ms = Some(6_000);
        }
        assert!(!meta.close_killed_run());
        assert!(meta.unsettled);
        let run = &meta.runs[0];
        assert_eq!(run.state.as_deref(), Some("killed"));
        assert_eq!(run.duration_s(99_000), 2.5);
        assert_eq!((meta.requests, meta.rate_limited), (105, 2));
    }

    /// Killed a moment after it last saved its record, a run finished more
    /// items than the record says: the checkpoint's counts, less what the
    /// job had when it started, are its own.
    #[test]
    fn a_killed_run_is_counted_as_far_as_the_checkpoint_recorded_it() {
        let mut meta = JobMeta {
            total: 300,
            done: 20,
            failed: 1,
            requests: 21,
            ..JobMeta::default()
        };
        meta.start_run(1_000);
        if let Some(r) = meta.last_run_mut() {
            (r.done, r.requests, r.seen_unix_ms) = (60, 61, Some(4_000));
        }
        (meta.done, meta.failed) = (100, 3);
        let shown = meta.last_run().unwrap().caught_up(meta.done, meta.failed);
        assert_eq!((shown.done, shown.failed, shown.requests), (80, 2, 61));
        assert!(meta.close_killed_run());
        let run = meta.last_run().unwrap();
        assert_eq!((run.done, run.failed, run.requests), (80, 2, 61));
        assert_eq!(meta.requests, 21 + 61);
        // A record of an older build knows not where the run began.
        let mut old = shown.clone();
        (old.ended_unix_ms, old.done_before, old.done, old.requests) = (None, None, 60, 61);
        assert_eq!(old.caught_up(100, 3), old);
    }

    #[test]
    fn an_older_record_opens_with_no_runs_and_a_new_one_keeps_them() {
        let old = r#"{"id":"j","input":"/x","fingerprint":"f","total":3,"template":"t",
            "created_unix":1,"last_active_unix_ms":2,"meter":{"last":null,"fired":[],"cycle_renewal":null},"halt_reason":null,
            "last_state":"done","requests":3,"rate_limited":0,"retries":0,"cost_per_item":null}"#;
        let mut meta: JobMeta = serde_json::from_str(old).unwrap();
        assert!(meta.runs.is_empty());
        meta.start_run(1_000);
        meta.last_run_mut().unwrap().ended_unix_ms = Some(3_500);
        let back: JobMeta = serde_json::from_slice(&serde_json::to_vec(&meta).unwrap()).unwrap();
        assert_eq!(back.runs, meta.runs);
        assert_eq!(back.last_run().unwrap().duration_s(0), 2.5);
    }

    #[test]
    fn only_the_last_runs_are_kept() {
        let mut meta = JobMeta::default();
        for i in 0..(RUNS_KEPT as u64 + 5) {
            meta.start_run(i);
        }
        assert_eq!(meta.runs.len(), RUNS_KEPT);
        assert_eq!(meta.runs[0].started_unix_ms, 5);
    }
}
