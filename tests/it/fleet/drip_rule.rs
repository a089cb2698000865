//! The drip rules in two stores: the SpikeArrest mirror and the token
//! bucket in-process (`batchrun::rate::scenario::drip`) and in the fleet's
//! script (`spike_*` / `bucket_*` ops) in a real Redis, through the same
//! scenarios on one fake clock; any answer that differs fails the test
//! with the scenario.

use std::time::{Duration, Instant};

use batchrun::rate::bucket::{skew_allowance, TokenBucket};
use batchrun::rate::scenario::drip::DripRule;
use batchrun::rate::scenario::{self, Answer, Call, Op, Scenario, Step, Store};
use batchrun::rate::Rate;
use proptest::prelude::*;
use proptest::test_runner::TestRunner;

use super::rule::Lua;
use super::scenarios::op;
use super::support::Redis;

/// The script keeping one drip rule for one scenario.
struct DripLua {
    lua: Lua,
    kind: &'static str,
    window: Duration,
    /// The rule as the fleet's pacer describes it to the script.
    a: String,
    b: String,
}

impl DripLua {
    fn new(redis: &Redis, rule: DripRule, s: &Scenario) -> DripLua {
        let window = Duration::from_millis(s.window);
        let (kind, a, b) = match rule {
            DripRule::Spike => ("spike", s.limit.to_string(), "0".to_string()),
            DripRule::Bucket { burst } => {
                let r = Rate {
                    count: s.limit,
                    period: window,
                };
                let t = TokenBucket::for_limit(r, burst, false, Instant::now())
                    .expect("the scenario's bucket is sized");
                (
                    "bucket",
                    t.capacity().to_string(),
                    t.rate_per_sec().to_string(),
                )
            }
        };
        DripLua {
            lua: Lua::new(redis, s),
            kind,
            window,
            a,
            b,
        }
    }

    fn op<T: redis::FromRedisValue>(
        &mut self,
        now: u64,
        verb: &str,
        args: impl FnOnce(&mut redis::ScriptInvocation<'_>, &str, &str),
    ) -> T {
        let name = format!("{}_{verb}", self.kind);
        let (a, b) = (self.a.clone(), self.b.clone());
        self.lua.op(now, &name, |inv| args(inv, &a, &b))
    }
}

impl Store for DripLua {
    fn name(&self) -> &'static str {
        "script"
    }

    fn apply(&mut self, now: u64, call: Call) -> Answer {
        match call {
            Call::Take(id, _) => {
                let v: Vec<i64> = self.op(now, "take", |inv, a, b| {
                    // No ceiling, no settles, nothing to put back.
                    inv.arg(id.to_string()).arg(a).arg(b).arg(0);
                    inv.arg(0);
                    inv.arg(0).arg(0).arg(0).arg(0);
                });
                match v[..] {
                    [1, limit, occupancy, 0, 0] => Answer::Granted {
                        limit: limit as u64,
                        occupancy: occupancy as u64,
                        learnt: 0,
                        settled: false,
                    },
                    [0, ms, why] => Answer::Wait {
                        ms: ms as u64,
                        paused: why == 1,
                    },
                    _ => panic!("take answered {v:?}"),
                }
            }
            Call::Settle(id, ago, _) => {
                let _: i64 = self.op(now, "settle", |inv, _, _| {
                    inv.arg(1).arg(id.to_string()).arg(ago as i64);
                });
                Answer::Noted
            }
            Call::Cancel(id) => {
                let _: i64 = self.op(now, "settle", |inv, _, _| {
                    inv.arg(1).arg(id.to_string()).arg(-1);
                });
                Answer::Noted
            }
            Call::RateLimited(pause) => {
                let v: Vec<i64> = self.op(now, "pause", |inv, a, b| {
                    inv.arg(pause).arg(a).arg(b).arg(0);
                });
                Answer::Paused {
                    ms: v[0] as u64,
                    learnt: v[1] as u64,
                }
            }
            Call::InForce(l) => {
                let mut extra = Vec::new();
                if self.kind == "bucket" {
                    let r = Rate {
                        count: l,
                        period: self.window,
                    };
                    // As the fleet's pacer: a limit no bucket fits is not told.
                    let Ok(t) = TokenBucket::for_limit(r, None, false, Instant::now()) else {
                        return Answer::InForce { lowered: false };
                    };
                    let span = (self.window + skew_allowance(self.window)).as_micros();
                    extra = vec![
                        t.capacity().to_string(),
                        t.rate_per_sec().to_string(),
                        span.to_string(),
                    ];
                }
                let lowered: i64 = self.op(now, "inforce", |inv, a, b| {
                    inv.arg(l).arg(a).arg(b);
                    for e in &extra {
                        inv.arg(e);
                    }
                });
                Answer::InForce {
                    lowered: lowered == 1,
                }
            }
            Call::Full => Answer::Held { ms: 0 },
            // The drip rules keep no stated policy.
            Call::Stated(..)
            | Call::Refill(..)
            | Call::Emptied(..)
            | Call::Aligned(..)
            | Call::Spent(..) => Answer::Noted,
        }
    }
}

fn check(redis: &Redis, rule: DripRule, s: &Scenario) -> Result<(), String> {
    let mut mine = rule.in_process(s);
    scenario::compare(s, mine.as_mut(), &mut DripLua::new(redis, rule, s)).map(|_| ())
}

#[test]
fn the_script_answers_the_drip_design_scenarios_as_the_rules_do() {
    let redis = Redis::start();
    let failed: Vec<String> = scenario::design::drip_all()
        .into_iter()
        .filter_map(|(name, rule, s)| {
            check(&redis, rule, &s)
                .err()
                .map(|e| format!("{name}: {e}"))
        })
        .collect();
    assert!(failed.is_empty(), "{}", failed.join("\n\n"));
}

/// A drip rule and a scenario for it: steps often in one instant, else a
/// few ms apart, now and then a window or two; a limit reported in half.
fn scenarios() -> impl Strategy<Value = (DripRule, Scenario)> {
    let sized = (2u64..=60).prop_flat_map(|limit| {
        let burst = prop_oneof![Just(None), (1..limit).prop_map(Some)];
        (Just(limit), burst)
    });
    let rule = prop_oneof![
        (1u64..=60).prop_map(|l| (DripRule::Spike, l)),
        sized.prop_map(|(l, burst)| (DripRule::Bucket { burst }, l)),
        Just((DripRule::Bucket { burst: None }, 1)),
    ];
    (rule, 20u64..=1500, any::<bool>()).prop_flat_map(|((rule, limit), window, reports)| {
        let gap = prop_oneof![3 => Just(0), 6 => 1..=window / 8, 1 => window..=2 * window];
        let inforce = (1u64..=60).prop_map(|limit| Op::InForce { limit });
        let step = prop_oneof![40 => op(window), u32::from(reports) => inforce];
        proptest::collection::vec((gap, step), 1..=80).prop_map(move |steps| {
            let mut at = 0;
            let steps = steps
                .into_iter()
                .map(|(gap, op)| {
                    at += gap;
                    Step { at, op }
                })
                .collect();
            (
                rule,
                Scenario {
                    steps,
                    ..Scenario::of(limit, window)
                },
            )
        })
    })
}

#[test]
fn the_script_and_the_drip_rules_answer_every_scenario_alike() {
    let redis = Redis::start();
    let mut runner = TestRunner::new(ProptestConfig {
        cases: 1000,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    let result = runner.run(&scenarios(), |(rule, s)| {
        check(&redis, rule, &s).map_err(|e| TestCaseError::fail(format!("{rule:?}: {e}")))
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// The loss check for a drip rule, op by op on the script's clock: after a
/// `FLUSHALL` the next take hears the fleet was forgotten, the mirror
/// starts again empty and the fleet is held one window, and once the
/// process has put its call in flight back, the drip still cannot pay
/// that call back. Without the check, the take after the flush would be
/// granted at once from a full bucket, beside a call the gateway may not
/// have seen yet.
#[test]
fn a_forgotten_spike_fleet_starts_empty_holds_a_window_and_keeps_its_calls_in_flight() {
    let redis = Redis::start();
    // 10 per 1 s: a bucket of 1, one call per 100 ms.
    let s = Scenario::of(10, 1000);
    let mut lua = Lua::new(&redis, &s);
    // take: id, messagesPerPeriod, unused, no ceiling, no settles, then a
    // restore block, then the loss check (epoch heard, fresh, witness).
    let mut take = |now: u64, id: &str, restore: &[&str], check: [&str; 3]| -> Vec<i64> {
        lua.op(now, "spike_take", |inv| {
            inv.arg(id).arg(10).arg(0).arg(0).arg(0);
            inv.arg(0).arg(0).arg(0).arg(restore.len());
            for r in restore {
                inv.arg(*r).arg(3_600_000).arg(1);
            }
            inv.arg(check[0]).arg(check[1]).arg(check[2]);
        })
    };
    assert_eq!(take(0, "a", &[], ["", "7", ""]), [1, 10, 1, 0, 0, 7]);
    redis::cmd("FLUSHALL")
        .query::<()>(&mut redis.conn())
        .unwrap();
    // Heard epoch 7, with "a" in flight: forgotten, a new epoch (8).
    assert_eq!(take(10, "b", &[], ["7", "8", "a"]), [0, 1, 4, 8]);
    // Putting "a" back: held until a window after the loss.
    assert_eq!(take(11, "b", &["a"], ["", "9", ""]), [0, 999, 2, 8]);
    // After the hold the empty bucket has refilled, but "a" is still out.
    assert_eq!(take(1010, "b", &[], ["8", "9", "a"]), [0, 100, 2, 8]);
    let settled: i64 = lua.op(1010, "spike_settle", |inv| {
        inv.arg(1).arg("a").arg(0);
    });
    assert_eq!(settled, 1);
    let mut take = |now: u64| -> Vec<i64> {
        lua.op(now, "spike_take", |inv| {
            inv.arg("b").arg(10).arg(0).arg(0).arg(0);
            inv.arg(0).arg(0).arg(0).arg(0);
            inv.arg("8").arg("9").arg("");
        })
    };
    assert_eq!(take(1109), [0, 1, 2, 8]);
    assert_eq!(take(1110), [1, 10, 1, 0, 0, 8]);
}
