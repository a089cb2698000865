//! The fleet pacer itself, in-process, on a real Redis: two pacers stand
//! for two processes.

mod forgotten;

use std::sync::Arc;
use std::time::{Duration, Instant};

use batchrun::fleet::pacer::{FleetPacer, FleetPacing};
use batchrun::fleet::{Fleet, FleetAlerts, FleetKeys, FleetSettings};
use batchrun::pace::{PaceNote, Pacer};
use batchrun::rate::policies::Heard;
use batchrun::rate::Limit;

use super::support::{fleet_name, Proxy, Redis};

pub(super) async fn fleet_on(redis: &Redis, name: &str) -> Fleet {
    Fleet::connect(&FleetSettings {
        url: redis.url.clone(),
        headroom: 1.0,
        keys: FleetKeys::named(name),
        redis_timeout: Duration::from_secs(5),
    })
    .await
    .expect("connect")
}

pub(super) fn pacer(fleet: Fleet, limit: &str) -> Arc<FleetPacer> {
    paced(fleet, limit, false)
}

/// A pacer told `limit`, its shape unknown (a bare rate) or named.
fn paced(fleet: Fleet, limit: &str, shape_unknown: bool) -> Arc<FleetPacer> {
    paced_from(fleet, limit, shape_unknown, None)
}

/// The same, for a job whose checkpoint says an earlier run `learnt`.
fn paced_from(
    fleet: Fleet,
    limit: &str,
    shape_unknown: bool,
    learnt: Option<batchrun::rate::learn::Learnt>,
) -> Arc<FleetPacer> {
    let cfg = FleetPacing {
        shape_unknown,
        learnt,
        ..pacing(limit)
    };
    Arc::new(FleetPacer::new(fleet, cfg))
}

/// What a test's pacer paces to: `limit` named (not a bare rate), 100 in
/// flight at most, calls timing out after a second, nothing learnt before.
pub(super) fn pacing(limit: &str) -> FleetPacing {
    FleetPacing {
        limit: limit.parse::<Limit>().unwrap(),
        concurrency: 100,
        timeout: Duration::from_secs(1),
        wait_for_quota: false,
        shape_unknown: false,
        learnt: None,
        ran_lately: false,
    }
}

/// Redis forgets the fleet's window, leases and limit hash, as a restart
/// without persistence does.
fn forget(c: &mut redis::Connection, keys: &FleetKeys) {
    let _: i64 = redis::cmd("DEL")
        .arg(keys.window())
        .arg(keys.leases())
        .arg(keys.limit())
        .query(c)
        .unwrap();
}

/// The most of `stamps` (sorted) inside any span shorter than `w`.
fn most_in(stamps: &[Instant], w: Duration) -> usize {
    (0..stamps.len())
        .map(|i| {
            stamps[i..]
                .iter()
                .take_while(|b| **b - stamps[i] < w)
                .count()
        })
        .max()
        .unwrap_or(0)
}

/// The fleet's learnt limit, as Redis holds it.
fn learnt_in(c: &mut redis::Connection, name: &str) -> Option<u64> {
    redis::cmd("HGET")
        .arg(FleetKeys::named(name).limit())
        .arg("learnt")
        .query(c)
        .unwrap()
}

/// Takes `n` permits one after another, each completed at once.
async fn calls(p: &FleetPacer, n: usize) {
    for _ in 0..n {
        p.take()
            .await
            .unwrap()
            .complete(tokio::time::Instant::now());
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn two_processes_share_one_window_exactly() {
    let redis = Redis::start();
    let name = fleet_name("window");
    let a = pacer(fleet_on(&redis, &name).await, "5/400ms");
    let b = pacer(fleet_on(&redis, &name).await, "5/400ms");
    let stamps = Arc::new(std::sync::Mutex::new(Vec::new()));
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for p in [a.clone(), b.clone(), a, b] {
        let stamps = stamps.clone();
        tasks.push(tokio::spawn(async move {
            while t0.elapsed() < Duration::from_millis(1300) {
                let permit = p.take().await.expect("permit");
                stamps.lock().unwrap().push(Instant::now());
                permit.complete(tokio::time::Instant::now());
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let mut s = stamps.lock().unwrap().clone();
    s.sort();
    assert!(most_in(&s, Duration::from_millis(400)) <= 5, "{s:?}");
    // Four windows' worth: the fleet is not starved either.
    assert!(s.len() >= 15, "only {} calls", s.len());
}

/// `p`'s next call waits at least `for_`: another process's pause holds it.
async fn assert_held(p: &FleetPacer, for_: Duration) {
    let t0 = Instant::now();
    p.take()
        .await
        .unwrap()
        .complete(tokio::time::Instant::now());
    assert!(t0.elapsed() >= for_, "{:?}", t0.elapsed());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pause_from_one_process_holds_every_process() {
    let redis = Redis::start();
    let name = fleet_name("pause");
    let a = pacer(fleet_on(&redis, &name).await, "50/1s");
    let b = pacer(fleet_on(&redis, &name).await, "50/1s");
    a.pause(Duration::from_millis(800)).await.unwrap();
    assert_held(&b, Duration::from_millis(700)).await;
}

/// A quota waited for (`--wait-for-quota`) holds every process as a pause
/// does, and teaches the fleet no limit: the quota refused the call.
#[tokio::test(flavor = "multi_thread")]
async fn a_quota_waited_for_holds_every_process_and_teaches_nothing() {
    let redis = Redis::start();
    let name = fleet_name("hold");
    let a = pacer(fleet_on(&redis, &name).await, "10/300ms");
    let b = pacer(fleet_on(&redis, &name).await, "10/300ms");
    let mut c = redis.conn();
    calls(&a, 4).await;
    a.hold(Duration::from_millis(800)).await.unwrap();
    assert_eq!(learnt_in(&mut c, &name), None);
    assert_eq!(a.learnt(), None);
    assert_held(&b, Duration::from_millis(700)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_secret_limit_is_learnt_at_a_429_and_probed_back_up() {
    let redis = Redis::start();
    let name = fleet_name("learn");
    let p = pacer(fleet_on(&redis, &name).await, "10/300ms");
    let mut c = redis.conn();
    calls(&p, 4).await;
    // A 429 without any x-rate-limit header: the limit is the answered
    // calls occupying, less the refused one.
    p.pause(Duration::from_millis(1)).await.unwrap();
    assert_eq!(learnt_in(&mut c, &name), Some(3));
    // Within one window a fourth call waits for the oldest to age out.
    let t0 = Instant::now();
    calls(&p, 4).await;
    assert!(
        t0.elapsed() >= Duration::from_millis(250),
        "{:?}",
        t0.elapsed()
    );
    // A clean window settles it; then each clean window that used it in
    // full lets one more through, up to one below the refused 10.
    let mut seen = vec![3];
    let deadline = Instant::now() + Duration::from_secs(6);
    while seen.last() != Some(&9) {
        assert!(Instant::now() < deadline, "still probing: {seen:?}");
        let l = learnt_in(&mut c, &name).expect("a learnt limit");
        if seen.last() != Some(&l) {
            seen.push(l);
        }
        p.take()
            .await
            .unwrap()
            .complete(tokio::time::Instant::now());
    }
    assert_eq!(seen, vec![3, 4, 5, 6, 7, 8, 9], "probed +1 per window");
}

#[tokio::test(flavor = "multi_thread")]
async fn fleet_alert_claims_go_to_one_process() {
    let redis = Redis::start();
    let name = fleet_name("claims");
    let a = FleetAlerts::for_fleet(&fleet_on(&redis, &name).await, "acct".into());
    let b = FleetAlerts::for_fleet(&fleet_on(&redis, &name).await, "acct".into());
    let alert = |renewal| {
        let mut x = batchrun::credits::Alert::new(
            batchrun::credits::AlertKind::Threshold,
            "pct-0.8",
            "80% used",
            None,
        );
        x.renewal = Some(renewal);
        x
    };
    assert!(a.claim(&alert(1_900_000_000)).await);
    assert!(!b.claim(&alert(1_900_000_000)).await);
    assert!(
        b.claim(&alert(1_900_086_400)).await,
        "a new cycle alerts again"
    );
    // Another account on the same named fleet, renewing at the same
    // second, sends its own.
    let other = FleetAlerts::for_fleet(&fleet_on(&redis, &name).await, "other".into());
    assert!(other.claim(&alert(1_900_000_000)).await);
}

/// A bare rate in a fleet is kept as a sliding window until a burst under
/// it is refused: that 429 lowers nothing and paces every process evenly,
/// which is said once (with how to name a burst); a 429 at the even pace
/// lowers the limit. A shape named is learnt from as a window's.
#[tokio::test(flavor = "multi_thread")]
async fn a_refused_burst_under_a_bare_rate_paces_the_fleet_evenly_and_says_so_once() {
    use reqwest::header::HeaderMap;
    let redis = Redis::start();
    let none = HeaderMap::new();
    let evenly = PaceNote::FleetPacedEvenly {
        limit: 10,
        told: "10/2s".into(),
    };
    for (bare, said) in [(true, evenly), (false, PaceNote::Learnt(3))] {
        let name = fleet_name(if bare { "bare" } else { "named" });
        let fleet = || async { paced(fleet_on(&redis, &name).await, "10/2s", bare) };
        let (a, b) = (fleet().await, fleet().await);
        calls(&a, 4).await;
        a.pause(Duration::from_millis(1)).await.unwrap();
        assert_eq!(a.observe(&none).await, Some(said.clone()), "bare: {bare}");
        assert_eq!(a.note(), None, "bare: {bare}");
        if !bare {
            continue;
        }
        assert_eq!(
            a.learnt().map(|l| l.limit),
            None,
            "the burst's 429 lowered nothing"
        );
        // Three calls, from either process, go one even interval (220 ms)
        // apart at least; the other process hears of the pace once.
        let t0 = Instant::now();
        calls(&b, 2).await;
        calls(&a, 1).await;
        assert!(
            t0.elapsed() >= Duration::from_millis(440),
            "{:?}",
            t0.elapsed()
        );
        assert_eq!(b.observe(&none).await, Some(said.clone()));
        assert_eq!(b.note(), None);
        // Refused at the even pace: the limit is lowered, and no more is
        // said of the pace.
        a.pause(Duration::from_millis(1)).await.unwrap();
        calls(&a, 1).await;
        let later: Vec<_> = std::iter::once(a.observe(&none).await)
            .chain(std::iter::from_fn(|| a.note().map(Some)))
            .flatten()
            .collect();
        assert!(
            matches!(later.first(), Some(PaceNote::Learnt(n)) if *n < 10),
            "{later:?}"
        );
        assert!(
            !later
                .iter()
                .any(|n| matches!(n, PaceNote::FleetPacedEvenly { .. })),
            "said once: {later:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn every_process_hears_a_learnt_limit_once_and_its_settling() {
    // A 2 s window: the four calls are still in it when the 429 comes,
    // however slow the machine (at 300 ms a loaded one let one age out).
    use reqwest::header::HeaderMap;
    let redis = Redis::start();
    let name = fleet_name("notes");
    let a = pacer(fleet_on(&redis, &name).await, "10/2s");
    let b = pacer(fleet_on(&redis, &name).await, "10/2s");
    let none = HeaderMap::new();
    calls(&a, 4).await;
    a.pause(Duration::from_millis(1)).await.unwrap();
    assert_eq!(a.observe(&none).await, Some(PaceNote::Learnt(3)));
    assert_eq!(a.observe(&none).await, None, "said once");
    assert_eq!(
        a.learnt().map(|l| l.limit),
        Some(3),
        "kept for the checkpoint"
    );
    // The other process learns it from its next take.
    b.take()
        .await
        .unwrap()
        .complete(tokio::time::Instant::now());
    assert_eq!(b.observe(&none).await, Some(PaceNote::Learnt(3)));
    // A clean window later, each process hears that it held.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut settled = (false, false);
    while settled != (true, true) {
        assert!(Instant::now() < deadline, "never settled: {settled:?}");
        for (p, flag) in [(&a, &mut settled.0), (&b, &mut settled.1)] {
            p.take()
                .await
                .unwrap()
                .complete(tokio::time::Instant::now());
            if let Some(PaceNote::LearntSettled(n)) = p.observe(&none).await {
                assert!(n >= 3, "{n}");
                *flag = true;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_late_429_from_before_a_lowering_teaches_nothing_more() {
    let redis = Redis::start();
    let name = fleet_name("stale");
    let p = pacer(fleet_on(&redis, &name).await, "10/400ms");
    let mut c = redis.conn();
    calls(&p, 4).await;
    // Two calls of the old pace still in flight when the 429 comes.
    let late = [p.take().await.unwrap(), p.take().await.unwrap()];
    p.pause(Duration::from_millis(20)).await.unwrap();
    assert_eq!(learnt_in(&mut c, &name), Some(3));
    tokio::time::sleep(Duration::from_millis(40)).await;
    // After the pause, one of them comes back refused too: it was sent at
    // the old pace, so it says nothing new about the limit.
    for permit in late {
        permit.complete(tokio::time::Instant::now());
    }
    p.pause(Duration::from_millis(1)).await.unwrap();
    assert_eq!(
        learnt_in(&mut c, &name),
        Some(3),
        "lowered again for the same overrun"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn remaining_zero_holds_every_process_until_a_place_frees() {
    use reqwest::header::{HeaderMap, HeaderValue};
    let redis = Redis::start();
    let name = fleet_name("full");
    let a = pacer(fleet_on(&redis, &name).await, "100/600ms");
    let b = pacer(fleet_on(&redis, &name).await, "100/600ms");
    let t0 = Instant::now();
    a.take()
        .await
        .unwrap()
        .complete(tokio::time::Instant::now());
    // The key's window is full (of calls from outside the fleet, say),
    // though the fleet itself has used one place of 100.
    let mut full = HeaderMap::new();
    full.insert("x-rate-limit-remaining", HeaderValue::from_static("0"));
    assert_eq!(a.observe(&full).await, None);
    b.take()
        .await
        .unwrap()
        .complete(tokio::time::Instant::now());
    assert!(
        t0.elapsed() >= Duration::from_millis(550),
        "the other process went at {:?}",
        t0.elapsed()
    );
}

/// Redis's own clock, in unix ms.
fn redis_ms(c: &mut redis::Connection) -> f64 {
    let (s, us): (u64, u64) = redis::cmd("TIME").query(c).unwrap();
    (s * 1000) as f64 + us as f64 / 1000.0
}

/// One process's call that came back after another process adopted a
/// stated window (100 per 10 s), but before its own process passed that
/// window's key, is settled there again once it does: it then ends 10 s
/// after its response, not where a call in flight would (its timeout and
/// the window's slack further).
#[tokio::test(flavor = "multi_thread")]
async fn a_call_back_before_its_process_took_on_an_adopted_window_is_settled_there() {
    let redis = Redis::start();
    let name = fleet_name("resettle");
    let a = pacer(fleet_on(&redis, &name).await, "50/1s");
    let b = pacer(fleet_on(&redis, &name).await, "50/1s");
    let stated = stated_ten_seconds();
    let permit = b.take().await.unwrap();
    let note = a.observe(&stated).await;
    assert!(
        matches!(&note, Some(PaceNote::Heard(_))),
        "A said it adopted the window: {note:?}"
    );
    let key = FleetKeys::named(&name).further(100, 10_000);
    let mut c = redis.conn();
    let end_of = |c: &mut redis::Connection| -> f64 {
        let v: Vec<(String, f64)> = redis::cmd("ZRANGE")
            .arg(&key)
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .query(c)
            .unwrap();
        assert_eq!(v.len(), 1, "B's call alone: {v:?}");
        v[0].1
    };
    permit.complete(tokio::time::Instant::now());
    b.flush().await;
    let back = redis_ms(&mut c);
    // Settled without the key: still a call in flight's end, 12 s on.
    assert!(
        end_of(&mut c) - back > 11_000.0,
        "{}",
        end_of(&mut c) - back
    );
    b.observe(&stated).await;
    b.flush().await;
    let left = end_of(&mut c) - back;
    assert!((9_000.0..=10_050.0).contains(&left), "{left} ms left");
}

/// A response stating the primary window (50 a second) and a window of
/// 100 per 10 s that the pacers were not told.
fn stated_ten_seconds() -> reqwest::header::HeaderMap {
    let mut stated = reqwest::header::HeaderMap::new();
    stated.insert(
        "ratelimit-policy",
        r#""s";q=50;w=1, "m";q=100;w=10"#.parse().unwrap(),
    );
    stated
}

/// A bare rate's first window goes on the even pace whichever worker asks
/// first: ten workers taking at once are granted one per 110 ms (W/L and a
/// tenth), none before the start began.
#[tokio::test(flavor = "multi_thread")]
async fn a_bare_rates_first_window_is_paced_evenly_for_every_worker() {
    let redis = Redis::start();
    let p = paced(fleet_on(&redis, &fleet_name("start")).await, "10/1s", true);
    let t0 = Instant::now();
    let workers: Vec<_> = (0..10)
        .map(|_| {
            let p = p.clone();
            tokio::spawn(async move {
                p.take()
                    .await
                    .unwrap()
                    .complete(tokio::time::Instant::now());
            })
        })
        .collect();
    for w in workers {
        w.await.unwrap();
    }
    assert!(
        t0.elapsed() >= Duration::from_millis(990),
        "{:?}",
        t0.elapsed()
    );
}

/// A response stating ten policies of calls, the tightest last (nine of
/// 1,000 per 2-10 s, then 3 per 20 s): the fleet adopts the most it keeps,
/// the tightest first, so 3 per 20 s is paced to, and says which it left
/// out. It adopted the first eight as stated, and sent a call a
/// millisecond where the server allowed 3 in 20 s.
#[tokio::test(flavor = "multi_thread")]
async fn beyond_the_most_adopted_the_loosest_policies_are_left_out_and_said() {
    let redis = Redis::start();
    let name = fleet_name("many-stated");
    let p = pacer(fleet_on(&redis, &name).await, "100/1s");
    let loose: Vec<String> = (2..=10)
        .map(|i| format!(r#""p{i}";q=1000;w={i}"#))
        .collect();
    let policy = format!(r#"{}, "tight";q=3;w=20"#, loose.join(", "));
    let mut h = reqwest::header::HeaderMap::new();
    h.insert("ratelimit-policy", policy.parse().unwrap());
    p.observe(&h).await;
    let notes: Vec<PaceNote> = std::iter::from_fn(|| p.note()).collect();
    let ignored: Vec<&str> = notes
        .iter()
        .filter_map(|n| match n {
            PaceNote::Heard(Heard::Ignored { name, .. }) => Some(name.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(ignored, ["p3", "p2"], "{notes:?}");
    calls(&p, 3).await;
    let fourth = tokio::time::timeout(Duration::from_secs(2), p.take()).await;
    assert!(
        fourth.is_err(),
        "a fourth call went in 20 s where 3 were stated"
    );
}

/// A process that left out a stated policy still says the fleet is held
/// for a used-up quota another process found: the note that a policy was
/// left out stood for a hold said already (a review found it).
#[tokio::test(flavor = "multi_thread")]
async fn a_policy_left_out_does_not_silence_a_quotas_hold() {
    let redis = Redis::start();
    let name = fleet_name("left-out-held");
    let a = Arc::new(FleetPacer::new(
        fleet_on(&redis, &name).await,
        FleetPacing {
            wait_for_quota: true,
            ..pacing("100/1s")
        },
    ));
    let b = pacer(fleet_on(&redis, &name).await, "100/1s");
    let loose: Vec<String> = (2..=10)
        .map(|i| format!(r#""p{i}";q=1000;w={i}"#))
        .collect();
    let mut h = reqwest::header::HeaderMap::new();
    h.insert("ratelimit-policy", loose.join(", ").parse().unwrap());
    a.observe(&h).await;
    let notes: Vec<PaceNote> = std::iter::from_fn(|| a.note()).collect();
    let ignored = |n: &PaceNote| matches!(n, PaceNote::Heard(Heard::Ignored { .. }));
    assert!(notes.iter().any(ignored), "{notes:?}");
    let mut h = reqwest::header::HeaderMap::new();
    h.insert(
        "ratelimit-policy",
        r#""day";q=1000;w=86400"#.parse().unwrap(),
    );
    h.insert("ratelimit", r#""day";r=0;t=7200"#.parse().unwrap());
    b.observe(&h).await;
    let _ = tokio::time::timeout(Duration::from_millis(1500), a.take()).await;
    let notes: Vec<PaceNote> = std::iter::from_fn(|| a.note()).collect();
    let held = |n: &PaceNote| matches!(n, PaceNote::Heard(Heard::Exhausted { .. }));
    assert!(notes.iter().any(held), "the hold was not said: {notes:?}");
}
