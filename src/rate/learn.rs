//! Learning a secret limit's shape: a bucket told from a window.
//!
//! A server that keeps its limit secret answers 429 when a call is one too
//! many, and the exact window ([`ExactWindow`](super::exact::ExactWindow))
//! learns the limit from the calls the server had accepted in the window.
//! That is right for a window (sliding or fixed), whose count per window is
//! the limit. It is wrong for a bucket (GCRA, as nginx `limit_req` and
//! SpikeArrest keep it): a bucket refuses a burst above its small capacity
//! although its *rate* is the one told, and the window would conclude
//! "6 calls per window" where 30 a second are accepted when paced evenly.
//!
//! So a 429 that came after a burst (calls sent faster than the told rate)
//! first changes how calls go, not how many: the window paces evenly, one
//! call per W/L plus [`SKEW`], with no burst ([`Phase::Probing`]).
//! - If even pacing holds for a whole window with no 429, the limit is a
//!   bucket at that rate; its burst is taken as what was accepted before
//!   the refusal, less what the rate drained over those sends and less one
//!   (erring low: a burst too large costs a 429 after every idle spell),
//!   and pacing stays even.
//! - If even pacing is refused too, the rate itself is lower: the exact
//!   window lowers its limit as it always did (from the calls accepted per
//!   window), and pacing stays even at the lower limit, which a window of
//!   that limit accepts as well as a bucket of that rate. Once every answer
//!   of the start and the ramp is in, a fit replaces that count: the bucket
//!   that answers them as the server did, else the window that does, then
//!   paced as a window (`fitted.rs`).
//!
//! A 429 after even pacing, or with no burst before it, says the rate is
//! lower at once. Everything here is pure: every method takes `now`.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

mod fit;
mod fitted;
mod start;
mod windows;

pub use fitted::{Fitted, FittedKind};
use start::Start;
pub use start::{START_AHEAD, START_WITHIN};

/// The even pace's allowance for latency varying between calls: a call
/// per W/L times 1 + `SKEW`. Two calls sent one interval apart may arrive
/// a little closer; a bucket with no burst refuses the second.
pub const SKEW: f64 = 0.1;

/// The even pace's interval at `limit` calls per `window`: one call per
/// W/L, plus the [`SKEW`] allowance.
pub fn even_interval(window: Duration, limit: u64) -> Duration {
    window.mul_f64((1.0 + SKEW) / limit.max(1) as f64)
}

/// At most this many sends are remembered for telling a burst (the last
/// window's, as long as they are fewer).
const MAX_SENDS: usize = 4096;

/// After a burst was refused, the even pace starts at this share of its
/// rate and rises to all of it over a window (a ramp): a rate far below
/// the told one is then refused on a pace close to it, after a span
/// longer than the burst's, and the two refusals tell the bucket's rate
/// and burst apart (see `learn/fit.rs` and `learn/fitted.rs`). A bucket
/// at the told rate loses a third of a window's calls to it, once.
pub const RAMP_FROM: f64 = 0.25;

/// What a 429 means, as the learner reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The burst was too big, not the rate: pace evenly and keep the limit.
    Hold,
    /// The rate is lower: lower the limit (the window's own learning).
    Lower,
    /// The bucket fitted to the start and the ramp was refused, and a
    /// fixed window of this many calls fitted them as well: the limit is
    /// that window's, paced as a sliding one (see `learn/fitted.rs`).
    Fixed(u64),
}

/// Where the learner stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Nothing refused after a burst: paced as a window.
    Window,
    /// A burst was refused: pacing evenly since `since` (the end of the
    /// pause), to see whether the rate holds. `at_once` calls had been
    /// accepted before the refusal.
    Probing {
        /// When the even pace started (or the last pause ended).
        since: Instant,
        /// Calls the server had accepted when it refused the burst, less
        /// those a bucket at the limit drained meanwhile.
        at_once: u64,
        /// Calls sent evenly since `since`.
        sent: u64,
        /// Whether the pace rises from [`RAMP_FROM`] of the rate over the
        /// first window (the rate is not known; a stated quota's is).
        ramp: bool,
    },
    /// Paced evenly for good: a bucket, with `burst` calls at once beyond
    /// the even pace after an idle spell.
    Bucket {
        /// The learnt burst (0 when even pacing was refused too).
        burst: u64,
    },
}

/// A limit learnt from a server, as a checkpoint keeps it for the next run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Learnt {
    /// Calls per window.
    pub limit: u64,
    /// What it was learnt to be beyond its count.
    pub shape: LearntShape,
}

/// What a learnt limit is beyond its count, as a checkpoint keeps it
/// beside the count for a resumed run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LearntShape {
    /// The bucket's burst, when the limit was learnt to be a bucket; `None`
    /// for a window (and for a checkpoint older than shape learning).
    pub burst: Option<u64>,
    /// The fixed window a refusal of that bucket switches to (see
    /// [`Verdict::Fixed`]), while it has not been refused.
    pub fixed_too: Option<u64>,
    /// Whether the limit was learnt to be a fixed window's (fitted, or
    /// switched to): paced as a sliding window of it, never probed above.
    pub fixed: bool,
    /// The most a fit of the start's and the ramp's answers allows (a
    /// sliding window's count, a bucket's greatest rate per window), or
    /// one below a limit refused (the window adds that): a resumed run
    /// probes no higher, as the run that learnt it did.
    pub most: Option<u64>,
}

impl From<u64> for Learnt {
    fn from(limit: u64) -> Learnt {
        Learnt {
            limit,
            shape: LearntShape::default(),
        }
    }
}

/// The shape learner of one window.
#[derive(Debug, Clone)]
pub struct ShapeLearner {
    window: Duration,
    phase: Phase,
    /// Send instants within the last window, oldest first.
    sends: VecDeque<Instant>,
    /// The even pace's theoretical arrival time of the next call (GCRA).
    tat: Option<Instant>,
    /// The highest limit an even pace held a whole window at.
    held: u64,
    /// Whether an even pace was refused with nothing counted (a bucket
    /// with no burst): the rate is then searched for by halving.
    searching: bool,
    /// The start, while the shape is unknown; `None` once a window passed,
    /// a 429 or a pause came, or an earlier run's bucket was restored.
    start: Option<Start>,
    /// The calls sent while the shape is unknown, with their answers.
    evidence: fit::Evidence,
    /// An even pace was refused with the limit at `.0`, at `.1`: a bucket
    /// is fitted to the evidence once every call of it is answered.
    pending_fit: Option<(u64, Instant)>,
    /// A fixed window's limit that fitted the answers exactly as well as
    /// the bucket taken, below the bucket's rate: what a refusal of that
    /// bucket switches to (once).
    fixed_too: Option<u64>,
    /// The fitted bucket's burst, set aside (paced with none) while a
    /// fixed window fits as well; given back once two windows held rule
    /// the window out.
    burst_aside: u64,
    /// Whether the limit was learnt to be a fixed window's.
    fixed: bool,
    /// The most the last fit allowed (see [`LearntShape::most`]).
    most: Option<u64>,
    /// The limits of the last two windows in a row an even pace held,
    /// used in full, since the last refusal (0: none): two say what a
    /// whole fixed window let through.
    held_in_a_row: [u64; 2],
    /// After a start with no refusal from a server stating nothing, the
    /// even pace goes on at the told rate itself (no skew) until then, a
    /// window more: the places the start's pace left unused (a tenth of
    /// the limit) then go one by one, not at once, which a bucket with a
    /// burst smaller than that would refuse. A window of the limit loses
    /// nothing: the rate is the same.
    handover: Option<Instant>,
    /// The last answered call's round trip (send to answer).
    round_trip: Option<Duration>,
}

impl ShapeLearner {
    /// A learner for `window` that knows nothing yet.
    pub fn new(window: Duration) -> ShapeLearner {
        ShapeLearner {
            window,
            phase: Phase::Window,
            sends: VecDeque::new(),
            tat: None,
            held: 0,
            searching: false,
            start: Some(Start::default()),
            evidence: fit::Evidence::default(),
            pending_fit: None,
            fixed_too: None,
            burst_aside: 0,
            fixed: false,
            most: None,
            held_in_a_row: [0; 2],
            handover: None,
            round_trip: None,
        }
    }

    /// A learner that starts from what an earlier run learnt: a bucket
    /// (with the fixed window its refusal would switch to), a fixed window,
    /// or a window (a limit learnt by lowering, or by a checkpoint older
    /// than shape learning). Either way its shape is known as far as it was
    /// learnt, so there is no start: a window's first span goes at once.
    pub fn restored(window: Duration, learnt: Option<Learnt>) -> ShapeLearner {
        let mut l = ShapeLearner::new(window);
        let Some(learnt) = learnt.map(|l| l.shape) else {
            return l;
        };
        l.start = None;
        l.most = learnt.most;
        if let Some(burst) = learnt.burst {
            l.phase = Phase::Bucket { burst };
            l.fixed_too = learnt.fixed_too;
        } else {
            l.fixed = learnt.fixed;
        }
        l
    }

    /// What the limit was learnt to be beyond its count (a bucket's burst,
    /// the fixed window its refusal switches to, a fixed window).
    pub fn learnt_shape(&self) -> LearntShape {
        LearntShape {
            burst: self.burst(),
            fixed_too: self.fixed_too,
            fixed: self.fixed,
            most: self.most,
        }
    }

    /// The same learner with no start: for a limit known to be a window
    /// (a plan's), whose first span may go at once.
    pub fn without_start(mut self) -> ShapeLearner {
        self.start = None;
        self
    }

    /// Where the learner stands.
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// The learnt bucket's burst, once even pacing held (or was refused
    /// too); `None` while paced as a window or still probing.
    pub fn burst(&self) -> Option<u64> {
        match self.phase {
            Phase::Bucket { burst } => Some(burst),
            _ => None,
        }
    }

    /// The even pace's interval at `limit` calls per window at `now`, and
    /// the burst allowed beyond it; `None` when paced as a window (after
    /// the handover, if there was one).
    fn pace(&self, limit: u64, now: Instant) -> Option<(Duration, u64)> {
        let (burst, share) = match self.phase {
            Phase::Window => {
                self.handover.filter(|&u| now < u)?;
                let interval = self.window.div_f64(limit.max(1) as f64);
                return Some((interval, 0));
            }
            Phase::Probing {
                since, ramp: true, ..
            } => {
                let done = now.saturating_duration_since(since).as_secs_f64()
                    / self.window.as_secs_f64().max(1e-9);
                (0, RAMP_FROM + (1.0 - RAMP_FROM) * done.min(1.0))
            }
            Phase::Probing { .. } => (0, 1.0),
            Phase::Bucket { burst } => (burst, 1.0),
        };
        let interval = self
            .window
            .mul_f64((1.0 + SKEW) / (limit.max(1) as f64 * share));
        Some((interval, burst))
    }

    /// When the even pace lets the next call go, if later than `now`.
    pub fn ready_at(&self, limit: u64, now: Instant) -> Option<Instant> {
        let (interval, burst) = self.pace(limit, now)?;
        let tat = self.tat?;
        let ahead = interval.saturating_mul(u32::try_from(burst).unwrap_or(u32::MAX));
        let at = tat.checked_sub(ahead).unwrap_or(now);
        (at > now).then_some(at)
    }

    /// During the ramp, while one of its calls is on its way and a round
    /// trip is under two of the told rate's intervals: a time to look again
    /// (an answer wakes the waiter sooner). The ramp then sends one call
    /// at a time. Its refusal comes back before another call goes, where
    /// the ramp's interval is shorter than a round trip, which leaves no
    /// refused call in its wake. One call per round trip still reaches
    /// half the told rate, beyond a secret limit at a third of it. Behind
    /// a longer round trip one at a time would hold the ramp under the rate
    /// it is there to try (docs/performance.md, "One call at a time during
    /// the ramp"), and it goes as before.
    pub fn awaiting_ramp_answer(&self, limit: u64, now: Instant) -> Option<Instant> {
        let Phase::Probing {
            since, ramp: true, ..
        } = self.phase
        else {
            return None;
        };
        let told = self.window.div_f64(limit.max(1) as f64);
        let short = self
            .round_trip
            .is_some_and(|rt| rt <= told.saturating_mul(2));
        (short && now >= since && self.evidence.in_flight_since(since))
            .then(|| now.checked_add(self.window).unwrap_or(now))
    }

    /// A call came back after `round_trip`.
    pub fn round_trip(&mut self, round_trip: Duration) {
        self.round_trip = Some(round_trip);
    }

    /// When a call may go after a response said nothing is left
    /// (`remaining: 0`) while paced evenly: the even pace's next slot with
    /// no burst, as a bucket whose burst is spent allows. `None` when paced
    /// as a window (the handover's even pace too), where it means the
    /// window is full.
    pub fn unbursted_at(&self, limit: u64, now: Instant) -> Option<Instant> {
        if self.phase == Phase::Window {
            return None;
        }
        self.pace(limit, now)?;
        Some(self.tat.map_or(now, |t| t.max(now)))
    }

    /// The server refused call `id` (a rate-limit 429), which is told
    /// before it is [`answered`](Self::answered).
    pub fn refused_call(&mut self, id: u64) {
        self.evidence.answered(id, false);
    }

    /// Call `id` was given back unsent: it is no evidence.
    pub fn unsent(&mut self, id: u64) {
        self.evidence.unsent(id);
        self.answered(id);
    }

    /// The call `id` came back or was given back: a call of the round
    /// closes it until the rest of it is back too.
    pub fn answered(&mut self, id: u64) {
        self.evidence.answered(id, true);
        if let Some(start) = &mut self.start {
            if let Some(i) = start.ahead.iter().position(|&a| a == id) {
                start.ahead.swap_remove(i);
                start.closing = !start.ahead.is_empty();
                start.rounds += usize::from(start.ahead.is_empty());
            } else if let Some(i) = start.on_pace.iter().position(|&(a, _)| a == id) {
                start.on_pace.swap_remove(i);
            }
        }
    }

    /// A call was sent at `now`, paced to `limit`.
    pub fn sent(&mut self, limit: u64, now: Instant) {
        if let Some(start) = &mut self.start {
            // Past the clock's range (never, for a window): no start at all.
            start
                .ends
                .get_or_insert(now.checked_add(self.window).unwrap_or(now));
            start.sent += 1;
            let on_pace = start.tat.map_or(true, |t| t <= now);
            if on_pace {
                let interval = even_interval(self.window, limit);
                start.tat = Some(now.checked_add(interval).unwrap_or(now));
            }
        }
        while self
            .sends
            .front()
            .is_some_and(|&s| now.saturating_duration_since(s) >= self.window)
            || self.sends.len() >= MAX_SENDS
        {
            self.sends.pop_front();
        }
        self.sends.push_back(now);
        if let Phase::Probing { since, sent, .. } = &mut self.phase {
            if now >= *since {
                *sent += 1;
            }
        }
        if let Some((interval, _)) = self.pace(limit, now) {
            let from = self.tat.map_or(now, |t| t.max(now));
            // Past the clock's range (never, for an interval of a window):
            // the window's own rule still holds.
            self.tat = Some(from.checked_add(interval).unwrap_or(from));
        }
    }

    /// Whether the latest sends ran ahead of `limit` per window: some run
    /// of them, up to the newest, holds more intervals than the even pace
    /// fits in its span (the even pace itself never does). Two calls at
    /// once are a burst to a bucket with none; so are calls at exactly the
    /// told rate, which a bucket with none refuses at the least jitter.
    fn burst_before(&self, limit: u64) -> bool {
        let per_second = limit as f64 / self.window.as_secs_f64() / (1.0 + SKEW);
        let Some(&newest) = self.sends.back() else {
            return false;
        };
        self.sends.iter().rev().enumerate().any(|(i, &s)| {
            let span = newest.saturating_duration_since(s).as_secs_f64();
            i as f64 > span * per_second + 1e-9
        })
    }

    /// Whole calls a bucket at `limit` per window drained over the span of
    /// the latest sends: of the calls it accepted before refusing, these
    /// were its rate's, not its burst's (rounded down: a burst learnt too
    /// large costs a 429 after every idle spell, one too small only a
    /// little speed).
    fn drained(&self, limit: u64) -> u64 {
        let (Some(&first), Some(&last)) = (self.sends.front(), self.sends.back()) else {
            return 0;
        };
        let span = last.saturating_duration_since(first).as_secs_f64();
        (span * limit as f64 / self.window.as_secs_f64()).floor() as u64
    }

    /// A rate-limit 429 at `now` that teaches (the window already left out
    /// the ones that cannot): `accepted` calls had been accepted in the
    /// window, paced to `limit`. Says whether the limit is to be lowered.
    /// `secret`: the server states no limit, so an even pace after it
    /// ramps up to tell the rate (see [`RAMP_FROM`]).
    pub fn refused(&mut self, limit: u64, accepted: u64, now: Instant, secret: bool) -> Verdict {
        self.handover = None;
        self.held_in_a_row = [0; 2];
        // The run's first refusal, in its first window: whatever went
        // before it, one refusal tells a bucket's burst from its rate no
        // better than a window's count (see `fit`); the ramp tells them.
        let first = self
            .start
            .take()
            .is_some_and(|s| s.ends.map_or(true, |e| now < e));
        let burst = (first && secret) || self.burst_before(limit);
        // The fitted bucket refused: the fixed window that fitted as well
        // is the server's (a start and a ramp across one reset fit a bucket
        // a little faster than the window, with a burst).
        if let (Phase::Bucket { .. }, true) = (self.phase, secret) {
            if let Some(fixed) = self.fixed_too.take() {
                self.burst_aside = 0;
                self.phase = Phase::Window;
                self.fixed = true;
                return Verdict::Fixed(fixed);
            }
        }
        match self.phase {
            // One call accepted says nothing of the rate either: a bucket
            // with no burst refuses a second call just faster than it.
            Phase::Window if burst || accepted <= 1 => {
                self.phase = Phase::Probing {
                    since: now,
                    at_once: accepted.saturating_sub(self.drained(limit)),
                    sent: 0,
                    ramp: secret,
                };
                self.tat = None;
                Verdict::Hold
            }
            // A bucket an earlier run learnt may have had its burst
            // overestimated: keep the rate, drop the burst.
            Phase::Bucket { burst: b } if b > 0 && burst => {
                self.phase = Phase::Bucket { burst: 0 };
                Verdict::Hold
            }
            Phase::Probing { ramp, .. } => {
                self.phase = Phase::Bucket { burst: 0 };
                if ramp {
                    self.pending_fit = Some((limit, now));
                } else {
                    self.evidence.clear();
                }
                Verdict::Lower
            }
            _ => Verdict::Lower,
        }
    }

    /// A whole window passed at `limit` without a 429 (the window's own
    /// learning clock says so).
    pub fn held(&mut self, limit: u64) {
        if self.phase == Phase::Window {
            return;
        }
        self.held = self.held.max(limit);
        self.held_in_a_row = [self.held_in_a_row[1], limit];
        // Two windows of the even pace held hold a whole window of the
        // server's, with at least the slower one's count less two (one at
        // each end, where a send's arrival may fall either side of the
        // reset): a fixed window below that would have refused it, so it
        // is not the server's.
        let slower = self.held_in_a_row[0].min(limit);
        let count = (slower as f64 / (1.0 + SKEW)).floor() as u64;
        if slower > 0 {
            self.fixed_too = self.fixed_too.filter(|&f| count <= f.saturating_add(2));
        }
        if self.fixed_too.is_none() && self.burst_aside > 0 {
            if self.phase == (Phase::Bucket { burst: 0 }) {
                self.phase = Phase::Bucket {
                    burst: self.burst_aside,
                };
            }
            self.burst_aside = 0;
        }
    }

    /// A whole window passed without using the limit in full, or a 429
    /// came: the even pace's run of windows held is broken.
    pub fn idle(&mut self) {
        self.held_in_a_row = [0; 2];
    }

    /// A refusal lowers `limit`, with `accepted` calls accepted in the
    /// window: the lowest it may go. A pace that held says the rate is at
    /// least that. Paced evenly, the count is a window's size, or a
    /// bucket's burst and what it drained meanwhile (the two cannot be told
    /// apart from one refusal). But a bucket with no burst refuses the
    /// second call of a pace too fast, so one accepted call says only that
    /// the rate is lower: the limit is halved, and probing searches
    /// between it and the refused one. (A bucket fitted to every answer
    /// replaces either once the answers are in: [`take_fit`](Self::take_fit).)
    pub fn lowering(&mut self, limit: u64, accepted: u64) -> u64 {
        match self.phase {
            Phase::Bucket { .. } if accepted <= 1 => {
                self.searching = true;
                self.held.max(limit / 2)
            }
            // A count to go by: a pace that held below the burst's drain
            // says nothing of the rate, so it is forgotten.
            Phase::Bucket { .. } => {
                self.held = 0;
                0
            }
            _ => 0,
        }
    }

    /// Whether the rate is being searched for by halving.
    pub fn searching(&self) -> bool {
        self.searching
    }

    /// How far a clean window raises a `learnt` limit below `ceiling` (the
    /// last refused one, less one). Searching, halfway: a refusal there
    /// falls back to the highest pace that held, so the search costs a 429
    /// per halving at most, where one call per window would take as many
    /// windows as the limit is wide. Otherwise one call, the window's slow
    /// probe. Paced evenly, not at all once the gap is within the even
    /// pace's [`SKEW`]: a 429 and a pause would cost more than it can win.
    pub fn step(&self, learnt: u64, ceiling: u64) -> u64 {
        let gap = ceiling.saturating_sub(learnt);
        let even = self.phase != Phase::Window;
        match self.searching {
            _ if even && gap as f64 <= learnt as f64 * SKEW => 0,
            true => (gap / 2).max(1),
            false => 1,
        }
    }

    /// A pause until `until`: the even pace is judged from its end.
    pub fn paused_until(&mut self, until: Instant) {
        self.handover = None;
        self.start = None;
        if let Phase::Probing { since, sent, .. } = &mut self.phase {
            if until > *since {
                *since = until;
                *sent = 0;
            }
        }
    }

    /// Runs the learner's clock: once even pacing held a whole window with
    /// at least two calls and no 429, the limit is a bucket. Returns its
    /// burst then (once).
    pub fn advance(&mut self, now: Instant) -> Option<u64> {
        if let Some(start) = self.start.take_if(|s| s.ends.is_some_and(|e| now >= e)) {
            // A first window with no refusal: nothing to fit.
            if self.phase == Phase::Window {
                self.evidence.clear();
                if !start.stated {
                    self.handover = start.ends.and_then(|e| e.checked_add(self.window));
                    self.tat = start.tat;
                }
            }
        }
        let Phase::Probing {
            since,
            at_once,
            sent,
            ramp,
        } = self.phase
        else {
            return None;
        };
        // A ramp reaches the rate a window after it began: the rate holds
        // once a whole window at it did.
        let span = self.window.saturating_mul(if ramp { 2 } else { 1 });
        if sent < 2 || now.saturating_duration_since(since) < span {
            return None;
        }
        let burst = at_once.saturating_sub(1);
        self.phase = Phase::Bucket { burst };
        self.evidence.clear();
        Some(burst)
    }
}

#[cfg(test)]
mod tests;
