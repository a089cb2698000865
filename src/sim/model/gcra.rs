//! The bucket (GCRA) exactly as nginx's `limit_req` keeps it with
//! `burst=B nodelay`: a rate of N per W and room for B requests beyond the
//! one the rate allows now.
//!
//! nginx keeps one number per key, the *excess*, and on each request does
//! `excess = max(0, excess - rate·elapsed + 1)`; the request is refused
//! (503 by default, 429 with `limit_req_status 429`) when that is over B,
//! and a refused request changes nothing. A key never seen starts at 0.
//! So seven requests at once with `burst=5` pass six and refuse the
//! seventh, and with no burst a second request within 1/rate is refused.
//!
//! Here the state is the *level* `excess + 1` (zero for an idle key), in
//! exact integer units as in `spike_arrest` (one request = the period in
//! nanoseconds, and each elapsed nanosecond drains N units), so a request
//! weighing `n` units (tokens) raises it by `n`: `level = max(0, level -
//! drained) + n`, refused when over `B + 1`. For `n = 1` that is nginx's
//! formula.

use std::time::{Duration, Instant};

use super::sliding_window::RetryIn;
use crate::rate::Rate;

/// One key's bucket.
#[derive(Debug, Clone)]
pub struct Gcra {
    rate: Rate,
    burst: u64,
    /// Units in one request: the period in nanoseconds.
    unit: u128,
    /// Units drained per elapsed nanosecond: the rate's count.
    per_nano: u128,
    /// The level in units as of `last`.
    level: u128,
    last: Instant,
}

impl Gcra {
    /// A bucket of `rate` with room for `burst` beyond one, idle at `now`.
    pub fn new(rate: Rate, burst: u64, now: Instant) -> Self {
        Gcra {
            rate,
            burst,
            unit: rate.period.as_nanos().max(1),
            per_nano: u128::from(rate.count.max(1)),
            level: 0,
            last: now,
        }
    }

    /// The rate it drains at.
    pub fn rate(&self) -> Rate {
        self.rate
    }

    /// The burst: requests beyond the one the rate allows now.
    pub fn burst(&self) -> u64 {
        self.burst
    }

    fn cap(&self) -> u128 {
        u128::from(self.burst.saturating_add(1)) * self.unit
    }

    fn level_at(&self, now: Instant) -> u128 {
        let elapsed = now.saturating_duration_since(self.last).as_nanos();
        self.level
            .saturating_sub(elapsed.saturating_mul(self.per_nano))
    }

    /// nginx's excess at `now`, in requests (fractions included): how far
    /// the key is beyond the rate, at most the burst.
    pub fn excess(&self, now: Instant) -> f64 {
        let level = self.level_at(now);
        level.saturating_sub(self.unit) as f64 / self.unit as f64
    }

    /// Whole requests of `units` each that would pass at `now`, one after
    /// the other.
    pub fn remaining(&self, now: Instant, units: u64) -> u64 {
        let room = self.cap().saturating_sub(self.level_at(now));
        let per = (u128::from(units.max(1)) * self.unit).max(1);
        u64::try_from(room / per).unwrap_or(u64::MAX)
    }

    /// Whether a request of `units` passes at `now`, without taking it:
    /// `Ok(whole single requests left after it)` or the wait until it would
    /// (`MAX` when it weighs more than the bucket holds: it never passes).
    pub fn check(&self, now: Instant, units: u64) -> Result<u64, RetryIn> {
        let need = u128::from(units) * self.unit;
        let cap = self.cap();
        if need > cap {
            return Err(RetryIn(Duration::MAX));
        }
        let level = self.level_at(now);
        let after = level + need;
        if after <= cap {
            let left = (cap - after) / self.unit;
            return Ok(u64::try_from(left).unwrap_or(u64::MAX));
        }
        let wait = (after - cap).div_ceil(self.per_nano);
        Err(RetryIn(Duration::from_nanos(
            u64::try_from(wait).unwrap_or(u64::MAX),
        )))
    }

    /// How long until the bucket is back to idle at `now`, every unit in it
    /// drained: what OpenAI and Anthropic state as a token limit's reset.
    pub fn until_idle(&self, now: Instant) -> Duration {
        let ns = self.level_at(now).div_ceil(self.per_nano);
        Duration::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX))
    }

    /// Takes a request of `units` at `now` without checking; returns the
    /// excess after it, in requests.
    pub fn record(&mut self, now: Instant, units: u64) -> f64 {
        let level = self.level_at(now);
        if now > self.last {
            self.last = now;
        }
        self.level = level.saturating_add(u128::from(units) * self.unit);
        self.excess(now)
    }

    /// Passes a request of `units` at `now` if it fits, taking it. A
    /// refused request changes nothing.
    pub fn try_acquire(&mut self, now: Instant, units: u64) -> Result<u64, RetryIn> {
        let left = self.check(now, units)?;
        self.record(now, units);
        Ok(left)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn per_sec(n: u64) -> Rate {
        Rate {
            count: n,
            period: Duration::from_secs(1),
        }
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn seven_at_once_with_burst_five_pass_six() {
        let t0 = Instant::now();
        let mut b = Gcra::new(per_sec(30), 5, t0);
        let passed: Vec<bool> = (0..7).map(|_| b.try_acquire(t0, 1).is_ok()).collect();
        assert_eq!(passed, [true, true, true, true, true, true, false]);
        assert_eq!(b.excess(t0), 5.0);
        // One request drains in 33.3 ms: then the seventh passes.
        let Err(RetryIn(wait)) = b.check(t0, 1) else {
            panic!("full")
        };
        assert_eq!(wait, Duration::from_nanos(33_333_334));
        assert!(b.try_acquire(t0 + wait, 1).is_ok());
        assert!(b.try_acquire(t0 + wait, 1).is_err());
    }

    #[test]
    fn without_a_burst_a_request_within_one_interval_is_refused() {
        let t0 = Instant::now();
        let mut b = Gcra::new(per_sec(10), 0, t0);
        assert_eq!(b.try_acquire(t0, 1), Ok(0));
        assert_eq!(b.try_acquire(t0 + ms(99), 1), Err(RetryIn(ms(1))));
        assert_eq!(b.try_acquire(t0 + ms(100), 1), Ok(0));
        // Evenly at the rate, never refused.
        for i in 2..100 {
            assert!(b.try_acquire(t0 + ms(100 * i), 1).is_ok(), "call {i}");
        }
    }

    #[test]
    fn nginx_excess_arithmetic_step_by_step() {
        // rate=2r/s burst=1: excess after each, as nginx's
        // `excess = max(0, excess - rate*ms/1000 + 1000)` in milli-requests.
        let t0 = Instant::now();
        let mut b = Gcra::new(per_sec(2), 1, t0);
        assert_eq!(b.record(t0, 1), 0.0); // a fresh key: 0
        assert!(b.check(t0 + ms(250), 1).is_ok());
        assert_eq!(b.record(t0 + ms(250), 1), 0.5); // 0 - 500 + 1000
        assert!(b.check(t0 + ms(300), 1).is_err()); // 500 - 100 + 1000 > 1000
        assert!(b.check(t0 + ms(500), 1).is_ok()); // 500 - 500 + 1000
                                                   // Idle: the excess drains to zero and stays there.
        assert_eq!(b.excess(t0 + Duration::from_secs(60)), 0.0);
        assert_eq!(b.remaining(t0 + Duration::from_secs(60), 1), 2);
    }

    #[test]
    fn a_refused_request_changes_nothing() {
        let t0 = Instant::now();
        let mut b = Gcra::new(per_sec(30), 5, t0);
        for _ in 0..6 {
            b.try_acquire(t0, 1).unwrap();
        }
        for _ in 0..100 {
            assert!(b.try_acquire(t0 + ms(10), 1).is_err());
        }
        assert!(b.try_acquire(t0 + ms(34), 1).is_ok());
    }

    #[test]
    fn weighted_requests_and_one_too_heavy_ever_to_pass() {
        let t0 = Instant::now();
        // 1000 tokens per second, room for 2000.
        let mut b = Gcra::new(per_sec(1000), 1999, t0);
        assert_eq!(b.try_acquire(t0, 1500), Ok(500));
        assert_eq!(b.check(t0, 600), Err(RetryIn(ms(100))));
        assert_eq!(b.check(t0, 2001), Err(RetryIn(Duration::MAX)));
        assert_eq!(b.remaining(t0, 100), 5);
    }
}
