//! The run's observers beyond the progress display: the job log, the
//! timeline and the `--metrics-addr` server, which keep a record of the run for later. They only consume what the
//! recording loop shows them, one hook per kind of event, and decide
//! nothing: a failing observer warns once and is given up, never the run.

use std::path::Path;
use std::time::Duration;

use super::calls::{Answer, CallId};
use super::joblog::JobLog;
use super::metrics::Metrics;
use super::timeline::{Moment, Timeline};
use crate::util::unix_now;

/// Prints a warning for the operator.
type Say = Box<dyn Fn(&str) + Send + Sync>;

/// Where the observers write, from the settings.
#[derive(Debug, Clone, Default)]
pub struct SinkPaths<'a> {
    /// `--joblog FILE`.
    pub joblog: Option<&'a Path>,
    /// The job's timeline, in the state directory.
    pub timeline: Option<&'a Path>,
    /// The configured limit and its window, for the timeline.
    pub limit: Option<(u64, Duration)>,
}

/// The observers of one run.
pub struct Sinks {
    joblog: Option<JobLog>,
    timeline: Option<Timeline>,
    metrics: Option<Metrics>,
    say: Say,
}

impl Sinks {
    /// No observer: what the recorder's own tests use.
    pub fn none() -> Sinks {
        Sinks {
            joblog: None,
            timeline: None,
            metrics: None,
            say: Box::new(|_| {}),
        }
    }

    /// Opens every observer asked for, before any call: a job log that
    /// cannot be written is a usage error, said before anything is sent.
    pub fn open(paths: &SinkPaths<'_>, say: Say) -> Result<Sinks, String> {
        let joblog = match paths.joblog {
            Some(p) => Some(
                JobLog::open(p)
                    .map_err(|e| format!("--joblog {} cannot be written: {e}", p.display()))?,
            ),
            None => None,
        };
        let timeline = match paths.timeline {
            Some(p) => Some(
                Timeline::open(p, paths.limit, now_s())
                    .map_err(|e| format!("the timeline {} cannot be written: {e}", p.display()))?,
            ),
            None => None,
        };
        Ok(Sinks {
            joblog,
            timeline,
            metrics: None,
            say,
        })
    }

    /// Adds the `--metrics-addr` server, already bound.
    pub fn with_metrics(mut self, metrics: Option<Metrics>) -> Sinks {
        self.metrics = metrics;
        self
    }

    /// A call went out.
    pub fn sent(&mut self) {
        if let Some(m) = &mut self.metrics {
            m.sent();
        }
        let r = self.timeline.as_mut().map(|t| t.sent(now_s()));
        self.timeline_did(r);
    }

    /// A 429 paused the run (or one worker, for concurrency).
    pub fn rate_limited(&mut self, concurrency: bool) {
        if let Some(m) = &mut self.metrics {
            m.rate_limited(concurrency);
        }
        let r = self
            .timeline
            .as_mut()
            .map(|t| t.rate_limited(concurrency, now_s()));
        self.timeline_did(r);
    }

    /// A timeline that fails to write warns once and is given up.
    fn timeline_did(&mut self, r: Option<std::io::Result<()>>) {
        if let Some(Err(e)) = r {
            self.timeline = None;
            (self.say)(&format!(
                "batchrun: warning: writing the run's timeline failed ({e}); the run goes on without it"
            ));
        }
    }

    /// A call came back (or failed to).
    pub fn answered(&mut self, id: CallId, answer: Answer, latency: Option<Duration>) {
        if let Some(m) = &mut self.metrics {
            m.answered(answer, latency);
        }
        let r = self
            .timeline
            .as_mut()
            .map(|t| t.answered(answer, latency, now_s()));
        self.timeline_did(r);
        if let Some(j) = &mut self.joblog {
            if let Some(w) = j.call(id, answer, latency, unix_now()) {
                (self.say)(&w);
            }
        }
    }

    /// A pacer that keeps no policies of its own (a bucket, SpikeArrest,
    /// the fleet) has the configured limit counted from the calls sent.
    fn counted(&self, mut m: Moment) -> Moment {
        if m.policies.is_empty() {
            m.policies
                .extend(self.timeline.as_ref().and_then(Timeline::counted));
        }
        m
    }

    /// A tick of the recording loop: what is buffered goes to disk.
    pub fn tick(&mut self, m: Moment) {
        let m = self.counted(m);
        if let Some(x) = &mut self.metrics {
            x.tick(&m);
        }
        if let Some(w) = self.joblog.as_mut().and_then(JobLog::flush) {
            (self.say)(&w);
        }
        let r = self.timeline.as_mut().map(|t| t.tick(m, now_s()));
        self.timeline_did(r);
    }

    /// The run is over.
    pub fn end(&mut self, m: Moment) {
        let m = self.counted(m);
        if let Some(x) = &mut self.metrics {
            x.end(&m);
        }
        if let Some(w) = self.joblog.as_mut().and_then(JobLog::flush) {
            (self.say)(&w);
        }
        let r = self.timeline.as_mut().map(|t| t.end(m, now_s()));
        self.timeline_did(r);
    }
}

fn now_s() -> u64 {
    unix_now().as_secs()
}
