//! No limit configured (`--limit none`, `--plan mega`): batchrun still
//! follows the limits the server states, in every dialect, as it does
//! those of a configured limit (docs/pacing.md, "A key capped below its
//! plan").

use crate::common::*;

/// GitHub's daily quota (`X-RateLimit-*`, the reset in epoch seconds):
/// the calls stop at the quota and the run halts resumably naming it, with
/// no call sent into a 429 (it went on to a 429, whose Retry-After halted
/// it).
#[tokio::test(flavor = "multi_thread")]
async fn a_daily_quota_stated_with_no_limit_configured_halts_at_the_quota() {
    let s = Scenario::new("unlimited-daily")
        .with_sim(&["--limit", "5/1d", "--dialect", "github"])
        .numbers(8);
    let r = s.run(&["--limit", "none", "--concurrency", "2"]);
    assert_eq!(r.code, 75, "{}", r.stderr);
    assert_eq!(r.summary["done"], 5, "{}", r.summary);
    assert_eq!(
        r.summary["status_counts"]["429"],
        serde_json::Value::Null,
        "{}",
        r.summary
    );
    let why = r.summary["halt_reason"].as_str().unwrap_or_default();
    assert!(
        why.contains("quota \"core\" is used up until"),
        "{}",
        r.summary
    );
    assert!(!why.contains("Retry-After"), "{}", r.summary);
    let stats = s.sim().stats().await;
    assert_eq!(stats["rejected_rate"], 0, "{stats}");
    assert_side_effects(&stats, 5);
}

/// A per-second quota stated in the IETF fields: kept from the first
/// response on, so only the first flight (`-c` calls) may be refused.
#[tokio::test(flavor = "multi_thread")]
async fn a_per_second_quota_stated_with_no_limit_configured_is_kept() {
    let s = Scenario::new("unlimited-per-second")
        .with_sim(&["--limit", "20/1s", "--cooldown", "0s", "--dialect", "ietf"])
        .numbers(100);
    let r = s.run(&["--limit", "none", "--concurrency", "3"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let limited = r.summary["rate_limited"].as_u64().unwrap();
    assert!(limited <= 3, "{limited} 429s: {}", r.stderr);
    let stats = s.sim().stats().await;
    assert!(stats["rejected_rate"].as_u64().unwrap() <= 3, "{stats}");
    assert!(
        r.stderr.contains("the server announces a further limit"),
        "{}",
        r.stderr
    );
    assert_each_item_once(&s.out_path(), 100);
    assert_side_effects(&stats, 100);
}
