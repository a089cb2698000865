//! The drip rules' in-process stores for the one scenario harness: the
//! SpikeArrest mirror ([`SpikePace`]) and the token bucket
//! ([`TokenBucket`]), answering the same [`Call`]s as the fleet's script
//! does for `--pacer spike` and `--pacer bucket` (`fleet/lua/drip.lua`).
//!
//! A [`Scenario`]'s `limit` per `window` is the rule's rate (and for the
//! bucket, the limit it is sized under). What the drip rules answer:
//! a granted take says the rate's count (the spike mirror's
//! messagesPerPeriod, the bucket's capacity) and the calls in flight; a
//! refused one the whole ms until the rule may let it go, rounded up, and
//! whether a pause is why; a 429 the pause in force and no learnt limit
//! (neither rule learns one); a reported limit whether the rule slowed;
//! `remaining: 0` holds nothing (neither rule reads it): `Held { ms: 0 }`.
//!
//! Both rules begin at the first call that reaches them, as the script's
//! state is made at the first op that needs it.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use super::{Answer, Call, Scenario, Store};
use crate::rate::bucket::TokenBucket;
use crate::rate::spike_pace::SpikePace;
use crate::rate::Rate;

/// Which drip rule a scenario drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DripRule {
    /// The SpikeArrest mirror.
    Spike,
    /// The token bucket with this `--burst` (a tenth of the limit when
    /// `None`).
    Bucket {
        /// The capacity asked for.
        burst: Option<u64>,
    },
}

impl DripRule {
    /// The in-process store of this rule for `s`.
    pub fn in_process(self, s: &Scenario) -> Box<dyn Store> {
        match self {
            DripRule::Spike => Box::new(InProcessSpike::new(s)),
            DripRule::Bucket { burst } => Box::new(InProcessBucket::new(s, burst)),
        }
    }
}

/// Whole ms from `now` to `until`, rounded up: the script's clock is in
/// whole ms, and a wait it answers is never shorter than the rule's.
fn ms_up(now: Instant, until: Instant) -> u64 {
    let ns = until.saturating_duration_since(now).as_nanos();
    u64::try_from(ns.div_ceil(1_000_000)).unwrap_or(u64::MAX)
}

/// The rate a scenario's rule keeps.
fn rate_of(s: &Scenario) -> Rate {
    Rate {
        count: s.limit,
        period: Duration::from_millis(s.window),
    }
}

/// The in-process SpikeArrest mirror on the scenario's clock.
pub struct InProcessSpike {
    rate: Rate,
    t0: Instant,
    p: Option<SpikePace>,
}

impl InProcessSpike {
    /// A mirror for `s`, made full at its first call.
    pub fn new(s: &Scenario) -> InProcessSpike {
        InProcessSpike {
            rate: rate_of(s),
            t0: Instant::now(),
            p: None,
        }
    }
}

impl Store for InProcessSpike {
    fn name(&self) -> &'static str {
        "in-process spike"
    }

    fn apply(&mut self, now: u64, call: Call) -> Answer {
        let at = |ms: u64| self.t0 + Duration::from_millis(ms);
        let t = at(now);
        if call == Call::Full {
            return Answer::Held { ms: 0 };
        }
        let rate = self.rate;
        let p = self.p.get_or_insert_with(|| SpikePace::new(rate, t));
        match call {
            Call::Take(..) => match p.try_take(t) {
                Ok(()) => Answer::Granted {
                    limit: p.rate().count,
                    occupancy: p.in_flight(),
                    learnt: 0,
                    settled: false,
                },
                Err(until) => Answer::Wait {
                    ms: ms_up(t, until),
                    paused: p.paused_until(t).is_some(),
                },
            },
            Call::Settle(_, ago, _) => {
                p.complete(at(now - ago));
                Answer::Noted
            }
            Call::Cancel(_) => {
                p.cancel();
                Answer::Noted
            }
            Call::RateLimited(pause) => {
                p.pause_until(t + Duration::from_millis(pause), t);
                let until = p.paused_until(t).unwrap_or(t);
                Answer::Paused {
                    ms: ms_up(t, until),
                    learnt: 0,
                }
            }
            Call::InForce(l) => Answer::InForce {
                lowered: p.shrink_to(l, t),
            },
            Call::Full => Answer::Held { ms: 0 },
            // The drip rules keep no stated policy, in-process or in Redis.
            Call::Stated(..)
            | Call::Refill(..)
            | Call::Emptied(..)
            | Call::Aligned(..)
            | Call::Spent(..) => Answer::Noted,
        }
    }
}

/// The in-process token bucket on the scenario's clock.
pub struct InProcessBucket {
    rate: Rate,
    burst: Option<u64>,
    t0: Instant,
    b: Option<TokenBucket>,
    /// Calls granted and not yet settled or cancelled.
    out: HashSet<u64>,
}

impl InProcessBucket {
    /// A bucket for `s` with `burst` (a tenth of the limit when `None`;
    /// [`TokenBucket::for_limit`] must size it), made full at its first
    /// call.
    pub fn new(s: &Scenario, burst: Option<u64>) -> InProcessBucket {
        InProcessBucket {
            rate: rate_of(s),
            burst,
            t0: Instant::now(),
            b: None,
            out: HashSet::new(),
        }
    }

    /// The bucket, made at `t` if this is the first call to reach it.
    fn bucket(&mut self, t: Instant) -> &mut TokenBucket {
        let (rate, burst) = (self.rate, self.burst);
        self.b.get_or_insert_with(|| {
            TokenBucket::for_limit(rate, burst, false, t)
                .unwrap_or_else(|_| TokenBucket::new(1, 1.0, t))
        })
    }
}

impl Store for InProcessBucket {
    fn name(&self) -> &'static str {
        "in-process bucket"
    }

    fn apply(&mut self, now: u64, call: Call) -> Answer {
        let t = self.t0 + Duration::from_millis(now);
        match call {
            Call::Take(id, _) => {
                let b = self.bucket(t);
                match b.try_take(t) {
                    Ok(()) => {
                        let limit = b.capacity();
                        self.out.insert(id);
                        Answer::Granted {
                            limit,
                            occupancy: self.out.len() as u64,
                            learnt: 0,
                            settled: false,
                        }
                    }
                    Err(until) => Answer::Wait {
                        ms: ms_up(t, until),
                        paused: b.paused_until(t).is_some(),
                    },
                }
            }
            Call::Settle(id, ..) => {
                self.out.remove(&id);
                Answer::Noted
            }
            Call::Cancel(id) => {
                if self.out.remove(&id) {
                    self.bucket(t).refund();
                }
                Answer::Noted
            }
            Call::RateLimited(pause) => {
                let b = self.bucket(t);
                b.pause_until(t + Duration::from_millis(pause), t);
                let until = b.paused_until(t).unwrap_or(t);
                Answer::Paused {
                    ms: ms_up(t, until),
                    learnt: 0,
                }
            }
            Call::InForce(l) => {
                let r = Rate {
                    count: l,
                    period: self.rate.period,
                };
                // A limit no bucket can be sized for is not followed, and
                // the fleet's pacer does not tell the script of it.
                if TokenBucket::for_limit(r, None, false, t).is_err() {
                    return Answer::InForce { lowered: false };
                }
                Answer::InForce {
                    lowered: self.bucket(t).shrink_to(r, t),
                }
            }
            Call::Full => Answer::Held { ms: 0 },
            // The drip rules keep no stated policy, in-process or in Redis.
            Call::Stated(..)
            | Call::Refill(..)
            | Call::Emptied(..)
            | Call::Aligned(..)
            | Call::Spent(..) => Answer::Noted,
        }
    }
}
