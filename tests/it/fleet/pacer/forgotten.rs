//! The fleet when Redis forgot it, or a checkpoint remembers more: what
//! was in the window, what was learnt and adopted, is put back.

use super::*;

#[tokio::test(flavor = "multi_thread")]
async fn calls_in_the_window_are_put_back_when_redis_comes_back_empty() {
    let redis = Redis::start();
    let mut proxy = Proxy::start(&redis.url).await;
    let name = fleet_name("restore");
    let fleet = Fleet::connect(&FleetSettings {
        url: proxy.url(),
        headroom: 1.0,
        keys: FleetKeys::named(&name),
        redis_timeout: Duration::from_secs(5),
    })
    .await
    .unwrap();
    let p = pacer(fleet, "3/2s");
    let t0 = Instant::now();
    for _ in 0..3 {
        p.take()
            .await
            .unwrap()
            .complete(tokio::time::Instant::now());
    }
    p.flush().await;
    // Redis restarts and forgets everything (as one without persistence does).
    proxy.cut().await;
    let mut c = redis.conn();
    let keys = FleetKeys::named(&name);
    forget(&mut c, &keys);
    proxy.resume().await;
    // The three calls still occupy the server's window: the fourth waits.
    p.take()
        .await
        .unwrap()
        .complete(tokio::time::Instant::now());
    assert!(
        t0.elapsed() >= Duration::from_millis(1900),
        "{:?}",
        t0.elapsed()
    );
    let n: i64 = redis::cmd("ZCARD")
        .arg(keys.window())
        .query(&mut c)
        .unwrap();
    assert!(n >= 1, "the window was not rebuilt");
}

/// Redis forgetting a fleet that learnt a bare rate's limit and paces it
/// evenly (a `DEL` of its keys, the connection up): the process that puts
/// its calls back puts back the learnt limit and the even pace too, so the
/// fleet does not pay the 429s that taught them again.
#[tokio::test(flavor = "multi_thread")]
async fn what_the_fleet_learnt_survives_redis_forgetting_it() {
    use reqwest::header::HeaderMap;
    let redis = Redis::start();
    let name = fleet_name("recall");
    let a = paced(fleet_on(&redis, &name).await, "10/2s", true);
    let none = HeaderMap::new();
    // A refused burst, then a refusal at the even pace: a limit learnt.
    calls(&a, 4).await;
    a.pause(Duration::from_millis(1)).await.unwrap();
    calls(&a, 2).await;
    a.pause(Duration::from_millis(1)).await.unwrap();
    // No take after the lowering: the pause alone told this process the
    // limit, and that the fleet still paces evenly.
    while a.observe(&none).await.is_some() || a.note().is_some() {}
    let learnt = a.learnt().expect("a limit learnt").limit;
    let keys = FleetKeys::named(&name);
    let mut c = redis.conn();
    forget(&mut c, &keys);
    // The loss is found, the fleet held a window, the calls put back.
    calls(&a, 2).await;
    let (got, even): (Option<u64>, Option<u8>) = redis::cmd("HMGET")
        .arg(keys.limit())
        .arg("learnt")
        .arg("even")
        .query(&mut c)
        .unwrap();
    assert_eq!((got, even), (Some(learnt), Some(1)));
    assert_eq!(a.learnt().map(|l| l.limit), Some(learnt));
}

/// Redis forgetting the fleet forgets the list of adopted policies too: the
/// process that adopted one lists it again once it has put its calls
/// back, so a process joining later is still told of it.
#[tokio::test(flavor = "multi_thread")]
async fn an_adopted_policy_is_listed_again_after_redis_forgot_the_fleet() {
    let redis = Redis::start();
    let name = fleet_name("relist");
    let a = pacer(fleet_on(&redis, &name).await, "50/1s");
    let stated = stated_ten_seconds();
    a.take()
        .await
        .unwrap()
        .complete(tokio::time::Instant::now());
    a.observe(&stated).await;
    let mut c = redis.conn();
    let listed = |c: &mut redis::Connection| -> Option<String> {
        redis::cmd("HGET")
            .arg(FleetKeys::named(&name).limit())
            .arg("stated")
            .query(c)
            .unwrap()
    };
    let key = FleetKeys::named(&name).further(100, 10_000);
    assert!(listed(&mut c).is_some_and(|l| l.contains(&key)));
    redis::cmd("FLUSHALL").query::<()>(&mut c).unwrap();
    assert_eq!(listed(&mut c), None);
    // The next take finds the loss, puts A's calls back, and lists again.
    a.take()
        .await
        .unwrap()
        .complete(tokio::time::Instant::now());
    assert!(
        listed(&mut c).is_some_and(|l| l.contains(&key)),
        "{:?}",
        listed(&mut c)
    );
}

/// Redis forgetting a fleet before it learnt anything begins the fleet
/// anew, and the new fleet starts on the even pace as the first did: ten
/// workers taking at once after a `FLUSHALL` are granted one per 110 ms
/// (beside the take that puts the calls back), not the window's room at
/// once, which a bucket with no burst would refuse.
#[tokio::test(flavor = "multi_thread")]
async fn a_fleet_forgotten_before_it_learnt_starts_on_the_even_pace_again() {
    let redis = Redis::start();
    let p = paced(
        fleet_on(&redis, &fleet_name("restart")).await,
        "10/1s",
        true,
    );
    p.take()
        .await
        .unwrap()
        .complete(tokio::time::Instant::now());
    redis::cmd("FLUSHALL")
        .query::<()>(&mut redis.conn())
        .unwrap();
    let t0 = Instant::now();
    let workers: Vec<_> = (0..10)
        .map(|_| {
            let p = p.clone();
            tokio::spawn(async move {
                let permit = p.take().await.unwrap();
                let at = t0.elapsed();
                permit.complete(tokio::time::Instant::now());
                at
            })
        })
        .collect();
    let mut granted = Vec::new();
    for w in workers {
        granted.push(w.await.unwrap());
    }
    granted.sort();
    // The even pace lets at most the first and those 110 and 220 ms after
    // it go within 300 ms, with the put-back take's call: a slow machine
    // grants fewer, never more. (Without the start, all ten went at once.)
    let first = granted[0];
    let early = granted
        .iter()
        .filter(|&&at| at < first + Duration::from_millis(300))
        .count();
    assert!(early <= 4, "granted at {granted:?}");
}

/// A pacer told the bare rate `limit`, whose job's checkpoint says an
/// earlier run learnt `learnt` calls per window, paced evenly, with a
/// limit refused above it (not probed above).
fn resumed(fleet: Fleet, limit: &str, learnt: u64) -> Arc<FleetPacer> {
    resumed_with(fleet, limit, learnt, Some(learnt))
}

/// The same, not probed above `most` (`None`: the told rate held, probed
/// above if told more).
fn resumed_with(fleet: Fleet, limit: &str, learnt: u64, most: Option<u64>) -> Arc<FleetPacer> {
    use batchrun::rate::learn::{Learnt, LearntShape};
    let shape = LearntShape {
        burst: Some(0),
        most,
        ..LearntShape::default()
    };
    let learnt = Learnt {
        limit: learnt,
        shape,
    };
    paced_from(fleet, limit, true, Some(learnt))
}

/// What a job's checkpoint says was learnt is put back by a process's
/// first take when no fleet is running on the key (the limit, settled, the
/// even pace, nothing probed above it), and is never put over a live
/// fleet, whose own learning stands: a new job inherits its origin's
/// learnt limit, which a fleet running elsewhere on the key never learnt.
#[tokio::test(flavor = "multi_thread")]
async fn a_checkpoints_learning_begins_a_fleet_and_never_lowers_a_live_one() {
    let redis = Redis::start();
    let mut c = redis.conn();
    let fresh = fleet_name("resumed");
    let r = resumed(fleet_on(&redis, &fresh).await, "10/2s", 4);
    calls(&r, 1).await;
    let held: (Option<u64>, Option<u8>, Option<u64>) = redis::cmd("HMGET")
        .arg(FleetKeys::named(&fresh).limit())
        .arg("learnt")
        .arg("even")
        .arg("refused_at")
        .query(&mut c)
        .unwrap();
    assert_eq!(held, (Some(4), Some(1), Some(5)));
    // What the fleet answered, and the checkpoint keeps it.
    let kept = r.learnt().expect("the fleet's learning");
    assert_eq!(kept.limit, 4);
    assert_eq!((kept.shape.burst, kept.shape.most), (Some(0), Some(4)));
    // Said by the start line, not again as news.
    assert_eq!(r.note(), None);

    // The told rate a run held (no most), resumed told more: probed above.
    let upgraded = fleet_name("upgraded");
    let u = resumed_with(fleet_on(&redis, &upgraded).await, "40/2s", 20, None);
    calls(&u, 1).await;
    let held: (Option<u64>, Option<u64>) = redis::cmd("HMGET")
        .arg(FleetKeys::named(&upgraded).limit())
        .arg("learnt")
        .arg("refused_at")
        .query(&mut c)
        .unwrap();
    assert_eq!(held, (Some(20), None));
    assert_eq!(
        u.learnt().and_then(|l| l.shape.most),
        None,
        "pinned for the next resume"
    );

    let live = fleet_name("live");
    let a = paced(fleet_on(&redis, &live).await, "10/2s", true);
    calls(&a, 1).await;
    let b = resumed(fleet_on(&redis, &live).await, "10/2s", 4);
    calls(&b, 1).await;
    assert_eq!(learnt_in(&mut c, &live), None, "the live fleet lowered");
    // Still in its start (the recall's even pace ends it for good).
    let start_ends: Option<u64> = redis::cmd("HGET")
        .arg(FleetKeys::named(&live).limit())
        .arg("start_ends")
        .query(&mut c)
        .unwrap();
    assert!(start_ends.is_some(), "the live fleet's start ended");
    // The resumed process hears the fleet's own learning: none.
    assert_eq!(b.learnt(), None);
}

/// Redis restarted under a running fleet, and a resumed job's process
/// took first: its take began the fleet and put its checkpoint's learning
/// back. The running process's own learning (here: none), put back after
/// the loss, replaces it: a checkpoint never decides for a live fleet.
#[tokio::test(flavor = "multi_thread")]
async fn a_live_processs_learning_put_back_after_a_loss_replaces_a_checkpoints() {
    let redis = Redis::start();
    let mut c = redis.conn();
    let name = fleet_name("race");
    let a = paced(fleet_on(&redis, &name).await, "10/2s", true);
    calls(&a, 1).await;
    forget(&mut c, &FleetKeys::named(&name));
    let b = resumed(fleet_on(&redis, &name).await, "10/2s", 4);
    calls(&b, 1).await;
    assert_eq!(learnt_in(&mut c, &name), Some(4), "b began the fleet");
    // a finds the loss and puts back what it heard: nothing learnt.
    calls(&a, 1).await;
    assert_eq!(learnt_in(&mut c, &name), None);
    let (even, refused): (Option<u8>, Option<u64>) = redis::cmd("HMGET")
        .arg(FleetKeys::named(&name).limit())
        .arg("even")
        .arg("refused_at")
        .query(&mut c)
        .unwrap();
    assert_eq!((even, refused), (None, None));
}
