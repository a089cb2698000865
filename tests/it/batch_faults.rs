//! Batches where one item's answer is not the whole call's: a per-item
//! 402, per-item bodies over `--max-body`, the reserve with batches, and
//! the sim's batch endpoint under injected resets.

use crate::common::*;

fn batch_url(s: &Scenario) -> String {
    format!("{}/batch/echo", s.sim().url)
}

/// `POST /batch/echo` with the body `[1, 2, 3]` under `idem`.
async fn post_batch(sim: &Sim, idem: &str) -> Result<serde_json::Value, String> {
    let r = reqwest::Client::new()
        .post(format!("{}/batch/echo", sim.url))
        .header("x-api-key", "k")
        .header("idempotency-key", idem)
        .header("content-type", "application/json")
        .body("[1, 2, 3]")
        .send()
        .await
        .map_err(|e| e.to_string())?;
    r.json().await.map_err(|e| e.to_string())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_batch_of_replays_only_is_never_reset() {
    let sim = Sim::start(&["--limit", "none", "--reset-rate", "1", "--seed", "1"]);
    assert!(post_batch(&sim, "b-1").await.is_err(), "the reset drops it");
    // Every item executed under this key: the resend replays them all, and
    // replays are not subject to injected faults (docs/sim.md).
    let answer = post_batch(&sim, "b-1").await.expect("a replay answers");
    assert_eq!(answer["results"][2]["data"], 3, "{answer}");
    let stats = sim.stats().await;
    assert_eq!(stats["side_effects"], 3, "{stats}");
    assert_eq!(stats["idempotent_replays"], 3, "{stats}");
    assert_eq!(stats["resets"], 1, "{stats}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_per_item_402_with_credits_left_fails_that_item_and_the_rest_go_on() {
    let s = Scenario::new("batch-item-402")
        .with_sim(&["--limit", "none", "--refuse", "n=15:402"])
        .numbers(40);
    let url = batch_url(&s);
    let args = [
        "--url",
        &url,
        "--json-body",
        "--batch",
        "10",
        "--limit",
        "none",
        "-c",
        "2",
    ];
    let r = s.run(&args);
    // Failed with its status, as an unbatched call's would be: no halt,
    // no "credits exhausted" alert while 99,961 credits are left.
    assert_eq!(r.code, 3, "{}", r.stderr);
    assert_eq!(r.summary["done"], 39, "{}", r.summary);
    assert_eq!(r.summary["failed"], 1, "{}", r.summary);
    assert!(alert_ids(&r.summary).is_empty(), "{}", r.summary);
    assert!(!r.stderr.contains("exhausted"), "{}", r.stderr);
    let failures = jsonl(&s.failures_path());
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert_eq!(
        (failures[0]["line"].as_u64(), failures[0]["status"].as_u64()),
        (Some(15), Some(402))
    );
    assert_side_effects(&s.sim().stats().await, 39);
}
