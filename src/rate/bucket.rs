//! The client-side token bucket, sized to a sliding window
//! (`capacity + rate × W ≤ L`, see docs/design.md).
//!
//! Pure: every method takes `now`. The async waiting lives in [`crate::pace`].

use std::time::{Duration, Instant};

use super::Rate;

/// Why a bucket could not be sized for a limit.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SizingError {
    /// The burst alone would use up the whole window.
    #[error("--burst {burst} leaves no room for a refill rate under a limit of {limit} (the burst must be below the limit)")]
    BurstTooLarge {
        /// Requested capacity.
        burst: u64,
        /// The limit per window.
        limit: u64,
    },
    /// A zero-capacity bucket could never release anything.
    #[error("--burst must be at least 1")]
    ZeroBurst,
}

/// A token bucket: tokens drip in at `rate_per_sec` up to `capacity`; every call
/// takes one. A pause empties it and holds everyone until the pause ends.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    capacity: f64,
    rate_per_sec: f64,
    tokens: f64,
    last: Instant,
    paused_until: Option<Instant>,
    /// When the bucket was made and how many tokens it has released since,
    /// so a shrink soon after the start can count the opening burst.
    created: Instant,
    released: u64,
    window: Duration,
}

/// How much of the window to hold back for the gap between our clock and the
/// server's: request latency varies, so two calls released exactly W apart can
/// arrive less than W apart. A twentieth of the window, at most 200 ms, costs
/// well under 1% of throughput on a one-minute window.
pub fn skew_allowance(window: Duration) -> Duration {
    (window / 20).min(Duration::from_millis(200))
}

impl TokenBucket {
    /// A bucket that starts full.
    pub fn new(capacity: u64, rate_per_sec: f64, now: Instant) -> TokenBucket {
        TokenBucket {
            capacity: capacity as f64,
            rate_per_sec,
            tokens: capacity as f64,
            last: now,
            paused_until: None,
            created: now,
            released: 0,
            window: Duration::ZERO,
        }
    }

    /// Sizes a bucket so that, whatever the call pattern, no span of the
    /// window (plus the [`skew_allowance`]) ever sees more than `limit.count`
    /// releases: `capacity + rate × (W + skew) ≤ L`.
    ///
    /// `burst` defaults to a tenth of the limit (at least 1). `start_empty`
    /// is for a job resumed within one window of its last call: the previous
    /// process may have used the burst already, and an empty start keeps the
    /// sum of both under the limit.
    ///
    /// ```
    /// use std::time::{Duration, Instant};
    /// use batchrun::rate::{bucket::TokenBucket, Rate};
    ///
    /// let starter = Rate { count: 60, period: Duration::from_secs(60) };
    /// let now = Instant::now();
    /// let mut b = TokenBucket::for_limit(starter, None, false, now).unwrap();
    /// assert_eq!(b.capacity(), 6);
    /// for _ in 0..6 {
    ///     assert!(b.try_take(now).is_ok()); // the burst
    /// }
    /// let next = b.try_take(now).unwrap_err(); // then about 0.9 a second
    /// assert!(next - now > Duration::from_millis(1100));
    /// ```
    pub fn for_limit(
        limit: Rate,
        burst: Option<u64>,
        start_empty: bool,
        now: Instant,
    ) -> Result<TokenBucket, SizingError> {
        let capacity = burst.unwrap_or_else(|| limit.default_burst());
        if capacity == 0 {
            return Err(SizingError::ZeroBurst);
        }
        if capacity >= limit.count {
            // A limit of 1 per window has no room for a burst of 1 plus a
            // refill, so it gets a pure drip of one per (window + skew) instead.
            if limit.count == 1 && burst.is_none() {
                let span = limit.period + skew_allowance(limit.period);
                let mut b = TokenBucket::new(1, 1.0 / span.as_secs_f64(), now);
                b.window = limit.period;
                if start_empty {
                    b.tokens = 0.0;
                }
                return Ok(b);
            }
            return Err(SizingError::BurstTooLarge {
                burst: capacity,
                limit: limit.count,
            });
        }
        let span = limit.period + skew_allowance(limit.period);
        let rate = (limit.count - capacity) as f64 / span.as_secs_f64();
        let mut b = TokenBucket::new(capacity, rate, now);
        b.window = limit.period;
        if start_empty {
            b.tokens = 0.0;
        }
        Ok(b)
    }

    /// Capacity in tokens.
    pub fn capacity(&self) -> u64 {
        self.capacity as u64
    }

    /// Refill rate in tokens per second.
    pub fn rate_per_sec(&self) -> f64 {
        self.rate_per_sec
    }

    /// When the current pause ends, if one is in force at `now`.
    pub fn paused_until(&self, now: Instant) -> Option<Instant> {
        self.paused_until.filter(|&u| u > now)
    }

    fn refill(&mut self, now: Instant) {
        if now > self.last {
            let dt = now.duration_since(self.last).as_secs_f64();
            self.tokens = (self.tokens + dt * self.rate_per_sec).min(self.capacity);
            self.last = now;
        }
    }

    /// Takes one token if there is one; otherwise says when to try again.
    pub fn try_take(&mut self, now: Instant) -> Result<(), Instant> {
        if let Some(until) = self.paused_until(now) {
            return Err(until);
        }
        self.refill(now);
        // A hair of tolerance so float rounding never turns "exactly one
        // token" into a second, pointless wake-up.
        if self.tokens >= 1.0 - 1e-9 {
            self.tokens = (self.tokens - 1.0).max(0.0);
            self.released = self.released.saturating_add(1);
            return Ok(());
        }
        let missing = 1.0 - self.tokens;
        // A limit such as 1 per century makes this wait astronomically long;
        // saturate rather than overflow.
        const FAR: Duration = Duration::from_secs(100 * 365 * 86_400);
        let wait = Duration::try_from_secs_f64(missing / self.rate_per_sec)
            .unwrap_or(FAR)
            .clamp(Duration::from_micros(1), FAR);
        Err(now
            .checked_add(wait)
            .unwrap_or(now + Duration::from_secs(365 * 86_400)))
    }

    /// Gives back a token taken for a call that was never sent (the run
    /// stopped, or no connection was made): it consumed nothing at the
    /// server, so it may go to the next call. Never above capacity.
    pub fn refund(&mut self) {
        self.tokens = (self.tokens + 1.0).min(self.capacity);
        self.released = self.released.saturating_sub(1);
    }

    /// A rate-limit 429 slipped through: hold every caller until `until`, and
    /// empty the bucket so nobody bursts the moment the pause ends.
    pub fn pause_until(&mut self, until: Instant, now: Instant) {
        self.refill(now);
        self.tokens = 0.0;
        let until = self.paused_until.map_or(until, |p| p.max(until));
        self.paused_until = Some(until);
        // Refill starts when the pause ends, not before.
        self.last = self.last.max(until);
    }

    /// Records `n` calls already made elsewhere in the current window as a
    /// debt, paid back before this bucket releases anything.
    pub fn owe(&mut self, n: u64) {
        self.tokens -= n as f64;
    }

    /// Shrinks the bucket to a lower limit the server reports being in force
    /// (`x-rate-limit-limit`): a key capped below its plan. Never grows it.
    pub fn shrink_to(&mut self, limit: Rate, now: Instant) -> bool {
        let Ok(smaller) = TokenBucket::for_limit(limit, None, false, now) else {
            return false;
        };
        if smaller.rate_per_sec >= self.rate_per_sec {
            return false;
        }
        self.refill(now);
        self.capacity = smaller.capacity.min(self.capacity);
        self.rate_per_sec = smaller.rate_per_sec;
        self.tokens = self.tokens.min(self.capacity);
        if now.saturating_duration_since(self.created) < self.window + skew_allowance(self.window) {
            // Everything released so far is still inside the server's window:
            // it is owed out of the smaller budget (negative tokens are a debt).
            self.tokens -= self.released as f64;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn per_min(count: u64) -> Rate {
        Rate {
            count,
            period: Duration::from_secs(60),
        }
    }

    #[test]
    fn starter_bucket_is_six_at_about_point_nine_per_second() {
        let b = TokenBucket::for_limit(per_min(60), None, false, Instant::now()).unwrap();
        assert_eq!(b.capacity(), 6);
        // The sizing rule's (60 - 6) / 60 = 0.9, less the 200 ms skew allowance.
        assert!((b.rate_per_sec() - 54.0 / 60.2).abs() < 1e-9);
        assert!(b.rate_per_sec() < 0.9);
    }

    #[test]
    fn check_yourself_capacity_ten_gives_at_most_five_sixths() {
        // Capacity 10 at 60/min → the highest safe rate is (60-10)/60.
        let b = TokenBucket::for_limit(per_min(60), Some(10), false, Instant::now()).unwrap();
        assert!(b.rate_per_sec() <= 50.0 / 60.0);
        assert!(b.rate_per_sec() > 0.82);
    }

    #[test]
    fn burst_must_stay_below_the_limit() {
        let t = Instant::now();
        assert!(TokenBucket::for_limit(per_min(60), Some(60), false, t).is_err());
        assert!(TokenBucket::for_limit(per_min(60), Some(0), false, t).is_err());
        // One per window still works, as a pure drip.
        let b = TokenBucket::for_limit(per_min(1), None, false, t).unwrap();
        assert_eq!(b.capacity(), 1);
    }

    /// Drives a bucket greedily (take whenever allowed) for `horizon` and
    /// returns release times.
    fn greedy(mut b: TokenBucket, t0: Instant, horizon: Duration) -> Vec<Instant> {
        let mut now = t0;
        let mut out = Vec::new();
        while now < t0 + horizon {
            match b.try_take(now) {
                Ok(()) => out.push(now),
                Err(at) => now = at,
            }
        }
        out
    }

    fn max_in_any_window(times: &[Instant], w: Duration) -> usize {
        let mut best = 0;
        let mut lo = 0;
        for hi in 0..times.len() {
            while times[hi].duration_since(times[lo]) >= w {
                lo += 1;
            }
            best = best.max(hi - lo + 1);
        }
        best
    }

    #[test]
    fn greedy_caller_never_exceeds_the_window_even_with_skew() {
        for (count, secs) in [(5, 60), (60, 60), (180, 60), (60, 1), (600, 6), (10, 2)] {
            let r = Rate {
                count,
                period: Duration::from_secs(secs),
            };
            let t0 = Instant::now();
            let b = TokenBucket::for_limit(r, None, false, t0).unwrap();
            let times = greedy(b, t0, r.period * 5);
            let widened = r.period + skew_allowance(r.period);
            assert!(
                max_in_any_window(&times, widened) <= count as usize,
                "{r}: {} in a window",
                max_in_any_window(&times, widened)
            );
            // And it is not needlessly slow: it releases everything the
            // sizing rule allows (the burst plus the refill over 5 windows).
            let cap = r.default_burst() as f64;
            let allowed =
                cap + (count as f64 - cap) * 5.0 * r.period.as_secs_f64() / widened.as_secs_f64();
            assert!(
                times.len() as f64 >= allowed.floor(),
                "{r}: {} < {allowed}",
                times.len()
            );
        }
    }

    #[test]
    fn resumed_empty_bucket_plus_a_previous_full_burst_stays_under_the_limit() {
        let r = per_min(60);
        let t0 = Instant::now();
        // The previous process: a greedy minute, stopped at t0 + 30 s.
        let prev = greedy(
            TokenBucket::for_limit(r, None, false, t0).unwrap(),
            t0,
            Duration::from_secs(30),
        );
        let t1 = t0 + Duration::from_secs(30);
        let next = greedy(
            TokenBucket::for_limit(r, None, true, t1).unwrap(),
            t1,
            Duration::from_secs(120),
        );
        let all: Vec<_> = prev.into_iter().chain(next).collect();
        assert!(max_in_any_window(&all, Duration::from_secs(60)) <= 60);
    }

    #[test]
    fn pause_holds_everyone_and_empties_the_bucket() {
        let t0 = Instant::now();
        let mut b = TokenBucket::for_limit(per_min(60), None, false, t0).unwrap();
        assert!(b.try_take(t0).is_ok());
        let until = t0 + Duration::from_secs(12);
        b.pause_until(until, t0);
        assert_eq!(b.try_take(t0 + Duration::from_secs(5)), Err(until));
        // At the end of the pause there is no burst waiting: the bucket was emptied.
        let next = b.try_take(until).unwrap_err();
        assert!(next > until);
        assert!(b.try_take(next).is_ok());
        // A shorter pause never shortens a longer one.
        b.pause_until(until + Duration::from_secs(30), next);
        b.pause_until(until + Duration::from_secs(1), next);
        assert_eq!(b.paused_until(next), Some(until + Duration::from_secs(30)));
    }

    #[test]
    fn an_absurdly_slow_limit_waits_long_but_never_panics() {
        let t0 = Instant::now();
        let r = Rate {
            count: 2,
            period: Duration::from_secs(u64::MAX / 4),
        };
        let mut b = TokenBucket::for_limit(r, None, false, t0).unwrap();
        assert!(b.try_take(t0).is_ok());
        let next = b.try_take(t0).unwrap_err();
        assert!(next - t0 >= Duration::from_secs(365 * 86_400));
    }

    #[test]
    fn shrinks_to_a_lower_limit_in_force_but_never_grows() {
        let t0 = Instant::now();
        let mut b = TokenBucket::for_limit(per_min(60), None, false, t0).unwrap();
        for _ in 0..6 {
            assert!(b.try_take(t0).is_ok());
        }
        assert!(b.shrink_to(per_min(20), t0));
        assert_eq!(b.capacity(), 2);
        // The six already sent count against the new limit of 20 per window.
        let times = greedy(b.clone(), t0, Duration::from_secs(300));
        let mut all = vec![t0; 6];
        all.extend(times);
        assert!(max_in_any_window(&all, Duration::from_secs(60)) <= 20);
        assert!(b.rate_per_sec() < 18.0 / 60.0 + 1e-9);
        assert!(!b.shrink_to(per_min(60), t0));
        assert_eq!(b.capacity(), 2);
    }
}
