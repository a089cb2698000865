//! The fixed window: at most N units per clock-aligned window of W, reset
//! at each boundary (express-rate-limit, rate-limiter-flexible, most daily
//! quotas).
//!
//! # Until the boundaries are known: a sliding window
//!
//! Every server window is a span of W, so "at most N in any span W" (the
//! sliding rule of [`crate::rate::tally`]) never overruns one, wherever
//! the server's boundaries are. That is how a fixed window is kept until a
//! response says when the server's window resets.
//!
//! # Aligned to the server's reset
//!
//! Once a reset is known, the boundaries are `origin + k·W`, known only to
//! lie within `[origin − early, origin + late]`: the reset was measured at
//! the server somewhere between the send and the response of the call that
//! carried it (`early`: up to a round trip), and a reset in whole seconds
//! may be rounded (`late`). A call that starts in client window k may reach
//! the server in any later one, and an answered call may have arrived
//! anywhere up to its response; so an answered call occupies until the
//! first boundary after `response + early`, plus `late`. A call may start
//! when the units occupying now and its own fit in N.
//!
//! Why no server window k holds more than N: of the calls it counted, take
//! the last sent, j. Every other one was sent before j and arrived in
//! window k, so at j's send it was in flight, or answered with its
//! occupancy reaching past the end of server window k (which lies after
//! j's send): the rule counted it when j started. With j, at most N. That
//! holds for any call whose occupancy reaches the end of the server window
//! it arrived in, which the sliding end (W after its answer) always does
//! and the aligned end does within the uncertainty: so a call occupies
//! until the earlier of the two. The aligned rule is used only when the
//! uncertainty is small next to the window (a tenth of it): otherwise the
//! sliding rule keeps more.
//!
//! The alignment is made once and assumes the boundaries stay where the
//! reset said: a server whose window starts at the first call after the
//! last one ended (rate-limiter-flexible's) moves them whenever no call
//! comes at one, and a restarted server moves them too. Against those the
//! sliding rule (no reset read, `--limit N/W` with no `fixed`) is the safe
//! one.
//!
//! Pure: every method takes the instant it acts at.

use std::time::{Duration, Instant};

use super::exact::later;
use super::tally::Tally;

/// Where the server's window boundaries lie, and how uncertain that is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Align {
    /// A boundary, as late as it may be measured.
    pub origin: Instant,
    /// How much earlier the true boundaries may lie.
    pub early: Duration,
    /// How much later the true boundaries may lie.
    pub late: Duration,
}

/// How long after its answer a response's headers may be read (its body
/// checked and cleaned first): a reset the server measured before the
/// answer is up to a round trip and this older when it is read.
pub const READ_AFTER: Duration = Duration::from_millis(250);

impl Align {
    /// The alignment a reset read at `origin` says, `reset` having been
    /// stated (its grain: whole seconds unless it has a fraction of one),
    /// `dated` measured from the response's `Date` (whole seconds: up to
    /// one long), by a server that measured it up to `trip` (the longest
    /// round trip) and [`READ_AFTER`] before it was read. In-process and
    /// in the fleet alike.
    pub fn of(origin: Instant, reset: Duration, dated: bool, trip: Duration) -> Align {
        let (early, late) = margins(reset, dated, trip);
        Align {
            origin,
            early,
            late,
        }
    }
}

/// How much earlier and later than read a stated reset may lie (see
/// [`Align::of`]): whole seconds may be rounded either way.
pub fn margins(reset: Duration, dated: bool, trip: Duration) -> (Duration, Duration) {
    let grain = match reset.subsec_nanos() {
        0 => Duration::from_secs(1),
        _ => Duration::from_millis(1),
    };
    let truncated = if dated {
        Duration::from_secs(1)
    } else {
        Duration::ZERO
    };
    (trip + READ_AFTER + grain + truncated, grain)
}

/// A fixed window of `quota` units per `window`.
#[derive(Debug, Clone)]
pub struct FixedWindow {
    tally: Tally,
    window: Duration,
    align: Option<Align>,
}

impl FixedWindow {
    /// A window of `quota` units per `window` whose boundaries are not
    /// known yet (kept as a sliding window).
    pub fn new(quota: u64, window: Duration) -> FixedWindow {
        FixedWindow {
            tally: Tally::new(quota),
            window: window.max(Duration::from_nanos(1)),
            align: None,
        }
    }

    /// The window (W).
    pub fn window(&self) -> Duration {
        self.window
    }

    /// The quota in force.
    pub fn quota(&self) -> u64 {
        self.tally.quota()
    }

    /// The ledger, to lower, hold or count in.
    pub fn tally_mut(&mut self) -> &mut Tally {
        &mut self.tally
    }

    /// The alignment in use, if any.
    pub fn aligned(&self) -> Option<Align> {
        self.align
    }

    /// The server says a window resets at `a.origin`: aligns to it the
    /// first time, when the uncertainty is under a tenth of the window.
    /// Returns whether it aligned now.
    pub fn align(&mut self, a: Align) -> bool {
        if self.align.is_some() || a.early.saturating_add(a.late) > self.window / 10 {
            return false;
        }
        let window = self.window;
        // Answered calls were given the sliding end, W after their
        // response: each takes the earlier of it and the aligned one.
        self.align = Some(a);
        let this = self.clone();
        self.tally
            .remap_done(|until| match until.checked_sub(window) {
                Some(arrived) => this.until(arrived),
                None => until,
            });
        true
    }

    /// Claims `weight` units at `now`, or says when to look again.
    pub fn try_take(&mut self, now: Instant, weight: u64) -> Result<u64, Instant> {
        self.tally.try_take(now, weight, self.window)
    }

    /// Call `id` was answered at `arrived`, having used `used` units (its
    /// weight when `None`).
    pub fn complete(&mut self, id: u64, arrived: Instant, used: Option<u64>) {
        let arrived = self.tally.sent(id).map_or(arrived, |s| arrived.max(s));
        let until = self.until(arrived);
        self.tally.complete(id, until, used);
    }

    /// When a call answered at `arrived` stops occupying: W after its
    /// answer, or, aligned, the first boundary after its answer and
    /// `early`, plus `late`, when that is earlier.
    fn until(&self, arrived: Instant) -> Instant {
        let sliding = later(arrived, self.window);
        match self.align {
            None => sliding,
            Some(a) => {
                let t = later(arrived, a.early);
                sliding.min(later(boundary_after(a.origin, self.window, t), a.late))
            }
        }
    }
}

/// The first boundary `origin + k·window` (k any integer) after `t`; never
/// earlier than it should be (`t + window` where the instant arithmetic
/// would underflow).
pub fn boundary_after(origin: Instant, window: Duration, t: Instant) -> Instant {
    let w = window.as_nanos().max(1);
    if t >= origin {
        let k = (t - origin).as_nanos() / w + 1;
        return nanos_after(origin, k * w).unwrap_or_else(|| later(t, window));
    }
    let back = (origin - t).as_nanos();
    let k = (back - 1) / w;
    u64::try_from(k * w)
        .ok()
        .and_then(|n| origin.checked_sub(Duration::from_nanos(n)))
        .unwrap_or_else(|| later(t, window))
}

fn nanos_after(t: Instant, n: u128) -> Option<Instant> {
    t.checked_add(Duration::from_nanos(u64::try_from(n).ok()?))
}

#[cfg(test)]
mod tests;
