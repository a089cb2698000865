//! A bare rate's even pace in the fleet's script (`--limit 30/1s`, no
//! shape named, the server stating none): the start, its handover, a
//! refused burst's even pace, the ramp that tells a bucket's rate, and what
//! the fleet learnt put back after Redis forgot it. The in-process learner
//! fits shapes from every answer, which no process of a fleet holds; these
//! are the script's own rules, on the scenario's clock in a real Redis.

use batchrun::rate::scenario::Scenario;
use proptest::prelude::*;
use proptest::test_runner::TestRunner;

use super::rule::{settle_now, take10, take_putting_back, take_under, Lua};
use super::support::Redis;

/// Under a bare rate of 10 a window, six calls at 0 ms as a window's burst
/// (none paced evenly), five answered and the sixth refused at 10 ms: no
/// limit learnt, and the even pace begins with a pause of 100 ms.
fn refuse_a_burst_of_six(lua: &mut Lua) {
    let ids: Vec<String> = (0..6).map(|i| format!("burst{i}")).collect();
    for id in &ids {
        let v = take10(lua, 0, id);
        assert_eq!((v[0], v[5]), (1, 0), "a window's burst: {v:?}");
    }
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    assert_eq!(bare_pause(lua, 10, 100, &ids), [100, 0, 1]);
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
    refuse_a_burst_of_six(&mut lua);
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
/// accepted four calls, 60 ms apart, before the one it refused, sent 240
/// ms after it began: about two beyond a slow rate), the ramp's refusal
/// 849 ms after it began, with eight accepted, gives four calls in the
/// 609 ms between: 6.6 a second, paced as the limit whose even pace it
/// is, 7 a window (the window's count would say 8), and no probing above
/// it (a pace over a bucket's rate drains its burst). A burst of one
/// reads as one too.
/// With none (the start refused its second call), the ramp is refused as
/// soon as its pace passes the rate, long before what it accepted on
/// average tells it: the bucket's replay does (5.9 a window, where the
/// average says 2), paced as the limit 5 with no probing above it. A window
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
        assert_eq!(take_under(&mut lua, 60 * i as u64, id, 20)[0], 1, "{id}");
    }
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    assert_eq!(
        bare_pause_under(&mut lua, 250, 1000, 20, &ids),
        [1000, 0, 1]
    );
    let ramp = [0, 220, 353, 460, 553, 636, 712, 783, 849];
    let ids: Vec<String> = (0..ramp.len()).map(|i| format!("r{i}")).collect();
    for (at, id) in ramp.iter().zip(&ids) {
        let v = take_under(&mut lua, 1250 + at, id, 20);
        assert_eq!(v[0], 1, "{id} at {at}: {v:?}");
    }
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    let v = bare_pause_under(&mut lua, 2105, 1000, 20, &ids);
    assert_eq!(v, [1000, 7, 0], "the rate with a burst");
    assert_eq!(
        lua.limit_field("refused_at").as_deref(),
        Some("8"),
        "no probe"
    );
    assert_eq!(lua.limit_field("ramp_since"), None, "the ramp tells once");
    // Paced evenly at 7 a window from the pause's end, with no ramp.
    assert_eq!(take_under(&mut lua, 3105, "e1", 20)[..2], [1, 7]);
    assert_eq!(take_under(&mut lua, 3106, "e2", 20), [0, 157, 2]);

    // A burst of one: the start accepted two calls 55 ms apart and refused
    // the third, which reads as 0.63 of a call beyond the rate (a part of
    // a call is unknown in each span): a burst still, and the rate paced.
    let mut lua = Lua::new(&redis, &Scenario::of(20, 1000));
    start(&mut lua);
    for (at, id) in [(0, "s0"), (55, "s1"), (110, "s2")] {
        assert_eq!(take_under(&mut lua, at, id, 20)[0], 1, "{id}");
    }
    let v = bare_pause_under(&mut lua, 120, 1000, 20, &["s0", "s1", "s2"]);
    assert_eq!(v, [1000, 0, 1]);
    let ramp = [0, 220, 353, 460, 553, 636, 712];
    let ids: Vec<String> = (0..ramp.len()).map(|i| format!("r{i}")).collect();
    for (at, id) in ramp.iter().zip(&ids) {
        assert_eq!(take_under(&mut lua, 1120 + at, id, 20)[0], 1, "{id}");
    }
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    let v = bare_pause_under(&mut lua, 1842, 1000, 20, &ids);
    assert_eq!(v, [1000, 7, 0], "four calls in 602 ms, paced as 7 a window");

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
    assert_eq!(
        lua.limit_field("refused_at").as_deref(),
        Some("6"),
        "no probe above the replay's rate"
    );

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
    refuse_a_burst_of_six(&mut lua);
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
/// first window goes one call per 110 ms, the next one call per 100 ms (the
/// handover), and a window later, with no 429, calls go at once again as
/// the window allows. A start is begun once, and
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
    // The start ended with no 429: for a window more the pace goes on at
    // the limit itself (one call per 100 ms, no skew), so the places the
    // start left unused go one by one (the handover). It is no refused
    // burst's even pace.
    let w = take10(&mut lua, 1000, "w0");
    assert_eq!((w[0], w[5]), (1, 0), "{w:?}");
    assert_eq!(take10(&mut lua, 1001, "w1"), [0, 99, 2]);
    assert_eq!(take10(&mut lua, 1100, "w1")[0], 1);
    assert_eq!(take10(&mut lua, 1150, "w2"), [0, 50, 2]);
    // A window after the start: the rest of the window's 10 go at once.
    for i in 2..8 {
        assert_eq!(take10(&mut lua, 2000, &format!("w{i}"))[0], 1, "{i}");
    }
    assert_eq!(
        take10(&mut lua, 2000, "w8"),
        [0, 1000, 2],
        "the window is full"
    );
    assert_eq!(start(&mut lua, 2001), 0, "started already");

    // A 429 during the handover is a burst's: the fleet paces evenly from
    // the pause's end, for good.
    let mut lua = Lua::new(&redis, &Scenario::of(10, 1000));
    assert_eq!(start(&mut lua, 0), 1);
    assert_eq!(take10(&mut lua, 0, "a")[0], 1);
    assert_eq!(take10(&mut lua, 1000, "b")[0], 1);
    let paused: Vec<i64> = lua.op(1010, "pause", |inv| {
        inv.arg(100).arg(10).arg(2).arg(1).arg("b").arg(0);
    });
    assert_eq!(paused, [100, 0, 1], "the even pace began");
    let c = take10(&mut lua, 1110, "c");
    assert_eq!((c[0], c[5]), (1, 1), "{c:?}");

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

/// Told only the rate (a bare `--limit 30/1s`) of a bucket keeping that
/// rate with any burst, whatever the number of calls in flight and the
/// answers' latency, the fleet's start, its handover and the window after
/// them are never refused: the start paces a tenth under the rate, the
/// handover at it (the places the start left unused go one by one, where
/// a window would send them at once, which a burst of one refuses), and
/// the window after sends as the handover's calls free their places.
#[test]
fn a_bucket_at_the_told_rate_never_refuses_the_fleets_start() {
    let redis = Redis::start();
    let mut runner = TestRunner::new(ProptestConfig::with_cases(32));
    let cases = (1u64..=8, 1usize..=10, 1u64..=40, 0u64..=4, any::<u64>());
    runner
        .run(&cases, |(burst, workers, base, jitter, seed)| {
            let mut lua = Lua::new(&redis, &Scenario::of(30, 1000));
            let _: i64 = lua.op(0, "start", |inv| {
                inv.arg(1);
            });
            let interval = 1000.0 / 30.0;
            let (tau, mut tat) = (burst as f64 * interval, 0.0f64);
            // Each worker is ready at a time, or waits for its call.
            let mut ready: Vec<Option<u64>> = vec![Some(0); workers];
            let mut out: Vec<(u64, String, usize)> = Vec::new();
            let mut rng = seed | 1;
            // Four windows: the start, the handover and two after it.
            for n in 0.. {
                let (w, at) = ready
                    .iter()
                    .enumerate()
                    .filter_map(|(w, r)| r.map(|at| (w, at)))
                    .min_by_key(|&(_, at)| at)
                    .unwrap_or((usize::MAX, u64::MAX));
                let first_back = (0..out.len()).min_by_key(|&k| out[k].0);
                if let Some(k) = first_back.filter(|&k| out[k].0 <= at) {
                    let (back, id, worker) = out.remove(k);
                    settle_now(&mut lua, back, &id);
                    ready[worker] = Some(back);
                    continue;
                }
                if at > 4000 {
                    break;
                }
                let id = format!("c{n}");
                let v = take_under(&mut lua, at, &id, 30);
                if v[0] != 1 {
                    ready[w] = Some(at + v[1] as u64);
                    continue;
                }
                let t = at as f64;
                prop_assert!(
                    tat - t <= tau + 1e-6,
                    "call {id} at {at} ms refused by a bucket with a burst of {burst}",
                );
                tat = tat.max(t) + interval;
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                out.push((at + base + rng % (jitter + 1), id, w));
                ready[w] = None;
            }
            Ok(())
        })
        .unwrap();
}

/// A limit put back after a loss is probed only after a window of its
/// own: its clean window starts when calls may go again, after the hold
/// the loss began, not when it was put back during that hold. Put back
/// 100 ms into a hold of 1 s and used in full at its end, it is not
/// raised 100 ms later (once seen on a loaded machine: a probe, and the
/// 429 it may cost, a window early).
#[test]
fn a_limit_put_back_during_a_hold_is_not_probed_before_a_window_of_its_own() {
    let redis = Redis::start();
    let mut lua = Lua::new(&redis, &Scenario::of(10, 1000));
    let _: i64 = lua.op(0, "hold", |inv| {
        inv.arg(1000).arg("the loss");
    });
    let v = take_putting_back(&mut lua, 100, "a", 10, (7, 0));
    assert_eq!(v[0], 0, "held: {v:?}");
    for i in 0..7 {
        let v = take10(&mut lua, 1000, &format!("b{i}"));
        assert_eq!(v[..2], [1, 7], "{v:?}");
    }
    let v = take10(&mut lua, 1150, "c");
    assert_eq!(v[0], 0, "probed above 7 within the window: {v:?}");
    assert_eq!(lua.limit_field("learnt").as_deref(), Some("7"));
}
