//! A fleet against a server that states one quota and keeps another.

use crate::common::*;

use super::support::{fleet_name, Redis};

/// The sim states only its quota of 100 per 5 s (the IETF fields) and
/// keeps 10 a second unstated: the fleet learns the second's limit from
/// its 429s, as one process does. The stated quota switched the fleet's
/// learning off, and every window of the run had its 429.
#[tokio::test(flavor = "multi_thread")]
async fn a_fleet_learns_a_limit_kept_unstated_beside_a_stated_quota() {
    let redis = Redis::start();
    let name = fleet_name("unstated");
    let s = Scenario::new("fleet-unstated")
        .with_sim(crate::learning::STATED_5S_SECRET_1S)
        .numbers(60);
    let r = s.run(&[
        "--limit",
        "30/1s",
        "--concurrency",
        "5",
        "--redis",
        &redis.url,
        "--fleet-key",
        &name,
    ]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let limited = r.summary["rate_limited"].as_u64().unwrap();
    assert!(limited <= 3, "{limited} 429s: {}", r.stderr);
    let stats = s.sim().stats().await;
    assert_each_item_once(&s.out_path(), 60);
    assert_side_effects(&stats, 60);
}

/// The sim states 100 a second and keeps 10 a second unstated in front of
/// it (a proxy's): the fleet, told the stated quota, learns the proxy's
/// limit beneath it, as one process does. The stated quota switched the
/// fleet's learning off, and every second of the run had its 429s (16 in
/// 100 calls); now those of the start's burst and a probe's.
#[tokio::test(flavor = "multi_thread")]
async fn a_fleet_learns_a_limit_kept_unstated_in_front_of_a_stated_quota() {
    let redis = Redis::start();
    let name = fleet_name("in-front");
    let s = Scenario::new("fleet-in-front")
        .with_sim(crate::learning::STATED_1S_SECRET_1S)
        .numbers(100);
    let r = s.run(&[
        "--limit",
        "100/1s",
        "--concurrency",
        "5",
        "--redis",
        &redis.url,
        "--fleet-key",
        &name,
    ]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let limited = r.summary["rate_limited"].as_u64().unwrap();
    assert!(limited <= 6, "{limited} 429s: {}", r.stderr);
    let stats = s.sim().stats().await;
    assert_each_item_once(&s.out_path(), 100);
    assert_side_effects(&stats, 100);
}
