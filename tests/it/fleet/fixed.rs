//! A fixed window told a fleet (`--limit 5/1m,fixed`, or of tokens): kept
//! as a sliding one until a response states when the server's window
//! resets, then aligned to that reset for every process, as in-process.

use std::time::Duration;

use batchrun::fleet::pacer::FleetPacer;
use batchrun::fleet::FleetKeys;
use batchrun::pace::{Pacer, Weight};
use batchrun::rate::policy::{Shape, TokenWeight, Unit};
use batchrun::rate::Rate;
use tokio::time::Instant;

use super::pacer::{fleet_on, pacing};
use super::support::{fleet_name, Redis};

/// Whether fleet `name`'s fixed window `key` is aligned (its limit hash
/// holds `align:KEY`).
fn aligned(redis: &Redis, name: &str, key: &str) -> bool {
    let align: Option<String> = redis::cmd("HGET")
        .arg(FleetKeys::named(name).limit())
        .arg(format!("align:{key}"))
        .query(&mut redis.conn())
        .unwrap();
    align.is_some()
}

/// Two processes of fleet `name`, each told a fixed window of 5 calls a
/// minute beside 10 a minute.
async fn two_of_five_a_minute(redis: &Redis, name: &str) -> (FleetPacer, FleetPacer) {
    let fixed = Rate {
        count: 5,
        period: Duration::from_secs(60),
    };
    let pacer =
        |fleet| FleetPacer::with_limits(fleet, pacing("10/1m"), &[(fixed, Shape::Fixed)], &[], &[]);
    let a = pacer(fleet_on(redis, name).await);
    let b = pacer(fleet_on(redis, name).await);
    (a, b)
}

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
    let (a, b) = two_of_five_a_minute(&redis, &name).await;
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
    assert!(aligned(&redis, &name, &key), "the window was not aligned");

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

/// A fixed window of tokens told a fleet (`--limit 1000/1m,fixed,tokens`):
/// 1000 tokens answered fill it, so another process's call of 100 waits.
/// A response states the token quota used up, resetting in 4 s (IETF
/// fields, `qu="tokens"`): the fleet aligns the window to that reset, so
/// the call goes once the reset (and its second of rounding) has passed,
/// not a minute after the first call's answer. Before, the fleet kept a
/// told fixed window of tokens as a sliding one for good.
#[tokio::test(flavor = "multi_thread")]
async fn a_fixed_window_of_tokens_stated_to_reset_frees_at_the_reset_for_every_process() {
    let redis = Redis::start();
    let name = fleet_name("fixed-tokens-aligned");
    let fixed = Rate {
        count: 1000,
        period: Duration::from_secs(60),
    };
    let told = [(fixed, Unit::Tokens, Shape::Fixed)];
    let pacer = |fleet| FleetPacer::with_limits(fleet, pacing("10/1m"), &[], &[], &told);
    let a = pacer(fleet_on(&redis, &name).await);
    let b = pacer(fleet_on(&redis, &name).await);
    let tokens = |n| Weight {
        calls: 1,
        tokens: TokenWeight::whole(n),
    };
    a.take_weighted(tokens(1000))
        .await
        .unwrap()
        .complete(Instant::now());
    let soon = tokio::time::timeout(Duration::from_millis(500), b.take_weighted(tokens(100))).await;
    assert!(soon.is_err(), "a call went past a window of tokens used up");

    let mut h = reqwest::header::HeaderMap::new();
    let policy = r#""tok";q=1000;w=60;qu="tokens""#;
    h.insert("ratelimit-policy", policy.parse().unwrap());
    h.insert("ratelimit", r#""tok";r=0;t=4"#.parse().unwrap());
    let stated = Instant::now();
    a.observe(&h).await;
    let key = FleetKeys::named(&name).fixed_tokens(Unit::Tokens, 1000, 60_000);
    assert!(
        aligned(&redis, &name, &key),
        "the window of tokens was not aligned"
    );

    let next = tokio::time::timeout(Duration::from_secs(20), b.take_weighted(tokens(100))).await;
    assert!(matches!(next, Ok(Ok(_))), "the call waited the minute");
    assert!(
        stated.elapsed() >= Duration::from_secs(4),
        "{:?}",
        stated.elapsed()
    );
}

/// Another client on the key spent 4 of a fixed window of 5 a minute: a
/// response saying only 1 is left makes the fleet count the 4 as spent
/// (as in-process), so another process's first call goes and its second
/// waits. Before, the fleet counted only its own calls and sent five more.
#[tokio::test(flavor = "multi_thread")]
async fn a_fixed_window_counts_what_another_client_spent_for_every_process() {
    let redis = Redis::start();
    let name = fleet_name("fixed-elsewhere");
    let (a, b) = two_of_five_a_minute(&redis, &name).await;
    let mut h = reqwest::header::HeaderMap::new();
    h.insert("ratelimit-policy", r#""fixed";q=5;w=60"#.parse().unwrap());
    h.insert("ratelimit", r#""fixed";r=1;t=40"#.parse().unwrap());
    a.observe(&h).await;

    let first = tokio::time::timeout(Duration::from_secs(2), b.take()).await;
    assert!(matches!(first, Ok(Ok(_))), "the one call left did not go");
    let second = tokio::time::timeout(Duration::from_millis(500), b.take()).await;
    assert!(
        second.is_err(),
        "a call went past what the server said is left"
    );
}
