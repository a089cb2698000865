//! A policy of any shape other than a sliding window of calls (which
//! [`ExactWindow`](crate::rate::exact::ExactWindow) keeps, learning
//! included): a sliding window of tokens, a fixed window, or a bucket, of
//! calls or of tokens. The [`PolicySet`](crate::rate::policies::PolicySet)
//! asks each of them before a call starts.

use std::time::{Duration, Instant};

use super::announce::Announced;
use super::exact::later;
use super::fixed::{Align, FixedWindow};
use super::gcra::Gcra;
use super::policy::{PolicySpec, Shape, TokenWeight, Unit, Used};
use super::refill::{RefillFit, Said};
use super::tally::Tally;
use super::{Limit, Rate};

/// How one policy keeps its quota.
#[derive(Debug, Clone)]
enum Rule {
    /// At most the quota in any span of the window.
    Sliding(Tally, Duration),
    /// At most the quota per server window.
    Fixed(FixedWindow),
    /// GCRA.
    Bucket(Gcra),
}

/// Whether a stated policy of tokens is watched for a continuous refill
/// (see [`crate::rate::refill`]).
#[derive(Debug, Clone)]
enum Refill {
    Unwatched,
    /// The statements so far, and the policy's window.
    Watching(RefillFit, Duration),
    /// Found: kept as a bucket since, its reset the time until full; the
    /// statements go on narrowing its period (the first ones found it
    /// before much of the quota was used, where whole seconds say little).
    Found(RefillFit, Duration),
}

/// One policy and how it is kept.
#[derive(Debug, Clone)]
pub struct Kept {
    spec: PolicySpec,
    rate: Rate,
    rule: Rule,
    refill: Refill,
}

impl Kept {
    /// The policy `spec` asks for; `None` for `none`. A bucket whose burst
    /// is not known is kept with none (the safe side).
    pub fn new(spec: PolicySpec) -> Option<Kept> {
        let rate = spec.rate()?;
        let rule = match spec.shape {
            Shape::Sliding => Rule::Sliding(Tally::new(rate.count), rate.period),
            Shape::Fixed => Rule::Fixed(FixedWindow::new(rate.count, rate.period)),
            Shape::Bucket { burst } => Rule::Bucket(Gcra::new(rate, burst.unwrap_or(0))),
        };
        Some(Kept {
            spec,
            rate,
            rule,
            refill: Refill::Unwatched,
        })
    }

    /// Watches the server's statements of this policy for a continuous
    /// refill: a sliding window of tokens kept for a stated quota (OpenAI's
    /// and Anthropic's state no shape) that may be a bucket.
    pub fn watch_refill(&mut self) {
        if matches!(self.rule, Rule::Sliding(..)) && self.spec.unit.is_tokens() {
            self.refill = Refill::Watching(RefillFit::new(), self.rate.period);
        }
    }

    /// Whether this policy is watched for a continuous refill, or found.
    pub fn watched(&self) -> bool {
        !matches!(self.refill, Refill::Unwatched)
    }

    /// Whether its level follows the server's `remaining` and its reset is
    /// when it is full again, so that a `remaining` of 0 is its level, not
    /// a hold until the reset: a bucket of tokens told (OpenAI's and
    /// Anthropic's reset is when full), or found unless the statements
    /// since stopped keeping proportion (then a `remaining` of 0 holds
    /// again, until they keep it anew).
    pub fn refills(&self) -> bool {
        match &self.refill {
            Refill::Found(fit, _) => !fit.doubted(),
            // Watched, it is still a window.
            _ => self.spec.unit.is_tokens() && matches!(self.rule, Rule::Bucket(_)),
        }
    }

    /// A statement of this policy, read on its arrival at `now`. Once the
    /// statements show a continuous refill, the rate of the bucket it is
    /// to be kept as ([`become_bucket`](Self::become_bucket)). Once found,
    /// the bucket follows what the statements fit since: its period and its
    /// quota, its level kept.
    pub fn heard_reset(&mut self, said: Said, now: Instant) -> Option<Rate> {
        let (fit, window, found) = match &mut self.refill {
            Refill::Unwatched => return None,
            Refill::Watching(fit, w) => (fit, *w, false),
            Refill::Found(fit, w) => (fit, *w, true),
        };
        let period = fit.observe(said, window);
        let rate = Rate {
            count: said.quota.max(1),
            period: period.unwrap_or(self.rate.period),
        };
        if !found {
            return period.map(|_| rate);
        }
        let was = self.rate;
        let moved = rate.period.max(was.period) - rate.period.min(was.period) > was.period / 100;
        if moved || rate.count != was.count {
            self.retime_bucket(rate, now);
        }
        None
    }

    /// A bucket found to refill is kept from `now` at `rate`, with room
    /// for all of it, its level kept ([`Gcra::retime`]): what narrower
    /// statements show. Returns whether it was a bucket.
    pub fn retime_bucket(&mut self, rate: Rate, now: Instant) -> bool {
        let Rule::Bucket(g) = &mut self.rule else {
            return false;
        };
        g.retime(rate, rate.count - 1, now);
        self.bucket_of(rate);
        true
    }

    /// Kept from `now` as a bucket of `rate` with room for all of it, after
    /// a statement showed a continuous refill and said `stated` of the
    /// quota is used. Its level is this client's own
    /// calls replayed into it, each from when its answer came back (the
    /// server counted it no later, so it drains no sooner), and the calls
    /// on their way (their tokens: `in_flight`), or what the statement says
    /// is used where that is more (other clients on the key). The statement
    /// alone misses calls the server counted after it whose answers were
    /// read before it; the statement and the calls on their way both count
    /// those the server counted at admission. The in-flight calls' new ids,
    /// in their order.
    pub fn become_bucket(
        &mut self,
        rate: Rate,
        stated: u64,
        in_flight: &[u64],
        now: Instant,
    ) -> Vec<u64> {
        let mut g = Gcra::new(rate, rate.count - 1);
        if let Rule::Sliding(t, window) = &self.rule {
            // Those ended occupy the window no more (the script has
            // dropped them).
            for &(until, w) in t.answered().iter().filter(|(u, _)| *u > now) {
                g.spend(until.checked_sub(*window).unwrap_or(until).min(now), w);
            }
        }
        let ids = in_flight.iter().map(|&t| g.admit(now, t)).collect();
        let ours = g.level(now);
        if stated > ours {
            g.spend(now, stated - ours);
        }
        self.rule = Rule::Bucket(g);
        self.bucket_of(rate);
        self.refill = match std::mem::replace(&mut self.refill, Refill::Unwatched) {
            Refill::Watching(fit, w) => Refill::Found(fit, w),
            other => other,
        };
        ids
    }

    /// The policy is a bucket of `rate` with room for all of it.
    fn bucket_of(&mut self, rate: Rate) {
        self.rate = rate;
        self.spec.limit = Limit::Rate(rate);
        self.spec.shape = Shape::Bucket {
            burst: Some(rate.count - 1),
        };
    }

    /// What the policy is.
    pub fn spec(&self) -> PolicySpec {
        self.spec
    }

    /// What it counts.
    pub fn unit(&self) -> Unit {
        self.spec.unit
    }

    /// Its window (a bucket's W of N per W).
    pub fn window(&self) -> Duration {
        self.rate.period
    }

    /// Its quota per window in force.
    pub fn quota(&self) -> u64 {
        match &self.rule {
            Rule::Sliding(t, _) => t.quota(),
            Rule::Fixed(f) => f.quota(),
            Rule::Bucket(_) => self.rate.count,
        }
    }

    /// Units per second it allows at most in the long run.
    pub fn per_second(&self) -> f64 {
        self.quota() as f64 / self.rate.period.as_secs_f64().max(1e-9)
    }

    /// What a call weighing `calls` calls and `tokens` weighs here.
    fn weight(&self, calls: u64, tokens: TokenWeight) -> u64 {
        match self.spec.unit {
            Unit::Calls => calls,
            unit => tokens.of(unit),
        }
    }

    /// Claims a place for a call at `now`, or says when to look again.
    pub fn try_take(
        &mut self,
        now: Instant,
        calls: u64,
        tokens: TokenWeight,
    ) -> Result<u64, Instant> {
        let w = self.weight(calls, tokens);
        match &mut self.rule {
            Rule::Sliding(t, window) => t.try_take(now, w, *window),
            Rule::Fixed(f) => f.try_take(now, w),
            Rule::Bucket(g) => g.try_take(now, w),
        }
    }

    /// Call `id` came back at `arrived`; `used` is the tokens it really
    /// cost, when the response said (calls are counted as taken).
    pub fn complete(&mut self, id: u64, arrived: Instant, used: Option<Used>) {
        let used = used.and_then(|u| u.of(self.spec.unit));
        match &mut self.rule {
            Rule::Sliding(t, window) => {
                let arrived = t.sent(id).map_or(arrived, |s| arrived.max(s));
                t.complete(id, later(arrived, *window), used);
            }
            Rule::Fixed(f) => f.complete(id, arrived, used),
            Rule::Bucket(g) => g.complete(id, used),
        }
    }

    /// Counts a call sent at `sent`, still in flight, estimated at
    /// `tokens` (a policy added while it is out); its id, to complete it
    /// with. `None` for a bucket, which keeps no calls in flight to add.
    pub fn admit_in_flight(&mut self, sent: Instant, tokens: TokenWeight) -> Option<u64> {
        let w = self.weight(1, tokens);
        match &mut self.rule {
            Rule::Sliding(t, _) => Some(t.admit_in_flight(sent, w)),
            Rule::Fixed(f) => Some(f.tally_mut().admit_in_flight(sent, w)),
            Rule::Bucket(_) => None,
        }
    }

    /// Call `id` was never sent.
    pub fn cancel(&mut self, id: u64) {
        match &mut self.rule {
            Rule::Sliding(t, _) => {
                t.cancel(id);
            }
            Rule::Fixed(f) => {
                f.tally_mut().cancel(id);
            }
            Rule::Bucket(g) => {
                g.cancel(id);
            }
        }
    }

    /// A rate-limit 429 came: a bucket widens its skew allowance (see
    /// [`Gcra::widen`]); a window keeps its count, which jitter cannot
    /// push over.
    pub fn widen(&mut self) {
        if let Rule::Bucket(g) = &mut self.rule {
            g.widen();
        }
    }

    /// The server says the quota is used up: no call starts before
    /// `until`, and a bucket is empty then (no burst after the hold).
    pub fn hold_until(&mut self, until: Instant) {
        match &mut self.rule {
            Rule::Sliding(t, _) => t.hold_until(until),
            Rule::Fixed(f) => f.tally_mut().hold_until(until),
            Rule::Bucket(g) => g.empty_until(until),
        }
    }

    /// The server's quota for this policy is `q`: a window is lowered to
    /// it (never raised); returns whether it fell. A bucket keeps its rate:
    /// a quota per window says nothing of its burst.
    pub fn lower_to(&mut self, q: u64) -> bool {
        match &mut self.rule {
            Rule::Sliding(t, _) => t.lower_to(q),
            Rule::Fixed(f) => f.tally_mut().lower_to(q),
            Rule::Bucket(_) => false,
        }
    }

    /// The server says its window resets at `a.origin`: a fixed window
    /// aligns to it. Returns whether it did.
    pub fn align(&mut self, a: Align) -> bool {
        match &mut self.rule {
            Rule::Fixed(f) => f.align(a),
            _ => false,
        }
    }

    /// Counts `units` the server says were spent already, as answered at
    /// `now` (a sliding window or a fixed one; a bucket takes them as sent
    /// now).
    pub fn admit_answered(&mut self, now: Instant, units: u64) {
        if units == 0 {
            return;
        }
        match &mut self.rule {
            Rule::Sliding(t, window) => t.admit_answered(later(now, *window), units),
            Rule::Fixed(f) => {
                let id = f.tally_mut().admit_in_flight(now, units);
                f.complete(id, now, None);
            }
            Rule::Bucket(g) => g.spend(now, units),
        }
    }

    /// Units occupying at `now`: a window's, or a bucket of tokens' level
    /// (OpenAI's and Anthropic's `remaining` is their bucket's, so what it
    /// says was spent corrects ours). `None` for a bucket of calls, whose
    /// stated quota per window is no measure of its level.
    pub fn used(&mut self, now: Instant) -> Option<u64> {
        match &mut self.rule {
            Rule::Sliding(t, _) => Some(t.used(now)),
            Rule::Fixed(f) => Some(f.tally_mut().used(now)),
            Rule::Bucket(g) if self.spec.unit.is_tokens() => Some(g.level(now)),
            Rule::Bucket(_) => None,
        }
    }

    /// What it allows and what occupies it at `now`: a window's quota and
    /// the units in it; a bucket's capacity (its burst and one) and the
    /// units' worth it holds.
    pub fn occupancy(&mut self, now: Instant) -> (u64, u64) {
        match &mut self.rule {
            Rule::Bucket(g) => (g.burst().saturating_add(1), g.level(now)),
            _ => (self.quota(), self.used(now).unwrap_or(0)),
        }
    }

    /// How long response `p` stating this policy used up holds calls, its
    /// reset said `reset`: a bucket of calls' as [`bucket_emptied_hold`]
    /// says; [`hold_until`](Self::hold_until) empties the bucket kept here
    /// as the server's is, so whoever emptied it, no burst follows the
    /// hold. A window's, and a bucket of tokens' (a token's interval says
    /// nothing of when a call fits), hold as said, no longer than the
    /// window for a reset in whole seconds ([`Announced::hold`]).
    pub fn emptied_hold(&self, p: &Announced, reset: Duration) -> Duration {
        match (self.spec.unit, &self.rule) {
            (Unit::Calls, Rule::Bucket(_)) => bucket_emptied_hold(self.rate, reset, p.reset_exact),
            _ => p.hold(reset, p.window.unwrap_or(self.window())),
        }
    }

    /// Whether this is a fixed window.
    pub fn is_fixed(&self) -> bool {
        matches!(self.rule, Rule::Fixed(_))
    }
}

/// The sliding window of calls that stands first in a set for `spec`: the
/// policy itself when it is one, else its envelope, the most calls any span
/// of its window can hold (twice the quota for a fixed window, the quota
/// plus the burst and one for a bucket, the quota for tokens, of which a
/// call costs at least one): it never binds before the policy itself, and
/// it is what pauses and learning act on.
pub fn envelope(spec: &PolicySpec) -> Option<(u64, Duration)> {
    let r = spec.rate()?;
    let n = match (spec.unit, spec.shape) {
        (Unit::Tokens | Unit::InputTokens | Unit::OutputTokens, _) => r.count,
        (Unit::Calls, Shape::Sliding) => r.count,
        (Unit::Calls, Shape::Fixed) => r.count.saturating_mul(2),
        (Unit::Calls, Shape::Bucket { burst }) => {
            r.count.saturating_add(burst.unwrap_or(0)).saturating_add(1)
        }
    };
    Some((n, r.period))
}

/// How long a response stating a bucket of calls of `rate` used up holds
/// calls, its reset said `reset` (stated to the millisecond: `exact`). Its
/// next call drips in within one interval, so a reset in whole seconds no
/// later than that and the second it is rounded up by says no more
/// (nginx's IETF `t=1` held a bucket of 10 a second for a second each time
/// it emptied): one interval, in whole ms (the fleet's clock's grain).
/// A longer reset holds as said.
pub fn bucket_emptied_hold(rate: Rate, reset: Duration, exact: bool) -> Duration {
    let unit = super::gcra::interval(rate);
    if exact || reset > unit + Duration::from_secs(1) {
        return reset;
    }
    let ms = unit.as_nanos().div_ceil(1_000_000);
    Duration::from_millis(u64::try_from(ms).unwrap_or(u64::MAX))
}

/// Whether `spec` is kept by an [`ExactWindow`](crate::rate::exact::ExactWindow).
pub fn is_sliding_calls(spec: &PolicySpec) -> bool {
    spec.shape == Shape::Sliding && spec.unit == Unit::Calls
}

#[cfg(test)]
mod tests;
