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

#[tokio::test(flavor = "multi_thread")]
async fn a_capped_key_is_followed_with_at_most_one_429() {
    // The plan says 60 a second; this key is capped at 20, and the server
    // says so on every response.
    let s = Scenario::new("pace-cap")
        .with_sim(&[
            "--limit",
            "60/1s",
            "--key-cap",
            &format!("{KEY}=20"),
            "--cooldown",
            "1s",
        ])
        .numbers(60);
    let r = s.run(&["--limit", "60/1s", "--concurrency", "5"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.summary["rate_limited"].as_u64().unwrap() <= 1,
        "{}",
        r.summary
    );
    let stats = s.sim().stats().await;
    assert!(stats["max_in_window"].as_u64().unwrap() <= 20, "{stats}");
    assert_each_item_once(&s.out_path(), 60);
    assert_side_effects(&stats, 60);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_secret_limit_at_a_third_costs_at_most_three_429s_and_is_remembered() {
    // Told 60 a second; the server allows 20, says nothing, and cools a key
    // down for a second after an overrun. The overrun costs one 429 per call
    // in flight when it happens, and probing upward past the limit at most
    // one more: two workers, at most three.
    let s = Scenario::new("pace-secret")
        .with_sim(&[
            "--limit",
            "20/1s",
            "--secret-limit",
            "--cooldown",
            "1s",
            "--latency",
            "2ms..10ms",
        ])
        .numbers(60);
    let r = s.run(&["--limit", "60/1s", "--concurrency", "2"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let limited = r.summary["rate_limited"].as_u64().unwrap();
    assert!((1..=3).contains(&limited), "{limited} 429s: {}", r.stderr);
    assert!(
        r.stderr.contains("a limit the server does not state"),
        "{}",
        r.stderr
    );
    let stats = s.sim().stats().await;
    assert_each_item_once(&s.out_path(), 60);
    assert_side_effects(&stats, 60);
    // The learnt limit is in the checkpoint: the same command again says
    // so before it would send anything.
    let again = s.run(&["--limit", "60/1s", "--concurrency", "2"]);
    assert_eq!(again.code, 0, "{}", again.stderr);
    assert_eq!(again.summary["requests"], 0);
    let first_line = again.stderr.lines().next().unwrap_or_default();
    assert!(first_line.contains("learnt "), "{first_line}");
}
