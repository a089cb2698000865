//! What the set heard from a server's headers that the operator should
//! hear too, each said once.

use std::fmt;
use std::time::Duration;

/// What the set heard from a server's headers that the operator should
/// hear too. Each is said once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Heard {
    /// The server keeps a policy it was not told of: paced to as well.
    Added {
        /// The policy's name in the headers.
        name: String,
        /// Its quota per window.
        quota: u64,
        /// Its window.
        window: Duration,
        /// Whether it counts tokens (else calls).
        tokens: bool,
    },
    /// The server's quota for a window in force (configured, or handed
    /// over to under `--limit none`) is lower: paced to it.
    Lowered {
        /// The policy's name in the headers.
        name: String,
        /// The server's quota.
        quota: u64,
        /// The window, when the headers state it.
        window: Option<Duration>,
        /// The configured limit it replaces.
        configured: u64,
        /// Whether it counts tokens (else calls).
        tokens: bool,
    },
    /// The server's quota for a window in force is higher: the limit in
    /// force is kept.
    Above {
        /// The policy's name in the headers.
        name: String,
        /// The server's quota.
        quota: u64,
        /// The window, when the headers state it.
        window: Option<Duration>,
        /// The configured limit that is kept.
        configured: u64,
        /// Whether it counts tokens (else calls).
        tokens: bool,
    },
    /// A stated quota of tokens refills continuously (its resets keep
    /// proportion with its use): paced as a bucket.
    Refills {
        /// The policy's name in the headers.
        name: String,
        /// Its quota: the bucket's size.
        quota: u64,
        /// The period it refills the whole quota over.
        period: Duration,
    },
    /// The server keeps a policy it was not told of, beyond the most the
    /// set keeps: not paced to. The tightest are kept first.
    Ignored {
        /// The policy's name in the headers.
        name: String,
        /// Its quota per window.
        quota: u64,
        /// Its window, when the headers state it.
        window: Option<Duration>,
        /// Whether it counts tokens (else calls).
        tokens: bool,
    },
    /// A policy is used up: calls are held until it resets.
    Exhausted {
        /// The policy's name in the headers.
        name: String,
        /// How long calls are held.
        for_: Duration,
    },
}

fn per(window: Option<Duration>) -> String {
    match window {
        Some(w) => format!("per {}", humantime::format_duration(w)),
        None => "per window".to_string(),
    }
}

fn what(tokens: bool) -> &'static str {
    if tokens {
        "token limit"
    } else {
        "limit"
    }
}

impl fmt::Display for Heard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Heard::Added { name, quota, window, tokens } => write!(
                f,
                "the server announces a further {} {name:?} of {quota} {}: pacing to it as well",
                what(*tokens),
                per(Some(*window))
            ),
            Heard::Lowered { name, quota, window, configured, tokens } => write!(
                f,
                "the server announces a {} {name:?} of {quota} {}, below the {configured} in force: slowing down to it",
                what(*tokens),
                per(*window)
            ),
            Heard::Above { name, quota, window, configured, tokens } => write!(
                f,
                "the server announces a {} {name:?} of {quota} {}, above the {configured} in force: keeping the {configured}",
                what(*tokens),
                per(*window)
            ),
            Heard::Ignored { name, quota, window, tokens } => write!(
                f,
                "the server announces a further {} {name:?} of {quota} {}, beyond the {} batchrun keeps (the tightest): not paced to",
                what(*tokens),
                per(*window),
                super::MAX_WINDOWS
            ),
            Heard::Refills { name, quota, period } => write!(
                f,
                "the server's token limit {name:?} of {quota} refills continuously, in full over {}: pacing to it as a bucket",
                humantime::format_duration(Duration::from_millis(period.as_millis() as u64))
            ),
            Heard::Exhausted { name, for_ } => write!(
                f,
                "the server says its limit {name:?} is used up: holding calls for {}, until it resets",
                humantime::format_duration(Duration::from_secs(for_.as_secs()))
            ),
        }
    }
}
