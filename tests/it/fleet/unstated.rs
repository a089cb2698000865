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
