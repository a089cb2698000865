//! The Apigee SpikeArrest model: a token bucket whose size is derived from the
//! units of the rate, with no queue.
//!
//! As docs/design.md describes it: one token drips in every `period / messagesPerPeriod`; the
//! bucket holds 10% of messagesPerPeriod (at least 1); the level is
//! `min(bucket, tokens + elapsed / interval)` whether or not anyone calls; a
//! request that finds a whole token passes and takes it, otherwise it is
//! refused at once and consumes nothing. So `30ps` and `1800pm` drip at the same
//! 30/s but hold 3 and 180 tokens: sixty times the burst tolerance.
//!
//! The level is kept in exact integer units (one token = `period` in
//! nanoseconds, and every elapsed nanosecond adds `messagesPerPeriod` units),
//! so a 33.3 ms interval accumulates no rounding drift however long it runs.

use std::time::{Duration, Instant};

use super::sliding_window::RetryIn;
use crate::rate::spike_pace::gateway_bucket;
use crate::rate::Rate;

/// One SpikeArrest identifier's bucket.
#[derive(Debug, Clone)]
pub struct SpikeArrest {
    rate: Rate,
    /// Units in one token: the period in nanoseconds.
    unit: u128,
    /// Units added per elapsed nanosecond: messagesPerPeriod.
    per_nano: u128,
    /// Bucket size in units.
    cap: u128,
    /// Level in units as of `last`.
    level: u128,
    last: Instant,
}

impl SpikeArrest {
    /// A bucket for `rate` that starts full at `now`: an identifier never seen
    /// before has been idle forever.
    pub fn new(rate: Rate, now: Instant) -> Self {
        let unit = rate.period.as_nanos().max(1);
        let cap = u128::from(Self::bucket_for(rate)) * unit;
        SpikeArrest {
            rate,
            unit,
            per_nano: u128::from(rate.count),
            cap,
            level: cap,
            last: now,
        }
    }

    /// The bucket size Apigee derives (see [`gateway_bucket`]).
    pub fn bucket_for(rate: Rate) -> u64 {
        gateway_bucket(rate)
    }

    /// The rate this bucket enforces.
    pub fn rate(&self) -> Rate {
        self.rate
    }

    /// Whole tokens the bucket holds when full.
    pub fn bucket(&self) -> u64 {
        Self::bucket_for(self.rate)
    }

    /// The drip interval: one token every this long.
    pub fn interval(&self) -> Duration {
        self.rate.period / u32::try_from(self.rate.count).unwrap_or(u32::MAX)
    }

    fn level_at(&self, now: Instant) -> u128 {
        let elapsed = now.saturating_duration_since(self.last).as_nanos();
        self.level
            .saturating_add(elapsed.saturating_mul(self.per_nano))
            .min(self.cap)
    }

    /// Tokens in the bucket at `now`, with the fraction still dripping in.
    pub fn tokens(&self, now: Instant) -> f64 {
        self.level_at(now) as f64 / self.unit as f64
    }

    /// Whole tokens available at `now`.
    pub fn available(&self, now: Instant) -> u64 {
        u64::try_from(self.level_at(now) / self.unit).unwrap_or(u64::MAX)
    }

    /// Whether a request at `now` would pass, without taking a token:
    /// `Ok(whole tokens left after it)` or how long until a whole token is in.
    pub fn check(&self, now: Instant) -> Result<u64, RetryIn> {
        let level = self.level_at(now);
        if level >= self.unit {
            return Ok(u64::try_from((level - self.unit) / self.unit).unwrap_or(u64::MAX));
        }
        let missing = self.unit - level;
        let nanos = missing.div_ceil(self.per_nano);
        Err(RetryIn(Duration::from_nanos(
            u64::try_from(nanos).unwrap_or(u64::MAX),
        )))
    }

    /// Passes a request at `now` if a whole token is in the bucket, taking it.
    /// A refused request consumes nothing and is not queued.
    pub fn try_acquire(&mut self, now: Instant) -> Result<u64, RetryIn> {
        let remaining = self.check(now)?;
        if now > self.last {
            self.level = self.level_at(now);
            self.last = now;
        }
        self.level -= self.unit;
        Ok(remaining)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rate::Limit;

    fn rate(s: &str) -> Rate {
        s.parse::<Limit>().unwrap().rate().unwrap()
    }

    /// Fires `n` requests spread evenly from `start` over `over` (all at
    /// `start` when `over` is zero) and counts the ones that pass.
    fn spike(sa: &mut SpikeArrest, start: Instant, n: u32, over: Duration) -> u32 {
        (0..n)
            .filter(|&i| {
                let at = if n > 1 { over * i / (n - 1) } else { over };
                sa.try_acquire(start + at).is_ok()
            })
            .count() as u32
    }

    #[test]
    fn same_drip_different_bucket() {
        // docs/design.md's table: 30ps and 1800pm both drip every 33.3 ms, but hold
        // 3 and 180.
        let t0 = Instant::now();
        let a = SpikeArrest::new(rate("30ps"), t0);
        let b = SpikeArrest::new(rate("1800pm"), t0);
        assert_eq!(a.interval(), b.interval());
        assert_eq!(a.interval(), Duration::from_nanos(33_333_333));
        assert_eq!((a.bucket(), b.bucket()), (3, 180));
        // The "pm buys you 60x the burst" table.
        let buckets: Vec<_> = ["10ps", "600pm", "100ps", "6000pm", "5pm"]
            .iter()
            .map(|r| SpikeArrest::bucket_for(rate(r)))
            .collect();
        assert_eq!(buckets, [1, 60, 10, 600, 1]);
    }

    #[test]
    fn a_spike_of_60_over_40ms_passes_4_at_30ps_and_all_at_1800pm() {
        let t0 = Instant::now();
        let mut ps = SpikeArrest::new(rate("30ps"), t0);
        let mut pm = SpikeArrest::new(rate("1800pm"), t0);
        // Bucket of 3, plus the one token that dripped in during the burst.
        assert_eq!(spike(&mut ps, t0, 60, Duration::from_millis(40)), 4);
        assert_eq!(spike(&mut pm, t0, 60, Duration::from_millis(40)), 60);
    }

    #[test]
    fn idle_time_buys_burst_only_up_to_the_cap() {
        let t0 = Instant::now();
        let mut sa = SpikeArrest::new(rate("30ps"), t0);
        let later = t0 + Duration::from_secs(3600);
        assert_eq!(sa.available(later), 3);
        assert_eq!(spike(&mut sa, later, 10, Duration::ZERO), 3);
    }

    #[test]
    fn at_1800pm_a_spike_of_240_empties_the_bucket_then_a_2s_lull_refills_about_61() {
        let t0 = Instant::now();
        let mut sa = SpikeArrest::new(rate("1800pm"), t0);
        // All at once: exactly the full bucket passes, the rest is shed.
        assert_eq!(spike(&mut sa, t0, 240, Duration::ZERO), 180);
        assert_eq!(sa.available(t0), 0);

        // Spread over the 120 ms of the play-by-play in docs/design.md: the bucket plus
        // the ~3.6 tokens that dripped in meanwhile.
        let t1 = t0 + Duration::from_secs(3600);
        let mut sa = SpikeArrest::new(rate("1800pm"), t1);
        let passed = spike(&mut sa, t1, 240, Duration::from_millis(120));
        assert_eq!(passed, 183);
        let end = t1 + Duration::from_millis(120);
        assert!(sa.tokens(end) < 1.0, "the bucket is empty after the spike");

        // A 2 s lull drips 60 tokens; a 150 spike (over 40 ms) then finds ~61.
        let after = end + Duration::from_secs(2);
        assert_eq!(sa.available(after), 60);
        assert_eq!(spike(&mut sa, after, 150, Duration::from_millis(40)), 61);
    }

    #[test]
    fn a_polite_client_at_the_drip_rate_is_never_refused() {
        let t0 = Instant::now();
        let mut sa = SpikeArrest::new(rate("30ps"), t0);
        let level = sa.available(t0);
        for i in 0..1000u32 {
            let at = t0 + Duration::from_nanos(33_333_334) * i;
            assert!(sa.try_acquire(at).is_ok(), "call {i}");
        }
        // Level holds flat: it never drains below bucket - 1.
        assert!(sa.available(t0 + Duration::from_nanos(33_333_334) * 1000) >= level - 1);
    }

    #[test]
    fn a_refused_request_consumes_nothing_and_says_when_a_token_is_in() {
        let t0 = Instant::now();
        let mut sa = SpikeArrest::new(rate("30ps"), t0);
        assert_eq!(spike(&mut sa, t0, 3, Duration::ZERO), 3);
        let at = t0 + Duration::from_millis(10);
        let e = sa.try_acquire(at).unwrap_err();
        // 33.33 ms drip, 10 ms already in.
        assert_eq!(e.0, Duration::from_nanos(23_333_334));
        for _ in 0..100 {
            assert!(sa.try_acquire(at).is_err());
        }
        // Refusals took nothing: the token arrives on schedule.
        assert_eq!(sa.try_acquire(at + e.0), Ok(0));
    }

    #[test]
    fn reports_the_tokens_left_after_a_pass() {
        let t0 = Instant::now();
        let mut sa = SpikeArrest::new(rate("1800pm"), t0);
        assert_eq!(sa.check(t0), Ok(179));
        assert_eq!(sa.try_acquire(t0), Ok(179));
        assert_eq!(sa.try_acquire(t0), Ok(178));
    }
}
