//! The sim's whole state as plain structs over an injected clock: per-key
//! pace ([`limiter`]), the account's credits ([`account`]), the idempotency
//! store ([`idempotency`]), the fault dice ([`faults`]) and the counters
//! behind `/admin/stats` ([`stats`]), composed here by [`Model`].
//!
//! Every method takes `now` and nothing here sleeps or reads a clock, so the
//! behaviour docs/design.md describes is unit-tested on fake time. The HTTP layer
//! (`sim::server`) calls [`Model::admit`] once per metered request, and then
//! exactly one of [`Model::complete`], [`Model::fail`] or [`Model::abandon`]
//! with the [`Ticket`] it got, so a slot, a credit reservation or an
//! idempotency claim can never leak.

mod account;
mod admission;
mod arrivals;
mod batch;
mod config;
mod faults;
pub mod fixed_window;
pub mod gcra;
mod idempotency;
mod limiter;
pub mod policy;
pub mod refusals;
#[cfg(test)]
mod shape_props;
#[cfg(test)]
mod shape_tests;
pub mod sliding_window;
pub mod spike_arrest;
mod stats;
#[cfg(test)]
mod testkit;
pub mod usage;
pub mod weighted_window;

use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use axum::body::Bytes;

use account::Account;
pub use admission::{Admission, CreditView, Faults, PolicyView, RateInfo, Rejection, Ticket};
use arrivals::ArrivalLog;
pub use batch::Settled;
pub use config::{Config, Dialect, ModelKind};
use faults::Dice;
use idempotency::{Found, IdemStore};
use limiter::{Keys, Refusal};
pub use policy::{PolicyStats, Tokens};
pub use stats::Stats;

/// A step of [`Model::admit`]: go on with a value, or answer at once.
type Step<T> = ControlFlow<Admission, T>;

/// The sim's state. See the module docs.
pub struct Model {
    cfg: Config,
    keys: Keys,
    account: Account,
    idem: IdemStore,
    dice: Dice,
    arrivals: ArrivalLog,
    stats: Stats,
}

impl Model {
    /// A fresh account at `now`, which is `unix_now` since the Unix epoch on
    /// the wall clock (only used to print `x-api-renewal`).
    pub fn new(cfg: Config, now: Instant, unix_now: Duration) -> Self {
        Model {
            account: Account::new(cfg.credits, cfg.renewal_in, now, unix_now),
            idem: IdemStore::new(cfg.idempotency_ttl),
            dice: Dice::new(&cfg),
            arrivals: ArrivalLog::new(now, arrivals::MAX_ARRIVALS),
            keys: Keys::new(now),
            stats: Stats {
                policies: cfg.policies.iter().map(PolicyStats::of).collect(),
                ..Stats::default()
            },
            cfg,
        }
    }

    /// The configuration in force.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Whether a policy counts tokens: then requests are weighed by their
    /// tokens and answers carry their `usage`.
    pub fn keeps_tokens(&self) -> bool {
        self.cfg.policies.iter().any(|p| p.unit.is_tokens())
    }

    /// The credit headers as they stand.
    pub fn credits(&mut self, now: Instant) -> CreditView {
        self.account.roll(now);
        self.account.view()
    }

    /// What one successful call to `endpoint` costs.
    pub fn cost_of(&self, endpoint: &str) -> u64 {
        self.cfg
            .costs
            .get(endpoint)
            .copied()
            .unwrap_or(self.cfg.default_cost)
    }

    /// Decides a metered request of API key `key` to `endpoint`, with an
    /// optional `Idempotency-Key`, arriving at `now`.
    ///
    /// The checks run in this order: cooldown, concurrency, rate, idempotent
    /// replay, credits. Only requests that pass them all are recorded in the
    /// key's window: a refused request never counts against the limit.
    /// (Authentication is the server's: a request without a key never gets
    /// here.) `--rate-limit-forever` refuses before every check, and
    /// `--secret-limit` strips the rate headers from the verdict.
    pub fn admit(
        &mut self,
        key: &str,
        endpoint: &str,
        idem: Option<&str>,
        now: Instant,
    ) -> Admission {
        self.admit_tokens(key, endpoint, idem, Tokens::default(), now)
    }

    /// [`Model::admit`] for a request of `tokens`: refused if a token policy
    /// cannot take `tokens.estimate`, charged `tokens.charged` if admitted.
    pub fn admit_tokens(
        &mut self,
        key: &str,
        endpoint: &str,
        idem: Option<&str>,
        tokens: Tokens,
        now: Instant,
    ) -> Admission {
        let (ControlFlow::Break(a) | ControlFlow::Continue(a)) =
            self.decide(key, endpoint, idem, tokens, now);
        // The default headers state the first policy, which is unstated.
        if self.cfg.secret_limit || self.cfg.secret_first {
            a.without_rate()
        } else {
            a
        }
    }

    fn decide(
        &mut self,
        key: &str,
        endpoint: &str,
        idem: Option<&str>,
        tokens: Tokens,
        now: Instant,
    ) -> Step<Admission> {
        self.stats.requests += 1;
        self.account.roll(now);
        let credits = self.account.view();
        let rate = match self.pace(key, tokens, now) {
            Ok(rate) => rate,
            Err(refusal) => return ControlFlow::Break(self.refuse(refusal, credits)),
        };
        let scoped = idem.map(|i| IdemStore::scoped(key, i));
        if let Some(k) = &scoped {
            self.replay(key, k, rate, credits, now)?;
        }
        let cost = self.cost_of(endpoint);
        self.check_credits(cost, rate)?;
        ControlFlow::Continue(self.accept(key, cost, tokens, scoped, rate, now))
    }

    /// The per-key checks in order: cooldown, concurrency, rate. Returns the
    /// rate headers of a request that fits.
    fn pace(
        &mut self,
        key: &str,
        tokens: Tokens,
        now: Instant,
    ) -> Result<Option<RateInfo>, Refusal> {
        let (cooldown, ceiling) = (self.cfg.cooldown, self.cfg.concurrency);
        let st = self.keys.entry(&self.cfg, key, now, &mut self.stats.keys);
        if self.cfg.rate_limit_forever {
            return Err(st.refuse_forever());
        }
        st.check_cooldown(cooldown, now)?;
        st.check_concurrency(ceiling, now)?;
        st.check_rate(cooldown, tokens, now)
    }

    /// Counts a refusal and renders it with the credit headers.
    fn refuse(&mut self, (why, rate): Refusal, credits: CreditView) -> Admission {
        let counter = match why {
            Rejection::Cooldown { .. } => &mut self.stats.rejected_cooldown,
            Rejection::Concurrency { .. } => &mut self.stats.rejected_concurrency,
            Rejection::Rate { .. } => &mut self.stats.rejected_rate,
            Rejection::Conflict => &mut self.stats.rejected_conflict,
            Rejection::Credits { .. } => &mut self.stats.rejected_credits,
        };
        *counter += 1;
        Admission::Rejected { why, rate, credits }
    }

    /// Idempotent replay: a stored response is answered (and counted in the
    /// window, uncharged); a key still executing is a conflict.
    fn replay(
        &mut self,
        key: &str,
        scoped: &str,
        rate: Option<RateInfo>,
        credits: CreditView,
        now: Instant,
    ) -> Step<()> {
        match self.idem.lookup(scoped, now) {
            None => ControlFlow::Continue(()),
            Some(Found::Done(body)) => {
                // A replay counts as a call but runs nothing: no tokens.
                self.record(key, Tokens::default(), now);
                self.stats.accepted += 1;
                self.stats.idempotent_replays += 1;
                ControlFlow::Break(Admission::Replay {
                    body,
                    rate,
                    credits,
                })
            }
            Some(Found::InProgress) => {
                let refusal = (Rejection::Conflict, not_counted(rate));
                ControlFlow::Break(self.refuse(refusal, credits))
            }
        }
    }

    /// Credits: the account must be able to pay `cost` now.
    fn check_credits(&mut self, cost: u64, rate: Option<RateInfo>) -> Step<()> {
        let balance = self.account.balance();
        if balance >= cost {
            return ControlFlow::Continue(());
        }
        let refusal = (Rejection::Credits { cost, balance }, not_counted(rate));
        let credits = self.account.shortfall_view(cost);
        ControlFlow::Break(self.refuse(refusal, credits))
    }

    /// Admitted: record, reserve the credits (refunded if it never executes),
    /// claim the slot and the idempotency key, draw the faults.
    fn accept(
        &mut self,
        key: &str,
        cost: u64,
        tokens: Tokens,
        scoped: Option<String>,
        rate: Option<RateInfo>,
        now: Instant,
    ) -> Admission {
        self.record(key, tokens, now);
        self.stats.accepted += 1;
        self.stats.tokens_charged += tokens.charged.total;
        self.account.reserve(cost);
        if let Some(k) = &scoped {
            self.idem.claim(k);
        }
        if let Some(st) = self.keys.get_mut(key) {
            st.in_flight += 1;
            self.stats.in_flight_max = self.stats.in_flight_max.max(st.in_flight as u64);
        }
        self.stats.in_flight += 1;
        Admission::Admitted {
            ticket: Ticket {
                key: key.to_string(),
                cost,
                idem: scoped,
            },
            rate,
            faults: self.dice.draw(),
        }
    }

    /// Records an accepted request in the key's window and updates
    /// `max_in_window`.
    fn record(&mut self, key: &str, tokens: Tokens, now: Instant) {
        let Some(st) = self.keys.get_mut(key) else {
            return;
        };
        let in_window = st.record(now, tokens, &mut self.stats.policies);
        self.stats.max_in_window = self.stats.max_in_window.max(in_window);
        self.arrivals.push(now);
    }

    /// Draws the `--latency-in` delay of a request about to be sent on, and
    /// counts it in `in_transit` until [`Model::transit_end`].
    pub fn transit_begin(&mut self) -> Duration {
        self.stats.in_transit += 1;
        self.dice.transit()
    }

    /// The request's transit-in delay is over (or its client went away).
    pub fn transit_end(&mut self) {
        self.stats.in_transit = self.stats.in_transit.saturating_sub(1);
    }

    /// When the requests that counted in a window arrived, oldest first, in
    /// milliseconds since the model started (at most the last two million).
    pub fn arrivals(&self) -> Vec<f64> {
        self.arrivals.snapshot()
    }

    fn release(&mut self, t: &Ticket) {
        if let Some(st) = self.keys.get_mut(&t.key) {
            st.in_flight = st.in_flight.saturating_sub(1);
        }
        self.stats.in_flight = self.stats.in_flight.saturating_sub(1);
    }

    fn refund(&mut self, t: &Ticket) {
        self.account.refund(t.cost);
        if let Some(k) = &t.idem {
            self.idem.release(k);
        }
    }

    /// The request executed and answered `body`: count the side effect, keep
    /// the charge, store the body for its idempotency key. Returns the credit
    /// headers after the charge.
    pub fn complete(&mut self, t: Ticket, body: Bytes, now: Instant) -> CreditView {
        self.release(&t);
        self.stats.side_effects += 1;
        if let Some(k) = t.idem {
            self.idem.store(k, body, now);
        }
        self.credits(now)
    }

    /// An injected 503: nothing executed, so the reservation is refunded and
    /// the idempotency key freed for a retry.
    pub fn fail(&mut self, t: Ticket, now: Instant) -> CreditView {
        self.release(&t);
        self.refund(&t);
        self.stats.injected_failures += 1;
        self.credits(now)
    }

    /// The client went away before the request executed.
    pub fn abandon(&mut self, t: Ticket) {
        self.release(&t);
        self.refund(&t);
        self.stats.abandoned += 1;
    }

    /// Counts a connection dropped after executing.
    pub fn note_reset(&mut self) {
        self.stats.resets += 1;
    }

    /// Counts a metered request refused for a missing API key.
    pub fn note_unauthorized(&mut self) {
        self.stats.requests += 1;
        self.stats.rejected_auth += 1;
    }

    /// Counts a metered request refused by `--refuse` (before admission).
    pub fn note_refused(&mut self) {
        self.stats.requests += 1;
        self.stats.rejected_refused += 1;
    }

    /// Counts a metered request refused as unreadable.
    pub fn note_bad_request(&mut self) {
        self.stats.requests += 1;
        self.stats.rejected_bad_request += 1;
    }

    /// Counts a request to an unknown path.
    pub fn note_not_found(&mut self) {
        self.stats.not_found += 1;
    }

    /// Adds `n` credits to this cycle's balance and allowance.
    pub fn topup(&mut self, n: u64, now: Instant) -> CreditView {
        self.account.topup(n, now)
    }

    /// Starts a new billing cycle now: used back to 0, the balance back to the
    /// base allowance (top-ups belonged to the old cycle), and `x-api-renewal`
    /// moved strictly later.
    pub fn renew(&mut self, now: Instant) -> CreditView {
        self.account.renew(now)
    }

    /// The counters, with the credit fields as of `now`.
    pub fn stats(&mut self, now: Instant) -> Stats {
        self.account.roll(now);
        let a = &self.account;
        Stats {
            credits_remaining: a.balance(),
            credits_used: a.used(),
            max_credits: a.allowance(),
            renewal: a.renewal_unix(),
            renewals: a.renewals(),
            ..self.stats.clone()
        }
    }

    /// Accepted requests of `key` inside its window at `now` (0 for a key
    /// never seen or without a limit).
    pub fn in_window(&self, key: &str, now: Instant) -> u64 {
        self.keys.get(key).map_or(0, |st| st.in_window(now))
    }
}

impl Model {
    /// Every limit of `key` as of `now`, for the header dialects: none for
    /// a key never seen, without a limit, or under `--secret-limit`.
    pub fn policies(&self, key: &str, now: Instant) -> Vec<PolicyView> {
        if self.cfg.secret_limit {
            return Vec::new();
        }
        let skip = usize::from(self.cfg.secret_first);
        self.keys.get(key).map_or_else(Vec::new, |st| {
            st.policies(now).into_iter().skip(skip).collect()
        })
    }
}

/// The rate headers of a refusal that came after the rate check passed: the
/// request does not count, so the slot it would have taken is still free.
fn not_counted(rate: Option<RateInfo>) -> Option<RateInfo> {
    rate.map(|r| RateInfo {
        remaining: r.remaining + 1,
        ..r
    })
}

#[cfg(test)]
mod tests {
    use super::testkit::*;
    use super::*;

    #[test]
    fn absurd_durations_do_not_overflow() {
        let (mut m, t0) = model(Config {
            cooldown: Duration::MAX,
            renewal_in: Duration::MAX,
            idempotency_ttl: Duration::MAX,
            ..cfg("1/1s")
        });
        assert!(executed(&call_idem(&mut m, "k", Some("i"), t0)));
        assert!(matches!(
            rejection(&call(&mut m, "k", t0)),
            Some(Rejection::Rate { .. })
        ));
        let a = call(&mut m, "k", t0 + secs(3600));
        assert!(matches!(rejection(&a), Some(Rejection::Cooldown { .. })));
        assert_eq!(credits(&a).renewal, u64::MAX);
        let _ = m.renew(t0);
    }

    #[test]
    fn the_request_counters_partition_the_requests() {
        let (mut m, t0) = model(Config {
            credits: 4,
            concurrency: 1,
            cooldown: secs(5),
            ..cfg("3/1m")
        });
        m.note_unauthorized();
        m.note_bad_request();
        let Admission::Admitted { ticket, .. } = m.admit("k", "echo", Some("i"), t0) else {
            panic!()
        };
        let _ = m.admit("k", "echo", None, t0); // concurrency
        let _ = m.complete(ticket, Bytes::new(), t0);
        let _ = call_idem(&mut m, "k", Some("i"), t0); // replay
        let _ = call(&mut m, "k", t0);
        let _ = call(&mut m, "k", t0); // rate
        let _ = call(&mut m, "k", t0); // cooldown
        for _ in 0..4 {
            let _ = call(&mut m, "k2", t0);
        }
        let s = m.stats(t0);
        let parts = s.rejected_auth
            + s.rejected_bad_request
            + s.rejected_cooldown
            + s.rejected_concurrency
            + s.rejected_rate
            + s.rejected_conflict
            + s.rejected_credits
            + s.rejected_refused
            + s.accepted;
        assert_eq!(parts, s.requests);
        assert_eq!(
            s.accepted,
            s.side_effects + s.idempotent_replays + s.injected_failures + s.abandoned + s.in_flight
        );
        assert_eq!(s.rejected_credits, 2, "{s:?}");
    }

    #[test]
    fn a_secret_limit_is_enforced_without_rate_headers() {
        let (mut m, t0) = model(Config {
            secret_limit: true,
            cooldown: secs(5),
            ..cfg("2/10s")
        });
        let outs = [
            call(&mut m, "k", t0),
            call_idem(&mut m, "k", Some("i"), t0),
            call(&mut m, "k", t0),
            call(&mut m, "k", t0),
        ];
        assert!(executed(&outs[0]) && executed(&outs[1]));
        assert_eq!(
            rejection(&outs[2]),
            Some(&Rejection::Rate { retry_after: 10 })
        );
        assert_eq!(
            rejection(&outs[3]),
            Some(&Rejection::Cooldown { retry_after: 5 })
        );
        assert!(outs.iter().all(|o| rate(o).is_none()), "{outs:?}");
        // A replay, once the window has room, carries none either.
        let a = call_idem(&mut m, "k", Some("i"), t0 + secs(10));
        assert!(matches!(a, Out::Replayed { rate: None, .. }), "{a:?}");
        let s = m.stats(t0 + secs(10));
        assert_eq!((s.accepted, s.rejected_rate, s.max_in_window), (3, 1, 2));
    }

    #[test]
    fn arrivals_are_the_requests_that_counted_in_a_window() {
        let (mut m, t0) = model(Config {
            cooldown: Duration::ZERO,
            ..cfg("2/1s")
        });
        assert!(executed(&call_idem(&mut m, "k", Some("i"), t0 + ms(5))));
        assert!(!executed(&call_idem(&mut m, "k", Some("i"), t0 + ms(250))));
        assert!(rejection(&call(&mut m, "k", t0 + ms(500))).is_some());
        assert!(executed(&call(&mut m, "k2", t0 + ms(1500))));
        assert_eq!(m.arrivals(), [5.0, 250.0, 1500.0]);
    }
}
