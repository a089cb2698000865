//! The run's observers beyond the progress display: the job log (and what
//! else keeps a record of the run for later). They only consume what the
//! recording loop shows them, one hook per kind of event, and decide
//! nothing: a failing observer warns once and is given up, never the run.

use std::path::Path;
use std::time::Duration;

use super::calls::{Answer, CallId};
use super::joblog::JobLog;
use crate::util::unix_now;

/// Prints a warning for the operator.
type Say = Box<dyn Fn(&str) + Send + Sync>;

/// Where the observers write, from the settings.
#[derive(Debug, Clone, Default)]
pub struct SinkPaths<'a> {
    /// `--joblog FILE`.
    pub joblog: Option<&'a Path>,
}

/// The observers of one run.
pub struct Sinks {
    joblog: Option<JobLog>,
    say: Say,
}

impl Sinks {
    /// No observer: what the recorder's own tests use.
    pub fn none() -> Sinks {
        Sinks {
            joblog: None,
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
        Ok(Sinks { joblog, say })
    }

    /// A call came back (or failed to).
    pub fn answered(&mut self, id: CallId, answer: Answer, latency: Option<Duration>) {
        if let Some(j) = &mut self.joblog {
            if let Some(w) = j.call(id, answer, latency, unix_now()) {
                (self.say)(&w);
            }
        }
    }

    /// A tick of the recording loop: what is buffered goes to disk.
    pub fn tick(&mut self) {
        if let Some(w) = self.joblog.as_mut().and_then(JobLog::flush) {
            (self.say)(&w);
        }
    }

    /// The run is over.
    pub fn end(&mut self) {
        self.tick();
    }
}
