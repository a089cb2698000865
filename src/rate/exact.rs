//! The exact sliding-window pacer: pacing at the physical limit of "at most
//! L calls in any sliding window W", with nothing held back but each call's
//! round trip.
//!
//! # The rule
//!
//! A call *occupies* the window from its send until W after its response
//! arrived (W after it gave up, for a timeout or a failed connect). A call
//! may start only when fewer than L calls occupy that instant. A call
//! dropped before it was sent frees its place at once.
//!
//! # Why no server window can hold more than L arrivals
//!
//! The server counts a call at its arrival, which lies somewhere between
//! its send and its response. Take any server window (t−W, t] and the calls
//! that arrived in it; let k be the last of them to be sent, at s_k. Every
//! other one, j, was sent no later than s_k, and its response came after its
//! arrival, which is after t−W; so its occupancy runs past t ≥ s_k, and it
//! occupied s_k. The rule let k start only because fewer than L calls
//! occupied s_k; with k itself that is at most L arrivals in the window.
//! Nothing was assumed about the order responses come back in, nor about
//! where between send and response each arrival fell.
//!
//! The only loss is the round trip each call holds its place for beyond W:
//! a greedy client reaches a utilization of about W / (W + RTT), 99.8% for a
//! 100 ms round trip on a one-minute window.
//!
//! The limit may shrink while calls occupy the window (a lower
//! `x-rate-limit-limit`, a learnt limit); the argument then holds with the
//! limit in force when k was sent, and no new call starts until the
//! occupancy is below the new limit.
//!
//! # Learning a limit the server does not report
//!
//! A server that never sends `x-rate-limit-limit` may still enforce a limit
//! below the configured one. Its first rate-limit 429 is a measurement: the
//! server refused because its window was full, and this client's calls in
//! that window are its best estimate of how full. See
//! [`ExactWindow::rate_limited`] for which calls are counted and why, and
//! [`Learning`] for what the caller hears.
//!
//! With [`ExactWindow::learning_shape`] (the default pacer's) it also
//! tells a bucket from a window before it lowers anything: see
//! [`learn`](super::learn).
//!
//! Memory is bounded: an occupancy entry is forgotten once it ends, so at
//! most L completed calls are remembered, plus the calls in flight (at most
//! the pool's size).

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use super::learn::{ShapeLearner, Verdict};

/// One call's place in the window, from [`ExactWindow::try_take`] until
/// [`ExactWindow::complete`] or [`ExactWindow::cancel`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SlotId(u64);

/// What the limit learning did, for the caller to log once and checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Learning {
    /// A rate-limit 429 came from a server that never reported its limit:
    /// pacing is now to this many calls per window.
    Lowered(u64),
    /// A full window of calls passed without a 429 since the last lowering:
    /// the learnt limit holds (probing upward from it continues slowly).
    Settled(u64),
    /// A burst was refused but an even pace at `limit` calls per window
    /// held for a window: the server keeps a bucket with this burst.
    Bucket {
        /// Calls per window the bucket accepts when paced evenly.
        limit: u64,
        /// Calls it accepts at once beyond the even pace.
        burst: u64,
    },
    /// The answers of the first windows fit a fixed window of this many
    /// calls and no sliding one: paced as a sliding window of it (which
    /// the fixed one never refuses), settled at once.
    FixedWindow(u64),
}

/// How long after a call sent before the last lowering came back that a 429
/// is still suspected to be that call's: a tenth of the window, at most
/// 100 ms. The pool reads a response's status right after completing its
/// permit, so this is generous, and it stays short next to the window so
/// that a real overrun is not ignored for long.
/// The fleet's script is given this too, so the two stores share it.
pub fn stale_grace(window: Duration) -> Duration {
    (window / 10).min(Duration::from_millis(100))
}

/// At most this many learning events wait for the caller; older ones are
/// superseded by newer ones anyway. The fleet pacer keeps as many notes.
pub(crate) const MAX_EVENTS: usize = 8;

/// The limit learning's state.
#[derive(Debug, Clone)]
struct Learner {
    /// The learnt limit, once a 429 taught one (or a resume restored it).
    learnt: Option<u64>,
    /// The limit in force at the last 429 that taught: the server refused
    /// it, so probing stays below it.
    refused_at: Option<u64>,
    /// When the limit was last lowered: calls sent before then were paced
    /// to the old limit and teach nothing about the new one.
    lowered_at: Option<Instant>,
    /// When the last of those calls came back.
    last_stale_done: Option<Instant>,
    /// Start of the current window without a 429.
    clean_since: Instant,
    /// Whether the last lowering has been reported as settled.
    settled: bool,
    /// Whether the limit was used in full during the current clean window:
    /// only then does a clean window say anything about one call more.
    pressed: bool,
}

/// The exact sliding-window state machine. Pure: every method takes the
/// time it acts at.
#[derive(Debug, Clone)]
pub struct ExactWindow {
    configured: u64,
    window: Duration,
    /// The lowest `x-rate-limit-limit` the server reported (since it last
    /// raised it).
    reported: Option<u64>,
    /// A higher limit the server reports since this instant (the least of
    /// them): followed once reported for a whole window with no report at
    /// or below the one in force.
    raise: Option<(u64, Instant)>,
    learn: Learner,
    /// Telling a bucket from a window, when enabled.
    shape: Option<ShapeLearner>,
    /// Calls sent and not yet answered, with their send instants.
    in_flight: HashMap<SlotId, Instant>,
    /// Response instants of answered calls still occupying, oldest first.
    done: VecDeque<Instant>,
    next_id: u64,
    paused_until: Option<Instant>,
    held_until: Option<Instant>,
    events: VecDeque<Learning>,
}

impl ExactWindow {
    /// A window admitting `limit` calls per `window` (a limit of 0 is
    /// treated as 1), empty at `now`.
    pub fn new(limit: u64, window: Duration, now: Instant) -> ExactWindow {
        ExactWindow {
            configured: limit.max(1),
            window,
            reported: None,
            raise: None,
            learn: Learner {
                learnt: None,
                refused_at: None,
                lowered_at: None,
                last_stale_done: None,
                clean_since: now,
                settled: true,
                pressed: false,
            },
            shape: None,
            in_flight: HashMap::new(),
            done: VecDeque::new(),
            next_id: 0,
            paused_until: None,
            held_until: None,
            events: VecDeque::new(),
        }
    }

    /// Starts from a limit learnt by an earlier run of the same job (never
    /// above the configured one, at least 1). It is taken as settled, and
    /// probing upward starts again from it, up to the configured limit
    /// unless [`probing_at_most`](Self::probing_at_most) says where the
    /// earlier run was refused.
    pub fn with_learnt(mut self, learnt: Option<u64>) -> ExactWindow {
        self.learn.learnt = learnt.map(|l| l.clamp(1, self.configured));
        self
    }

    /// The configured limit (L).
    pub fn configured(&self) -> u64 {
        self.configured
    }

    /// The window (W).
    pub fn window(&self) -> Duration {
        self.window
    }

    /// The limit in force: the lowest of the configured one, the one the
    /// server reported and the learnt one.
    pub fn limit(&self) -> u64 {
        let mut l = self.configured;
        if let Some(r) = self.reported {
            l = l.min(r);
        }
        if let Some(x) = self.learn.learnt {
            l = l.min(x);
        }
        l.max(1)
    }

    /// The learnt limit, if a 429 taught one (or a resume restored it).
    pub fn learnt(&self) -> Option<u64> {
        self.learn.learnt
    }

    /// Calls occupying the window at `now`.
    pub fn occupancy(&self, now: Instant) -> u64 {
        let ended = self
            .done
            .partition_point(|&r| now.saturating_duration_since(r) >= self.window);
        (self.in_flight.len() + self.done.len() - ended) as u64
    }

    /// Calls sent and not yet answered.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// When the current pause ends, if one is in force at `now`.
    pub fn paused_until(&self, now: Instant) -> Option<Instant> {
        self.paused_until.filter(|&u| u > now)
    }

    /// Claims a place for a call starting at `now`, or says when to look
    /// again. The instant is never later than the earliest moment the
    /// answer could change by time alone; a [`cancel`](Self::cancel) or a
    /// completion may make room sooner, so a waiter should also wake on
    /// those.
    pub fn try_take(&mut self, now: Instant) -> Result<SlotId, Instant> {
        self.advance(now);
        if let Some(u) = self.paused_until(now) {
            return Err(u);
        }
        if let Some(u) = self.held_until.filter(|&u| u > now) {
            return Err(u);
        }
        let limit = self.limit();
        let occupancy = (self.in_flight.len() + self.done.len()) as u64;
        if occupancy >= limit {
            self.learn.pressed = true;
            return Err(self.room_at(occupancy - limit + 1, now));
        }
        if let Some(at) = self.shape.as_ref().and_then(|s| s.ready_at(limit, now)) {
            // Held back by the even pace: the limit is what it uses.
            self.learn.pressed = true;
            return Err(at);
        }
        if let Some(at) = self
            .shape
            .as_ref()
            .and_then(|s| s.awaiting_ramp_answer(limit, now))
        {
            return Err(at);
        }
        let ahead = match &self.shape {
            Some(s) => s.start_gate(now)?,
            None => false,
        };
        if occupancy + 1 == limit {
            self.learn.pressed = true;
        }
        let id = SlotId(self.next_id);
        self.next_id += 1;
        if let Some(s) = &mut self.shape {
            s.sent(limit, now);
            s.sent_in_start(id.0, ahead, now);
        }
        self.in_flight.insert(id, now);
        Ok(id)
    }

    /// Counts a call sent at `sent` and not yet answered, whatever the
    /// occupancy: for a window added (a policy the server announced) while
    /// calls were already under way, so that it counts them too.
    pub fn admit_in_flight(&mut self, sent: Instant) -> SlotId {
        let id = SlotId(self.next_id);
        self.next_id += 1;
        self.in_flight.insert(id, sent);
        id
    }

    /// Counts a call the server says it accepted but this window never saw
    /// (it was added after the call came back) as answered at `arrived`.
    pub fn admit_answered(&mut self, arrived: Instant) {
        let at = self.done.partition_point(|&r| r <= arrived);
        self.done.insert(at, arrived);
    }

    /// The earliest instant by which `k` more occupancies could have ended.
    /// Answered calls end W after their response; a call still in flight
    /// cannot end before W from now.
    fn room_at(&self, k: u64, now: Instant) -> Instant {
        let i = usize::try_from(k - 1).unwrap_or(usize::MAX);
        let from = self.done.get(i).copied().unwrap_or(now);
        later(from, self.window)
    }

    /// The call in `slot` was answered (or gave up) at `arrived`: it keeps
    /// its place until W after that. Unknown slots are ignored.
    pub fn complete(&mut self, slot: SlotId, arrived: Instant) {
        let Some(sent) = self.in_flight.remove(&slot) else {
            return;
        };
        if let Some(s) = &mut self.shape {
            s.answered(slot.0);
        }
        // A response cannot precede its send; two threads reading the clock
        // in one order and locking in the other can make it look so.
        let arrived = arrived.max(sent);
        if let Some(s) = &mut self.shape {
            s.round_trip(arrived.saturating_duration_since(sent));
        }
        // At or before: a lowering starts a pause, so a call sent in its
        // very instant was sent before it (the fleet, in whole ms, agrees).
        if self.learn.lowered_at.is_some_and(|l| sent <= l) {
            let last = self
                .learn
                .last_stale_done
                .map_or(arrived, |d| d.max(arrived));
            self.learn.last_stale_done = Some(last);
        }
        let at = self.done.partition_point(|&r| r <= arrived);
        self.done.insert(at, arrived);
    }

    /// The call in `slot` was never sent: its place is free at once.
    /// Returns whether the slot was in flight.
    pub fn cancel(&mut self, slot: SlotId) -> bool {
        if let Some(s) = &mut self.shape {
            s.unsent(slot.0);
        }
        self.in_flight.remove(&slot).is_some()
    }

    /// A rate-limit 429: no call starts before `until`.
    pub fn pause_until(&mut self, until: Instant) {
        self.paused_until = Some(self.paused_until.map_or(until, |p| p.max(until)));
        // The window without a 429 starts when calls may go again.
        self.learn.clean_since = self.learn.clean_since.max(until);
        if let Some(s) = &mut self.shape {
            s.paused_until(until);
        }
    }

    /// Treats the window as full until `until`: for a job resumed soon
    /// after an earlier run, whose calls may still be in the server's
    /// window. Not reported as a pause.
    pub fn hold_until(&mut self, until: Instant) {
        self.held_until = Some(self.held_until.map_or(until, |h| h.max(until)));
    }

    /// The server reports the limit in force for this key
    /// (`x-rate-limit-limit`). A lower report wins at once; a higher one
    /// once the server has said it for a whole window with nothing lower
    /// between (a limit lowered for a moment held a run at a tenth of its
    /// pace to the end); the limit never grows above the configured one. A
    /// server that reports its limit needs no learning, so a learnt limit
    /// is dropped. A report above the configured one, with none lower in
    /// force, changes nothing: 429s then come from a limit the server does
    /// not state (a gateway's beside the API's stated quota), which is
    /// learnt.
    ///
    /// Returns whether this report lowered the limit below the configured
    /// one and below every earlier report: worth telling the operator.
    pub fn set_limit_in_force(&mut self, l: u64, now: Instant) -> bool {
        let Some(r) = self.reported else {
            if l > self.configured {
                return false;
            }
            return self.lower_to(l, now);
        };
        let l = l.clamp(1, self.configured);
        if l <= r {
            self.raise = None;
            return self.lower_to(l, now);
        }
        let (to, since) = match self.raise {
            Some((to, since)) => (to.min(l), since),
            None => (l, now),
        };
        match now.saturating_duration_since(since) >= self.window {
            true => {
                self.reported = Some(to);
                self.raise = None;
            }
            false => self.raise = Some((to, since)),
        }
        false
    }

    /// [`set_limit_in_force`](Self::set_limit_in_force) at or below the
    /// report in force (or the first).
    fn lower_to(&mut self, l: u64, now: Instant) -> bool {
        self.advance(now);
        let l = l.max(1);
        let lower = l < self.configured && self.reported.map_or(true, |r| l < r);
        self.reported = Some(self.reported.map_or(l, |r| r.min(l)));
        self.learn.learnt = None;
        self.learn.refused_at = None;
        self.events.clear();
        lower
    }

    /// A response said `x-rate-limit-remaining: 0`: the server's window is
    /// full, perhaps with calls of other clients on the same key. No new
    /// call starts until one of this client's occupancies ends. That is
    /// never later than W from now, which is also when the server's window
    /// frees at the latest: the call that carried the header arrived by now.
    /// Returns when this response asks new calls to wait until.
    pub fn remaining_zero(&mut self, now: Instant) -> Instant {
        // Not the learning clock: it runs where the fleet's script runs it
        // too (takes, 429s, events), so that both end clean windows alike.
        self.forget(now);
        // Paced evenly (a bucket, or probing for one), nothing left is the
        // bucket's burst spent, which its even pace refills: waiting for a
        // window's room would send one call a window.
        let limit = self.limit();
        if let Some(at) = self.shape.as_ref().and_then(|s| s.unbursted_at(limit, now)) {
            self.hold_until(at);
            return at;
        }
        let until = self.room_at(1, now);
        self.hold_until(until);
        until
    }

    /// A rate-limit 429 arrived at `now`, for a call already
    /// [`complete`](Self::complete)d (before any pause it causes). Returns
    /// the new limit when it taught one.
    ///
    /// It teaches only when the server never reported its limit, and only
    /// about calls paced to the current limit: while a pause is in force, or
    /// a call sent before the last lowering is in flight or just came back,
    /// the 429 may be that older call's, and counting it would lower the
    /// limit again for the same overrun.
    ///
    /// The new limit is the number of *answered* calls occupying `now`,
    /// less the refused one:
    /// - the refused call is left out because the server did not count it
    ///   (a refused request consumes nothing), and what is sought is how
    ///   many calls the server had accepted when it said no;
    /// - calls still in flight are left out because most of them were sent
    ///   after the refused call reached the server, which therefore did not
    ///   count them either.
    ///
    /// Both choices err low, which costs a little throughput until probing
    /// wins it back; erring high would cost another 429 (and, on some APIs,
    /// a cooldown of most of a window). The limit also drops by at least
    /// one, so repeated 429s converge. Probing then raises it by one per
    /// full window that used the limit without a 429, never up to a limit
    /// that was refused in this run, and never above the configured one.
    ///
    /// With [`learning_shape`](Self::learning_shape), the shape learner
    /// is asked first: a 429 after a burst keeps the limit and paces evenly
    /// (see [`learn`](super::learn)), and a lowering at the even pace may
    /// be a halving, or kept above a pace that held.
    pub fn rate_limited(&mut self, now: Instant) -> Option<u64> {
        self.advance(now);
        self.learn.clean_since = self.learn.clean_since.max(now);
        self.learn.pressed = false;
        // Whatever it teaches, a 429 breaks a run of windows held.
        if let Some(s) = &mut self.shape {
            s.idle();
        }
        // With no answered call occupying, the refused one is not among
        // them as this rule assumes: there is nothing to measure.
        if self.reported.is_some() || self.paused_until(now).is_some() || self.done.is_empty() {
            return None;
        }
        let stale_just_back = self
            .learn
            .last_stale_done
            .is_some_and(|d| now.saturating_duration_since(d) < stale_grace(self.window));
        if self.sent_before_the_change() || (self.learn.lowered_at.is_some() && stale_just_back) {
            return None;
        }
        match self.shape_verdict(now, true) {
            Some(Verdict::Hold) => return None,
            Some(Verdict::Fixed(fixed)) => return Some(self.switched_to_fixed(fixed, now)),
            Some(Verdict::Lower) | None => {}
        }
        let limit = self.limit();
        let accepted = (self.done.len() as u64).saturating_sub(1);
        let floor = self
            .shape
            .as_mut()
            .map_or(0, |s| s.lowering(limit, accepted));
        let new = accepted.max(floor).min(limit - 1).max(1);
        if new >= limit {
            return None;
        }
        let l = &mut self.learn;
        l.learnt = Some(new);
        l.refused_at = Some(limit);
        l.lowered_at = Some(now);
        l.last_stale_done = None;
        l.settled = false;
        // A bucket about to be fitted is said once fitted (or, if none
        // fits, this lowering then).
        if !self.shape.as_ref().is_some_and(ShapeLearner::fit_pending) {
            self.push_event(Learning::Lowered(new));
        }
        Some(new)
    }

    /// The next learning event for the caller as of `now`, oldest first.
    pub fn take_event(&mut self, now: Instant) -> Option<Learning> {
        self.advance(now);
        self.events.pop_front()
    }

    fn push_event(&mut self, e: Learning) {
        if self.events.len() >= MAX_EVENTS {
            self.events.pop_front();
        }
        self.events.push_back(e);
    }

    /// Forgets occupancies and a hold ended by `now`.
    fn forget(&mut self, now: Instant) {
        let ended = self
            .done
            .partition_point(|&r| now.saturating_duration_since(r) >= self.window);
        self.done.drain(..ended);
        if self.held_until.is_some_and(|h| h <= now) {
            self.held_until = None;
        }
    }

    /// Brings the state to `now`: forgets what ended and runs the learning
    /// clock.
    fn advance(&mut self, now: Instant) {
        self.forget(now);
        self.advance_shape(now);
        let Some(learnt) = self.learn.learnt else {
            return;
        };
        if self.paused_until(now).is_some()
            || now.saturating_duration_since(self.learn.clean_since) < self.window
        {
            return;
        }
        let ceiling = self
            .learn
            .refused_at
            .map_or(self.configured, |r| r.saturating_sub(1))
            .min(self.configured);
        if let Some(s) = self.shape.as_mut() {
            if self.learn.pressed {
                s.held(learnt);
            } else {
                s.idle();
            }
        }
        // A search (see learn::ShapeLearner::step) steps on from the window
        // that settled the lower limit too: it is costly to stay low.
        let searching = self.shape.as_ref().is_some_and(ShapeLearner::searching);
        let was_settled = self.learn.settled;
        if !was_settled {
            self.learn.settled = true;
            self.push_event(Learning::Settled(learnt));
        }
        if (searching || was_settled) && self.learn.pressed && learnt < ceiling {
            let step = self.shape.as_ref().map_or(1, |s| s.step(learnt, ceiling));
            self.learn.learnt = Some(learnt + step);
        }
        self.learn.clean_since = now;
        self.learn.pressed = false;
    }
}

/// `t + d`, saturating far in the future instead of overflowing.
pub(crate) fn later(t: Instant, d: Duration) -> Instant {
    const FAR: Duration = Duration::from_secs(100 * 365 * 86_400);
    t.checked_add(d).or_else(|| t.checked_add(FAR)).unwrap_or(t)
}

mod shape;
#[cfg(test)]
mod tests;
