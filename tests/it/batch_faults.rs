//! Batches where one item's answer is not the whole call's: a per-item
//! 402, per-item bodies over `--max-body`, the reserve with batches, and
//! the sim's batch endpoint under injected resets.

use crate::common::*;

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
