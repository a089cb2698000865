//! The fleet's script and the in-process state machine, one window rule in
//! two stores: every scenario of `batchrun::rate::scenario` is run against
//! both, the script in a real Redis on the scenario's clock, and any
//! answer that differs fails the test with the scenario.

use std::time::Duration;

use batchrun::fleet::script::{ScriptArgs, SCRIPT};
use batchrun::fleet::FleetKeys;
use batchrun::rate::scenario::{self, Answer, Call, InProcess, Op, Scenario, Step, Store};
use proptest::prelude::*;
use proptest::test_runner::TestRunner;

use super::support::{fleet_name, Redis};

/// Where the script's clock starts: a unix time in ms, as from `TIME`.
const BASE: u64 = 1_700_000_000_000;

/// The script on a connection of its own, one scenario's keys, and the
/// scenario's clock.
pub(super) struct Lua {
    conn: redis::Connection,
    script: redis::Script,
    names: FleetKeys,
    keys: Vec<String>,
    args: ScriptArgs,
    pub(super) limit: u64,
    /// No limit reported yet: a 429 teaches one, as in the fleet pacer.
    secret: bool,
}

impl Lua {
    pub(super) fn new(redis: &Redis, s: &Scenario) -> Lua {
        let window = Duration::from_millis(s.window);
        let k = FleetKeys::named(&fleet_name("rule"));
        Lua {
            conn: redis.conn(),
            script: redis::Script::new(SCRIPT),
            keys: {
                let mut keys = k.pacer().to_vec();
                keys.extend(s.further.iter().map(|&(l, w)| k.further(l, w)));
                // A fixed window no reset aligned: a further window.
                keys.extend(s.fixed.iter().map(|&(l, w)| k.further(l, w)));
                keys.extend(s.tokens.iter().map(|&(q, w)| k.tokens(q, w)));
                keys.extend(s.buckets.iter().filter_map(|&b| {
                    let spec = scenario::bucket(b);
                    Some(k.bucket(spec.rate()?, b.2, spec.unit))
                }));
                keys.extend(s.token_buckets.iter().filter_map(|&b| {
                    let spec = scenario::token_bucket(b);
                    Some(k.bucket(spec.rate()?, b.2, spec.unit))
                }));
                keys
            },
            names: k,
            // Calls in flight and leases outlast any scenario: neither is
            // part of the rule both stores share.
            args: ScriptArgs {
                window,
                hold: window + Duration::from_secs(3600),
                lease: Duration::from_secs(3600),
            },
            limit: s.limit,
            secret: true,
        }
    }

    pub(super) fn op<T: redis::FromRedisValue>(
        &mut self,
        now: u64,
        op: &str,
        args: impl FnOnce(&mut redis::ScriptInvocation<'_>),
    ) -> T {
        let mut inv = self
            .args
            .invoke(&self.script, &self.keys, op, Some(BASE + now));
        args(&mut inv);
        inv.invoke(&mut self.conn)
            .unwrap_or_else(|e| panic!("the script failed at {op}: {e}"))
    }

    /// Every key of the scenario (to forget them, as Redis may).
    pub(super) fn keys_held(&self) -> Vec<String> {
        self.keys.clone()
    }

    /// A field of the scenario's limit hash (KEYS[4]).
    pub(super) fn limit_field(&mut self, field: &str) -> Option<String> {
        redis::cmd("HGET")
            .arg(&self.keys[3])
            .arg(field)
            .query(&mut self.conn)
            .expect("HGET")
    }
}

fn settle_list(inv: &mut redis::ScriptInvocation<'_>, id: u64, ago: i64, used: Option<u64>) {
    let ago = match used {
        Some(u) => format!("{ago}/{u}"),
        None => ago.to_string(),
    };
    inv.arg(1).arg(id.to_string()).arg(ago);
}

impl Store for Lua {
    fn name(&self) -> &'static str {
        "script"
    }

    fn apply(&mut self, now: u64, call: Call) -> Answer {
        match call {
            Call::Take(id, tokens) => {
                let cap = self.limit;
                let v: Vec<i64> = self.op(now, "take", |inv| {
                    // Headroom 1, no ceiling, the estimate, no settles,
                    // nothing to put back.
                    inv.arg(id.to_string()).arg(cap).arg(1).arg(0).arg(tokens);
                    inv.arg(0);
                    inv.arg(0).arg(0).arg(0).arg(0);
                });
                match v[..] {
                    // The last: whether a bare rate's refused burst paced
                    // the fleet evenly (a pause with learning 2 only).
                    [1, limit, occupancy, learnt, settled, 0] => Answer::Granted {
                        limit: limit as u64,
                        occupancy: occupancy as u64,
                        learnt: learnt as u64,
                        settled: settled == 1,
                    },
                    [0, ms, why] => Answer::Wait {
                        ms: ms as u64,
                        paused: why == 1,
                    },
                    _ => panic!("take answered {v:?}"),
                }
            }
            Call::Settle(id, ago, used) => {
                let _: i64 = self.op(now, "settle", |inv| settle_list(inv, id, ago as i64, used));
                Answer::Noted
            }
            Call::Cancel(id) => {
                let _: i64 = self.op(now, "settle", |inv| settle_list(inv, id, -1, None));
                Answer::Noted
            }
            Call::RateLimited(pause) => {
                let (cap, learn) = (self.limit, u8::from(self.secret));
                let v: Vec<i64> = self.op(now, "pause", |inv| {
                    inv.arg(pause).arg(cap).arg(learn).arg(0);
                });
                Answer::Paused {
                    ms: v[0] as u64,
                    learnt: v[1] as u64,
                }
            }
            Call::InForce(l) => {
                self.secret = false;
                let lowered: i64 = self.op(now, "inforce", |inv| {
                    inv.arg(l);
                });
                Answer::InForce {
                    lowered: lowered == 1 && l < self.limit,
                }
            }
            Call::Full => {
                let ms: i64 = self.op(now, "full", |_| {});
                Answer::Held { ms: ms as u64 }
            }
            Call::Stated(quota, window, used, tokens) => {
                // As the fleet's pacer: a stated policy of calls means no
                // secret limit to learn; the adopted key is passed from
                // then on.
                let key = match tokens {
                    true => self.names.tokens(quota, window),
                    false => self.names.further(quota, window),
                };
                self.secret &= tokens;
                match self.keys.iter().position(|k| *k == key) {
                    None => {
                        self.keys.push(key);
                        let index = self.keys.len();
                        let _: i64 = self.op(now, "adopt", |inv| {
                            inv.arg(index).arg(used);
                        });
                    }
                    // Kept: what the server says beyond the fleet's count
                    // was spent elsewhere.
                    Some(i) if tokens => {
                        let _: i64 = self.op(now, "elsewhere", |inv| {
                            inv.arg(i + 1).arg(used);
                        });
                    }
                    Some(_) => {}
                }
                Answer::Noted
            }
        }
    }
}

fn check(redis: &Redis, s: &Scenario) -> Result<(), String> {
    scenario::compare(s, &mut InProcess::new(s), &mut Lua::new(redis, s)).map(|_| ())
}

#[test]
fn the_script_answers_the_design_scenarios_as_the_state_machine_does() {
    let redis = Redis::start();
    let failed: Vec<String> = scenario::design::all()
        .into_iter()
        .filter_map(|(name, s)| check(&redis, &s).err().map(|e| format!("{name}: {e}")))
        .collect();
    assert!(failed.is_empty(), "{}", failed.join("\n\n"));
}

pub(super) fn op(window: u64) -> impl Strategy<Value = Op> {
    prop_oneof![
        12 => Just(Op::Take),
        8 => (0usize..8, 0..=window).prop_map(|(pick, ago)| Op::Settle { pick, ago }),
        1 => (0usize..8).prop_map(|pick| Op::Cancel { pick }),
        2 => prop_oneof![0..=window / 8, 0..=2 * window].prop_map(|pause| Op::RateLimited { pause }),
        1 => Just(Op::Full),
    ]
}

/// Steps often in one instant, else a few ms apart, now and then a window
/// or two; a limit reported in half the scenarios.
fn scenarios() -> impl Strategy<Value = Scenario> {
    // A further limit in a third of them, two now and then.
    let further = prop_oneof![
        4 => Just(Vec::new()),
        2 => proptest::collection::vec((1u64..=8, 20u64..=3000), 1..=2),
    ];
    // A GCRA bucket in a third of them (N, W ms, burst), now and then two.
    let buckets = prop_oneof![
        4 => Just(Vec::new()),
        2 => proptest::collection::vec((1u64..=12, 20u64..=3000, 0u64..=4), 1..=2),
    ];
    // A fixed window in a sixth of them.
    let fixed = prop_oneof![
        5 => Just(Vec::new()),
        1 => proptest::collection::vec((1u64..=8, 20u64..=3000), 1..=1),
    ];
    // Token windows (Q, W ms) in a third of them, now and then two, with
    // weighed takes and settles that correct them.
    let tokens = prop_oneof![
        4 => Just(Vec::new()),
        2 => proptest::collection::vec((1u64..=200, 20u64..=3000), 1..=2),
    ];
    // Token buckets (Q, W ms, burst) in a sixth of them: weighed as the
    // token windows, a call heavier than the bucket now and then.
    let token_buckets = prop_oneof![
        5 => Just(Vec::new()),
        1 => proptest::collection::vec((1u64..=300, 20u64..=3000, 0u64..=200), 1..=2),
    ];
    (
        1u64..=8,
        20u64..=1500,
        any::<bool>(),
        further,
        (buckets, fixed, tokens, token_buckets),
    )
        .prop_flat_map(
            |(limit, window, reports, further, (buckets, fixed, tokens, token_buckets))| {
                let gap = prop_oneof![3 => Just(0), 6 => 1..=window / 8, 1 => window..=2 * window];
                let inforce = (1u64..=10).prop_map(|limit| Op::InForce { limit });
                let weighed = if tokens.is_empty() && token_buckets.is_empty() {
                    1
                } else {
                    20
                };
                let weighed_op = prop_oneof![
                    (0u64..=250).prop_map(|tokens| Op::TakeTokens { tokens }),
                    (0usize..8, 0..=window, 0u64..=250)
                        .prop_map(|(pick, ago, used)| Op::SettleUsed { pick, ago, used }),
                ];
                // A policy stated in a window no policy of the scenario
                // keeps (a fleet adopts it as a key of its own), once of
                // calls at most, and one of tokens, stated again and again.
                let taken: Vec<u64> = std::iter::once(window)
                    .chain(further.iter().chain(&fixed).chain(&tokens).map(|p| p.1))
                    .chain(buckets.iter().chain(&token_buckets).map(|b| b.1))
                    .collect();
                let stated = (any::<bool>(), 1u64..=200, 20u64..=3000, 0.0..1.0f64).prop_map(
                    move |(tokens, quota, mut window, used)| {
                        let quota = if tokens { quota } else { quota % 8 + 1 };
                        while taken.contains(&window) {
                            window += 1;
                        }
                        let used = (quota as f64 * used) as u64;
                        Op::Stated {
                            quota,
                            window,
                            used,
                            tokens,
                        }
                    },
                );
                let op = prop_oneof![
                    40 => op(window),
                    u32::from(reports) => inforce,
                    weighed => weighed_op,
                    2 => stated,
                ];
                proptest::collection::vec((gap, op), 1..=80).prop_map(move |steps| {
                    let mut at = 0;
                    let mut calls_once = false;
                    // A token policy stated again is the same policy with
                    // what the server says is used of it now.
                    let mut budget: Option<(u64, u64)> = None;
                    let steps = steps
                        .into_iter()
                        .filter_map(|(gap, op)| match op {
                            Op::Stated { tokens: false, .. } => {
                                (!std::mem::replace(&mut calls_once, true)).then_some((gap, op))
                            }
                            Op::Stated {
                                quota,
                                window,
                                used,
                                tokens: true,
                            } => {
                                let (quota, window) = *budget.get_or_insert((quota, window));
                                let used = used.min(quota.saturating_sub(1));
                                let tokens = true;
                                Some((
                                    gap,
                                    Op::Stated {
                                        quota,
                                        window,
                                        used,
                                        tokens,
                                    },
                                ))
                            }
                            op => Some((gap, op)),
                        })
                        .map(|(gap, op)| {
                            at += gap;
                            Step { at, op }
                        })
                        .collect();
                    Scenario {
                        limit,
                        window,
                        further: further.clone(),
                        buckets: buckets.clone(),
                        fixed: fixed.clone(),
                        tokens: tokens.clone(),
                        token_buckets: token_buckets.clone(),
                        steps,
                    }
                })
            },
        )
}

#[test]
fn the_script_and_the_state_machine_answer_every_scenario_alike() {
    let redis = Redis::start();
    let mut runner = TestRunner::new(ProptestConfig {
        cases: 1000,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    let result = runner.run(&scenarios(), |s| {
        check(&redis, &s).map_err(TestCaseError::fail)
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// Redis forgetting the fleet, on the script's clock: the process that
/// finds the loss holds the fleet for the longest token window (3 s), and
/// a process hearing of the new epoch later puts its calls back without
/// holding the fleet again from its own now.
#[test]
fn only_the_process_that_finds_a_loss_holds_the_fleet() {
    let redis = Redis::start();
    let s = Scenario {
        tokens: vec![(100, 3000)],
        ..Scenario::of(10, 1000)
    };
    let mut lua = Lua::new(&redis, &s);
    // take: id, cap, headroom 1, no ceiling, an estimate of 1 token, no
    // settles, no pause, nothing to put back, then the loss check (epoch
    // heard, fresh, witness).
    let mut take = |now: u64, id: &str, check: [&str; 3]| -> Vec<i64> {
        lua.op(now, "take", |inv| {
            inv.arg(id).arg(10).arg(1).arg(0).arg(1);
            inv.arg(0);
            inv.arg(0).arg(0).arg(0).arg(0);
            inv.arg(check[0]).arg(check[1]).arg(check[2]);
        })
    };
    let first = take(0, "a", ["", "7", ""]);
    assert_eq!((first[0], first[first.len() - 1]), (1, 7), "{first:?}");
    redis::cmd("FLUSHALL")
        .query::<()>(&mut redis.conn())
        .unwrap();
    // Its call "a" gone: this process finds the loss (a new epoch, 8).
    assert_eq!(take(10, "b", ["7", "8", "a"]), [0, 1, 4, 8]);
    // Another process, still on epoch 7, hears of epoch 8 later.
    assert_eq!(take(500, "c", ["7", "9", ""]), [0, 1, 4, 8]);
    // Held until 3 s after the loss was found, not after it heard of it.
    assert_eq!(take(501, "c", ["", "9", ""]), [0, 3010 - 501, 2, 8]);
    let after = take(3010, "c", ["8", "9", ""]);
    assert_eq!(after[0], 1, "{after:?}");
}

/// A policy one process adopted binds every process: a take that does not
/// pass its key is granted nothing and told to fetch the fleet's list
/// (answer 5); with the key, the window seeded with the call in flight and
/// what the server said was used is full.
#[test]
fn a_take_without_a_key_the_fleet_adopted_is_told_to_fetch_it() {
    let redis = Redis::start();
    let mut lua = Lua::new(&redis, &Scenario::of(10, 1000));
    assert_eq!(take10(&mut lua, 0, "a")[0], 1);
    // Another process reads "2 calls per 5 s, 2 used" and adopts it.
    let adopted = lua.names.further(2, 5000);
    lua.keys.push(adopted.clone());
    let index = lua.keys.len();
    let adopt = |lua: &mut Lua, now: u64| -> i64 {
        lua.op(now, "adopt", |inv| {
            inv.arg(index).arg(2);
        })
    };
    assert_eq!(adopt(&mut lua, 1), 1);
    assert_eq!(adopt(&mut lua, 1), 0, "adopted once");
    lua.keys.pop();
    assert_eq!(take10(&mut lua, 2, "b"), [0, 1, 5]);
    let listed: String = redis::cmd("HGET")
        .arg(lua.names.limit())
        .arg("stated")
        .query(&mut redis.conn())
        .unwrap();
    assert!(listed.split_whitespace().any(|k| k == adopted), "{listed}");
    // "a" in flight and one answered call the server counted besides.
    lua.keys.push(adopted);
    let full = take10(&mut lua, 3, "b");
    assert_eq!((full[0], full[2]), (0, 2), "{full:?}");
}

/// A window a process was told (`--limit 2/5s`) is a key that exists
/// before another process adopts the same policy from a statement: the
/// adoption still lists it and adds what the key lacks (that process's
/// calls in flight), so no take passing it goes over 2. At most eight
/// policies are listed.
#[test]
fn adopting_a_window_another_process_keeps_counts_every_call_once() {
    let redis = Redis::start();
    let mut lua = Lua::new(&redis, &Scenario::of(10, 1000));
    let told = lua.names.further(2, 5000);
    // Process B, told the limit, takes b1 with its key.
    lua.keys.push(told.clone());
    assert_eq!(take10(&mut lua, 0, "b1")[0], 1);
    // Process A, not told it, takes a1 and a2.
    lua.keys.pop();
    assert_eq!(take10(&mut lua, 1, "a1")[0], 1);
    assert_eq!(take10(&mut lua, 2, "a2")[0], 1);
    // A adopts it from a statement: listed although the key was there.
    lua.keys.push(told);
    let index = lua.keys.len();
    let listed: i64 = lua.op(3, "adopt", |inv| {
        inv.arg(index).arg(0);
    });
    assert_eq!(listed, 1);
    // Three calls in flight against 2: nothing more goes.
    let v = take10(&mut lua, 4, "a3");
    assert_eq!((v[0], v[2]), (0, 2), "{v:?}");
    // Eight listed at most.
    let mut answers = Vec::new();
    for w in 0..9 {
        let key = lua.names.further(5, 10_000 + w);
        lua.keys.push(key);
        let index = lua.keys.len();
        let a: i64 = lua.op(5, "adopt", |inv| {
            inv.arg(index).arg(0);
        });
        answers.push(a);
    }
    assert_eq!(answers, [1, 1, 1, 1, 1, 1, 1, -1, -1]);
}

/// A used-up quota's hold is said as such (why 6) with how long it lasts
/// itself: behind a window of the fleet that is full for longer, the
/// wait is the window's, and the hold's own 60 s is what a process
/// weighs against the bound before halting on the quota.
#[test]
fn a_quota_hold_is_named_only_while_it_is_the_wait() {
    let redis = Redis::start();
    let s = Scenario {
        further: vec![(1, 86_400_000)],
        ..Scenario::of(10, 1000)
    };
    let mut lua = Lua::new(&redis, &s);
    let hold = |lua: &mut Lua, now: u64, ms: u64| -> i64 {
        lua.op(now, "hold", |inv| {
            inv.arg(ms).arg("tokens");
        })
    };
    assert_eq!(hold(&mut lua, 0, 30_000), 30_000);
    assert_eq!(take10(&mut lua, 10, "a"), [0, 29_990, 6, 29_990]);
    assert_eq!(take10(&mut lua, 30_000, "a")[0], 1);
    // The day's window of 1 is full now: a hold shorter than it is not
    // what the take waits for.
    assert_eq!(hold(&mut lua, 30_001, 60_000), 60_000);
    let v = take10(&mut lua, 30_002, "b");
    assert_eq!((v[0], v[2], v[3]), (0, 6, 59_999), "{v:?}");
    assert!(v[1] > 86_000_000, "the day's window is the wait: {v:?}");
}

/// Under a bare rate (`--limit 10/1s`, learning 2), a 429 after a burst
/// lowers nothing: the fleet paces evenly from the pause's end, one call
/// per 110 ms (W/L and the even pace's tenth), with no burst, and every
/// take says so. A 429 at that pace lowers the limit as a window's 429
/// does, and the pace follows the lower limit. A server stating its limit
/// ends it.
#[test]
fn a_refused_burst_under_a_bare_rate_paces_the_fleet_evenly() {
    let redis = Redis::start();
    let mut lua = Lua::new(&redis, &Scenario::of(10, 1000));
    let pause = |lua: &mut Lua, now: u64, settles: &[&str]| bare_pause(lua, now, 100, settles);
    for i in 0..6 {
        let v = take10(&mut lua, 0, &format!("burst{i}"));
        assert_eq!((v[0], v[5]), (1, 0), "a window's burst: {v:?}");
    }
    // Five answered, the sixth refused: no limit learnt, the pace begins.
    let settles = ["burst0", "burst1", "burst2", "burst3", "burst4", "burst5"];
    assert_eq!(pause(&mut lua, 10, &settles), [100, 0, 1]);
    assert_eq!(take10(&mut lua, 50, "a")[..3], [0, 60, 1], "paused");
    let a = take10(&mut lua, 110, "a");
    assert_eq!((a[0], a[1], a[4], a[5]), (1, 10, 0, 1), "{a:?}");
    // The pace ramps from a quarter of its rate (1100/2.5 ms) to all of it
    // (110 ms) over the window after the pause.
    assert_eq!(take10(&mut lua, 111, "b"), [0, 439, 2], "a quarter of it");
    assert_eq!(take10(&mut lua, 550, "b")[0], 1);
    // 0.58 of it at 550: 1100/5.8 ms on.
    assert_eq!(take10(&mut lua, 739, "c"), [0, 1, 2]);
    assert_eq!(take10(&mut lua, 740, "c")[0], 1);
    // Refused at that pace too: the rate is lower. The ramp accepted one
    // call where the burst had five, so it tells no rate (a window's
    // count): the burst's six answers (the refused one among them) and two
    // of the pace's occupy the window ("c" is in flight), less the refused
    // one: 7.
    let lowered = pause(&mut lua, 400, &["a", "b"]);
    assert_eq!(lowered, [100, 7, 0], "lowered, no second beginning");
    // The window of 7 is full until the burst's answers leave it; from
    // then on, one call per 1100/7 ms (157.1).
    assert_eq!(take10(&mut lua, 500, "d")[..3], [0, 510, 2]);
    assert_eq!(take10(&mut lua, 1010, "d")[..2], [1, 7]);
    assert_eq!(take10(&mut lua, 1100, "e"), [0, 68, 2]);
    assert_eq!(take10(&mut lua, 1168, "e")[0], 1);
    // A server stating its limit: no learning, no even pace.
    let _: i64 = lua.op(1168, "inforce", |inv| {
        inv.arg(10);
    });
    let v = take10(&mut lua, 1169, "f");
    assert_eq!((v[0], v[5]), (1, 0), "{v:?}");
}

/// A 429 during the ramp tells a bucket's rate. With a burst (the start
/// accepted four calls, 55 ms apart, before the one it refused, sent 220
/// ms after it began: about two beyond a slow rate), the ramp's refusal
/// 849 ms after it began, with eight accepted, gives four calls in the
/// 629 ms between: 6 a window, where the window's count would say 8;
/// probing stays under the ramp's pace then (0.89 of 20: 18). With none
/// (the start refused its second call), the ramp is refused as soon as its
/// pace passes the rate, long before what it accepted on average tells
/// it: the bucket's replay does (5, where the average says 2). A window
/// accepts as many during the ramp as the start did: its count. (Of the
/// answers a pause carries, the refused call is the last to arrive, of
/// those at once the last sent.)
#[test]
fn a_refusal_during_the_ramp_fits_a_buckets_rate() {
    let redis = Redis::start();
    let start = |lua: &mut Lua| {
        let _: i64 = lua.op(0, "start", |inv| {
            inv.arg(1);
        });
    };
    let mut lua = Lua::new(&redis, &Scenario::of(20, 1000));
    start(&mut lua);
    let ids: Vec<String> = (0..5).map(|i| format!("s{i}")).collect();
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(take_under(&mut lua, 55 * i as u64, id, 20)[0], 1, "{id}");
    }
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    assert_eq!(
        bare_pause_under(&mut lua, 230, 1000, 20, &ids),
        [1000, 0, 1]
    );
    let ramp = [0, 220, 353, 460, 553, 636, 712, 783, 849];
    let ids: Vec<String> = (0..ramp.len()).map(|i| format!("r{i}")).collect();
    for (at, id) in ramp.iter().zip(&ids) {
        let v = take_under(&mut lua, 1230 + at, id, 20);
        assert_eq!(v[0], 1, "{id} at {at}: {v:?}");
    }
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    let v = bare_pause_under(&mut lua, 2085, 1000, 20, &ids);
    assert_eq!(v, [1000, 6, 0], "the rate with a burst");
    assert_eq!(lua.limit_field("refused_at").as_deref(), Some("18"));
    assert_eq!(lua.limit_field("ramp_since"), None, "the ramp tells once");
    // Paced evenly at 6 a window from the pause's end, with no ramp.
    assert_eq!(take_under(&mut lua, 3085, "e1", 20)[..2], [1, 6]);
    assert_eq!(take_under(&mut lua, 3086, "e2", 20), [0, 183, 2]);

    let mut lua = Lua::new(&redis, &Scenario::of(10, 1000));
    start(&mut lua);
    assert_eq!(take10(&mut lua, 0, "s1")[0], 1);
    assert_eq!(take10(&mut lua, 110, "s2")[0], 1);
    assert_eq!(bare_pause(&mut lua, 120, 1000, &["s1", "s2"]), [1000, 0, 1]);
    // The ramp from 1120: 440 ms, then 189.7, then 152.3 on.
    for (at, id) in [(1120, "r1"), (1560, "r2"), (1750, "r3"), (1903, "r4")] {
        let v = take10(&mut lua, at, id);
        assert_eq!(v[0], 1, "{id} at {at}: {v:?}");
    }
    let v = bare_pause(&mut lua, 1910, 1000, &["r1", "r2", "r3", "r4"]);
    assert_eq!(v, [1000, 5, 0], "the rate with no burst");
    assert_eq!(lua.limit_field("refused_at").as_deref(), Some("9"));

    // A window accepts as many during the ramp as the start did: its count.
    let mut lua = Lua::new(&redis, &Scenario::of(10, 1000));
    start(&mut lua);
    let mut ids = Vec::new();
    for i in 0..4 {
        let id = format!("s{i}");
        assert_eq!(take10(&mut lua, 110 * i, &id)[0], 1);
        ids.push(id);
    }
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    assert_eq!(bare_pause(&mut lua, 340, 1000, &ids), [1000, 0, 1]);
    let mut ids = Vec::new();
    for (at, id) in [(1340, "r1"), (1780, "r2"), (1970, "r3"), (2123, "r4")] {
        assert_eq!(take10(&mut lua, at, id)[0], 1, "{id}");
        ids.push(id);
    }
    assert_eq!(
        bare_pause(&mut lua, 2130, 1000, &ids),
        [1000, 3, 0],
        "a window of 3"
    );
}

/// Redis forgetting the fleet forgets what it learnt: each process puts
/// back what it last heard in the take that puts its calls back (its
/// restore block), so that take is already granted under it; the lowest
/// limit wins, taken as settled, with the even pace; the fleet is past its
/// start; a stated limit is not overruled.
#[test]
fn what_the_fleet_learnt_is_put_back_after_redis_forgot_it() {
    let redis = Redis::start();
    let mut lua = Lua::new(&redis, &Scenario::of(10, 1000));
    let put_back = |lua: &mut Lua, now: u64, id: &str, learnt: u64, even: u8| {
        take_putting_back(lua, now, id, 10, (learnt, even))
    };
    let forget = |lua: &mut Lua| {
        let keys = lua.keys_held();
        redis::cmd("DEL")
            .arg(keys)
            .query::<()>(&mut redis.conn())
            .unwrap();
    };
    forget(&mut lua);
    let v = put_back(&mut lua, 0, "a", 7, 1);
    assert_eq!(v, [1, 7, 1, 7, 1, 1], "learnt 7, settled, paced evenly");
    // One interval of 7 (1100/7 ms) on, and no ramp.
    assert_eq!(take10(&mut lua, 1, "b"), [0, 157, 2]);
    let v = put_back(&mut lua, 2, "b", 8, 1);
    assert_eq!(v, [0, 156, 2], "the lowest wins");
    assert_eq!(lua.limit_field("learnt").as_deref(), Some("7"));
    let v = put_back(&mut lua, 160, "b", 5, 0);
    assert_eq!(v[..4], [1, 5, 2, 5]);
    let started: i64 = lua.op(161, "start", |inv| {
        inv.arg(1);
    });
    assert_eq!(started, 0, "past the start");

    // A stated limit: nothing learnt is put back over it.
    forget(&mut lua);
    let _: i64 = lua.op(200, "inforce", |inv| {
        inv.arg(9);
    });
    let v = put_back(&mut lua, 200, "c", 5, 1);
    assert_eq!((v[0], v[1], v[3], v[5]), (1, 9, 0, 0), "{v:?}");

    // A process that joined after the loss began a start, whose even pace
    // would end a window later: a recalled even pace is for good.
    forget(&mut lua);
    let started: i64 = lua.op(300, "start", |inv| {
        inv.arg(1);
    });
    assert_eq!(started, 1);
    assert_eq!(put_back(&mut lua, 300, "c", 5, 1)[0], 1);
    assert_eq!(lua.limit_field("start_ends"), None);
    let v = take10(&mut lua, 1500, "d");
    assert_eq!(
        (v[0], v[5]),
        (1, 1),
        "still paced evenly a window on: {v:?}"
    );
}

/// A ramp that ended with no 429 leaves nothing behind: a 429 long after
/// it lowers the limit by the window's count, not to what the refused
/// burst before the ramp had accepted.
#[test]
fn a_ramp_that_held_tells_nothing_of_a_later_refusal() {
    let redis = Redis::start();
    let mut lua = Lua::new(&redis, &Scenario::of(10, 1000));
    // The start's first three calls on its even pace, the third refused:
    // the even pace ramps from 400.
    let started: i64 = lua.op(0, "start", |inv| {
        inv.arg(1);
    });
    assert_eq!(started, 1);
    for (at, id) in [(0, "s0"), (110, "s1"), (220, "s2")] {
        assert_eq!(take10(&mut lua, at, id)[0], 1, "{id}");
    }
    assert_eq!(bare_pause(&mut lua, 230, 170, &["s0", "s1", "s2"])[2], 1);
    // Three windows of calls on the pace, each answered at once.
    let (mut now, mut n, mut last) = (400, 0, String::new());
    while now < 3100 {
        let id = format!("c{n}");
        let v = take10(&mut lua, now, &id);
        if v[0] == 1 {
            settle_now(&mut lua, now + 1, &id);
            (n, last) = (n + 1, id);
            now += 1;
        } else {
            now += v[1].max(1) as u64;
        }
    }
    assert!(n >= 20, "{n} calls in three windows");
    // A 429 now, its call answered among the window's others: the limit
    // is the window's count less the refused call, far above the burst's 2.
    let v = bare_pause(&mut lua, now, 100, &[&last]);
    assert!(v[1] >= 5, "learnt {v:?}");
    assert_eq!(lua.limit_field("ramp_since"), None);
}

/// A limit lowered while paced evenly probes upward as in-process does: a
/// clean window settles it, and a clean window in which the even pace held
/// a take back used it in full (the pace is what the limit allows), though
/// a window paced evenly seldom holds the whole limit.
#[test]
fn a_limit_lowered_at_the_even_pace_probes_upward_once_the_pace_held_a_take() {
    let redis = Redis::start();
    let mut lua = Lua::new(&redis, &Scenario::of(10, 1000));
    let pause = |lua: &mut Lua, now: u64, settles: &[&str]| bare_pause(lua, now, 100, settles);
    // As above: a burst of six refused, then the ramp refused too, the
    // limit lowered to 7 from 700 on.
    for i in 0..6 {
        take10(&mut lua, 0, &format!("burst{i}"));
    }
    let burst: Vec<String> = (0..6).map(|i| format!("burst{i}")).collect();
    let burst: Vec<&str> = burst.iter().map(String::as_str).collect();
    assert_eq!(pause(&mut lua, 10, &burst), [100, 0, 1]);
    assert_eq!(take10(&mut lua, 110, "a")[0], 1);
    assert_eq!(take10(&mut lua, 550, "b")[0], 1);
    assert_eq!(pause(&mut lua, 600, &["a", "b"])[1], 7);
    assert_eq!(take10(&mut lua, 1010, "d")[..2], [1, 7]);
    settle_now(&mut lua, 1020, "d");
    // A clean window after the lowering settles it, and no take was held
    // back in it: the limit stays.
    let v = take10(&mut lua, 1700, "e");
    assert_eq!((v[0], v[1], v[3], v[4]), (1, 7, 7, 1), "settled: {v:?}");
    settle_now(&mut lua, 1710, "e");
    let v = take10(&mut lua, 2700, "f");
    assert_eq!((v[0], v[1], v[3]), (1, 7, 7), "nothing pressed: {v:?}");
    settle_now(&mut lua, 2710, "f");
    // The pace holds the next take back (a window holding two calls of 7):
    // the window after probes one up.
    assert_eq!(take10(&mut lua, 2701, "g")[..3], [0, 157, 2]);
    let v = take10(&mut lua, 3700, "g");
    assert_eq!((v[0], v[1], v[3]), (1, 8, 8), "probed: {v:?}");
}

/// A bare rate's fleet starts on the even pace (op `start`, once): its
/// first window goes one call per 110 ms, and a window later, with no 429,
/// calls go at once again as the window allows. A start is begun once, and
/// never after a limit was learnt or stated. A 429 during the start keeps
/// the even pace and says so.
#[test]
fn a_bare_rate_starts_the_fleet_on_the_even_pace_for_a_window() {
    let redis = Redis::start();
    let start = |lua: &mut Lua, now: u64| -> i64 {
        lua.op(now, "start", |inv| {
            inv.arg(1);
        })
    };
    let mut lua = Lua::new(&redis, &Scenario::of(10, 1000));
    assert_eq!(start(&mut lua, 0), 1);
    assert_eq!(start(&mut lua, 5), 0, "begun once, by the first process");
    let a = take10(&mut lua, 0, "a");
    assert_eq!(
        (a[0], a[5]),
        (1, 0),
        "the start is not a refused burst: {a:?}"
    );
    assert_eq!(take10(&mut lua, 1, "b"), [0, 109, 2]);
    assert_eq!(take10(&mut lua, 110, "b")[0], 1);
    assert_eq!(take10(&mut lua, 219, "c"), [0, 1, 2]);
    // A window after the start: the rest of the window's 10 go at once.
    for i in 0..8 {
        assert_eq!(take10(&mut lua, 1000, &format!("w{i}"))[0], 1, "{i}");
    }
    assert_eq!(start(&mut lua, 1001), 0, "started already");

    // Refused during the start: paced evenly from the pause's end, for good.
    let mut lua = Lua::new(&redis, &Scenario::of(10, 1000));
    assert_eq!(start(&mut lua, 0), 1);
    assert_eq!(take10(&mut lua, 0, "a")[0], 1);
    let paused: Vec<i64> = lua.op(10, "pause", |inv| {
        inv.arg(100).arg(10).arg(2).arg(1).arg("a").arg(0);
    });
    assert_eq!(paused, [100, 0, 1]);
    let b = take10(&mut lua, 1500, "b");
    assert_eq!((b[0], b[5]), (1, 1), "{b:?}");
    assert_eq!(
        take10(&mut lua, 1501, "c"),
        [0, 109, 2],
        "past the window too"
    );

    // Nothing to start once a server stated its limit.
    let mut lua = Lua::new(&redis, &Scenario::of(10, 1000));
    let _: i64 = lua.op(0, "inforce", |inv| {
        inv.arg(10);
    });
    assert_eq!(start(&mut lua, 1), 0);
}

/// Whatever the calls' timing, the answers and the 429s, once the fleet
/// paces a bare rate evenly no two of its grants are closer than the even
/// interval at the limit the earlier one was granted under (each grant
/// moves the next slot by its own limit's interval; a lowering only
/// lengthens the next): a bucket with no burst at that rate never refuses
/// them for their spacing. And whatever the ramp's refusal tells, a limit
/// learnt stays within what `--limit` allows: at least one, below the cap.
#[test]
fn the_even_pace_never_grants_two_calls_closer_than_its_interval() {
    let redis = Redis::start();
    let mut runner = TestRunner::new(ProptestConfig::with_cases(48));
    let ops = (
        any::<bool>(),
        proptest::collection::vec((0u64..150, 0u8..10), 1..80),
    );
    runner
        .run(&ops, |(start, ops)| {
            let mut lua = Lua::new(&redis, &Scenario::of(10, 1000));
            if start {
                let _: i64 = lua.op(0, "start", |inv| {
                    inv.arg(1);
                });
            }
            let (mut now, mut out, mut last) = (0u64, Vec::<String>::new(), None::<(u64, i64)>);
            let mut even = false;
            for (n, (step, what)) in ops.into_iter().enumerate() {
                now += step;
                match what {
                    // A 429, the oldest call answered with it.
                    0 => {
                        let settle: Vec<String> = out.drain(..out.len().min(1)).collect();
                        let v: Vec<i64> = lua.op(now, "pause", |inv| {
                            inv.arg(50).arg(10).arg(2).arg(settle.len());
                            for id in &settle {
                                inv.arg(id).arg(0);
                            }
                        });
                        prop_assert!((0..10).contains(&v[1]), "learnt {}", v[1]);
                    }
                    // An answer.
                    1..=3 if !out.is_empty() => {
                        let id = out.remove(0);
                        let _: i64 = lua.op(now, "settle", |inv| {
                            inv.arg(1).arg(&id).arg(0);
                        });
                    }
                    _ => {
                        let id = format!("c{n}");
                        let v = take10(&mut lua, now, &id);
                        if v[0] != 1 {
                            continue;
                        }
                        out.push(id);
                        prop_assert!((1..=10).contains(&v[1]), "paced to {}", v[1]);
                        if let (true, Some((at, limit))) = (v[5] == 1 && even, last) {
                            let interval = 1100.0 / limit as f64;
                            prop_assert!(
                                (now - at) as f64 >= interval - 1e-6,
                                "granted {} ms after the last, granted at a limit of {limit}",
                                now - at,
                            );
                        }
                        even = v[5] == 1;
                        last = Some((now, v[1]));
                    }
                }
            }
            Ok(())
        })
        .unwrap();
}

/// A 429 under a bare rate capped at 10 (learning 2), pausing `ms`, with
/// the calls answered since (each just now; the refused one among them).
fn bare_pause(lua: &mut Lua, now: u64, ms: u64, settles: &[&str]) -> Vec<i64> {
    bare_pause_under(lua, now, ms, 10, settles)
}

/// [`bare_pause`] under a cap of `cap`.
fn bare_pause_under(lua: &mut Lua, now: u64, ms: u64, cap: u64, settles: &[&str]) -> Vec<i64> {
    lua.op(now, "pause", |inv| {
        inv.arg(ms).arg(cap).arg(2).arg(settles.len());
        for id in settles {
            inv.arg(*id).arg(0);
        }
    })
}

/// Call `id` answered at `now` (op `settle`).
fn settle_now(lua: &mut Lua, now: u64, id: &str) {
    let _: i64 = lua.op(now, "settle", |inv| {
        inv.arg(1).arg(id).arg(0);
    });
}

/// A take of call `id` under a cap of 10: headroom 1, no ceiling, no
/// tokens, no settles, no pause, nothing to put back, no loss check.
fn take10(lua: &mut Lua, now: u64, id: &str) -> Vec<i64> {
    take_under(lua, now, id, 10)
}

/// [`take10`] under a cap of `cap`.
fn take_under(lua: &mut Lua, now: u64, id: &str, cap: u64) -> Vec<i64> {
    take_putting_back(lua, now, id, cap, (0, 0))
}

/// A take of call `id` under a cap of `cap` whose restore block puts back
/// no calls but `heard`: the learnt limit (0: none) and 1 if paced evenly.
fn take_putting_back(lua: &mut Lua, now: u64, id: &str, cap: u64, heard: (u64, u8)) -> Vec<i64> {
    lua.op(now, "take", |inv| {
        inv.arg(id).arg(cap).arg(1).arg(0).arg(0);
        inv.arg(0);
        inv.arg(0).arg(heard.0).arg(heard.1).arg(0);
    })
}
