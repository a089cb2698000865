//! A weighted occupancy ledger: the bookkeeping the token windows and the
//! fixed window share. Each call *occupies* its weight from its send until
//! an instant its policy names when the response comes back; a call may
//! start only when the weight occupying now, plus its own, stays within
//! the quota.
//!
//! The sliding rule is the one of [`crate::rate::exact`] with weights: an
//! answered call occupies until W after its response, so no span W of
//! arrivals holds more than the quota (the same argument, summing weights
//! instead of counting calls). A call heavier than the whole quota could
//! never fit: it goes alone, when nothing else occupies, which is the best
//! any client can do for it.
//!
//! Pure: every method takes the instant it acts at.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::exact::later;

/// A weighted ledger of `quota` units.
#[derive(Debug, Clone)]
pub struct Tally {
    quota: u64,
    /// Weights in flight, by id: their send instants and weights.
    in_flight: HashMap<u64, (Instant, u64)>,
    /// Answered calls still occupying: (until, weight), sorted by until.
    done: Vec<(Instant, u64)>,
    next: u64,
    held_until: Option<Instant>,
}

impl Tally {
    /// An empty ledger of `quota` units (0 is taken as 1).
    pub fn new(quota: u64) -> Tally {
        Tally {
            quota: quota.max(1),
            in_flight: HashMap::new(),
            done: Vec::new(),
            next: 0,
            held_until: None,
        }
    }

    /// The quota.
    pub fn quota(&self) -> u64 {
        self.quota
    }

    /// Lowers (never raises) the quota to `q`; returns whether it fell.
    pub fn lower_to(&mut self, q: u64) -> bool {
        let q = q.max(1);
        let lower = q < self.quota;
        self.quota = self.quota.min(q);
        lower
    }

    /// Units occupying at `now`.
    pub fn used(&mut self, now: Instant) -> u64 {
        self.forget(now);
        // Saturating: a server may report any usage, up to u64::MAX.
        let in_flight = self.in_flight.values().map(|&(_, w)| w);
        let done = self.done.iter().map(|&(_, w)| w);
        in_flight.chain(done).fold(0, u64::saturating_add)
    }

    /// The answered calls still occupying: (until, weight), by until.
    pub fn answered(&self) -> &[(Instant, u64)] {
        &self.done
    }

    /// Claims `weight` units at `now`, or says when to look again (a
    /// completion may make room sooner: waiters also wake on those).
    /// `fallback` is how long to wait when only calls in flight occupy.
    pub fn try_take(
        &mut self,
        now: Instant,
        weight: u64,
        fallback: Duration,
    ) -> Result<u64, Instant> {
        if let Some(h) = self.held_until.filter(|&h| h > now) {
            return Err(h);
        }
        let used = self.used(now);
        if used > 0 && used.saturating_add(weight) > self.quota {
            let mut free = used.saturating_add(weight) - self.quota;
            for &(until, w) in &self.done {
                if w >= free {
                    return Err(until);
                }
                free -= w;
            }
            // Only calls in flight are in the way: none ends by time alone.
            return Err(later(now, fallback));
        }
        Ok(self.admit_in_flight(now, weight))
    }

    /// Counts `weight` units sent at `sent`, whatever the occupancy.
    pub fn admit_in_flight(&mut self, sent: Instant, weight: u64) -> u64 {
        let id = self.next;
        self.next += 1;
        self.in_flight.insert(id, (sent, weight));
        id
    }

    /// Counts `weight` units already answered, occupying until `until`.
    pub fn admit_answered(&mut self, until: Instant, weight: u64) {
        let at = self.done.partition_point(|&(u, _)| u <= until);
        self.done.insert(at, (until, weight));
    }

    /// The send instant of call `id`, if it is in flight.
    pub fn sent(&self, id: u64) -> Option<Instant> {
        self.in_flight.get(&id).map(|&(s, _)| s)
    }

    /// Call `id` was answered: it occupies `used` units (its weight when
    /// `None`) until `until`.
    pub fn complete(&mut self, id: u64, until: Instant, used: Option<u64>) {
        if let Some((_, w)) = self.in_flight.remove(&id) {
            self.admit_answered(until, used.unwrap_or(w));
        }
    }

    /// Call `id` was never sent: its units are free at once.
    pub fn cancel(&mut self, id: u64) -> bool {
        self.in_flight.remove(&id).is_some()
    }

    /// No call starts before `until` (the server said the quota is used up).
    pub fn hold_until(&mut self, until: Instant) {
        self.held_until = Some(self.held_until.map_or(until, |h| h.max(until)));
    }

    /// When a hold in force at `now` ends.
    pub fn held_until(&self, now: Instant) -> Option<Instant> {
        self.held_until.filter(|&h| h > now)
    }

    /// Moves the end of every answered call's occupancy by `f`: for a
    /// policy whose rule for when an occupancy ends changes.
    pub fn remap_done(&mut self, f: impl Fn(Instant) -> Instant) {
        for (u, _) in &mut self.done {
            *u = f(*u);
        }
        self.done.sort_by_key(|&(u, _)| u);
    }

    fn forget(&mut self, now: Instant) {
        let ended = self.done.partition_point(|&(u, _)| u <= now);
        self.done.drain(..ended);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn weights_add_up_to_the_quota_and_free_in_order() {
        let t0 = Instant::now();
        let mut t = Tally::new(10);
        let a = t.try_take(t0, 4, ms(1000)).unwrap();
        let b = t.try_take(t0, 6, ms(1000)).unwrap();
        assert_eq!(
            t.try_take(t0, 1, ms(1000)),
            Err(t0 + ms(1000)),
            "in flight only"
        );
        t.complete(a, t0 + ms(500), None);
        t.complete(b, t0 + ms(700), Some(2));
        assert_eq!(t.used(t0), 6);
        assert_eq!(t.try_take(t0, 5, ms(1000)), Err(t0 + ms(500)));
        assert!(t.try_take(t0, 4, ms(1000)).is_ok());
    }

    #[test]
    fn a_call_heavier_than_the_quota_goes_alone() {
        let t0 = Instant::now();
        let mut t = Tally::new(10);
        let a = t.try_take(t0, 50, ms(1000)).unwrap();
        assert!(t.try_take(t0, 1, ms(1000)).is_err());
        t.complete(a, t0 + ms(10), None);
        assert_eq!(t.try_take(t0, 1, ms(1000)), Err(t0 + ms(10)));
        assert!(t.try_take(t0 + ms(10), 1, ms(1000)).is_ok());
    }

    #[test]
    fn usage_reported_near_u64_max_holds_calls_as_any_usage_over_the_quota_does() {
        let t0 = Instant::now();
        let mut t = Tally::new(200);
        let (a, b) = (t.admit_in_flight(t0, 10), t.admit_in_flight(t0, 10));
        // Two answers of 2^63 each: summed unchecked they wrap to nothing.
        t.complete(a, t0 + ms(1000), Some(1 << 63));
        t.complete(b, t0 + ms(1000), Some(1 << 63));
        assert_eq!(t.used(t0), u64::MAX);
        assert!(t.try_take(t0, 10, ms(1000)).is_err());
        assert!(t.try_take(t0 + ms(1000), 10, ms(1000)).is_ok());
    }
}
