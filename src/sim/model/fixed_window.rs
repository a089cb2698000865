//! The fixed-window limiter: at most `limit` units per window of `window`,
//! the windows aligned to an origin and the count reset at each boundary, as
//! express-rate-limit's memory store and rate-limiter-flexible keep it (and
//! most daily quotas).
//!
//! The windows are `[origin + k·W, origin + (k+1)·W)`. The sim aligns them to
//! its own start, as express-rate-limit does to its store's creation, so a
//! daily quota resets a day after the sim started: never within a test.
//!
//! A fixed window lets through up to twice its limit across a boundary
//! (`limit` just before it, `limit` just after); that is the shape, not a
//! bug, and the sim's stats show it.

use std::time::{Duration, Instant};

use super::sliding_window::RetryIn;

/// One key's fixed-window counter.
#[derive(Debug, Clone)]
pub struct FixedWindow {
    limit: u64,
    window: Duration,
    origin: Instant,
    /// Index of the window `count` belongs to.
    index: u128,
    /// Units accepted in window `index`.
    count: u64,
}

impl FixedWindow {
    /// A counter of `limit` units per `window`, the windows starting at
    /// `origin` (a zero window is taken as one nanosecond).
    pub fn new(limit: u64, window: Duration, origin: Instant) -> Self {
        FixedWindow {
            limit,
            window: window.max(Duration::from_nanos(1)),
            origin,
            index: 0,
            count: 0,
        }
    }

    /// The units admitted per window.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The window's length.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// Lowers (or raises) the limit; what the window holds stays.
    pub fn set_limit(&mut self, limit: u64) {
        self.limit = limit;
    }

    fn index_at(&self, now: Instant) -> u128 {
        now.saturating_duration_since(self.origin).as_nanos() / self.window.as_nanos()
    }

    /// Units counted in the window that holds `now`.
    pub fn count(&self, now: Instant) -> u64 {
        if self.index_at(now) == self.index {
            self.count
        } else {
            0
        }
    }

    /// Units still admitted in the window that holds `now`.
    pub fn remaining(&self, now: Instant) -> u64 {
        self.limit.saturating_sub(self.count(now))
    }

    /// How long from `now` until the next boundary, when the count resets.
    pub fn reset_in(&self, now: Instant) -> Duration {
        let w = self.window.as_nanos();
        let into = now.saturating_duration_since(self.origin).as_nanos() % w;
        nanos(w - into)
    }

    /// Whether `units` more fit at `now`, without counting them:
    /// `Ok(units left after them)` or the wait until the boundary (`MAX`
    /// when more than the whole limit is asked: it never fits).
    pub fn check(&self, now: Instant, units: u64) -> Result<u64, RetryIn> {
        if units > self.limit {
            return Err(RetryIn(Duration::MAX));
        }
        let left = self.remaining(now);
        if units <= left {
            return Ok(left - units);
        }
        Err(RetryIn(self.reset_in(now)))
    }

    /// Counts `units` at `now` without checking; returns the window's count.
    pub fn record(&mut self, now: Instant, units: u64) -> u64 {
        let i = self.index_at(now);
        // A clock read slightly out of order (an earlier window) counts in
        // the current one, never resetting it.
        if i > self.index {
            self.index = i;
            self.count = 0;
        }
        self.count = self.count.saturating_add(units);
        self.count
    }

    /// Admits `units` at `now` if they fit, counting them.
    pub fn try_acquire(&mut self, now: Instant, units: u64) -> Result<u64, RetryIn> {
        let left = self.check(now, units)?;
        self.record(now, units);
        Ok(left)
    }
}

fn nanos(n: u128) -> Duration {
    Duration::from_nanos(u64::try_from(n).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn admits_the_limit_then_waits_for_the_boundary() {
        let t0 = Instant::now();
        let mut w = FixedWindow::new(3, ms(1000), t0);
        for i in 0..3 {
            assert_eq!(w.try_acquire(t0 + ms(100 + i), 1), Ok(2 - i));
        }
        // Refused until the boundary at 1 s, whatever happened in between.
        assert_eq!(w.try_acquire(t0 + ms(400), 1), Err(RetryIn(ms(600))));
        assert_eq!(w.count(t0 + ms(400)), 3, "a refusal is not counted");
        assert_eq!(w.try_acquire(t0 + ms(999), 1), Err(RetryIn(ms(1))));
        // At the boundary the count is back to zero.
        assert_eq!(w.remaining(t0 + ms(1000)), 3);
        assert_eq!(w.try_acquire(t0 + ms(1000), 1), Ok(2));
        assert_eq!(w.reset_in(t0 + ms(1000)), ms(1000));
    }

    #[test]
    fn twice_the_limit_can_pass_across_a_boundary() {
        let t0 = Instant::now();
        let mut w = FixedWindow::new(5, ms(1000), t0);
        let before = (0..5)
            .filter(|_| w.try_acquire(t0 + ms(999), 1).is_ok())
            .count();
        let after = (0..6)
            .filter(|_| w.try_acquire(t0 + ms(1001), 1).is_ok())
            .count();
        assert_eq!((before, after), (5, 5));
    }

    #[test]
    fn units_are_weighted_and_a_request_over_the_limit_never_fits() {
        let t0 = Instant::now();
        let mut w = FixedWindow::new(100, ms(1000), t0);
        assert_eq!(w.try_acquire(t0, 60), Ok(40));
        assert_eq!(w.check(t0, 41), Err(RetryIn(ms(1000))));
        assert_eq!(w.try_acquire(t0, 40), Ok(0));
        assert_eq!(w.check(t0 + ms(5000), 101), Err(RetryIn(Duration::MAX)));
    }

    #[test]
    fn a_daily_quota_resets_a_day_after_its_origin() {
        let t0 = Instant::now();
        let day = Duration::from_secs(86_400);
        let mut w = FixedWindow::new(2, day, t0);
        let later = t0 + Duration::from_secs(5);
        assert!(w.try_acquire(later, 1).is_ok());
        assert!(w.try_acquire(later, 1).is_ok());
        let Err(RetryIn(wait)) = w.try_acquire(later, 1) else {
            panic!("over the quota")
        };
        assert_eq!(wait, day - Duration::from_secs(5));
    }

    #[test]
    fn a_clock_read_out_of_order_never_resets_the_count() {
        let t0 = Instant::now();
        let mut w = FixedWindow::new(10, ms(100), t0);
        w.record(t0 + ms(150), 3);
        assert_eq!(w.record(t0 + ms(90), 1), 4);
        assert_eq!(w.count(t0 + ms(199)), 4);
        assert_eq!(w.count(t0 + ms(200)), 0);
    }
}
