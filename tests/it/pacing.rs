//! The pacers end to end: the real binary against a real `batchrun sim`
//! enforcing the same limit the client paces to.

use crate::common::*;

#[tokio::test(flavor = "multi_thread")]
async fn the_window_pacer_fills_the_window_to_the_limit_and_never_beyond() {
    let s = Scenario::new("pace-window")
        .with_sim(&[
            "--limit",
            "40/2s",
            "--concurrency",
            "10",
            "--latency",
            "5ms..30ms",
            "--cooldown",
            "1s",
        ])
        .numbers(100);
    let r = s.run(&["--limit", "40/2s", "--concurrency", "10"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.summary["rate_limited"], 0, "{}", r.summary);
    let stats = s.sim().stats().await;
    assert_eq!(stats["rejected_rate"], 0, "{stats}");
    assert_eq!(stats["rejected_cooldown"], 0, "{stats}");
    // At the physical limit: a window holds all 40, and never 41.
    assert_eq!(stats["max_in_window"], 40, "{stats}");
    assert_each_item_once(&s.out_path(), 100);
    assert_side_effects(&stats, 100);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_spike_pacer_is_never_refused_by_a_spike_arrest_gateway() {
    let s = Scenario::new("pace-spike")
        .with_sim(&[
            "--model",
            "spike-arrest",
            "--limit",
            "30ps",
            "--concurrency",
            "10",
            "--latency",
            "0ms..20ms",
        ])
        .numbers(90);
    let r = s.run(&["--pacer", "spike", "--limit", "30ps", "--concurrency", "5"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.summary["rate_limited"], 0, "{}", r.summary);
    let stats = s.sim().stats().await;
    assert_eq!(stats["rejected_rate"], 0, "{stats}");
    assert_each_item_once(&s.out_path(), 90);
    assert_side_effects(&stats, 90);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_token_bucket_is_still_there_and_keeps_its_burst() {
    let s = Scenario::new("pace-bucket")
        .with_sim(&[
            "--limit",
            "40/2s",
            "--concurrency",
            "10",
            "--cooldown",
            "1s",
        ])
        .numbers(60);
    let r = s.run(&[
        "--pacer",
        "bucket",
        "--burst",
        "4",
        "--limit",
        "40/2s",
        "--concurrency",
        "10",
    ]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.summary["rate_limited"], 0, "{}", r.summary);
    let stats = s.sim().stats().await;
    assert_eq!(stats["rejected_rate"], 0, "{stats}");
    // Burst 4 + (40 - 4) per 2.1 s: never the whole window at once.
    let max = stats["max_in_window"].as_u64().unwrap();
    assert!((30..40).contains(&max), "{stats}");
    assert_each_item_once(&s.out_path(), 60);
}

#[test]
fn a_burst_too_large_for_the_limit_is_refused_before_any_call() {
    let dir = TempDir::new("pace-burst");
    let input = numbers(&dir, "items.jsonl", 1);
    let run = |pacer: &str| {
        bin()
            .arg(&input)
            .args(["--pacer", pacer, "--limit", "10/1s", "--burst", "10"])
            .args(["--url", "http://127.0.0.1:9/v1/x"])
            .arg("--state-dir")
            .arg(dir.path().join("state"))
            .env("BATCHRUN_API_KEY", KEY)
            .output()
            .unwrap()
    };
    let out = run("bucket");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--burst 10"));
}
