//! A fixed window told a fleet (`--limit 5/1m,fixed`): kept as a sliding
//! one until a response states when the server's window resets, then
//! aligned to that reset for every process, as in-process.

use std::time::Duration;

use batchrun::fleet::pacer::FleetPacer;
use batchrun::fleet::FleetKeys;
use batchrun::pace::Pacer;
use batchrun::rate::policy::Shape;
use batchrun::rate::Rate;
use tokio::time::Instant;

use super::pacer::{fleet_on, pacing};
use super::support::{fleet_name, Redis};

/// Five calls of a window of five a minute, answered: a sixth, from
/// another process, waits. A response states the window used up and
/// resetting in 4 s (IETF fields, whole seconds): the fleet aligns the
/// window to that reset, so the five occupy until the reset and its second
/// of rounding, not a minute after their answers, and the sixth goes then.
/// Before, the fleet kept a told fixed window as a sliding one for good: the
/// sixth waited the minute out.
#[tokio::test(flavor = "multi_thread")]
async fn a_fixed_window_stated_to_reset_frees_at_the_reset_for_every_process() {
    let redis = Redis::start();
    let name = fleet_name("fixed-aligned");
    let fixed = Rate {
        count: 5,
        period: Duration::from_secs(60),
    };
    let pacer =
        |fleet| FleetPacer::with_limits(fleet, pacing("10/1m"), &[(fixed, Shape::Fixed)], &[], &[]);
    let a = pacer(fleet_on(&redis, &name).await);
    let b = pacer(fleet_on(&redis, &name).await);
    for _ in 0..5 {
        a.take().await.unwrap().complete(Instant::now());
    }
    let soon = tokio::time::timeout(Duration::from_millis(500), b.take()).await;
    assert!(soon.is_err(), "a sixth call went in a window of five");

    let mut h = reqwest::header::HeaderMap::new();
    h.insert("ratelimit-policy", r#""fixed";q=5;w=60"#.parse().unwrap());
    h.insert("ratelimit", r#""fixed";r=0;t=4"#.parse().unwrap());
    let stated = Instant::now();
    a.observe(&h).await;
    let key = FleetKeys::named(&name).fixed(5, 60_000);
    let mut c = redis.conn();
    let align: Option<String> = redis::cmd("HGET")
        .arg(FleetKeys::named(&name).limit())
        .arg(format!("align:{key}"))
        .query(&mut c)
        .unwrap();
    assert!(align.is_some(), "the window was not aligned");

    let sixth = tokio::time::timeout(Duration::from_secs(20), b.take()).await;
    assert!(
        matches!(sixth, Ok(Ok(_))),
        "the sixth call waited the minute"
    );
    // Not before the reset the server stated.
    assert!(
        stated.elapsed() >= Duration::from_secs(4),
        "{:?}",
        stated.elapsed()
    );
}
