//! One policy a key is held to (a [`PolicySpec`]: a rate, its shape and
//! what it counts), kept by the model of its shape, with the meters behind
//! the per-policy stats.
//!
//! A request must fit every policy of its key; each one it fits then counts
//! it (a refused request counts in none). Calls weigh 1, and a token policy
//! weighs a request by its tokens.

use std::time::{Duration, Instant};

use serde::Serialize;

use super::admission::PolicyView;
use super::config::ModelKind;
use super::fixed_window::FixedWindow;
use super::gcra::Gcra;
use super::sliding_window::{RetryIn, SlidingWindow};
use super::spike_arrest::SpikeArrest;
use super::weighted_window::WeightedWindow;
use crate::rate::policy::{PolicySpec, Shape, TokenWeight, Unit};
use crate::rate::Rate;

/// A request's tokens: what it may need and what it is charged, in all
/// and its prompt's (input) and answer's (output) apart. (It is one call
/// whatever its tokens.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Tokens {
    /// Tokens the request is estimated to need (checked against the
    /// token policies).
    pub estimate: TokenWeight,
    /// Tokens it is charged (counted in the token policies).
    pub charged: TokenWeight,
}

impl Tokens {
    /// `estimate` and `charged` tokens, not told apart.
    pub fn whole(estimate: u64, charged: u64) -> Tokens {
        Tokens {
            estimate: TokenWeight::whole(estimate),
            charged: TokenWeight::whole(charged),
        }
    }
}

/// The most one policy saw, over every key: what integration tests assert
/// "never over the limit" with.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct PolicyStats {
    /// The policy as `--limit` spells it.
    pub policy: String,
    /// The most units (calls or tokens) accepted in any span of the
    /// policy's window, whatever its shape.
    pub max_in_window: u64,
    /// A fixed window's most units in one of its windows.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_in_fixed_window: Option<u64>,
    /// A bucket's most excess (nginx's: requests beyond the rate), rounded
    /// up; never above its burst.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_excess: Option<u64>,
}

impl PolicyStats {
    /// Empty stats of `spec`.
    pub fn of(spec: &PolicySpec) -> Self {
        PolicyStats {
            policy: spec.to_string(),
            max_in_fixed_window: (spec.shape == Shape::Fixed).then_some(0),
            max_excess: matches!(spec.shape, Shape::Bucket { .. }).then_some(0),
            ..PolicyStats::default()
        }
    }
}

enum Counter {
    Sliding(SlidingWindow),
    Weighted(WeightedWindow),
    Fixed(FixedWindow),
    Bucket(Gcra),
    Spike(SpikeArrest),
}

/// One policy of one key.
pub(super) struct Policy {
    rate: Rate,
    unit: Unit,
    counter: Counter,
    /// Units accepted per span of the window, for `max_in_window`.
    meter: WeightedWindow,
}

/// The burst a bucket is given when `--limit` names none: nginx's default
/// (0) for calls; a whole window's worth for tokens, or no request of
/// more than one token would ever pass.
fn burst_of(spec: &PolicySpec, rate: Rate) -> u64 {
    match (spec.shape, spec.unit) {
        (Shape::Bucket { burst: Some(b) }, _) => b,
        (_, Unit::Calls) => 0,
        (_, _) => rate.count.saturating_sub(1),
    }
}

impl Policy {
    /// The model of `spec` at `rate` (the spec's, or lowered by a key cap);
    /// fixed windows start at `origin`. Under `--model spike-arrest` a
    /// sliding policy of calls is a SpikeArrest bucket.
    pub(super) fn new(
        spec: &PolicySpec,
        rate: Rate,
        kind: ModelKind,
        origin: Instant,
        now: Instant,
    ) -> Self {
        let counter = match (spec.shape, spec.unit) {
            (Shape::Sliding, Unit::Calls) if kind == ModelKind::SpikeArrest => {
                Counter::Spike(SpikeArrest::new(rate, now))
            }
            (Shape::Sliding, Unit::Calls) => Counter::Sliding(SlidingWindow::for_rate(rate)),
            (Shape::Sliding, _) => Counter::Weighted(WeightedWindow::new(rate.count, rate.period)),
            (Shape::Fixed, _) => Counter::Fixed(FixedWindow::new(rate.count, rate.period, origin)),
            (Shape::Bucket { .. }, _) => {
                Counter::Bucket(Gcra::new(rate, burst_of(spec, rate), now))
            }
        };
        Policy {
            rate,
            unit: spec.unit,
            counter,
            meter: WeightedWindow::new(u64::MAX, rate.period),
        }
    }

    /// Units per window.
    pub(super) fn limit(&self) -> u64 {
        self.rate.count
    }

    /// Whether an overrun starts the key's cooldown: only a sliding window
    /// of calls (APIVerve's edge) does; buckets and fixed windows do not.
    pub(super) fn cools_down(&self) -> bool {
        matches!(self.counter, Counter::Sliding(_))
    }

    fn units(&self, tokens: TokenWeight) -> u64 {
        match self.unit {
            Unit::Calls => 1,
            unit => tokens.of(unit),
        }
    }

    /// Whether a request needing `tokens.estimate` fits at `now`:
    /// `Ok(units left after it)` or the wait until it would.
    pub(super) fn check(&self, now: Instant, tokens: Tokens) -> Result<u64, RetryIn> {
        let n = self.units(tokens.estimate);
        match &self.counter {
            Counter::Sliding(w) => w.check(now),
            Counter::Weighted(w) => w.check(now, n),
            Counter::Fixed(w) => w.check(now, n),
            Counter::Bucket(b) => b.check(now, n),
            Counter::Spike(s) => s.check(now),
        }
    }

    /// Counts an accepted request charged `tokens.charged` at `now`, and raises
    /// `peak` with what the meters say after it.
    pub(super) fn record(&mut self, now: Instant, tokens: Tokens, peak: &mut PolicyStats) {
        let n = self.units(tokens.charged);
        match &mut self.counter {
            Counter::Sliding(w) => w.record(now),
            Counter::Weighted(w) => {
                w.record(now, n);
            }
            Counter::Fixed(w) => {
                let c = w.record(now, n);
                peak.max_in_fixed_window = Some(peak.max_in_fixed_window.unwrap_or(0).max(c));
            }
            Counter::Bucket(b) => {
                let e = b.record(now, n).ceil() as u64;
                peak.max_excess = Some(peak.max_excess.unwrap_or(0).max(e));
            }
            Counter::Spike(s) => {
                // check() passed under the same lock, so this cannot fail.
                let _ = s.try_acquire(now);
            }
        }
        let in_window = self.meter.record(now, n);
        peak.max_in_window = peak.max_in_window.max(in_window);
    }

    /// Units accepted in the last window at `now`, whatever the shape.
    pub(super) fn in_window(&self, now: Instant) -> u64 {
        self.meter.count(now)
    }

    /// Units still admitted at `now`: what the headers call remaining.
    pub(super) fn remaining(&self, now: Instant) -> u64 {
        match &self.counter {
            Counter::Sliding(w) => w.remaining(now),
            Counter::Weighted(w) => w.remaining(now),
            Counter::Fixed(w) => w.remaining(now),
            Counter::Bucket(b) => b.remaining(now, 1),
            Counter::Spike(s) => s.available(now),
        }
    }

    /// When the quota resets, as the shape has it: a sliding window's
    /// oldest arrival ages out, a fixed window's boundary, a bucket's next
    /// call fits (zero while one does).
    fn reset(&self, now: Instant) -> Duration {
        let until_one = |r: Result<u64, RetryIn>| r.err().map_or(Duration::ZERO, |w| w.0);
        match &self.counter {
            Counter::Sliding(w) => w
                .oldest_expiry(now)
                .map_or(Duration::ZERO, |e| e.saturating_duration_since(now)),
            Counter::Weighted(w) => w.reset_in(now),
            Counter::Fixed(w) => w.reset_in(now),
            Counter::Bucket(b) => until_one(b.check(now, 1)),
            Counter::Spike(s) => until_one(s.check(now)),
        }
    }

    /// The policy as the header dialects state it at `now`.
    pub(super) fn view(&self, now: Instant) -> PolicyView {
        let reset = self.reset(now);
        PolicyView {
            limit: self.rate.count,
            window: self.rate.period,
            remaining: self.remaining(now),
            reset,
            idle: match &self.counter {
                Counter::Bucket(b) => b.until_idle(now),
                _ => reset,
            },
            unit: self.unit,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(s: &str, t0: Instant) -> Policy {
        let spec: PolicySpec = s.parse().unwrap();
        Policy::new(&spec, spec.rate().unwrap(), ModelKind::Window, t0, t0)
    }

    #[test]
    fn each_shape_states_its_own_reset() {
        let t0 = Instant::now();
        let at = t0 + Duration::from_millis(300);
        let one = Tokens::default();
        let mut stats = PolicyStats::default();
        for (spec, reset_after_two) in [
            ("2/1s", Duration::from_millis(1000)),
            ("2/1s,fixed", Duration::from_millis(700)),
            ("2/1s,burst=1", Duration::from_millis(500)),
        ] {
            let mut p = policy(spec, t0);
            p.record(at, one, &mut stats);
            p.record(at, one, &mut stats);
            let v = p.view(at);
            assert_eq!((v.limit, v.remaining), (2, 0), "{spec}");
            assert_eq!(v.reset, reset_after_two, "{spec}");
            assert!(p.check(at, one).is_err(), "{spec}");
        }
    }

    #[test]
    fn a_token_policy_checks_the_estimate_and_counts_the_charge() {
        let t0 = Instant::now();
        let mut p = policy("100/1m,tokens", t0);
        let mut stats = PolicyStats::of(&"100/1m,tokens".parse().unwrap());
        let tokens = Tokens::whole(80, 50);
        assert_eq!(p.check(t0, tokens), Ok(20));
        p.record(t0, tokens, &mut stats);
        assert_eq!(p.remaining(t0), 50);
        assert!(p.check(t0, tokens).is_err(), "80 more do not fit in 50");
        assert_eq!(stats.max_in_window, 50);
        assert_eq!(p.view(t0).unit, Unit::Tokens);
    }
}
