//! The start: the first window of a rate whose shape is not known, sent
//! on the even pace with small rounds ahead of it (see [`START_AHEAD`]),
//! and what a stated quota read during it says of the shape
//! ([`ShapeLearner::spent_early`]).

use std::time::{Duration, Instant};

use super::{even_interval, Phase, ShapeLearner};

/// While the shape is unknown (the first window of a bare rate), calls go
/// *ahead* of the even pace in rounds of at most this many, a round only
/// once the last one's have all come back. The first round is one call:
/// a bucket with no burst refuses it (two calls at once), which tells it
/// from the first response. Further rounds (of two) go only once the
/// server stated what is left of a quota: its `remaining` says a bucket's
/// burst was spent before a refusal would ([`ShapeLearner::spent_early`]),
/// and a window of the quota is filled within a few round trips. A server
/// that states nothing gets the even pace alone after the first round, as
/// the fleet's start does: rounds ahead of it add up, against a fast
/// server, to more than a small burst allows (real nginx at 30 r/s with
/// `burst=5`, told `--limit 30/1s`: 2 429s and 1.28x with rounds, none
/// and 1.04x without), and a window of the told rate loses no more than
/// its first span's calls at once (1.11x to 1.29x for 150 items on the
/// sim). Rounds of two, not three: a round of three arriving at a full
/// window cost a secret sliding window a fourth 429 (2 of 8 sims of a
/// secret `30/1s` told `90/1s`; 0 of 13 with rounds of two). Calls on the
/// even pace go freely, so a slow API with many calls in flight is not
/// held back.
pub const START_AHEAD: usize = 2;

/// The longest window whose start is paced evenly. A bucket keeps a rate
/// per second or per minute (nginx `r/s` and `r/m`, SpikeArrest `ps` and
/// `pm`); a longer window is a quota, which an even start would spread over
/// all of it: `--limit 10/1h` sent a call every 6.6 minutes, where the
/// window lets all ten go at once.
pub const START_WITHIN: Duration = Duration::from_secs(60);

/// The longest window whose stated quota, used up early, is read as a
/// bucket's burst spent (see [`ShapeLearner::spent_early`]).
const SPENT_EARLY_WITHIN: Duration = Duration::from_secs(60);

/// The first window of a shape not yet known: the even pace, with rounds
/// of [`START_AHEAD`] calls ahead of it.
#[derive(Debug, Clone, Default)]
pub(super) struct Start {
    /// When the start ends: a window after its first send.
    pub(super) ends: Option<Instant>,
    /// The even pace's next slot.
    pub(super) tat: Option<Instant>,
    /// The current round's calls still in flight, by the caller's ids.
    pub(super) ahead: Vec<u64>,
    /// The start's calls on the even pace still in flight, with when they
    /// went: a new round opens only once none sent before it is, as one of
    /// them refused would say the round before used up the burst.
    pub(super) on_pace: Vec<(u64, Instant)>,
    /// Whether a call of the current round came back: the round is closed
    /// to new calls until the rest of it has too.
    pub(super) closing: bool,
    /// Rounds whose calls have all come back: the first takes one call,
    /// the rest [`START_AHEAD`] once `stated`, else none.
    pub(super) rounds: usize,
    /// Whether a response stated what is left of a quota (see
    /// [`ShapeLearner::spent_early`]): rounds after the first go ahead of
    /// the even pace only then.
    pub(super) stated: bool,
    /// Calls sent in the start: all of them, where the learner's `sends`
    /// keep at most [`MAX_SENDS`](super::MAX_SENDS) (a stated quota above it is no bucket's
    /// sign for having more left than those explain).
    pub(super) sent: u64,
}

impl Start {
    /// How many calls the current round takes.
    pub(super) fn round_size(&self) -> usize {
        match (self.rounds, self.stated) {
            (0, _) => 1,
            (_, true) => START_AHEAD,
            (_, false) => 0,
        }
    }
}

impl ShapeLearner {
    /// Whether a call may go at `now` during the start: `Ok(true)` as one
    /// more of the round ahead of the even pace, `Ok(false)` on the pace
    /// (or after the start), `Err(at)` when only the pace's next slot at
    /// `at` (or the round's last answer) lets it go. A call that goes is
    /// then told with [`sent_in_start`](Self::sent_in_start).
    pub fn start_gate(&self, now: Instant) -> Result<bool, Instant> {
        let Some(start) = &self.start else {
            return Ok(false);
        };
        let on_pace = start.tat.unwrap_or(now);
        // A round opens with nothing of the start sent before it in flight,
        // and takes calls until it has its size or one of them came back.
        let opens = !start.ahead.is_empty() || start.on_pace.iter().all(|&(_, t)| t >= now);
        if on_pace <= now {
            Ok(false)
        } else if opens && !start.closing && start.ahead.len() < start.round_size() {
            Ok(true)
        } else {
            Err(on_pace)
        }
    }

    /// The call `id` (the caller's) went at `now`: told of every call.
    /// During the start, `ahead` of the even pace (a round's) or on it;
    /// during the start and the ramp, kept as evidence for a fit.
    pub fn sent_in_start(&mut self, id: u64, ahead: bool, now: Instant) {
        // Evidence for a fit: the start's calls and the ramp's.
        let ramp = matches!(self.phase, Phase::Probing { ramp: true, .. });
        if self.start.is_some() || ramp {
            self.evidence.sent(id, now);
        }
        if let Some(start) = &mut self.start {
            match ahead {
                true => start.ahead.push(id),
                false => start.on_pace.push((id, now)),
            }
        }
    }

    /// A server stating a quota of `limit` said `remaining` is left of it
    /// at `now`, during the start, less than the calls this client sent in
    /// it leave of it (nothing left after fewer calls than the quota, say),
    /// `accepted` of them answered and `in_flight` on their way: a bucket whose burst is
    /// smaller than the quota (or another client on the key). It paces
    /// evenly from now, as after a 429 after a burst, without waiting for
    /// one: a window of the stated quota would let the rest of it go at
    /// once, into the bucket's refusals. Returns whether it began to.
    ///
    /// A window of the quota that counts only this client's calls never
    /// says less: in the run's first window, it has counted at most the
    /// calls sent so far. Only during the start: later, the count a
    /// response carries is as old as its latency, and may still hold
    /// calls whose place in this client's window has ended. And only for
    /// a window of a minute at most: a longer quota used up (by an earlier
    /// run, say) is a quota to wait for, not a bucket's rate to pace
    /// evenly to.
    ///
    /// The even pace's first slot leaves a unit for each of the
    /// `in_flight` calls still on their way, which the bucket may grant,
    /// beyond what is left.
    pub fn spent_early(
        &mut self,
        limit: u64,
        remaining: u64,
        (accepted, in_flight): (u64, u64),
        now: Instant,
    ) -> bool {
        let Some(start) = self
            .start
            .as_mut()
            .filter(|s| s.ends.map_or(true, |e| now < e))
        else {
            return false;
        };
        start.stated = true;
        let short = self.window <= SPENT_EARLY_WITHIN;
        let explained = start.sent.saturating_add(remaining) >= limit;
        if self.phase != Phase::Window || !short || explained {
            return false;
        }
        self.start = None;
        self.phase = Phase::Probing {
            since: now,
            at_once: accepted
                .saturating_add(remaining)
                .saturating_sub(in_flight.saturating_add(self.drained(limit))),
            sent: 0,
            ramp: false,
        };
        let interval = even_interval(self.window, limit);
        let units = in_flight.saturating_add(1).saturating_sub(remaining);
        let units = u32::try_from(units).unwrap_or(u32::MAX);
        self.tat = now.checked_add(interval.saturating_mul(units));
        true
    }
}
