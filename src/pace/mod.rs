//! When may the next call go? The async face of the pure rate logic in
//! [`crate::rate`].
//!
//! The pool sees only the [`Pacer`] interface, so the token bucket, the
//! exact sliding window and a pacer shared by many processes through Redis
//! are interchangeable behind it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use reqwest::header::HeaderMap;
use tokio::time::Instant;

use crate::rate::bucket::{SizingError, TokenBucket};
use crate::rate::Limit;

mod bucket;
pub mod shared;
mod unpaced;

pub use bucket::BucketPacer;
pub use shared::{SharedConfig, SharedPacer};
pub use unpaced::Unpaced;

/// A boxed future, so `Pacer` can be used as a trait object.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Why a pacer could not hand out a permit.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PaceError {
    /// The pacer's shared state cannot be reached. No call may go out
    /// without a permit (that would risk the limit), so the run must stop
    /// resumably instead.
    #[error("the pacer is unavailable: {0}")]
    Unavailable(String),
}

/// Something a pacer learnt from a response that the operator should hear.
#[derive(Debug, Clone, PartialEq)]
pub enum PaceNote {
    /// The server reports a limit in force below the configured one.
    LimitInForce(u64),
}

/// Decides when each call may start. One pacer is shared by every worker of
/// a run (and, for a shared pacer, by every process on the key).
pub trait Pacer: Send + Sync {
    /// Waits until one call may start and claims its place. The permit is
    /// what lets a window pacer count a call from its send until its
    /// response: complete it with the response's arrival, or drop it if the
    /// call was never sent. Fails only when the pacer's state is out of
    /// reach, in which case no call may go out.
    fn take(&self) -> BoxFuture<'_, Result<Permit, PaceError>>;

    /// A rate-limit 429 arrived: every worker waits `for_` before its next
    /// call, and nobody bursts when the pause ends. Async because a shared
    /// pacer tells every process through its store.
    fn pause(&self, for_: Duration) -> BoxFuture<'_, Result<(), PaceError>>;

    /// Sees every response's headers, so the pacer can follow the limit the
    /// server says is in force (`x-rate-limit-limit`). Returns a note when
    /// that changed what the pacer does.
    fn observe<'a>(&'a self, headers: &'a HeaderMap) -> BoxFuture<'a, Option<PaceNote>>;

    /// When the current pause ends, if one is in force: for the progress
    /// display only, so it may be approximate for a shared pacer.
    fn paused_until(&self) -> Option<Instant>;

    /// Hands back what the pacer still owes its shared store (completed
    /// permits not yet recorded there) before the run ends. Bounded in time.
    fn flush(&self) -> BoxFuture<'_, ()> {
        ready(())
    }
}

/// The bookkeeping a pacer attaches to one permit.
pub trait Ticket: Send {
    /// The call's response arrived (or it gave up waiting) at `arrived`.
    fn complete(self: Box<Self>, arrived: Instant);
    /// The call was never sent: its place is free again.
    fn cancel(self: Box<Self>);
}

/// Leave to send one call. Dropping it unused gives the place back.
#[must_use = "a permit is completed when the call's response arrives"]
pub struct Permit {
    ticket: Option<Box<dyn Ticket>>,
}

impl std::fmt::Debug for Permit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Permit")
            .field("tracked", &self.ticket.is_some())
            .finish()
    }
}

impl Permit {
    /// A permit for a pacer that keeps no per-call state (the bucket).
    pub fn untracked() -> Permit {
        Permit { ticket: None }
    }

    /// A permit carrying a pacer's per-call state.
    pub fn tracked(ticket: Box<dyn Ticket>) -> Permit {
        Permit {
            ticket: Some(ticket),
        }
    }

    /// The call ended at `arrived`: its response came (or the call gave up).
    pub fn complete(mut self, arrived: Instant) {
        if let Some(t) = self.ticket.take() {
            t.complete(arrived);
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if let Some(t) = self.ticket.take() {
            t.cancel();
        }
    }
}

/// The pacer for `limit`, and the pause a rate-limit 429 without a usable
/// Retry-After causes. A job resumed within one window of its last call
/// (`last_active`, unix time; zero for never) starts with an empty bucket:
/// the previous run may have spent the burst.
pub fn for_limit(
    limit: Limit,
    burst: Option<u64>,
    last_active: Duration,
    now_unix: Duration,
) -> Result<(Arc<dyn Pacer>, Duration), SizingError> {
    match limit {
        Limit::Rate(r) => {
            let since_last = now_unix.saturating_sub(last_active);
            // The margin covers the pacing stamp a kill -9 may not have
            // saved (saved every second, flushed within half a second more).
            let start_empty =
                !last_active.is_zero() && since_last < r.period + Duration::from_secs(3);
            let bucket = TokenBucket::for_limit(r, burst, start_empty, now_std())?;
            Ok((
                Arc::new(BucketPacer::new(bucket, r.period)),
                r.period.min(Duration::from_secs(60)),
            ))
        }
        Limit::Unlimited => Ok((Arc::new(Unpaced::default()), Duration::from_secs(30))),
    }
}

/// The pacer of a process in a fleet (`--redis`): the window, the
/// concurrency ceiling, the pause and the learnt limit are shared with every
/// process on the key. Returns the pause of a 429 without a usable
/// Retry-After, as [`for_limit`] does.
pub fn for_fleet(fleet: crate::fleet::Fleet, cfg: SharedConfig) -> (Arc<dyn Pacer>, Duration) {
    let pause = match cfg.limit {
        Limit::Rate(r) => r.period.min(Duration::from_secs(60)),
        Limit::Unlimited => Duration::from_secs(30),
    };
    (Arc::new(SharedPacer::new(fleet, cfg)), pause)
}

/// The time on tokio's clock as a std instant, for the pure rate logic
/// (which tokio's paused test clock then drives as well).
pub(crate) fn now_std() -> std::time::Instant {
    Instant::now().into_std()
}

/// Ready-made future for pacers whose answer needs no waiting.
fn ready<'a, T: Send + 'a>(v: T) -> BoxFuture<'a, T> {
    Box::pin(std::future::ready(v))
}

#[cfg(test)]
pub(crate) mod testing {
    //! Helpers the pacer tests share.
    use super::*;

    /// A response's headers carrying `x-rate-limit-limit: l`.
    pub fn limit_header(l: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(crate::wire::RATE_LIMIT_LIMIT, l.parse().unwrap());
        h
    }

    /// The most release times (sorted) inside any span shorter than `w`.
    pub fn max_in_window(stamps: &[Instant], w: Duration) -> usize {
        (0..stamps.len())
            .map(|i| {
                stamps[i..]
                    .iter()
                    .take_while(|b| **b - stamps[i] < w)
                    .count()
            })
            .max()
            .unwrap_or(0)
    }

    /// Takes a permit and completes it at once (a zero-latency call).
    pub async fn call(p: &dyn Pacer) {
        p.take().await.expect("permit").complete(Instant::now());
    }
}
