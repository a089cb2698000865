//! The in-process store of the scenario harness: the window rule's
//! [`ExactWindow`] in a [`PolicySet`] with every further policy, on the
//! scenario's clock, answering each [`Call`] as the fleet's script is
//! asked to (see the parent module).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::{Answer, Call, Scenario, Store};
use crate::rate::announce::Announced;
use crate::rate::exact::{ExactWindow, Learning};
use crate::rate::fixed::Align;
use crate::rate::kept::Kept;
use crate::rate::policies::{PolicySet, SetSlot};
use crate::rate::policy::{PolicySpec, Shape, TokenWeight, Unit};
use crate::rate::{Limit, Rate};

/// The in-process store: an [`ExactWindow`] on the scenario's clock, in a
/// [`PolicySet`] with one more for each further limit.
pub struct InProcess {
    w: PolicySet,
    t0: Instant,
    slots: HashMap<u64, SetSlot>,
    /// Whether the learnt limit has settled, as its events said.
    settled: bool,
    /// The first policy of tokens stated (quota, window ms, unit), and the
    /// period it refills over once an [`Op::Refill`] said so.
    stated: Option<(u64, u64, Unit)>,
    refilled: Option<u64>,
    /// The scenario's buckets of calls (N, W ms, B).
    buckets: Vec<(u64, u64, u64)>,
    /// The scenario's fixed windows (N, W ms, what each counts).
    fixed: Vec<(u64, u64, Unit)>,
}

impl InProcess {
    /// An empty window for `s`.
    pub fn new(s: &Scenario) -> InProcess {
        let t0 = Instant::now();
        InProcess {
            w: PolicySet::new(
                ExactWindow::new(s.limit, Duration::from_millis(s.window), t0),
                s.further
                    .iter()
                    .map(|&(l, w)| ExactWindow::new(l, Duration::from_millis(w), t0))
                    .collect(),
            )
            .with_kept(
                s.buckets
                    .iter()
                    .map(|&b| bucket(b))
                    .chain(s.fixed.iter().map(|&f| fixed(f)))
                    .chain(s.tokens.iter().map(|&t| tokens(t)))
                    .chain(s.token_buckets.iter().map(|&b| token_bucket(b)))
                    .filter_map(Kept::new)
                    .collect(),
            ),
            t0,
            slots: HashMap::new(),
            settled: false,
            stated: None,
            refilled: None,
            buckets: s.buckets.clone(),
            fixed: s.fixed.clone(),
        }
    }

    /// Whole ms from `now` until `until`, rounded up as the script rounds
    /// a bucket's wait (every other wait is in whole ms already).
    fn ms_from(&self, now: Instant, until: Instant) -> u64 {
        let d = until.saturating_duration_since(now);
        u64::try_from(d.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX)
    }

    /// Reads the learning events at `now`, where the fleet would hear them.
    fn hear(&mut self, now: Instant) {
        while let Some(e) = self.w.primary_mut().take_event(now) {
            self.settled = matches!(e, Learning::Settled(_));
        }
    }

    fn take(&mut self, id: u64, tokens: TokenWeight, now: Instant) -> Answer {
        let r = self.w.try_take_weighted(now, 1, tokens);
        self.hear(now);
        match r {
            Ok(slot) => {
                self.slots.insert(id, slot);
                let p = self.w.primary();
                let learnt = p.learnt();
                Answer::Granted {
                    limit: p.limit(),
                    occupancy: p.occupancy(now),
                    learnt: learnt.unwrap_or(0),
                    settled: learnt.is_some() && self.settled,
                }
            }
            Err(until) => Answer::Wait {
                ms: self.ms_from(now, until),
                paused: self.w.primary().paused_until(now).is_some(),
            },
        }
    }
}

/// The policy of a scenario's bucket (N, W ms, B).
pub fn bucket((n, w, b): (u64, u64, u64)) -> PolicySpec {
    PolicySpec {
        limit: Limit::Rate(Rate {
            count: n,
            period: Duration::from_millis(w),
        }),
        shape: Shape::Bucket { burst: Some(b) },
        unit: Unit::Calls,
        named: true,
    }
}

/// The policy of a scenario's token bucket (Q, W ms, B, what it counts).
pub fn token_bucket((q, w, b, unit): (u64, u64, u64, Unit)) -> PolicySpec {
    PolicySpec {
        unit,
        ..bucket((q, w, b))
    }
}

/// The policy of a scenario's token window (Q, W ms, what it counts).
pub fn tokens((q, w, unit): (u64, u64, Unit)) -> PolicySpec {
    PolicySpec {
        limit: Limit::Rate(Rate {
            count: q,
            period: Duration::from_millis(w),
        }),
        shape: Shape::Sliding,
        unit,
        named: true,
    }
}

/// The policy of a scenario's fixed window (N, W ms, what it counts).
pub fn fixed((n, w, unit): (u64, u64, Unit)) -> PolicySpec {
    PolicySpec {
        limit: Limit::Rate(Rate {
            count: n,
            period: Duration::from_millis(w),
        }),
        shape: Shape::Fixed,
        unit,
        named: true,
    }
}

impl Store for InProcess {
    fn name(&self) -> &'static str {
        "in-process"
    }

    fn apply(&mut self, now: u64, call: Call) -> Answer {
        let at = |ms: u64| self.t0 + Duration::from_millis(ms);
        let t = at(now);
        match call {
            Call::Take(id, tokens) => self.take(id, tokens, t),
            Call::Settle(id, ago, used) => {
                if let Some(slot) = self.slots.remove(&id) {
                    self.w.complete_used(slot, at(now - ago), used);
                }
                Answer::Noted
            }
            Call::Cancel(id) => {
                if let Some(slot) = self.slots.remove(&id) {
                    self.w.cancel(slot);
                }
                Answer::Noted
            }
            Call::RateLimited(pause) => {
                let learnt = self.w.rate_limited(t);
                self.w.widen_buckets();
                self.w
                    .primary_mut()
                    .pause_until(t + Duration::from_millis(pause));
                self.hear(t);
                let until = self.w.primary().paused_until(t).unwrap_or(t);
                Answer::Paused {
                    ms: self.ms_from(t, until),
                    learnt: learnt.unwrap_or(0),
                }
            }
            Call::InForce(l) => Answer::InForce {
                lowered: self.w.primary_mut().set_limit_in_force(l, t),
            },
            Call::Full => {
                let until = self.w.primary_mut().remaining_zero(t);
                Answer::Held {
                    ms: self.ms_from(t, until),
                }
            }
            Call::Refill(period, used) => self.refill(period, used, t),
            Call::Emptied(bucket, reset, exact) => {
                self.emptied(bucket, reset, exact, t);
                Answer::Noted
            }
            Call::Aligned(fixed, reset, early, late) => {
                Answer::Aligned(self.align(fixed, reset, early, late, t))
            }
            Call::Stated(quota, window, used, unit) => {
                self.stated(quota, window, used, unit, t);
                Answer::Noted
            }
            Call::Spent(fixed, used) => {
                if let Some(&(n, w, unit)) = self.fixed.get(fixed % self.fixed.len().max(1)) {
                    self.w
                        .announce(&[announced(n, w, n.saturating_sub(used), unit)], t);
                }
                Answer::Noted
            }
        }
    }
}

impl InProcess {
    /// The first budget of tokens stated refills over `period` ms: kept as
    /// a bucket, or, found already, retimed from the period it keeps.
    fn refill(&mut self, period: u64, used: u64, t: Instant) -> Answer {
        let Some((q, w, unit)) = self.stated else {
            return Answer::Refilled(false);
        };
        let rate = Rate {
            count: q,
            period: Duration::from_millis(period),
        };
        let window = Duration::from_millis(self.refilled.unwrap_or(w));
        let done = self.w.refill_stated(unit, window, rate, used, t);
        if done {
            self.refilled = Some(period);
        }
        Answer::Refilled(done)
    }

    /// The policy of calls bucket `bucket` (modulo how many) keeps is said
    /// to be used up, resetting in `reset` ms, for its window.
    fn emptied(&mut self, bucket: usize, reset: u64, exact: bool, t: Instant) {
        let Some(&(n, w, _)) = self.buckets.get(bucket % self.buckets.len().max(1)) else {
            return;
        };
        let said = Announced {
            name: "emptied".into(),
            unit: crate::rate::announce::Unit::Calls,
            quota: Some(n),
            window: Some(Duration::from_millis(w)),
            remaining: Some(0),
            reset_in: Some(Duration::from_millis(reset)),
            reset_exact: exact,
            reset_dated: false,
        };
        self.w.announce(&[said], t);
    }

    /// Fixed window `fixed` (modulo how many) is said to reset in `reset`
    /// ms, `early` ms earlier or `late` ms later at most: aligned to it
    /// (whether now).
    fn align(&mut self, fixed: usize, reset: u64, early: u64, late: u64, t: Instant) -> bool {
        let Some(&(_, w, unit)) = self.fixed.get(fixed % self.fixed.len().max(1)) else {
            return false;
        };
        let ms = Duration::from_millis;
        let a = Align {
            origin: t + ms(reset),
            early: ms(early),
            late: ms(late),
        };
        self.w.align_fixed(unit, ms(w), a)
    }

    /// A policy stated: `quota` of `unit` per `window` ms, `used` of it
    /// used. The budget of tokens found to refill is read against the
    /// bucket it became, whose window is its period.
    fn stated(&mut self, quota: u64, window: u64, used: u64, unit: Unit, t: Instant) {
        let window = match self.refilled {
            Some(period) if self.stated == Some((quota, window, unit)) => period,
            _ => window,
        };
        if unit.is_tokens() && self.stated.is_none() {
            self.stated = Some((quota, window, unit));
        }
        let stated = announced(quota, window, quota.saturating_sub(used), unit);
        self.w.announce(&[stated], t);
    }
}

/// A statement of `quota` of `unit` per `window` ms with `left` left and
/// no reset.
fn announced(quota: u64, window: u64, left: u64, unit: Unit) -> Announced {
    use crate::rate::announce::Unit as Said;
    Announced {
        name: format!("stated {}", unit.name()),
        unit: match unit {
            Unit::Calls => Said::Calls,
            Unit::Tokens => Said::Tokens,
            Unit::InputTokens => Said::InputTokens,
            Unit::OutputTokens => Said::OutputTokens,
        },
        quota: Some(quota),
        window: Some(Duration::from_millis(window)),
        remaining: Some(left),
        reset_in: None,
        reset_exact: false,
        reset_dated: false,
    }
}
