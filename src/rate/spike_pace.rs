//! Pacing to an Apigee SpikeArrest gateway: a client-side mirror of
//! `SpikeArrest` (the sim's `sim::model::spike_arrest`) (one token every
//! `period / messagesPerPeriod`, a bucket of 10% of messagesPerPeriod, at
//! least 1) that stays safe when network latency moves arrivals around.
//!
//! # Why exact mirroring is not enough
//!
//! A client that sends exactly when its own copy of the gateway's bucket
//! holds a token is safe only if every call arrives a fixed delay after its
//! send. Real arrivals land anywhere between send and response: two calls
//! sent one interval apart can arrive together, and a clump of `bucket + 1`
//! arrivals is refused. The gateway accepts every arrival exactly when, for
//! every run of consecutive arrivals from `a_i` to `a_j`,
//! `count ≤ bucket + (a_j − a_i) / interval`.
//!
//! # The rule
//!
//! A mirrored bucket whose drip can never pay back a call that has not been
//! answered yet. In numbers: the debt is the calls sent less the tokens
//! dripped back, a call may start when the debt is at most `bucket − 1`,
//! and the tokens dripped back never outnumber the calls already answered.
//!
//! # Why the gateway never refuses
//!
//! The drip pays back at most `(y − x) / interval` between any two instants
//! x ≤ y, and by y it has paid back at most the calls answered before x
//! plus that. So the calls sent by y and not answered before x, that is
//! every call whose send-to-response span meets [x, y], number at most
//! `bucket + (y − x) / interval`. Any run of arrivals from `a_i` to `a_j`
//! consists of such calls (each arrived between its send and its
//! response), which is the gateway's condition above. The gateway must see
//! only this client under that identifier, and have a full bucket when the
//! first call arrives (an identifier it has not seen for a full bucket's
//! drip).
//!
//! # The margin
//!
//! The price of that guarantee is that no more than `bucket` calls can be
//! in flight: the rate is the gateway's while a round trip stays under
//! `bucket × interval` (100 ms at 30ps with a bucket of 3, 6 s at 1800pm),
//! and `bucket / RTT` beyond. With no latency at all it is exactly the
//! gateway's bucket. The level is kept in the gateway's own exact integer
//! units, so no rounding can make it more generous than the gateway.

use std::time::{Duration, Instant};

use super::Rate;

/// The bucket size an Apigee SpikeArrest gateway derives from its rate:
/// 10% of messagesPerPeriod, at least 1 (the seed's figure: `30ps` holds
/// 3, `1800pm` 180). The client mirrors it; the sim's gateway keeps it.
pub fn gateway_bucket(rate: Rate) -> u64 {
    (rate.count / 10).max(1)
}

/// The client's mirror of one SpikeArrest identifier's bucket. Pure: every
/// method takes the time it acts at.
#[derive(Debug, Clone)]
pub struct SpikePace {
    rate: Rate,
    /// Units in one token: the period in nanoseconds.
    unit: u128,
    /// Units dripped back per nanosecond: messagesPerPeriod.
    per_nano: u128,
    /// Whole tokens the gateway's bucket holds.
    bucket: u64,
    /// Calls sent and not yet dripped back, in units, as of `last`.
    debt: u128,
    /// Calls sent and not yet answered: the drip cannot pay these back.
    in_flight: u64,
    last: Instant,
    paused_until: Option<Instant>,
}

impl SpikePace {
    /// A mirror with a full bucket at `now`, as the gateway has for an
    /// identifier it has not seen lately.
    pub fn new(rate: Rate, now: Instant) -> SpikePace {
        let unit = rate.period.as_nanos().max(1);
        SpikePace {
            rate,
            unit,
            per_nano: u128::from(rate.count.max(1)),
            bucket: gateway_bucket(rate),
            debt: 0,
            in_flight: 0,
            last: now,
            paused_until: None,
        }
    }

    /// A mirror with an empty bucket at `now`: for a job resumed soon after
    /// an earlier run, which may have spent the gateway's bucket.
    pub fn new_empty(rate: Rate, now: Instant) -> SpikePace {
        let mut p = SpikePace::new(rate, now);
        p.debt = u128::from(p.bucket) * p.unit;
        p
    }

    /// The rate mirrored (messagesPerPeriod per period).
    pub fn rate(&self) -> Rate {
        self.rate
    }

    /// Whole tokens the gateway's bucket holds.
    pub fn bucket(&self) -> u64 {
        self.bucket
    }

    /// Calls sent and not yet answered.
    pub fn in_flight(&self) -> u64 {
        self.in_flight
    }

    /// When the current pause ends, if one is in force at `now`.
    pub fn paused_until(&self, now: Instant) -> Option<Instant> {
        self.paused_until.filter(|&u| u > now)
    }

    fn advance(&mut self, now: Instant) {
        if now <= self.last {
            return;
        }
        let dripped = now
            .duration_since(self.last)
            .as_nanos()
            .saturating_mul(self.per_nano);
        let floor = u128::from(self.in_flight) * self.unit;
        self.debt = self.debt.saturating_sub(dripped).max(floor);
        self.last = now;
    }

    /// Claims a call starting at `now`, or says when to look again. The
    /// instant is never later than the earliest the answer could change:
    /// a call answered meanwhile only lets the drip resume from then, so a
    /// waiter that also wakes on completions loses nothing.
    pub fn try_take(&mut self, now: Instant) -> Result<(), Instant> {
        self.advance(now);
        if let Some(u) = self.paused_until(now) {
            return Err(u);
        }
        let room = u128::from(self.bucket - 1) * self.unit;
        if self.debt <= room {
            self.debt += self.unit;
            self.in_flight += 1;
            return Ok(());
        }
        let nanos = (self.debt - room).div_ceil(self.per_nano);
        let wait = Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX));
        Err(now
            .checked_add(wait)
            .or_else(|| now.checked_add(Duration::from_secs(365 * 86_400)))
            .unwrap_or(now))
    }

    /// A call's response arrived (or it gave up) at `arrived`: the drip
    /// may pay it back from then on.
    pub fn complete(&mut self, arrived: Instant) {
        // Earlier than a moment already accounted for (clocks read out of
        // order across threads) counts as that moment: later is the safe
        // side.
        self.advance(arrived);
        self.in_flight = self.in_flight.saturating_sub(1);
    }

    /// A call taken was never sent: as if it had not been taken.
    pub fn cancel(&mut self) {
        if self.in_flight > 0 {
            self.in_flight -= 1;
            self.debt = self.debt.saturating_sub(self.unit);
        }
    }

    /// A rate-limit 429: no call starts before `until`, and the bucket
    /// starts refilling only then, from empty (the gateway's is empty, or
    /// it would not have refused), so nobody bursts when the pause ends.
    pub fn pause_until(&mut self, until: Instant, now: Instant) {
        self.advance(now);
        let until = self.paused_until.map_or(until, |p| p.max(until));
        self.paused_until = Some(until);
        let pause = until
            .saturating_duration_since(now)
            .as_nanos()
            .saturating_mul(self.per_nano);
        let empty_then = (u128::from(self.bucket) * self.unit).saturating_add(pause);
        self.debt = self.debt.max(empty_then);
    }

    /// Follows a lower messagesPerPeriod the server reports for the same
    /// period. Never grows. Returns whether it changed.
    pub fn shrink_to(&mut self, count: u64, now: Instant) -> bool {
        let count = count.max(1);
        if count >= self.rate.count {
            return false;
        }
        self.advance(now);
        self.rate.count = count;
        self.per_nano = u128::from(count);
        self.bucket = gateway_bucket(self.rate);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rate::testing::{drive, fates, Client, Fate};
    use crate::rate::Limit;
    use crate::sim::model::spike_arrest::SpikeArrest;
    use proptest::prelude::*;

    fn rate(s: &str) -> Rate {
        s.parse::<Limit>().unwrap().rate().unwrap()
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn with_no_latency_it_is_exactly_the_gateways_bucket() {
        let t0 = Instant::now();
        for r in ["30ps", "1800pm", "5pm", "10ps"] {
            let mut p = SpikePace::new(rate(r), t0);
            let mut g = SpikeArrest::new(rate(r), t0);
            let mut now = t0;
            let mut sent = 0;
            while sent < 400 {
                match p.try_take(now) {
                    Ok(()) => {
                        assert!(g.try_acquire(now).is_ok(), "{r}: refused call {sent}");
                        p.complete(now);
                        sent += 1;
                    }
                    Err(at) => {
                        // Not a nanosecond early: the gateway would refuse.
                        let before = at - Duration::from_nanos(1);
                        assert!(g.check(before).is_err(), "{r}: waited too long");
                        now = at;
                    }
                }
            }
        }
    }

    #[test]
    fn the_burst_is_the_gateways_then_one_per_interval() {
        let t0 = Instant::now();
        let mut p = SpikePace::new(rate("1800pm"), t0);
        for _ in 0..180 {
            p.try_take(t0).unwrap();
            p.complete(t0);
        }
        let next = p.try_take(t0).unwrap_err();
        assert_eq!(next - t0, Duration::from_nanos(33_333_334));
    }

    #[test]
    fn calls_in_flight_are_not_paid_back() {
        let t0 = Instant::now();
        let mut p = SpikePace::new(rate("30ps"), t0);
        for _ in 0..3 {
            p.try_take(t0).unwrap();
        }
        // A second later the drip would have refilled 30 tokens, but all
        // three calls are still unanswered: they could all still arrive in
        // one clump with the next.
        let later = t0 + Duration::from_secs(1);
        assert!(p.try_take(later).is_err());
        p.complete(later);
        // Answered now: its token drips back one interval from now.
        let at = p.try_take(later).unwrap_err();
        assert_eq!(at - later, Duration::from_nanos(33_333_334));
        assert!(p.try_take(at).is_ok());
    }

    #[test]
    fn a_call_never_sent_gives_its_token_back() {
        let t0 = Instant::now();
        let mut p = SpikePace::new(rate("30ps"), t0);
        for _ in 0..3 {
            p.try_take(t0).unwrap();
        }
        assert!(p.try_take(t0).is_err());
        p.cancel();
        assert_eq!(p.in_flight(), 2);
        assert!(p.try_take(t0).is_ok());
    }

    #[test]
    fn a_pause_holds_and_the_bucket_refills_only_after_it() {
        let t0 = Instant::now();
        let mut p = SpikePace::new(rate("1800pm"), t0);
        p.pause_until(t0 + Duration::from_secs(2), t0);
        assert_eq!(p.paused_until(t0), Some(t0 + Duration::from_secs(2)));
        assert_eq!(p.try_take(t0 + ms(100)), Err(t0 + Duration::from_secs(2)));
        let end = t0 + Duration::from_secs(2);
        let next = p.try_take(end).unwrap_err();
        assert_eq!(next - end, Duration::from_nanos(33_333_334));
    }

    #[test]
    fn a_resumed_job_starts_with_an_empty_bucket() {
        let t0 = Instant::now();
        let mut p = SpikePace::new_empty(rate("30ps"), t0);
        assert!(p.try_take(t0).is_err());
        assert!(p.try_take(t0 + ms(34)).is_ok());
    }

    #[test]
    fn a_lower_reported_rate_slows_the_drip() {
        let t0 = Instant::now();
        let mut p = SpikePace::new(rate("100ps"), t0);
        assert!(!p.shrink_to(100, t0));
        assert!(p.shrink_to(10, t0));
        assert_eq!(p.bucket(), 1);
        p.try_take(t0).unwrap();
        p.complete(t0);
        assert_eq!(p.try_take(t0), Err(t0 + ms(100)));
    }

    impl Client for SpikePace {
        type Slot = ();
        fn try_take(&mut self, now: Instant) -> Result<(), Instant> {
            SpikePace::try_take(self, now)
        }
        fn complete(&mut self, _: (), at: Instant, _refused: bool) {
            SpikePace::complete(self, at);
        }
        fn cancel(&mut self, _: ()) {
            SpikePace::cancel(self);
        }
    }

    /// A SpikeArrest rate and fates whose round trips reach several times
    /// the time the bucket takes to fill.
    fn scenario() -> impl Strategy<Value = (Rate, Vec<Fate>)> {
        let period = prop_oneof![
            Just(Duration::from_secs(1)),
            Just(Duration::from_secs(60)),
            (50u64..=5000).prop_map(ms),
        ];
        (1u64..=300, period, 0u32..=400).prop_flat_map(|(count, period, pct)| {
            let r = Rate { count, period };
            let fill = period / u32::try_from(count).unwrap_or(1)
                * u32::try_from(SpikeArrest::bucket_for(r)).unwrap_or(1);
            (Just(r), fates(150, fill * pct / 100))
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn the_gateway_never_refuses_whatever_the_transit(
            (r, fates) in scenario(),
            workers in 1usize..=8,
        ) {
            let t0 = Instant::now();
            // The gateway starts full: it has not seen the identifier lately.
            let mut gateway = SpikeArrest::new(r, t0);
            let mut p = SpikePace::new(r, t0);
            let calls = drive(&mut p, workers, &fates, t0, &mut |at| {
                gateway.try_acquire(at).is_ok()
            });
            let refused = calls.iter().filter(|c| c.refused).count();
            prop_assert_eq!(refused, 0, "{} of {} refused at {}", refused, calls.len(), r);
        }
    }
}
