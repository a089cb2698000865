//! The sliding-window limiter: at most `limit` accepted requests whose arrival
//! lies in the last `window`.
//!
//! This is the server-side model of an APIVerve-style per-minute limit (see
//! docs/design.md: "the limiter counts your requests in the last 60 seconds, not per
//! clock minute"), and it is exact: it keeps the arrival instant of every
//! request still inside the window instead of approximating with buckets, so
//! the same type can serve as an exact client-side pacer.
//!
//! An arrival at `t` is inside the window at `now` while `now - t < window`;
//! at `now == t + window` it has aged out.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::rate::Rate;

/// How long until a request would fit in the window again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryIn(pub Duration);

impl RetryIn {
    /// The wait in whole seconds, rounded up and at least 1, as `retry-after`
    /// wants it: rounding down would invite a retry that is still too early.
    pub fn whole_seconds(&self) -> u64 {
        ceil_secs(self.0)
    }
}

/// Whole seconds in `d`, rounded up, at least 1.
pub fn ceil_secs(d: Duration) -> u64 {
    let s = d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0));
    s.max(1)
}

/// An exact sliding-window log of accepted arrivals.
#[derive(Debug, Clone)]
pub struct SlidingWindow {
    limit: u64,
    window: Duration,
    /// Arrival instants still (possibly) inside the window, oldest first.
    log: VecDeque<Instant>,
}

impl SlidingWindow {
    /// A window admitting `limit` requests per `window`.
    ///
    /// `limit` may be `u64::MAX` to use the window purely as a counter.
    pub fn new(limit: u64, window: Duration) -> Self {
        SlidingWindow {
            limit,
            window,
            log: VecDeque::new(),
        }
    }

    /// A window for a [`Rate`]: `rate.count` per `rate.period`.
    pub fn for_rate(rate: Rate) -> Self {
        Self::new(rate.count, rate.period)
    }

    /// The number of requests admitted per window.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The window's length.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// Changes the limit; arrivals already logged stay, so lowering it below
    /// the current count simply blocks until enough of them age out.
    pub fn set_limit(&mut self, limit: u64) {
        self.limit = limit;
    }

    /// Index of the first arrival still inside the window at `now`.
    fn first_live(&self, now: Instant) -> usize {
        // The log is sorted, so the aged-out arrivals form a prefix.
        self.log
            .partition_point(|&t| now.saturating_duration_since(t) >= self.window)
    }

    /// Arrivals inside the window at `now`.
    pub fn count(&self, now: Instant) -> u64 {
        (self.log.len() - self.first_live(now)) as u64
    }

    /// Requests that would still be admitted at `now`.
    pub fn remaining(&self, now: Instant) -> u64 {
        self.limit.saturating_sub(self.count(now))
    }

    /// When the oldest arrival inside the window at `now` ages out, if any
    /// (`None` also when that instant is beyond what `Instant` can hold).
    pub fn oldest_expiry(&self, now: Instant) -> Option<Instant> {
        self.log
            .get(self.first_live(now))
            .and_then(|&t| t.checked_add(self.window))
    }

    /// Forgets arrivals that have aged out, so the log stays at most `limit`
    /// entries long (plus whatever a lowered limit left behind).
    pub fn prune(&mut self, now: Instant) {
        let n = self.first_live(now);
        self.log.drain(..n);
    }

    /// Whether a request at `now` would be admitted, without recording it:
    /// `Ok(remaining after admitting it)` or how long until it would fit.
    pub fn check(&self, now: Instant) -> Result<u64, RetryIn> {
        let first = self.first_live(now);
        let count = (self.log.len() - first) as u64;
        if count < self.limit {
            return Ok(self.limit - count - 1);
        }
        // Room appears when all but limit-1 of the live arrivals have aged
        // out; with count == limit that is simply the oldest one.
        let excess = (count - self.limit) as usize;
        let t = self.log[first + excess];
        // Durations, not `t + window`: an absurd window must not overflow.
        let age = now.saturating_duration_since(t);
        Err(RetryIn(self.window.saturating_sub(age)))
    }

    /// Records an arrival at `now` without checking the limit.
    ///
    /// `now` earlier than the newest arrival (two threads reading the clock in
    /// one order and locking in the other) is treated as that arrival's
    /// instant, which keeps the log sorted at a cost of nanoseconds.
    pub fn record(&mut self, now: Instant) {
        self.prune(now);
        let at = match self.log.back() {
            Some(&last) if last > now => last,
            _ => now,
        };
        self.log.push_back(at);
    }

    /// Admits and records a request at `now` if it fits: `Ok(remaining)`
    /// after it, or `Err` with the wait until it would fit. A refused request
    /// is not recorded.
    pub fn try_acquire(&mut self, now: Instant) -> Result<u64, RetryIn> {
        let remaining = self.check(now)?;
        self.record(now);
        Ok(remaining)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn admits_the_limit_then_refuses_until_the_oldest_ages_out() {
        let t0 = Instant::now();
        let mut w = SlidingWindow::new(5, Duration::from_secs(2));
        for i in 0..5 {
            assert_eq!(w.try_acquire(t0 + ms(i * 100)), Ok(4 - i));
        }
        // The oldest arrived at t0, so room appears at t0 + 2 s.
        assert_eq!(w.try_acquire(t0 + ms(500)), Err(RetryIn(ms(1500))));
        assert_eq!(w.count(t0 + ms(500)), 5, "a refusal is not recorded");
        assert_eq!(w.oldest_expiry(t0 + ms(500)), Some(t0 + ms(2000)));
        assert_eq!(w.try_acquire(t0 + ms(1999)), Err(RetryIn(ms(1))));
        // Exactly W after the arrival it has aged out.
        assert_eq!(w.try_acquire(t0 + ms(2000)), Ok(0));
        assert_eq!(w.try_acquire(t0 + ms(2050)), Err(RetryIn(ms(50))));
    }

    #[test]
    fn sixty_in_the_first_second_lock_you_out_for_59() {
        // docs/design.md: "Sixty calls fired in the first second of a minute lock
        // you out for the next 59".
        let t0 = Instant::now();
        let mut w = SlidingWindow::for_rate(Rate {
            count: 60,
            period: Duration::from_secs(60),
        });
        for i in 0..60 {
            assert!(w.try_acquire(t0 + ms(i * 16)).is_ok());
        }
        let e = w.try_acquire(t0 + ms(1000)).unwrap_err();
        assert_eq!(e, RetryIn(Duration::from_secs(59)));
        assert_eq!(e.whole_seconds(), 59);
    }

    #[test]
    fn sixty_spread_evenly_never_trip_it() {
        let t0 = Instant::now();
        let mut w = SlidingWindow::new(60, Duration::from_secs(60));
        // One a second for ten minutes: the window never holds more than 60.
        for i in 0..600 {
            let now = t0 + Duration::from_secs(i);
            assert!(w.try_acquire(now).is_ok(), "call {i}");
            assert!(w.count(now) <= 60);
        }
        // The log is pruned as it goes.
        assert!(w.log.len() <= 60);
    }

    #[test]
    fn counts_and_expiry_on_an_empty_window() {
        let t0 = Instant::now();
        let w = SlidingWindow::new(3, ms(100));
        assert_eq!((w.count(t0), w.remaining(t0)), (0, 3));
        assert_eq!(w.oldest_expiry(t0), None);
        assert_eq!(w.check(t0), Ok(2));
    }

    #[test]
    fn a_lowered_limit_waits_for_enough_arrivals_to_age_out() {
        let t0 = Instant::now();
        let mut w = SlidingWindow::new(4, Duration::from_secs(10));
        for i in 0..4 {
            w.try_acquire(t0 + Duration::from_secs(i)).unwrap();
        }
        w.set_limit(2);
        // Live arrivals at 0,1,2,3 s; below 2 live needs the one at 2 s gone.
        assert_eq!(
            w.check(t0 + Duration::from_secs(4)),
            Err(RetryIn(Duration::from_secs(8)))
        );
        assert_eq!(w.check(t0 + Duration::from_secs(12)), Ok(0));
    }

    #[test]
    fn a_clock_read_slightly_out_of_order_keeps_the_log_sorted() {
        let t0 = Instant::now();
        let mut w = SlidingWindow::new(10, ms(100));
        w.record(t0 + ms(10));
        w.record(t0 + ms(5));
        assert_eq!(w.count(t0 + ms(10)), 2);
        assert_eq!(w.count(t0 + ms(110)), 0);
    }

    #[test]
    fn whole_seconds_round_up_and_never_say_zero() {
        assert_eq!(RetryIn(ms(1)).whole_seconds(), 1);
        assert_eq!(RetryIn(ms(0)).whole_seconds(), 1);
        assert_eq!(RetryIn(ms(1000)).whole_seconds(), 1);
        assert_eq!(RetryIn(ms(1001)).whole_seconds(), 2);
        assert_eq!(RetryIn(Duration::from_secs(59)).whole_seconds(), 59);
        assert_eq!(RetryIn(Duration::MAX).whole_seconds(), u64::MAX);
    }

    #[test]
    fn an_absurd_window_does_not_overflow() {
        let t0 = Instant::now();
        let mut w = SlidingWindow::new(1, Duration::MAX);
        w.try_acquire(t0).unwrap();
        assert_eq!(
            w.try_acquire(t0 + ms(5)),
            Err(RetryIn(Duration::MAX - ms(5)))
        );
        assert_eq!(w.oldest_expiry(t0), None);
    }

    #[test]
    fn a_counting_window_never_refuses() {
        let t0 = Instant::now();
        let mut w = SlidingWindow::new(u64::MAX, Duration::from_secs(1));
        for _ in 0..1000 {
            w.try_acquire(t0).unwrap();
        }
        assert_eq!(w.count(t0), 1000);
    }
}
