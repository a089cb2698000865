//! Which buckets could have answered as the server did: the rates and
//! bursts of every GCRA (nginx `limit_req`, SpikeArrest) that accepts each
//! call the server accepted and refuses each one it refused, replayed on
//! the calls' send instants.
//!
//! One refusal says only that the burst and what the rate drained add up
//! to what was accepted: b + 1 + r·t = n, one equation for two unknowns.
//! Two refusals after spans of different length tell both. Every call
//! answered adds a constraint, so the run's whole log is replayed: for a
//! rate r the server's theoretical arrival time (TAT) moves only with the
//! calls it accepted, whatever the burst, so each accepted call at t asks
//! τ ≥ TAT − t and each refused one τ < TAT − t (τ = b·T, T = 1/r). An
//! accepted call may have arrived up to `slack` early (the spread between
//! a send and its arrival); a refused one is taken as it stands. Both err
//! toward a slower, smaller bucket: one that refuses more.
//!
//! The answer is the least rate and the least burst of the buckets that
//! fit: a bucket that strict refuses nothing the server's bucket accepts,
//! whichever of those it is (evidence allows no more).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// At most this many calls are kept: the learning is over long before.
const MAX_CALLS: usize = 4096;

/// Rates tried between the floor and the ceiling, each this much above
/// the one before: a rate learnt is within 0.2% of the least that fits
/// (over a busy span of n calls the replay drifts n steps of that).
const STEP: f64 = 1.002;

/// The largest burst considered: beyond it a "bucket" is a window.
const MAX_BURST: u64 = 10_000;

/// A bucket that fits the calls: `per_second` and `burst` (units beyond
/// the one the rate allows now).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fit {
    /// The least rate that fits, in calls a second.
    pub per_second: f64,
    /// The least burst that fits at any rate that fits.
    pub burst: u64,
    /// The greatest rate that fits: probing above it is refused.
    pub most: f64,
}

/// The calls sent while a limit's shape is unknown, in send order, with
/// the server's answers as they come: the caller's id, the send instant,
/// and whether it was accepted (`None` while in flight).
#[derive(Debug, Clone, Default)]
pub struct Evidence {
    calls: VecDeque<(u64, Instant, Option<bool>)>,
}

impl Evidence {
    /// Call `id` went at `now` (ignored once full: the replay starts from
    /// the first call, so the oldest are never dropped). Ids grow.
    pub fn sent(&mut self, id: u64, now: Instant) {
        let after = self.calls.back().map_or(true, |c| c.0 < id);
        if self.calls.len() < MAX_CALLS && after {
            self.calls.push_back((id, now, None));
        }
    }

    /// Where call `id` is kept (ids grow with each send).
    fn find(&self, id: u64) -> Option<usize> {
        self.calls.binary_search_by_key(&id, |c| c.0).ok()
    }

    /// Call `id` was answered: `accepted`, unless a refusal was said first.
    pub fn answered(&mut self, id: u64, accepted: bool) {
        if let Some(i) = self.find(id) {
            self.calls[i].2.get_or_insert(accepted);
        }
    }

    /// Call `id` was never sent.
    pub fn unsent(&mut self, id: u64) {
        if let Some(i) = self.find(id) {
            self.calls.remove(i);
        }
    }

    /// Whether a call sent at or after `since` is still unanswered.
    pub fn in_flight_since(&self, since: Instant) -> bool {
        self.calls
            .iter()
            .rev()
            .take_while(|c| c.1 >= since)
            .any(|c| c.2.is_none())
    }

    /// Whether every call kept has been answered.
    pub fn answered_all(&self) -> bool {
        self.calls.iter().all(|c| c.2.is_some())
    }

    /// Forgets everything (the shape is known).
    pub fn clear(&mut self) {
        self.calls = VecDeque::new();
    }

    /// The calls answered so far: send instant, accepted.
    pub fn answers(&self) -> Vec<(Instant, bool)> {
        self.calls
            .iter()
            .filter_map(|&(_, at, ok)| ok.map(|ok| (at, ok)))
            .collect()
    }

    /// [`fit`] to the calls answered so far. Calls sent within `slack` of
    /// each other may have reached the server in either order, and a
    /// bucket accepts before it refuses: an accepted call is replayed
    /// before a refused one sent up to twice `slack` before it (a round's
    /// calls go at one instant, and the server saw them in any order).
    pub fn fit(&self, floor: f64, ceiling: f64, slack: Duration) -> Option<Fit> {
        let mut answered = self.answers();
        let order = |&(at, ok): &(Instant, bool)| match ok {
            true => (at.checked_sub(slack).unwrap_or(at), false),
            false => (at + slack, true),
        };
        answered.sort_by_key(order);
        fit(&answered, floor, ceiling, slack)
    }
}

/// The least rate and burst of the buckets between `floor` and `ceiling`
/// calls a second that answer `calls` (send instant, accepted) as the
/// server did, sent in that order; `None` when none does (the server keeps
/// something else: a window, or a limit shared with other clients).
pub fn fit(calls: &[(Instant, bool)], floor: f64, ceiling: f64, slack: Duration) -> Option<Fit> {
    // (Written so that a NaN bound is no range either.)
    let range = floor > 0.0 && ceiling >= floor;
    if !range || calls.iter().all(|&(_, ok)| ok) {
        return None;
    }
    let mut best: Option<Fit> = None;
    let mut r = floor;
    while r <= ceiling * (1.0 + 1e-9) {
        if let Some(b) = bursts(calls, r, slack) {
            let f = best.get_or_insert(Fit {
                per_second: r,
                burst: b,
                most: r,
            });
            f.burst = f.burst.min(b);
            f.most = r;
        }
        r *= STEP;
    }
    best
}

/// The least burst with which a bucket of `per_second` answers `calls` as
/// the server did, if any burst does.
fn bursts(calls: &[(Instant, bool)], per_second: f64, slack: Duration) -> Option<u64> {
    let t = 1.0 / per_second;
    let slack = slack.as_secs_f64();
    // The earliest send: replayed first or not (see `Evidence::fit`).
    let origin = calls.iter().map(|c| c.0).min()?;
    let mut tat: Option<f64> = None;
    // τ at least `need` (every accepted call conformed), less than `room`
    // (every refused one did not).
    let (mut need, mut room) = (0.0f64, f64::INFINITY);
    for &(sent, accepted) in calls {
        let at = sent.saturating_duration_since(origin).as_secs_f64();
        let ahead = tat.map_or(f64::NEG_INFINITY, |tat| tat - at);
        if accepted {
            need = need.max(ahead - slack);
            tat = Some(tat.map_or(at, |tat: f64| tat.max(at)) + t);
        } else {
            room = room.min(ahead);
        }
    }
    // The least whole burst b with b·T ≥ need, if b·T < room.
    let b = (need / t - 1e-9).ceil().max(0.0);
    (b * t < room && b <= MAX_BURST as f64).then_some(b as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// What a bucket of `rate` a second with `burst` answers to calls sent
    /// at `sends` (ms from t0).
    fn answered(rate: f64, burst: u64, t0: Instant, sends: &[u64]) -> Vec<(Instant, bool)> {
        let t = 1.0 / rate;
        let mut tat: Option<f64> = None;
        sends
            .iter()
            .map(|&s| {
                let at = s as f64 / 1000.0;
                let ok = tat.map_or(true, |tat| at >= tat - burst as f64 * t - 1e-9);
                if ok {
                    tat = Some(tat.map_or(at, |tat: f64| tat.max(at)) + t);
                }
                (t0 + ms(s), ok)
            })
            .collect()
    }

    /// A burst at three times the rate, a pause of a second, then a
    /// slower burst: both refused, after spans of different length.
    fn two_refusals() -> Vec<u64> {
        let fast = (0..12).map(|i| i * 11);
        let slow = (0..40).map(|i| 1200 + i * 22);
        fast.chain(slow).collect()
    }

    #[test]
    fn two_refusals_at_different_paces_tell_the_rate_and_the_burst() {
        let t0 = Instant::now();
        let calls = answered(30.0, 5, t0, &two_refusals());
        assert!(calls.iter().filter(|c| !c.1).count() >= 2);
        let f = fit(&calls, 1.0, 90.0, ms(1)).unwrap();
        assert!(
            (26.0..=30.0 * STEP).contains(&f.per_second),
            "{f:?}: the least rate that fits, within a step of 30"
        );
        assert!(f.burst <= 5, "{f:?}");
    }

    #[test]
    fn one_refusal_leaves_the_rate_open_and_the_answer_low() {
        let t0 = Instant::now();
        let sends: Vec<u64> = (0..12).map(|i| i * 11).collect();
        let calls = answered(30.0, 5, t0, &sends);
        let f = fit(&calls, 1.0, 90.0, ms(1)).unwrap();
        assert!(f.per_second < 10.0, "{f:?}: a burst alone fits as well");
    }

    #[test]
    fn a_bucket_with_no_burst_is_told_by_its_spacing() {
        let t0 = Instant::now();
        // Three at once (two refused), a pause, then calls closer and
        // closer: 60 ms apart down to 20.
        let mut sends = vec![0u64, 0, 0, 1000];
        for i in 0..30 {
            sends.push(sends[i + 3] + 60 - (i as u64 * 40 / 30));
        }
        let calls = answered(30.0, 0, t0, &sends);
        let f = fit(&calls, 1.0, 90.0, ms(1)).unwrap();
        assert!((27.0..=30.0 * STEP).contains(&f.per_second), "{f:?}");
        assert_eq!(f.burst, 0);
    }

    #[test]
    fn a_rounds_calls_may_have_reached_the_server_in_any_order() {
        // A round of four at one instant (microseconds apart): the server
        // took three and refused the one sent second, which reached it
        // last. A bucket with a burst of 2.
        let t0 = Instant::now();
        let us = |n| t0 + Duration::from_micros(n);
        let round = [(0, 0, true), (1, 10, false), (2, 20, true), (3, 30, true)];
        let mut e = Evidence::default();
        for (id, at, _) in round {
            e.sent(id, us(at));
        }
        for (id, _, ok) in round {
            e.answered(id, ok);
        }
        assert!(e.answered_all());
        assert_eq!(e.fit(1.0, 90.0, ms(2)).map(|f| f.burst), Some(2));
        // Taken in the order sent, no bucket refuses the second and then
        // takes the third and fourth.
        let as_sent: Vec<_> = round.iter().map(|&(_, at, ok)| (us(at), ok)).collect();
        assert_eq!(fit(&as_sent, 1.0, 90.0, ms(2)), None);
    }

    #[test]
    fn nothing_refused_or_nothing_that_fits_is_no_bucket() {
        let t0 = Instant::now();
        let all_ok: Vec<_> = (0..5).map(|i| (t0 + ms(i), true)).collect();
        assert_eq!(fit(&all_ok, 1.0, 90.0, ms(1)), None);
        // A bucket accepts the first call it sees.
        let odd = [(t0, false), (t0 + ms(500), true)];
        assert_eq!(fit(&odd, 1.0, 90.0, Duration::ZERO), None);
    }

    #[test]
    fn the_least_that_fits_is_never_above_the_servers_bucket() {
        // Random paces against random buckets: the answer, when there is
        // one, paced with the even pace's allowance, is no faster than the
        // server's own bucket, and its burst at most one larger (the rates
        // tried may miss the server's by a step; the learner takes one off).
        let mut rng = fastrand::Rng::with_seed(7);
        let mut worst = 0.0f64;
        for _ in 0..1000 {
            let rate = 5.0 + rng.f64() * 80.0;
            let burst = rng.u64(0..8);
            let t0 = Instant::now();
            let mut sends = Vec::new();
            let mut at = 0u64;
            for _ in 0..rng.usize(5..80) {
                at += rng.u64(0..60);
                sends.push(at);
            }
            let calls = answered(rate, burst, t0, &sends);
            if let Some(f) = fit(&calls, 1.0, 100.0, ms(1)) {
                worst = worst.max(f.per_second / rate);
                assert!(f.burst <= burst + 1, "{f:?} against {rate}/{burst}");
            }
        }
        assert!(worst <= 1.0 + super::super::SKEW, "{worst}");
    }
}
