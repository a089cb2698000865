//! A told bucket of calls whose policy a server states used up (nginx's
//! IETF fields, `RateLimit: r=0;t=1`, a second in whole seconds): the
//! fleet holds that bucket for one interval, as in-process, not the whole
//! fleet for the second.

use std::time::Duration;

use batchrun::fleet::pacer::FleetPacer;
use batchrun::fleet::FleetKeys;
use batchrun::pace::Pacer;
use batchrun::rate::policy::Unit;
use batchrun::rate::Rate;

use super::pacer::{fleet_on, pacing};
use super::support::{fleet_name, Redis};

/// Told `--limit 10/1s,burst=5` (the fleet's primary window is the
/// bucket's envelope, 16 a second), it reads nginx's statement of 10 a
/// second with nothing left, full again in a second. In-process the told
/// bucket keeps that policy: it is held one interval (100 ms) and empty
/// then, and nothing else is lowered or held. Before, the fleet lowered
/// its envelope to the stated 10 and held every call for the second: 60
/// calls took 9.7 s where in-process took 5.5 s (ideal 5.4 s).
#[tokio::test(flavor = "multi_thread")]
async fn a_told_bucket_of_calls_said_empty_is_held_one_interval() {
    let redis = Redis::start();
    let name = fleet_name("emptied");
    let told = Rate {
        count: 10,
        period: Duration::from_secs(1),
    };
    let p = FleetPacer::with_limits(
        fleet_on(&redis, &name).await,
        pacing("16/1s"),
        &[],
        &[(told, 5, Unit::Calls)],
        &[],
    );
    p.take()
        .await
        .unwrap()
        .complete(tokio::time::Instant::now());
    let mut h = reqwest::header::HeaderMap::new();
    h.insert("ratelimit-policy", r#""default";q=10;w=1"#.parse().unwrap());
    h.insert("ratelimit", r#""default";r=0;t=1"#.parse().unwrap());
    p.observe(&h).await;

    let keys = FleetKeys::named(&name);
    let mut c = redis.conn();
    let field = |c: &mut redis::Connection, key: &str, f: &str| -> Option<i64> {
        redis::cmd("HGET").arg(key).arg(f).query(c).unwrap()
    };
    assert_eq!(
        field(&mut c, &keys.limit(), "held_until"),
        None,
        "the fleet held"
    );
    assert_eq!(
        field(&mut c, &keys.limit(), "in_force"),
        None,
        "the envelope lowered"
    );
    // The bucket held no more than one interval, and empty then: its TAT
    // at least the hold plus its tolerance (500 ms) less its allowance
    // (50 ms) ahead, where the one call had left it 100 ms ahead.
    let bucket = keys.bucket(told, 5, Unit::Calls);
    let held = field(&mut c, &bucket, "held_until").expect("the bucket held");
    let tat = field(&mut c, &bucket, "tat_ms").expect("a TAT");
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query(&mut c).unwrap();
    let now = secs * 1000 + micros / 1000;
    assert!(held - now <= 100, "held {} ms more", held - now);
    assert!(
        tat - held >= 449,
        "the bucket left {} ms past the hold",
        tat - held
    );
}
