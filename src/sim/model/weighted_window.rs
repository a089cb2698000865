//! A sliding window of weighted arrivals: at most `limit` units (tokens)
//! whose arrival lies in the last `window`, the tokens-per-minute limit of
//! an LLM API. The calls-only [`SlidingWindow`](super::sliding_window) is the
//! special case of weight 1; this one also serves as the sim's meter of the
//! most units any policy saw in one window (with `limit = u64::MAX`).
//!
//! As there, an arrival at `t` is inside the window at `now` while
//! `now - t < window`.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::sliding_window::RetryIn;

/// An exact log of weighted arrivals.
#[derive(Debug, Clone)]
pub struct WeightedWindow {
    limit: u64,
    window: Duration,
    /// Arrivals still (possibly) inside the window, oldest first.
    log: VecDeque<(Instant, u64)>,
    /// The sum of the weights in `log`.
    total: u64,
}

impl WeightedWindow {
    /// A window admitting `limit` units per `window`.
    pub fn new(limit: u64, window: Duration) -> Self {
        WeightedWindow {
            limit,
            window,
            log: VecDeque::new(),
            total: 0,
        }
    }

    /// Units admitted per window.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The window's length.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// Changes the limit; what the window holds stays.
    pub fn set_limit(&mut self, limit: u64) {
        self.limit = limit;
    }

    fn live(&self, t: Instant, now: Instant) -> bool {
        now.saturating_duration_since(t) < self.window
    }

    /// Units inside the window at `now`.
    pub fn count(&self, now: Instant) -> u64 {
        let dead: u64 = self
            .log
            .iter()
            .take_while(|(t, _)| !self.live(*t, now))
            .map(|(_, w)| *w)
            .sum();
        self.total - dead
    }

    /// Units still admitted at `now`.
    pub fn remaining(&self, now: Instant) -> u64 {
        self.limit.saturating_sub(self.count(now))
    }

    /// How long from `now` until the oldest arrival inside the window ages
    /// out (zero for an empty window).
    pub fn reset_in(&self, now: Instant) -> Duration {
        self.log
            .iter()
            .find(|(t, _)| self.live(*t, now))
            .map_or(Duration::ZERO, |(t, _)| {
                self.window
                    .saturating_sub(now.saturating_duration_since(*t))
            })
    }

    /// Whether `units` more fit at `now`, without recording them:
    /// `Ok(units left after)` or the wait until enough have aged out
    /// (`MAX` when more than the whole limit is asked).
    pub fn check(&self, now: Instant, units: u64) -> Result<u64, RetryIn> {
        if units > self.limit {
            return Err(RetryIn(Duration::MAX));
        }
        let count = self.count(now);
        if count.saturating_add(units) <= self.limit {
            return Ok(self.limit - count - units);
        }
        // Walk the live arrivals oldest first until enough have aged out.
        let mut over = count + units - self.limit;
        for (t, w) in self.log.iter().filter(|(t, _)| self.live(*t, now)) {
            over = over.saturating_sub(*w);
            if over == 0 {
                let age = now.saturating_duration_since(*t);
                return Err(RetryIn(self.window.saturating_sub(age)));
            }
        }
        Err(RetryIn(self.window))
    }

    /// Records `units` at `now` without checking; returns the count in the
    /// window after them. An instant earlier than the newest arrival is
    /// taken as that arrival's, which keeps the log sorted.
    pub fn record(&mut self, now: Instant, units: u64) -> u64 {
        while let Some(&(t, w)) = self.log.front() {
            if self.live(t, now) {
                break;
            }
            self.total -= w;
            self.log.pop_front();
        }
        let at = match self.log.back() {
            Some(&(last, _)) if last > now => last,
            _ => now,
        };
        self.log.push_back((at, units));
        self.total = self.total.saturating_add(units);
        self.total
    }

    /// Admits `units` at `now` if they fit, recording them.
    pub fn try_acquire(&mut self, now: Instant, units: u64) -> Result<u64, RetryIn> {
        let left = self.check(now, units)?;
        self.record(now, units);
        Ok(left)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn admits_units_until_the_budget_then_waits_for_enough_to_age_out() {
        let t0 = Instant::now();
        let mut w = WeightedWindow::new(1000, ms(1000));
        assert_eq!(w.try_acquire(t0, 400), Ok(600));
        assert_eq!(w.try_acquire(t0 + ms(100), 500), Ok(100));
        // 300 more need the 400 of t0 gone: at 1 s.
        assert_eq!(w.check(t0 + ms(200), 300), Err(RetryIn(ms(800))));
        // 700 more need both gone: at 1.1 s.
        assert_eq!(w.check(t0 + ms(200), 700), Err(RetryIn(ms(900))));
        assert_eq!(w.count(t0 + ms(200)), 900, "a refusal is not recorded");
        assert_eq!(w.try_acquire(t0 + ms(1000), 300), Ok(200));
        assert_eq!(w.reset_in(t0 + ms(1000)), ms(100));
        assert_eq!(w.check(t0, 1001), Err(RetryIn(Duration::MAX)));
    }

    #[test]
    fn as_a_meter_it_counts_the_most_in_a_window() {
        let t0 = Instant::now();
        let mut m = WeightedWindow::new(u64::MAX, ms(100));
        assert_eq!(m.record(t0, 5), 5);
        assert_eq!(m.record(t0 + ms(99), 5), 10);
        assert_eq!(m.record(t0 + ms(100), 1), 6);
        assert_eq!(
            m.record(t0 + ms(50), 1),
            7,
            "out of order: the newest instant"
        );
        assert!(m.log.len() <= 3);
    }
}
