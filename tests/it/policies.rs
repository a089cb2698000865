//! Policies of every shape end to end: the real binary told a limit's
//! shape (`--limit 30/1s,burst=5`, several `--limit`, a token budget)
//! against a real `batchrun sim`.
//!
//! The sim on this branch models sliding windows (and SpikeArrest) only:
//! the bucket and the token budget are judged here by the sim's window
//! stats and by wall time, and exactly (against reference GCRA, fixed and
//! token counters) by the property tests of `rate::kept`.

use std::time::Instant;

use crate::common::*;

#[tokio::test(flavor = "multi_thread")]
async fn told_a_bucket_and_its_burst_it_sends_the_burst_then_the_rate() {
    // nginx `rate=30r/s burst=5`: at most 1 + 5 + 30 calls in any second,
    // which a window of 40 a second never refuses.
    let s = Scenario::new("policies-bucket")
        .with_sim(&[
            "--limit",
            "40/1s",
            "--concurrency",
            "10",
            "--latency",
            "1ms..5ms",
        ])
        .numbers(96);
    let t0 = Instant::now();
    let r = s.run(&["--limit", "30/1s,burst=5", "--concurrency", "10"]);
    let took = t0.elapsed().as_secs_f64();
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.summary["rate_limited"], 0, "{}", r.summary);
    let stats = s.sim().stats().await;
    assert_eq!(stats["rejected_rate"], 0, "{stats}");
    assert!(stats["max_in_window"].as_u64().unwrap() <= 36, "{stats}");
    // Ideal: (96 − 6) / 30 = 3 s; paced to the bucket, not the window.
    assert!((2.8..4.5).contains(&took), "took {took:.2} s");
    assert_each_item_once(&s.out_path(), 96);
    assert_side_effects(&stats, 96);
}

#[tokio::test(flavor = "multi_thread")]
async fn several_limits_of_several_shapes_are_each_kept() {
    let s = Scenario::new("policies-several")
        .with_sim(&[
            "--limit",
            "20/1s",
            "--limit",
            "30/2s",
            "--concurrency",
            "10",
            "--latency",
            "1ms..20ms",
            "--cooldown",
            "1s",
        ])
        .numbers(70);
    let r = s.run(&[
        "--limit",
        "20/1s",
        "--limit",
        "30/2s,fixed",
        "--limit",
        "25/1s,burst=10",
        "--concurrency",
        "10",
    ]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.summary["rate_limited"], 0, "{}", r.summary);
    let stats = s.sim().stats().await;
    assert_eq!(stats["rejected_rate"], 0, "{stats}");
    assert!(stats["max_in_window"].as_u64().unwrap() <= 20, "{stats}");
    assert_each_item_once(&s.out_path(), 70);
    assert_side_effects(&stats, 70);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_token_budget_paces_calls_by_their_cost() {
    // 60 calls of 10 tokens against 200 tokens a second: 600 tokens, the
    // first 200 at once, so at least 2 s, where calls alone would take none.
    let s = Scenario::new("policies-tokens")
        .with_sim(&["--limit", "1000/1s", "--concurrency", "10"])
        .numbers(60);
    let t0 = Instant::now();
    let r = s.run(&[
        "--limit",
        "1000/1s",
        "--limit",
        "200/1s,tokens",
        "--cost",
        "n - n + 10",
        "--concurrency",
        "10",
    ]);
    let took = t0.elapsed().as_secs_f64();
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.summary["rate_limited"], 0, "{}", r.summary);
    assert!((1.9..4.0).contains(&took), "took {took:.2} s");
    assert_each_item_once(&s.out_path(), 60);
}

#[tokio::test(flavor = "multi_thread")]
async fn shapes_where_they_cannot_be_kept_and_bad_costs_are_usage_errors() {
    let s = Scenario::new("policies-refused").numbers(3);
    for (extra, says) in [
        (
            &["--limit", "30/1s,burst=5", "--pacer", "bucket"][..],
            "window pacer",
        ),
        (
            &[
                "--limit",
                "30/1s,tokens",
                "--redis",
                "redis://127.0.0.1:1/0",
            ][..],
            "--redis",
        ),
        (&["--limit", "30/1s,sideways"][..], "sideways"),
        (
            &["--limit", "30/1s,tokens", "--cost", "max_tokens +"][..],
            "max_tokens +",
        ),
    ] {
        let mut args = vec!["--url", "http://127.0.0.1:1/v1/echo"];
        args.extend_from_slice(extra);
        let r = s.run(&args);
        assert_eq!(r.code, 2, "{extra:?}: {}", r.stderr);
        assert!(r.stderr.contains(says), "{extra:?}: {}", r.stderr);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_item_its_cost_cannot_be_read_from_fails_naming_its_line() {
    let s = Scenario::new("policies-cost-row")
        .with_sim(&["--limit", "100/1s"])
        .input("in.jsonl", "{\"n\": 1, \"max_tokens\": 5}\n{\"n\": 2}\n");
    let r = s.run(&[
        "--limit",
        "100/1s",
        "--limit",
        "1000/1m,tokens",
        "--cost",
        "max_tokens",
    ]);
    assert_eq!(r.summary["done"], 1, "{} {}", r.summary, r.stderr);
    let failures = std::fs::read_to_string(s.failures_path()).unwrap();
    assert!(failures.contains("in.jsonl:2"), "{failures}");
    assert!(failures.contains("max_tokens"), "{failures}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_daily_quota_used_up_halts_resumably_and_says_when_it_resets() {
    let s = Scenario::new("policies-daily")
        .with_sim(&["--limit", "5/1d", "--dialect", "github"])
        .numbers(8);
    let r = s.run(&["--limit", "5/1d", "--concurrency", "1"]);
    assert_eq!(r.code, 75, "{}", r.stderr);
    assert_eq!(r.summary["done"], 5, "{}", r.summary);
    assert_eq!(r.summary["rate_limited"], 0, "{}", r.summary);
    assert!(r.stderr.contains("used up until"), "{}", r.stderr);
    assert!(r.stderr.contains("--wait-for-quota"), "{}", r.stderr);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rehearsal_of_a_bucket_told_its_burst_sees_no_429() {
    let s = Scenario::new("policies-rehearsal").numbers(40);
    let out = bin()
        .arg(s.input_path())
        .args(["--sim", "--limit", "30/1s,burst=5", "-c", "5", "--json"])
        .arg("--state-dir")
        .arg(s.state_dir())
        .env_remove("BATCHRUN_URL")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["done"], 40, "{summary}");
    assert_eq!(summary["rate_limited"], 0, "{summary}");
}
