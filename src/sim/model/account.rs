//! The account: one credit balance shared by every key, its billing cycle,
//! reservations at admission and refunds for calls that never executed.

use std::time::{Duration, Instant};

use super::admission::CreditView;
use crate::sim::model::sliding_window::ceil_secs;

pub(super) struct Account {
    /// `--credits`: what every cycle starts with.
    base: u64,
    /// `--renewal-in`: how long a cycle lasts.
    cycle_len: Duration,
    allowance: u64,
    used: u64,
    remaining: u64,
    /// When this cycle started; it renews `cycle_len` later.
    cycle_start: Instant,
    renewal_unix: u64,
    /// Cycles started after the first.
    renewals: u64,
    /// The model's start, and the wall clock then (only to print
    /// `x-api-renewal`).
    epoch: Instant,
    epoch_unix: Duration,
}

impl Account {
    /// A fresh account at `now`, which is `unix_now` on the wall clock.
    pub(super) fn new(base: u64, cycle_len: Duration, now: Instant, unix_now: Duration) -> Self {
        let mut a = Account {
            base,
            cycle_len,
            allowance: base,
            used: 0,
            remaining: base,
            cycle_start: now,
            renewal_unix: 0,
            renewals: 0,
            epoch: now,
            epoch_unix: unix_now,
        };
        a.start_cycle(now);
        a
    }

    /// Unix seconds (rounded up) of `at` plus `later`, saturating instead of
    /// overflowing on absurd durations.
    fn unix_secs(&self, at: Instant, later: Duration) -> u64 {
        let t = if at >= self.epoch {
            self.epoch_unix.saturating_add(at - self.epoch)
        } else {
            self.epoch_unix.saturating_sub(self.epoch - at)
        };
        ceil_secs(t.saturating_add(later))
    }

    fn start_cycle(&mut self, now: Instant) {
        self.allowance = self.base;
        self.used = 0;
        self.remaining = self.base;
        self.cycle_start = now;
        // Clients detect a new cycle by x-api-renewal changing, so it must
        // move even when two renewals fall in the same second.
        let unix = self.unix_secs(now, self.cycle_len);
        self.renewal_unix = unix.max(self.renewal_unix.saturating_add(1));
    }

    /// Renews the cycle if it has run out by `now`.
    pub(super) fn roll(&mut self, now: Instant) {
        if now.saturating_duration_since(self.cycle_start) >= self.cycle_len {
            self.start_cycle(now);
            self.renewals += 1;
        }
    }

    /// The credit headers as they stand (call [`Account::roll`] first).
    pub(super) fn view(&self) -> CreditView {
        CreditView {
            remaining: i64::try_from(self.remaining).unwrap_or(i64::MAX),
            used: self.used,
            max: self.allowance,
            renewal: self.renewal_unix,
        }
    }

    /// The balance left this cycle.
    pub(super) fn balance(&self) -> u64 {
        self.remaining
    }

    /// Credits spent this cycle.
    pub(super) fn used(&self) -> u64 {
        self.used
    }

    /// This cycle's allowance.
    pub(super) fn allowance(&self) -> u64 {
        self.allowance
    }

    /// Unix seconds when this cycle renews.
    pub(super) fn renewal_unix(&self) -> u64 {
        self.renewal_unix
    }

    /// Cycles started after the first.
    pub(super) fn renewals(&self) -> u64 {
        self.renewals
    }

    /// The credit headers of a credits-exhausted 429 for a call of `cost`.
    ///
    /// The credit-exhaustion signal (docs/design.md) is a 429 whose remaining header
    /// reads zero or below: an empty account says 0, one that merely cannot
    /// afford this endpoint says the shortfall.
    pub(super) fn shortfall_view(&self, cost: u64) -> CreditView {
        let balance = self.remaining;
        let shown = if balance == 0 {
            0
        } else {
            balance as i64 - cost.min(i64::MAX as u64) as i64
        };
        CreditView {
            remaining: shown,
            ..self.view()
        }
    }

    /// Charges `cost` up front; refunded if the call never executes.
    pub(super) fn reserve(&mut self, cost: u64) {
        // Saturating: absurd --cost or top-up values must not panic the sim.
        self.remaining = self.remaining.saturating_sub(cost);
        self.used = self.used.saturating_add(cost);
    }

    /// Gives back a reservation of `cost`.
    pub(super) fn refund(&mut self, cost: u64) {
        // A renewal in between already reset the meter; don't over-refund.
        let back = cost.min(self.used);
        self.used -= back;
        self.remaining = self.remaining.saturating_add(back);
    }

    /// Adds `n` credits to this cycle's balance and allowance.
    pub(super) fn topup(&mut self, n: u64, now: Instant) -> CreditView {
        self.roll(now);
        self.remaining = self.remaining.saturating_add(n);
        self.allowance = self.allowance.saturating_add(n);
        self.view()
    }

    /// Starts a new cycle now.
    pub(super) fn renew(&mut self, now: Instant) -> CreditView {
        self.start_cycle(now);
        self.renewals += 1;
        self.view()
    }
}

#[cfg(test)]
mod tests {
    use super::super::testkit::*;
    use super::super::*;

    #[test]
    fn credits_are_charged_per_endpoint_and_exhaustion_is_its_own_429() {
        let mut c = Config {
            credits: 3,
            ..cfg("none")
        };
        c.costs.insert("pricey".into(), 2);
        let (mut m, t0) = model(c);
        let renewal = m.credits(t0).renewal;
        assert_eq!(renewal, 1_800_000_000 + 30 * 86_400);

        let Admission::Admitted { ticket, .. } = m.admit("k", "pricey", None, t0) else {
            panic!()
        };
        let cv = m.complete(ticket, Bytes::new(), t0);
        assert_eq!((cv.remaining, cv.used, cv.max), (1, 2, 3));

        // 1 left, 2 needed: refused, the header shows the shortfall.
        let Admission::Rejected {
            why, credits: cv, ..
        } = m.admit("k", "pricey", None, t0)
        else {
            panic!("admitted without credits")
        };
        assert_eq!(
            why,
            Rejection::Credits {
                cost: 2,
                balance: 1
            }
        );
        assert_eq!(cv.remaining, -1);

        // A 1-credit endpoint still works, then the account is empty.
        assert!(executed(&call(&mut m, "k", t0)));
        let a = call(&mut m, "k", t0);
        assert_eq!((credits(&a).remaining, credits(&a).used), (0, 3));
        assert!(matches!(rejection(&a), Some(Rejection::Credits { .. })));

        // Top-up raises the balance and the allowance at once.
        let cv = m.topup(10, t0);
        assert_eq!((cv.remaining, cv.used, cv.max), (10, 3, 13));
        assert!(executed(&call(&mut m, "k", t0)));

        // Renew: used back to 0, balance to the base allowance, renewal moves
        // strictly later even within the same second.
        let cv = m.renew(t0);
        assert_eq!((cv.remaining, cv.used, cv.max), (3, 0, 3));
        assert!(cv.renewal > renewal);
        let again = m.renew(t0).renewal;
        assert!(again > cv.renewal);

        let s = m.stats(t0);
        assert_eq!((s.side_effects, s.rejected_credits, s.renewals), (3, 2, 2));
    }

    #[test]
    fn the_cycle_renews_by_itself() {
        let (mut m, t0) = model(Config {
            credits: 2,
            renewal_in: secs(10),
            ..cfg("none")
        });
        assert!(executed(&call(&mut m, "k", t0)));
        assert!(executed(&call(&mut m, "k", t0)));
        assert!(rejection(&call(&mut m, "k", t0 + secs(9))).is_some());
        let before = m.credits(t0).renewal;
        let a = call(&mut m, "k", t0 + secs(10));
        assert!(executed(&a));
        let cv = credits(&a);
        assert_eq!((cv.remaining, cv.used), (1, 1));
        assert_eq!(cv.renewal, before + 10);
    }

    #[test]
    fn a_rate_429_shows_a_positive_balance() {
        let (mut m, t0) = model(cfg("1/1m"));
        assert!(executed(&call(&mut m, "k", t0)));
        let a = call(&mut m, "k", t0);
        assert!(matches!(rejection(&a), Some(Rejection::Rate { .. })));
        assert_eq!(credits(&a).remaining, 99_999);
        let a = call(&mut m, "k", t0);
        assert!(matches!(rejection(&a), Some(Rejection::Cooldown { .. })));
        assert_eq!(credits(&a).remaining, 99_999);
    }

    #[test]
    fn exhausted_credits_are_not_counted_in_the_window() {
        let (mut m, t0) = model(Config {
            credits: 1,
            ..cfg("2/1m")
        });
        assert!(executed(&call(&mut m, "k", t0)));
        for _ in 0..5 {
            assert!(matches!(
                rejection(&call(&mut m, "k", t0)),
                Some(Rejection::Credits { .. })
            ));
        }
        let _ = m.topup(5, t0);
        assert!(executed(&call(&mut m, "k", t0)));
        assert_eq!(m.in_window("k", t0), 2);
    }
}
