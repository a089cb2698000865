//! The fleet's script and the in-process state machine, one window rule in
//! two stores: every scenario of `batchrun::rate::scenario` is run against
//! both, the script in a real Redis on the scenario's clock, and any
//! answer that differs fails the test with the scenario.

use std::collections::HashMap;
use std::time::Duration;

use batchrun::fleet::script::{tokens_arg, ScriptArgs, SCRIPT};
use batchrun::fleet::FleetKeys;
use batchrun::rate::policy::{TokenWeight, Unit};
use batchrun::rate::scenario::{self, Answer, Call, InProcess, Scenario, Store};
use batchrun::rate::Rate;
use proptest::prelude::*;
use proptest::test_runner::TestRunner;

use super::scenarios::scenarios;
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
    /// A limit was reported to the script (it keeps one in force).
    reported: bool,
    /// Each call's estimate, which a response's usage corrects part by
    /// part (as the fleet pacer's permit keeps it).
    estimates: HashMap<u64, TokenWeight>,
    /// The first policy of tokens stated (quota, window ms, unit), and
    /// each adopted window kept as a bucket since, by its bucket's key.
    stated: Option<(u64, u64, Unit)>,
    refilled: HashMap<String, String>,
    /// The scenario's buckets of calls, with their keys.
    buckets: Vec<(Rate, String)>,
}

impl Lua {
    pub(super) fn new(redis: &Redis, s: &Scenario) -> Lua {
        let window = Duration::from_millis(s.window);
        let k = FleetKeys::named(&fleet_name("rule"));
        let names = k.clone();
        Lua {
            conn: redis.conn(),
            script: redis::Script::new(SCRIPT),
            keys: {
                let mut keys = k.pacer().to_vec();
                keys.extend(s.further.iter().map(|&(l, w)| k.further(l, w)));
                // A fixed window: a further window (or a token window)
                // until a reset aligns it.
                keys.extend(s.fixed.iter().map(|&(l, w, u)| match u {
                    Unit::Calls => k.fixed(l, w),
                    u => k.fixed_tokens(u, l, w),
                }));
                keys.extend(s.tokens.iter().map(|&(q, w, u)| k.tokens(u, q, w)));
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
            reported: false,
            estimates: HashMap::new(),
            stated: None,
            refilled: HashMap::new(),
            buckets: s
                .buckets
                .iter()
                .filter_map(|&b| {
                    let spec = scenario::bucket(b);
                    let r = spec.rate()?;
                    Some((r, names.bucket(r, b.2, spec.unit)))
                })
                .collect(),
        }
    }

    /// A bucket's policy said used up, as the fleet's pacer reads it: the
    /// first bucket of its window keeps it, held for as long as
    /// in-process, and emptied.
    fn emptied(&mut self, now: u64, bucket: usize, reset: u64, exact: bool) {
        let Some((rate, _)) = self.buckets.get(bucket % self.buckets.len().max(1)) else {
            return;
        };
        let Some((rate, key)) = self.buckets.iter().find(|(r, _)| r.period == rate.period) else {
            return;
        };
        self.secret = false;
        let reset = Duration::from_millis(reset);
        let hold = batchrun::rate::kept::bucket_emptied_hold(*rate, reset, exact);
        let index = 1 + self.keys.iter().position(|k| k == key).expect("passed");
        let _: i64 = self.op(now, "empty", |inv| {
            inv.arg(index).arg(hold.as_millis() as u64);
        });
    }

    /// The index in the script's keys (from 1) of fixed window `fixed`,
    /// modulo how many.
    fn fixed_index(&self, fixed: usize) -> Option<usize> {
        let n = self.keys.iter().filter(|k| k.contains(":fixed:")).count();
        let key = self
            .keys
            .iter()
            .filter(|k| k.contains(":fixed:"))
            .nth(fixed % n.max(1))?;
        Some(1 + self.keys.iter().position(|k| k == key)?)
    }

    /// The stated window of tokens becomes a bucket refilling over
    /// `period` ms, as the fleet's pacer asks once it finds the refill:
    /// passed in the window's place when the script did it.
    fn refill(&mut self, now: u64, period: u64, used: u64) -> bool {
        let Some((q, w, unit)) = self.stated else {
            return false;
        };
        // Found already: retimed from the bucket it became.
        let window = self.names.tokens(unit, q, w);
        let from = self
            .refilled
            .get(&window)
            .cloned()
            .unwrap_or(window.clone());
        let Some(at) = self.keys.iter().position(|k| *k == from) else {
            return false;
        };
        let rate = Rate {
            count: q,
            period: Duration::from_millis(period),
        };
        let bucket = self.names.bucket(rate, q - 1, unit);
        self.keys.push(bucket.clone());
        let (from, to) = (at + 1, self.keys.len());
        let done: i64 = self.op(now, "refill", |inv| {
            inv.arg(from).arg(to).arg(used);
        });
        if done == 1 {
            self.keys.swap_remove(at);
            self.refilled.insert(window, bucket);
        } else {
            self.keys.pop();
        }
        done == 1
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

fn settle_list(
    inv: &mut redis::ScriptInvocation<'_>,
    id: u64,
    ago: i64,
    used: Option<TokenWeight>,
) {
    let ago = match used {
        Some(u) => format!("{ago}/{}", tokens_arg(u)),
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
                self.estimates.insert(id, tokens);
                let v: Vec<i64> = self.op(now, "take", |inv| {
                    // Headroom 1, no ceiling, the estimate, no settles,
                    // nothing to put back.
                    inv.arg(id.to_string()).arg(cap).arg(1).arg(0);
                    inv.arg(tokens_arg(tokens));
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
                    // A quota hold says how long it lasts besides.
                    [0, ms, why, ..] => Answer::Wait {
                        ms: ms as u64,
                        paused: why == 1,
                    },
                    _ => panic!("take answered {v:?}"),
                }
            }
            Call::Settle(id, ago, used) => {
                let estimate = self.estimates.remove(&id).unwrap_or_default();
                let used = used.map(|u| u.or(estimate));
                let _: i64 = self.op(now, "settle", |inv| settle_list(inv, id, ago as i64, used));
                Answer::Noted
            }
            Call::Cancel(id) => {
                self.estimates.remove(&id);
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
            // As the fleet's pacer: a limit above the configured one
            // changes nothing and leaves learning on, unless one is in
            // force, which it raises back to the configured one.
            Call::InForce(l) if l > self.limit && !self.reported => {
                Answer::InForce { lowered: false }
            }
            Call::InForce(l) => {
                (self.secret, self.reported) = (false, true);
                let l = l.min(self.limit);
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
            Call::Refill(period, used) => Answer::Refilled(self.refill(now, period, used)),
            Call::Emptied(bucket, reset, exact) => {
                self.emptied(now, bucket, reset, exact);
                Answer::Noted
            }
            Call::Spent(fixed, used) => {
                // As the fleet's pacer: what the statement says beyond the
                // fleet's count was spent elsewhere (the quota stated is the
                // window's own, so what it says is used is what is spent).
                if let Some(index) = self.fixed_index(fixed) {
                    // A stated policy of calls means no secret limit to
                    // learn (`...:fixed:L:W`; one of tokens names its unit).
                    let calls = self.keys[index - 1]
                        .rsplit(':')
                        .nth(2)
                        .is_some_and(|l| l == "fixed");
                    self.secret &= !calls;
                    let _: i64 = self.op(now, "elsewhere", |inv| {
                        inv.arg(index).arg(used).arg(1);
                    });
                }
                Answer::Noted
            }
            Call::Aligned(fixed, reset, early, late) => {
                let Some(index) = self.fixed_index(fixed) else {
                    return Answer::Aligned(false);
                };
                let aligned: i64 = self.op(now, "align", |inv| {
                    inv.arg(index).arg(BASE + now + reset).arg(early).arg(late);
                });
                Answer::Aligned(aligned == 1)
            }
            Call::Stated(quota, window, used, unit) => {
                // As the fleet's pacer: a stated policy of another window
                // leaves a secret limit of the primary one to learn (but
                // for a 429 while it is used up, which `used` never is
                // here); the adopted key is passed from then on.
                let tokens = unit.is_tokens();
                let key = match unit {
                    Unit::Calls => self.names.further(quota, window),
                    u => self.names.tokens(u, quota, window),
                };
                if tokens && self.stated.is_none() {
                    self.stated = Some((quota, window, unit));
                }
                let key = self.refilled.get(&key).cloned().unwrap_or(key);
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
        tokens: vec![(100, 3000, Unit::Tokens)],
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
    // Held until 3 s after the loss was found, not after it heard of it,
    // and the token window's skew allowance more (3 s / 20).
    assert_eq!(take(501, "c", ["", "9", ""]), [0, 3160 - 501, 2, 8]);
    assert_eq!(take(3159, "c", ["8", "9", ""])[0], 0);
    let after = take(3160, "c", ["8", "9", ""]);
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

/// Call `id` answered at `now` (op `settle`).
pub(super) fn settle_now(lua: &mut Lua, now: u64, id: &str) {
    let _: i64 = lua.op(now, "settle", |inv| {
        inv.arg(1).arg(id).arg(0);
    });
}

/// A take of call `id` under a cap of 10: headroom 1, no ceiling, no
/// tokens, no settles, no pause, nothing to put back, no loss check.
pub(super) fn take10(lua: &mut Lua, now: u64, id: &str) -> Vec<i64> {
    take_under(lua, now, id, 10)
}

/// [`take10`] under a cap of `cap`.
pub(super) fn take_under(lua: &mut Lua, now: u64, id: &str, cap: u64) -> Vec<i64> {
    take_putting_back(lua, now, id, cap, (0, 0))
}

/// A take of call `id` under a cap of `cap` whose restore block puts back
/// no calls but `heard`: the learnt limit (0: none) and 1 if paced evenly.
pub(super) fn take_putting_back(
    lua: &mut Lua,
    now: u64,
    id: &str,
    cap: u64,
    heard: (u64, u8),
) -> Vec<i64> {
    lua.op(now, "take", |inv| {
        inv.arg(id).arg(cap).arg(1).arg(0).arg(0);
        inv.arg(0);
        inv.arg(0).arg(heard.0).arg(heard.1).arg(0);
    })
}

/// A job checkpoint's learning, passed with a process's first take
/// (`c@M`: not probed above M), is put back only by a take that begins the
/// fleet, marked with its epoch. A process that heard that fleet and then
/// lost Redis for a moment puts back as any other (the lower limit wins);
/// one that last heard an earlier epoch (it ran before Redis restarted)
/// replaces the checkpoint's learning with its own.
#[test]
fn a_checkpoints_learning_is_put_back_only_where_no_fleet_ran() {
    let redis = Redis::start();
    let mut lua = Lua::new(&redis, &Scenario::of(10, 1000));
    // take: id, cap 10, headroom 1, no ceiling, no token estimate, no
    // settles; the restore block (no pause, `learnt`, `flag`, no calls);
    // the loss check (epoch heard, fresh, witness).
    let take = |lua: &mut Lua, now: u64, id: &str, learnt: u64, flag: &str, heard: &str| {
        lua.op::<Vec<i64>>(now, "take", |inv| {
            inv.arg(id).arg(10).arg(1).arg(0).arg(0);
            inv.arg(0);
            inv.arg(0).arg(learnt).arg(flag).arg(0);
            inv.arg(heard).arg("7").arg("");
        })
    };
    // A fleet running already: the checkpoint's learning is dropped.
    take(&mut lua, 0, "a", 0, "0", "");
    take(&mut lua, 1, "b", 4, "c@4:1", "");
    assert_eq!(lua.limit_field("learnt"), None);
    redis::cmd("FLUSHALL")
        .query::<()>(&mut redis.conn())
        .unwrap();
    // No fleet: it begins one, in epoch 7, with the learning.
    take(&mut lua, 10, "c", 4, "c@5:1", "");
    let fields = ["learnt", "refused_at", "even", "recalled"].map(|f| lua.limit_field(f));
    assert_eq!(fields, ["4", "6", "1", "7"].map(|v| Some(v.to_string())));
    // A process of that fleet puts back what it heard after a moment's
    // loss: nothing is replaced, the lower limit wins.
    take(&mut lua, 20, "d", 0, "l@7:0", "");
    take(&mut lua, 21, "e", 5, "l@7:1", "");
    assert_eq!(lua.limit_field("learnt").as_deref(), Some("4"));
    // A process that ran before the restart (epoch 3) replaces it.
    take(&mut lua, 30, "f", 0, "l@3:0", "");
    let fields = ["learnt", "refused_at", "even", "recalled"].map(|f| lua.limit_field(f));
    assert_eq!(fields, [None, None, None, None]);
}

/// The script tells a reset too uncertain to align (−3) from a window
/// aligned already (0): a process marks the window settled on the second
/// answer only, and asks again after the first (it marked both, and a
/// reset the script found too uncertain kept it from ever aligning).
#[test]
fn the_script_tells_a_reset_too_uncertain_from_a_window_aligned_already() {
    let redis = Redis::start();
    let mut s = Scenario::of(10, 1000);
    s.fixed = vec![(5, 1000, Unit::Calls)];
    let mut lua = Lua::new(&redis, &s);
    let index = lua.fixed_index(0).expect("a fixed window");
    let mut ask = |early: u64| -> i64 {
        lua.op(0, "align", |inv| {
            inv.arg(index).arg(BASE + 500).arg(early).arg(10);
        })
    };
    assert_eq!(ask(200), -3, "too uncertain");
    assert_eq!(ask(20), 1, "aligned");
    assert_eq!(ask(20), 0, "aligned already");
}
