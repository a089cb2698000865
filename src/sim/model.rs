//! The sim's whole state as one plain struct over an injected clock: per-key
//! rate limiters, cooldowns and concurrency counters, the account's credits,
//! the idempotency store, the fault dice and the counters behind
//! `/admin/stats`.
//!
//! Every method takes `now` and nothing here sleeps or reads a clock, so the
//! seeds' behaviour is unit-tested on fake time. The HTTP layer
//! (`sim::server`) calls [`Model::admit`] once per metered request, and then
//! exactly one of [`Model::complete`], [`Model::fail`] or [`Model::abandon`]
//! with the [`Ticket`] it got, so a slot, a credit reservation or an
//! idempotency claim can never leak.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use serde::Serialize;

use crate::rate::spike::SpikeArrest;
use crate::rate::window::{ceil_secs, SlidingWindow};
use crate::rate::{Limit, Rate};

/// Which server-side rate model limits each key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ModelKind {
    /// APIVerve-style: at most L accepted requests in any sliding window W,
    /// and an overrun starts a cooldown for the key.
    #[default]
    Window,
    /// Apigee SpikeArrest: a token bucket of 10% of messagesPerPeriod,
    /// dripping one token per period/messagesPerPeriod, no queue, no cooldown.
    SpikeArrest,
}

/// Everything the model needs to know, already validated.
#[derive(Debug, Clone)]
pub struct Config {
    /// Rate model for every key.
    pub kind: ModelKind,
    /// The plan's limit for every key (before per-key caps).
    pub limit: Limit,
    /// Requests in flight per key before 429 with `x-concurrency-limit`.
    pub concurrency: usize,
    /// Cooldown after a window overrun; zero disables it.
    pub cooldown: Duration,
    /// Per-key caps below the plan's limit (`--key-cap KEY=N`).
    pub key_caps: HashMap<String, u64>,
    /// The cycle's base allowance (`--credits`).
    pub credits: u64,
    /// Credits per successful call unless the endpoint has its own cost.
    pub default_cost: u64,
    /// Per-endpoint costs (`--cost NAME=N`).
    pub costs: HashMap<String, u64>,
    /// Length of a billing cycle.
    pub renewal_in: Duration,
    /// How long an idempotency key's stored response is kept.
    pub idempotency_ttl: Duration,
    /// Injected latency, uniform in `[lo, hi]`.
    pub latency: Option<(Duration, Duration)>,
    /// Probability that an admitted request gets a 503 instead of executing.
    pub fail_rate: f64,
    /// Probability that the connection is dropped after executing.
    pub reset_rate: f64,
    /// Seed of the fault dice.
    pub seed: u64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            kind: ModelKind::Window,
            limit: Limit::Rate(Rate {
                count: 60,
                period: Duration::from_secs(60),
            }),
            concurrency: 5,
            cooldown: Duration::from_secs(50),
            key_caps: HashMap::new(),
            credits: 100_000,
            default_cost: 1,
            costs: HashMap::new(),
            renewal_in: Duration::from_secs(30 * 86_400),
            idempotency_ttl: Duration::from_secs(86_400),
            latency: None,
            fail_rate: 0.0,
            reset_rate: 0.0,
            seed: 0,
        }
    }
}

/// The rate headers of a response: `x-rate-limit-limit` and
/// `x-rate-limit-remaining`. Absent when the key has no rate limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateInfo {
    /// The limit in force for this key (after its cap).
    pub limit: u64,
    /// What is left in the window (or whole tokens in the bucket).
    pub remaining: u64,
}

/// The four credit headers every metered response carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CreditView {
    /// `x-api-remaining-credits`: zero or below on a credits-exhausted 429.
    pub remaining: i64,
    /// `x-api-credits-used`.
    pub used: u64,
    /// `x-api-max-credits`: the cycle's allowance.
    pub max: u64,
    /// `x-api-renewal`: unix seconds when the cycle renews.
    pub renewal: u64,
}

/// Why a metered request was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rejection {
    /// The key is cooling down after a window overrun.
    Cooldown {
        /// Seconds left in the cooldown, rounded up.
        retry_after: u64,
    },
    /// The key already has `limit` requests in flight.
    Concurrency {
        /// The ceiling (`x-concurrency-limit`).
        limit: usize,
    },
    /// The rate model refused it.
    Rate {
        /// Seconds until it would fit, rounded up, at least 1.
        retry_after: u64,
    },
    /// The same idempotency key is still executing.
    Conflict,
    /// The account cannot pay for the call.
    Credits {
        /// This endpoint's cost.
        cost: u64,
        /// The balance that fell short.
        balance: u64,
    },
}

/// Injected faults for one admitted request, drawn at admission so that a
/// seed gives the same sequence for the same order of arrivals.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Faults {
    /// Sleep this long before answering (the request stays in flight).
    pub latency: Duration,
    /// Answer 503 instead of executing; `Some(Some(n))` adds `retry-after: n`.
    pub fail: Option<Option<u64>>,
    /// Drop the connection after executing, without a response.
    pub reset: bool,
}

/// A claim on a concurrency slot, a credit reservation and possibly an
/// idempotency key; hand it back through exactly one of `complete`, `fail` or
/// `abandon`.
#[derive(Debug)]
#[must_use = "a ticket holds a slot and credits until it is handed back"]
pub struct Ticket {
    key: String,
    cost: u64,
    idem: Option<String>,
}

/// What to do with a metered request.
#[derive(Debug)]
pub enum Admission {
    /// Answer with a 4xx at once.
    Rejected {
        /// Why.
        why: Rejection,
        /// Rate headers.
        rate: Option<RateInfo>,
        /// Credit headers.
        credits: CreditView,
    },
    /// Answer with the stored response of this idempotency key.
    Replay {
        /// The stored body.
        body: Bytes,
        /// Rate headers.
        rate: Option<RateInfo>,
        /// Credit headers (nothing was charged).
        credits: CreditView,
    },
    /// Go ahead: apply the faults, execute, and hand the ticket back.
    Admitted {
        /// The claim to hand back.
        ticket: Ticket,
        /// Rate headers.
        rate: Option<RateInfo>,
        /// Faults to inject.
        faults: Faults,
    },
}

/// The counters of `/admin/stats`.
///
/// The request counters partition the metered requests:
/// `requests = rejected_auth + rejected_bad_request + rejected_cooldown +
/// rejected_concurrency + rejected_rate + rejected_conflict + rejected_credits +
/// accepted`, and every accepted request ends as a side effect, a replay, an
/// injected failure, an abandoned request or is still in flight.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct Stats {
    /// Requests to `/v1/*`.
    pub requests: u64,
    /// Requests that passed every admission check (and count in the window).
    pub accepted: u64,
    /// Missing or empty `x-api-key` (401).
    pub rejected_auth: u64,
    /// Unreadable query, body or header (400/413), not metered.
    pub rejected_bad_request: u64,
    /// 429 during a cooldown.
    pub rejected_cooldown: u64,
    /// 429 over the concurrency ceiling.
    pub rejected_concurrency: u64,
    /// 429 from the rate model.
    pub rejected_rate: u64,
    /// 409: the same idempotency key was still executing.
    pub rejected_conflict: u64,
    /// 429 credits exhausted.
    pub rejected_credits: u64,
    /// Successful executions (each charged once).
    pub side_effects: u64,
    /// Stored responses replayed for a repeated idempotency key.
    pub idempotent_replays: u64,
    /// Injected 503s (nothing executed, nothing charged).
    pub injected_failures: u64,
    /// Connections dropped after executing.
    pub resets: u64,
    /// Admitted requests whose client went away before they executed.
    pub abandoned: u64,
    /// Requests to unknown paths (404), not metered.
    pub not_found: u64,
    /// The most accepted requests of one key seen inside one window (the
    /// limit's period; 0 when there is no limit).
    pub max_in_window: u64,
    /// Requests in flight now, all keys.
    pub in_flight: u64,
    /// The most requests of one key ever in flight at once.
    pub in_flight_max: u64,
    /// Credits left this cycle.
    pub credits_remaining: u64,
    /// Credits spent this cycle.
    pub credits_used: u64,
    /// The cycle's allowance.
    pub max_credits: u64,
    /// Unix seconds when the cycle renews.
    pub renewal: u64,
    /// Billing cycles started after the first (renewals).
    pub renewals: u64,
    /// Distinct API keys seen.
    pub keys: u64,
}

enum Limiter {
    Window(SlidingWindow),
    Spike {
        bucket: SpikeArrest,
        /// Counts accepted requests per period, only for `max_in_window`.
        meter: SlidingWindow,
    },
    Unlimited,
}

impl Limiter {
    fn info(&self, remaining: u64) -> Option<RateInfo> {
        let limit = match self {
            Limiter::Window(w) => w.limit(),
            Limiter::Spike { bucket, .. } => bucket.rate().count,
            Limiter::Unlimited => return None,
        };
        Some(RateInfo { limit, remaining })
    }

    fn remaining(&self, now: Instant) -> u64 {
        match self {
            Limiter::Window(w) => w.remaining(now),
            Limiter::Spike { bucket, .. } => bucket.available(now),
            Limiter::Unlimited => 0,
        }
    }
}

struct KeyState {
    limiter: Limiter,
    /// When the current cooldown started (it lasts `cfg.cooldown`). Kept as
    /// a start, not an end, so an absurd cooldown cannot overflow an Instant.
    cooling_since: Option<Instant>,
    in_flight: usize,
}

enum Idem {
    InProgress,
    Done { body: Bytes, at: Instant },
}

struct Account {
    allowance: u64,
    used: u64,
    remaining: u64,
    /// When this cycle started; it renews `cfg.renewal_in` later.
    cycle_start: Instant,
    renewal_unix: u64,
}

/// The sim's state. See the module docs.
pub struct Model {
    cfg: Config,
    keys: HashMap<String, KeyState>,
    account: Account,
    /// Keyed by `api key \0 idempotency key`: header values cannot hold NUL,
    /// so the join is unambiguous.
    idem: HashMap<String, Idem>,
    /// Completed idempotency keys in completion order, for expiry.
    idem_order: VecDeque<(Instant, String)>,
    rng: fastrand::Rng,
    stats: Stats,
    epoch: Instant,
    epoch_unix: Duration,
}

impl Model {
    /// A fresh account at `now`, which is `unix_now` since the Unix epoch on
    /// the wall clock (only used to print `x-api-renewal`).
    pub fn new(cfg: Config, now: Instant, unix_now: Duration) -> Self {
        let rng = fastrand::Rng::with_seed(cfg.seed);
        let mut m = Model {
            account: Account {
                allowance: cfg.credits,
                used: 0,
                remaining: cfg.credits,
                cycle_start: now,
                renewal_unix: 0,
            },
            cfg,
            keys: HashMap::new(),
            idem: HashMap::new(),
            idem_order: VecDeque::new(),
            rng,
            stats: Stats::default(),
            epoch: now,
            epoch_unix: unix_now,
        };
        m.start_cycle(now);
        m
    }

    /// The configuration in force.
    pub fn config(&self) -> &Config {
        &self.cfg
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
        let a = &mut self.account;
        a.allowance = self.cfg.credits;
        a.used = 0;
        a.remaining = self.cfg.credits;
        a.cycle_start = now;
        // Clients detect a new cycle by x-api-renewal changing, so it must
        // move even when two renewals fall in the same second.
        let unix = self.unix_secs(now, self.cfg.renewal_in);
        self.account.renewal_unix = unix.max(self.account.renewal_unix.saturating_add(1));
    }

    fn roll_cycle(&mut self, now: Instant) {
        if now.saturating_duration_since(self.account.cycle_start) >= self.cfg.renewal_in {
            self.start_cycle(now);
            self.stats.renewals += 1;
        }
    }

    fn credit_view(&self) -> CreditView {
        let a = &self.account;
        CreditView {
            remaining: i64::try_from(a.remaining).unwrap_or(i64::MAX),
            used: a.used,
            max: a.allowance,
            renewal: a.renewal_unix,
        }
    }

    /// The credit headers as they stand.
    pub fn credits(&mut self, now: Instant) -> CreditView {
        self.roll_cycle(now);
        self.credit_view()
    }

    /// What one successful call to `endpoint` costs.
    pub fn cost_of(&self, endpoint: &str) -> u64 {
        self.cfg
            .costs
            .get(endpoint)
            .copied()
            .unwrap_or(self.cfg.default_cost)
    }

    fn key_limit(cfg: &Config, key: &str) -> Option<Rate> {
        let cap = cfg.key_caps.get(key).copied();
        match (cfg.limit, cap) {
            (Limit::Rate(r), None) => Some(r),
            (Limit::Rate(r), Some(c)) => Some(Rate {
                count: r.count.min(c),
                period: r.period,
            }),
            // A capped key on a plan without a per-minute limit gets a
            // per-minute limit of its cap: the seeds' "lowest cap wins".
            (Limit::Unlimited, Some(c)) => Some(Rate {
                count: c,
                period: Duration::from_secs(60),
            }),
            (Limit::Unlimited, None) => None,
        }
    }

    fn new_key(cfg: &Config, key: &str, now: Instant) -> KeyState {
        let limiter = match (Self::key_limit(cfg, key), cfg.kind) {
            (None, _) => Limiter::Unlimited,
            (Some(r), ModelKind::Window) => Limiter::Window(SlidingWindow::for_rate(r)),
            (Some(r), ModelKind::SpikeArrest) => Limiter::Spike {
                bucket: SpikeArrest::new(r, now),
                meter: SlidingWindow::new(u64::MAX, r.period),
            },
        };
        KeyState {
            limiter,
            cooling_since: None,
            in_flight: 0,
        }
    }

    fn prune_idem(&mut self, now: Instant) {
        while let Some((at, _)) = self.idem_order.front() {
            if now.saturating_duration_since(*at) < self.cfg.idempotency_ttl {
                break;
            }
            if let Some((at, k)) = self.idem_order.pop_front() {
                if matches!(self.idem.get(&k), Some(Idem::Done { at: a, .. }) if *a == at) {
                    self.idem.remove(&k);
                }
            }
        }
    }

    fn draw_faults(&mut self) -> Faults {
        let mut f = Faults::default();
        if let Some((lo, hi)) = self.cfg.latency {
            let lo_n = u64::try_from(lo.as_nanos()).unwrap_or(u64::MAX);
            let hi_n = u64::try_from(hi.as_nanos()).unwrap_or(u64::MAX);
            f.latency = Duration::from_nanos(self.rng.u64(lo_n..=hi_n.max(lo_n)));
        }
        if self.cfg.fail_rate > 0.0 && self.rng.f64() < self.cfg.fail_rate {
            // Real gateways send retry-after on some 503s and not others;
            // clients must cope with both.
            f.fail = Some(self.rng.bool().then_some(1));
        }
        if self.cfg.reset_rate > 0.0 && self.rng.f64() < self.cfg.reset_rate {
            f.reset = true;
        }
        f
    }

    /// Decides a metered request of API key `key` to `endpoint`, with an
    /// optional `Idempotency-Key`, arriving at `now`.
    ///
    /// The checks run in this order: cooldown, concurrency, rate, idempotent
    /// replay, credits. Only requests that pass them all are recorded in the
    /// key's window: a refused request never counts against the limit.
    pub fn admit(
        &mut self,
        key: &str,
        endpoint: &str,
        idem: Option<&str>,
        now: Instant,
    ) -> Admission {
        self.stats.requests += 1;
        self.roll_cycle(now);
        let cost = self.cost_of(endpoint);
        let credits = self.credit_view();
        let cfg_concurrency = self.cfg.concurrency;
        let cooldown = self.cfg.cooldown;
        let (cfg, seen) = (&self.cfg, &mut self.stats.keys);
        let st = self.keys.entry(key.to_owned()).or_insert_with(|| {
            *seen += 1;
            Self::new_key(cfg, key, now)
        });

        // Cooldown: answered without looking at anything else, and not
        // counted in the window.
        if let Some(since) = st.cooling_since {
            let left = cooldown.saturating_sub(now.saturating_duration_since(since));
            if !left.is_zero() {
                let rate = st.limiter.info(0);
                self.stats.rejected_cooldown += 1;
                let retry_after = ceil_secs(left);
                return Admission::Rejected {
                    why: Rejection::Cooldown { retry_after },
                    rate,
                    credits,
                };
            }
            st.cooling_since = None;
        }

        if st.in_flight >= cfg_concurrency {
            let rate = st.limiter.info(st.limiter.remaining(now));
            self.stats.rejected_concurrency += 1;
            return Admission::Rejected {
                why: Rejection::Concurrency {
                    limit: cfg_concurrency,
                },
                rate,
                credits,
            };
        }

        let checked = match &st.limiter {
            Limiter::Window(w) => w.check(now),
            Limiter::Spike { bucket, .. } => bucket.check(now),
            Limiter::Unlimited => Ok(0),
        };
        let remaining = match checked {
            Ok(r) => r,
            Err(wait) => {
                if matches!(st.limiter, Limiter::Window(_)) && !cooldown.is_zero() {
                    st.cooling_since = Some(now);
                }
                let rate = st.limiter.info(0);
                self.stats.rejected_rate += 1;
                return Admission::Rejected {
                    why: Rejection::Rate {
                        retry_after: wait.whole_seconds(),
                    },
                    rate,
                    credits,
                };
            }
        };
        let rate = st.limiter.info(remaining);

        let idem_key = idem.map(|i| format!("{key}\0{i}"));
        if let Some(k) = &idem_key {
            self.prune_idem(now);
            match self.idem.get(k) {
                Some(Idem::Done { body, .. }) => {
                    let body = body.clone();
                    self.record(key, now);
                    self.stats.accepted += 1;
                    self.stats.idempotent_replays += 1;
                    return Admission::Replay {
                        body,
                        rate,
                        credits,
                    };
                }
                Some(Idem::InProgress) => {
                    self.stats.rejected_conflict += 1;
                    let rate = rate.map(|r| RateInfo {
                        remaining: r.remaining + 1,
                        ..r
                    });
                    return Admission::Rejected {
                        why: Rejection::Conflict,
                        rate,
                        credits,
                    };
                }
                None => {}
            }
        }

        if self.account.remaining < cost {
            let balance = self.account.remaining;
            self.stats.rejected_credits += 1;
            // The seeds' CreditsExhausted signal is a 429 whose remaining
            // header reads zero or below: an empty account says 0, one that
            // merely cannot afford this endpoint says the shortfall.
            let shown = if balance == 0 {
                0
            } else {
                balance as i64 - cost.min(i64::MAX as u64) as i64
            };
            let rate = rate.map(|r| RateInfo {
                remaining: r.remaining + 1,
                ..r
            });
            return Admission::Rejected {
                why: Rejection::Credits { cost, balance },
                rate,
                credits: CreditView {
                    remaining: shown,
                    ..credits
                },
            };
        }

        // Admitted: record, reserve the credits (refunded if it never
        // executes), claim the slot and the idempotency key.
        self.record(key, now);
        self.stats.accepted += 1;
        // Saturating: absurd --cost or top-up values must not panic the sim.
        self.account.remaining = self.account.remaining.saturating_sub(cost);
        self.account.used = self.account.used.saturating_add(cost);
        if let Some(k) = &idem_key {
            self.idem.insert(k.clone(), Idem::InProgress);
        }
        if let Some(st) = self.keys.get_mut(key) {
            st.in_flight += 1;
            self.stats.in_flight_max = self.stats.in_flight_max.max(st.in_flight as u64);
        }
        self.stats.in_flight += 1;
        let faults = self.draw_faults();
        Admission::Admitted {
            ticket: Ticket {
                key: key.to_string(),
                cost,
                idem: idem_key,
            },
            rate,
            faults,
        }
    }

    /// Records an accepted request in the key's window and updates
    /// `max_in_window`.
    fn record(&mut self, key: &str, now: Instant) {
        let Some(st) = self.keys.get_mut(key) else {
            return;
        };
        let in_window = match &mut st.limiter {
            Limiter::Window(w) => {
                w.record(now);
                w.count(now)
            }
            Limiter::Spike { bucket, meter } => {
                // check() passed under the same lock, so this cannot fail.
                let _ = bucket.try_acquire(now);
                meter.record(now);
                meter.count(now)
            }
            Limiter::Unlimited => 0,
        };
        self.stats.max_in_window = self.stats.max_in_window.max(in_window);
    }

    fn release(&mut self, t: &Ticket) {
        if let Some(st) = self.keys.get_mut(&t.key) {
            st.in_flight = st.in_flight.saturating_sub(1);
        }
        self.stats.in_flight = self.stats.in_flight.saturating_sub(1);
    }

    fn refund(&mut self, t: &Ticket) {
        // A renewal in between already reset the meter; don't over-refund.
        let back = t.cost.min(self.account.used);
        self.account.used -= back;
        self.account.remaining = self.account.remaining.saturating_add(back);
        if let Some(k) = &t.idem {
            if matches!(self.idem.get(k), Some(Idem::InProgress)) {
                self.idem.remove(k);
            }
        }
    }

    /// The request executed and answered `body`: count the side effect, keep
    /// the charge, store the body for its idempotency key. Returns the credit
    /// headers after the charge.
    pub fn complete(&mut self, t: Ticket, body: Bytes, now: Instant) -> CreditView {
        self.release(&t);
        self.stats.side_effects += 1;
        if let Some(k) = t.idem {
            self.idem.insert(k.clone(), Idem::Done { body, at: now });
            self.idem_order.push_back((now, k));
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
        self.roll_cycle(now);
        self.account.remaining = self.account.remaining.saturating_add(n);
        self.account.allowance = self.account.allowance.saturating_add(n);
        self.credit_view()
    }

    /// Starts a new billing cycle now: used back to 0, the balance back to the
    /// base allowance (top-ups belonged to the old cycle), and `x-api-renewal`
    /// moved strictly later.
    pub fn renew(&mut self, now: Instant) -> CreditView {
        self.start_cycle(now);
        self.stats.renewals += 1;
        self.credit_view()
    }

    /// The counters, with the credit fields as of `now`.
    pub fn stats(&mut self, now: Instant) -> Stats {
        self.roll_cycle(now);
        let a = &self.account;
        Stats {
            credits_remaining: a.remaining,
            credits_used: a.used,
            max_credits: a.allowance,
            renewal: a.renewal_unix,
            ..self.stats.clone()
        }
    }

    /// Accepted requests of `key` inside its window at `now` (0 for a key
    /// never seen or without a limit).
    pub fn in_window(&self, key: &str, now: Instant) -> u64 {
        match self.keys.get(key).map(|s| &s.limiter) {
            Some(Limiter::Window(w)) => w.count(now),
            Some(Limiter::Spike { meter, .. }) => meter.count(now),
            _ => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UNIX: Duration = Duration::from_secs(1_800_000_000);

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn model(cfg: Config) -> (Model, Instant) {
        let t0 = Instant::now();
        (Model::new(cfg, t0, UNIX), t0)
    }

    fn cfg(limit: &str) -> Config {
        Config {
            limit: limit.parse().unwrap(),
            ..Config::default()
        }
    }

    /// What became of a request that was admitted and at once completed.
    #[derive(Debug)]
    enum Out {
        Executed {
            rate: Option<RateInfo>,
            credits: CreditView,
        },
        Replayed {
            body: Bytes,
            rate: Option<RateInfo>,
            credits: CreditView,
        },
        Rejected {
            why: Rejection,
            rate: Option<RateInfo>,
            credits: CreditView,
        },
    }

    fn call(m: &mut Model, key: &str, now: Instant) -> Out {
        call_idem(m, key, None, now)
    }

    fn call_idem(m: &mut Model, key: &str, idem: Option<&str>, now: Instant) -> Out {
        match m.admit(key, "echo", idem, now) {
            Admission::Admitted {
                ticket,
                rate,
                faults,
            } => {
                assert_eq!(faults, Faults::default(), "no faults configured");
                let credits = m.complete(ticket, Bytes::from_static(b"{}"), now);
                Out::Executed { rate, credits }
            }
            Admission::Replay {
                body,
                rate,
                credits,
            } => Out::Replayed {
                body,
                rate,
                credits,
            },
            Admission::Rejected { why, rate, credits } => Out::Rejected { why, rate, credits },
        }
    }

    fn executed(a: &Out) -> bool {
        matches!(a, Out::Executed { .. })
    }

    fn rejection(a: &Out) -> Option<&Rejection> {
        match a {
            Out::Rejected { why, .. } => Some(why),
            _ => None,
        }
    }

    fn refused(a: &Admission) -> Option<&Rejection> {
        match a {
            Admission::Rejected { why, .. } => Some(why),
            _ => None,
        }
    }

    fn rate(a: &Out) -> Option<RateInfo> {
        match a {
            Out::Executed { rate, .. }
            | Out::Replayed { rate, .. }
            | Out::Rejected { rate, .. } => *rate,
        }
    }

    fn credits(a: &Out) -> CreditView {
        match a {
            Out::Executed { credits, .. }
            | Out::Replayed { credits, .. }
            | Out::Rejected { credits, .. } => *credits,
        }
    }

    #[test]
    fn window_overrun_gives_retry_after_to_the_oldest_then_a_cooldown() {
        let (mut m, t0) = model(Config {
            cooldown: secs(50),
            ..cfg("60/1m")
        });
        // Sixty in the first second.
        for i in 0..60 {
            let a = call(&mut m, "k", t0 + ms(i * 16));
            assert!(executed(&a), "call {i}");
            assert_eq!(
                rate(&a),
                Some(RateInfo {
                    limit: 60,
                    remaining: 59 - i
                })
            );
        }
        let a = call(&mut m, "k", t0 + ms(1000));
        assert_eq!(rejection(&a), Some(&Rejection::Rate { retry_after: 59 }));
        assert_eq!(
            rate(&a),
            Some(RateInfo {
                limit: 60,
                remaining: 0
            })
        );
        // The cooldown runs 50 s from the overrun; retrying doesn't shorten
        // or extend it, and isn't counted.
        for s in [1, 10, 30, 49] {
            let a = call(&mut m, "k", t0 + ms(1000) + secs(s) - ms(500));
            assert_eq!(
                rejection(&a),
                Some(&Rejection::Cooldown {
                    retry_after: 50 - s + 1
                })
            );
        }
        // Over at 51 s; the window still holds the 60 until 60 s.
        let a = call(&mut m, "k", t0 + secs(51));
        assert_eq!(rejection(&a), Some(&Rejection::Rate { retry_after: 9 }));
        let s = m.stats(t0 + secs(51));
        assert_eq!(
            (
                s.accepted,
                s.rejected_rate,
                s.rejected_cooldown,
                s.max_in_window
            ),
            (60, 2, 4, 60)
        );
        // ...which started a new cooldown, to 101 s.
        let a = call(&mut m, "k", t0 + secs(100));
        assert_eq!(rejection(&a), Some(&Rejection::Cooldown { retry_after: 1 }));
        assert!(executed(&call(&mut m, "k", t0 + secs(101))));
    }

    #[test]
    fn a_zero_cooldown_disables_it() {
        let (mut m, t0) = model(Config {
            cooldown: Duration::ZERO,
            ..cfg("5/2s")
        });
        for _ in 0..5 {
            assert!(executed(&call(&mut m, "k", t0)));
        }
        let a = call(&mut m, "k", t0 + ms(100));
        assert_eq!(rejection(&a), Some(&Rejection::Rate { retry_after: 2 }));
        let a = call(&mut m, "k", t0 + ms(1500));
        assert_eq!(rejection(&a), Some(&Rejection::Rate { retry_after: 1 }));
        assert!(executed(&call(&mut m, "k", t0 + secs(2))));
    }

    #[test]
    fn sub_keys_isolate_pace_not_budget() {
        let (mut m, t0) = model(Config {
            credits: 10,
            ..cfg("3/1m")
        });
        for _ in 0..3 {
            assert!(executed(&call(&mut m, "backfill", t0)));
        }
        assert!(rejection(&call(&mut m, "backfill", t0)).is_some());
        assert!(matches!(
            rejection(&call(&mut m, "backfill", t0)),
            Some(Rejection::Cooldown { .. })
        ));
        // The other key is not paused by the backfill's overrun...
        let a = call(&mut m, "prod", t0);
        assert!(executed(&a));
        // ...but it pays from the same balance.
        let c = credits(&a);
        assert_eq!((c.remaining, c.used), (6, 4));
        assert_eq!(m.stats(t0).keys, 2);
    }

    #[test]
    fn key_caps_lower_the_limit_in_force() {
        let mut c = cfg("60/1m");
        c.key_caps.insert("capped".into(), 2);
        c.key_caps.insert("loose".into(), 1000);
        let (mut m, t0) = model(c);
        assert_eq!(rate(&call(&mut m, "capped", t0)).map(|r| r.limit), Some(2));
        assert_eq!(rate(&call(&mut m, "loose", t0)).map(|r| r.limit), Some(60));
        assert_eq!(rate(&call(&mut m, "other", t0)).map(|r| r.limit), Some(60));
        assert!(executed(&call(&mut m, "capped", t0)));
        assert!(matches!(
            rejection(&call(&mut m, "capped", t0)),
            Some(Rejection::Rate { retry_after: 60 })
        ));

        // Without a plan limit a cap is per minute.
        let mut c = cfg("none");
        c.key_caps.insert("capped".into(), 1);
        let (mut m, t0) = model(c);
        assert_eq!(rate(&call(&mut m, "capped", t0)).map(|r| r.limit), Some(1));
        assert_eq!(rate(&call(&mut m, "free", t0)), None);
    }

    #[test]
    fn unlimited_keys_still_have_a_concurrency_ceiling() {
        let (mut m, t0) = model(Config {
            concurrency: 2,
            ..cfg("none")
        });
        let mut tickets = Vec::new();
        for _ in 0..2 {
            match m.admit("k", "echo", None, t0) {
                Admission::Admitted { ticket, rate, .. } => {
                    assert_eq!(rate, None);
                    tickets.push(ticket);
                }
                other => panic!("{other:?}"),
            }
        }
        let a = m.admit("k", "echo", None, t0);
        assert_eq!(refused(&a), Some(&Rejection::Concurrency { limit: 2 }));
        // Another key has its own ceiling.
        let other = m.admit("k2", "echo", None, t0);
        assert!(matches!(other, Admission::Admitted { .. }));
        if let Admission::Admitted { ticket, .. } = other {
            m.abandon(ticket);
        }
        let t = tickets.pop().unwrap();
        let _ = m.complete(t, Bytes::new(), t0);
        assert!(matches!(
            m.admit("k", "echo", None, t0),
            Admission::Admitted { .. }
        ));
        let s = m.stats(t0);
        assert_eq!((s.in_flight_max, s.rejected_concurrency), (2, 1));
        assert_eq!(s.in_flight, 2);
        // One executed plus two reserved in flight; the abandoned call was
        // refunded.
        assert_eq!(s.credits_used, 3);
        assert_eq!(s.abandoned, 1);
    }

    #[test]
    fn a_concurrency_refusal_is_not_counted_in_the_window() {
        let (mut m, t0) = model(Config {
            concurrency: 1,
            ..cfg("2/1m")
        });
        let Admission::Admitted { ticket, .. } = m.admit("k", "echo", None, t0) else {
            panic!()
        };
        for _ in 0..5 {
            assert!(matches!(
                refused(&m.admit("k", "echo", None, t0)),
                Some(Rejection::Concurrency { limit: 1 })
            ));
        }
        let _ = m.complete(ticket, Bytes::new(), t0);
        assert!(executed(&call(&mut m, "k", t0)));
        assert_eq!(m.in_window("k", t0), 2);
    }

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
    fn an_idempotency_key_executes_once_and_replays_for_24h() {
        let (mut m, t0) = model(cfg("none"));
        assert!(executed(&call_idem(&mut m, "k", Some("a"), t0)));
        let a = call_idem(&mut m, "k", Some("a"), t0 + secs(3600));
        assert!(
            matches!(&a, Out::Replayed { body, .. } if body.as_ref() == b"{}"),
            "{a:?}"
        );
        // Nothing charged for the replay.
        assert_eq!(credits(&a).used, 1);
        // The same idempotency key under another API key is another request.
        assert!(executed(&call_idem(&mut m, "k2", Some("a"), t0)));
        // Still there just under 24 h later, gone after.
        let a = call_idem(&mut m, "k", Some("a"), t0 + secs(86_399));
        assert!(!executed(&a));
        assert!(executed(&call_idem(
            &mut m,
            "k",
            Some("a"),
            t0 + secs(86_400)
        )));
        let s = m.stats(t0 + secs(86_400));
        assert_eq!((s.side_effects, s.idempotent_replays), (3, 2));
        assert_eq!(s.credits_used, 3);
    }

    #[test]
    fn a_concurrent_repeat_conflicts_and_a_failed_attempt_frees_the_key() {
        let (mut m, t0) = model(cfg("10/1m"));
        let Admission::Admitted { ticket, .. } = m.admit("k", "echo", Some("a"), t0) else {
            panic!()
        };
        let a = m.admit("k", "echo", Some("a"), t0);
        assert_eq!(refused(&a), Some(&Rejection::Conflict));
        // An injected 503: refunded and retryable.
        let cv = m.fail(ticket, t0);
        assert_eq!((cv.remaining, cv.used), (100_000, 0));
        assert!(executed(&call_idem(&mut m, "k", Some("a"), t0)));
        // The conflict didn't count in the window; the failure did.
        assert_eq!(m.in_window("k", t0), 2);
        let s = m.stats(t0);
        assert_eq!(
            (s.rejected_conflict, s.injected_failures, s.side_effects),
            (1, 1, 1)
        );
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

    #[test]
    fn spike_arrest_keys_follow_the_seed_play_by_play() {
        let (mut m, t0) = model(Config {
            kind: ModelKind::SpikeArrest,
            concurrency: 1000,
            cooldown: secs(50),
            ..cfg("30ps")
        });
        let passed = (0..60u32)
            .filter(|i| executed(&call(&mut m, "k", t0 + ms(40) * *i / 59)))
            .count();
        assert_eq!(passed, 4);
        // No cooldown in this model: once a token drips in, it passes.
        let a = call(&mut m, "k", t0 + ms(41));
        assert!(matches!(
            rejection(&a),
            Some(Rejection::Rate { retry_after: 1 })
        ));
        assert_eq!(
            rate(&a),
            Some(RateInfo {
                limit: 30,
                remaining: 0
            })
        );
        assert!(executed(&call(&mut m, "k", t0 + ms(67))));
        let s = m.stats(t0 + ms(67));
        assert_eq!(
            (s.accepted, s.rejected_cooldown, s.max_in_window),
            (5, 0, 5)
        );
    }

    #[test]
    fn faults_follow_the_seed() {
        let draw = |seed| {
            let (mut m, t0) = model(Config {
                fail_rate: 0.3,
                reset_rate: 0.3,
                latency: Some((ms(10), ms(20))),
                seed,
                ..cfg("none")
            });
            (0..50)
                .map(|_| match m.admit("k", "echo", None, t0) {
                    Admission::Admitted { ticket, faults, .. } => {
                        m.abandon(ticket);
                        faults
                    }
                    other => panic!("{other:?}"),
                })
                .collect::<Vec<_>>()
        };
        let a = draw(7);
        assert_eq!(a, draw(7));
        assert_ne!(a, draw(8));
        assert!(a.iter().all(|f| f.latency >= ms(10) && f.latency <= ms(20)));
        let fails = a.iter().filter(|f| f.fail.is_some()).count();
        let resets = a.iter().filter(|f| f.reset).count();
        assert!((5..=25).contains(&fails) && (5..=25).contains(&resets));
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
            + s.accepted;
        assert_eq!(parts, s.requests);
        assert_eq!(
            s.accepted,
            s.side_effects + s.idempotent_replays + s.injected_failures + s.abandoned + s.in_flight
        );
        assert_eq!(s.rejected_credits, 2, "{s:?}");
    }
}
