//! The exit-code contract, in one place.
//!
//! | code | meaning |
//! |---|---|
//! | 0 | every item done |
//! | 1 | fatal: the key was rejected, the job fails alike on every call, the input changed, the checkpoint is damaged or unusable, a bug |
//! | 2 | bad options or bad input (file, line and reason given); nothing sent |
//! | 3 | finished, but some items failed (see the failures file) |
//! | 75 | halted resumably: credits exhausted, reserve reached, nothing but 429s for `--max-wait`, the fleet's Redis out of reach (or out of memory at the start), or the checkpoint or the outputs could not be written; run again to resume |
//! | 129 | stopped by SIGHUP (the terminal or ssh session closed); run again to resume |
//! | 130 | interrupted by Ctrl-C (SIGINT); run again to resume |
//! | 143 | stopped by SIGTERM (a scheduler); run again to resume |

use crate::input::InputError;
use serde::Serialize;

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RunState {
    /// Every item was attempted (some may have failed).
    Done,
    /// Stopped early but resumable: credits exhausted or the reserve
    /// reached, nothing but 429s, the fleet's Redis out of reach, or the
    /// checkpoint could not be written.
    Halted,
    /// Stopped by Ctrl-C or SIGTERM; resumable.
    Interrupted,
    /// Stopped by a fatal error (the key was rejected, ...).
    Failed,
    /// `--dry-run`: the input was checked and nothing was sent.
    Checked,
}

/// Every item done.
pub const OK: i32 = 0;
/// A fatal error.
pub const FATAL: i32 = 1;
/// Bad options or input.
pub const USAGE: i32 = 2;
/// Finished with failed items.
pub const SOME_FAILED: i32 = 3;
/// Halted resumably (EX_TEMPFAIL).
pub const HALTED: i32 = 75;
/// The terminal hung up (128 + SIGHUP).
pub const HUNG_UP: i32 = 129;
/// Interrupted (128 + SIGINT).
pub const INTERRUPTED: i32 = 130;
/// Terminated (128 + SIGTERM).
pub const TERMINATED: i32 = 143;

/// The signal that stopped a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// Ctrl-C at a terminal.
    Interrupt,
    /// A scheduler (cron, systemd, a container runtime) stopping the job.
    Terminate,
    /// The terminal or ssh session the run was started from closed.
    HangUp,
}

impl Signal {
    /// The exit code for a run this signal stopped.
    pub fn exit_code(self) -> i32 {
        match self {
            Signal::Interrupt => INTERRUPTED,
            Signal::Terminate => TERMINATED,
            Signal::HangUp => HUNG_UP,
        }
    }

    /// How the summary names it.
    pub fn describe(self) -> &'static str {
        match self {
            Signal::Interrupt => "interrupted by Ctrl-C (SIGINT)",
            Signal::Terminate => "stopped by SIGTERM",
            Signal::HangUp => "stopped by SIGHUP (the terminal closed)",
        }
    }
}

/// Errors that stop a run before or outside the pool, by exit code.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Bad options (exit 2).
    #[error("{0}")]
    Usage(String),
    /// Bad input (exit 2): names the file, line and reason.
    #[error(transparent)]
    Input(#[from] InputError),
    /// Anything else (exit 1): state mismatch, unusable state dir, ...
    #[error(transparent)]
    Fatal(#[from] anyhow::Error),
    /// Something the run needs is unable for now (exit 75): nothing was
    /// sent, and the same command may go once it is able again.
    #[error(transparent)]
    Unable(anyhow::Error),
}

impl RunError {
    /// The process exit code for this error.
    pub fn exit_code(&self) -> i32 {
        match self {
            RunError::Usage(_) | RunError::Input(_) => USAGE,
            RunError::Fatal(_) => FATAL,
            RunError::Unable(_) => HALTED,
        }
    }
}

/// The exit code for a run that ended in `state` with `failed_items` failed.
pub fn for_state(state: RunState, failed_items: u64) -> i32 {
    match state {
        RunState::Done if failed_items > 0 => SOME_FAILED,
        RunState::Done | RunState::Checked => OK,
        RunState::Halted => HALTED,
        RunState::Interrupted => INTERRUPTED,
        RunState::Failed => FATAL,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_follow_the_contract() {
        assert_eq!(for_state(RunState::Done, 0), 0);
        assert_eq!(for_state(RunState::Done, 2), 3);
        assert_eq!(for_state(RunState::Halted, 0), 75);
        assert_eq!(for_state(RunState::Interrupted, 0), 130);
        assert_eq!(for_state(RunState::Interrupted, 5), 130);
        assert_eq!(for_state(RunState::Failed, 0), 1);
        assert_eq!(Signal::Interrupt.exit_code(), 130);
        assert_eq!(Signal::Terminate.exit_code(), 143);
        assert_eq!(Signal::HangUp.exit_code(), 129);
        assert_eq!(RunError::Usage("x".into()).exit_code(), 2);
        assert_eq!(RunError::Fatal(anyhow::anyhow!("x")).exit_code(), 1);
    }
}
