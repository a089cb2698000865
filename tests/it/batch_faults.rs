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

/// 20 items, each with a text of 60,000 characters.
fn long_items(tag: &str) -> Scenario {
    let text = "x".repeat(60_000);
    let items: String = (1..=20)
        .map(|n| format!("{{\"n\": {n}, \"text\": \"{text}\"}}\n"))
        .collect();
    Scenario::new(tag)
        .with_sim(&["--limit", "none"])
        .input("items.jsonl", &items)
}

/// Runs the batches of 10 of `s` with `--max-body max`.
fn run_long(s: &Scenario, max: &str) -> Finished {
    let url = batch_url(s);
    s.run(&[
        "--url",
        &url,
        "--json-body",
        "--batch",
        "10",
        "--limit",
        "none",
        "--max-body",
        max,
    ])
}

#[tokio::test(flavor = "multi_thread")]
async fn max_body_is_kept_per_item_of_a_batch_not_per_answer() {
    // Each result (~60 KB) fits 100KiB; the answer of 10 (~600 KB) does not.
    let s = long_items("batch-max-body-fits");
    let r = run_long(&s, "100KiB");
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_each_item_once(&s.out_path(), 20);
    assert_own_elements(&s);
    let stats = s.sim().stats().await;
    assert_side_effects(&stats, 20);
    assert_eq!(stats["idempotent_replays"], 0, "{stats}");
    // A result over --max-body is recorded cut, as an unbatched one is,
    // while the answer of its batch fits 10 of them.
    let items: String = (1..=20)
        .map(|n| {
            let text = "x".repeat(if n == 3 { 60_000 } else { 10 });
            format!("{{\"n\": {n}, \"text\": \"{text}\"}}\n")
        })
        .collect();
    let s = Scenario::new("batch-max-body-cut")
        .with_sim(&["--limit", "none"])
        .input("items.jsonl", &items);
    let r = run_long(&s, "10KiB");
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_each_item_once(&s.out_path(), 20);
    for row in jsonl(&s.out_path()) {
        let cut = row["line"] == 3;
        assert_eq!(
            row["body"]["batchrun_truncated"] == true,
            cut,
            "{}",
            row["line"]
        );
        if cut {
            assert_eq!(row["body"]["bytes_kept"], 10 * 1024);
        }
    }
    assert_side_effects(&s.sim().stats().await, 20);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_batch_answer_too_long_even_per_item_fails_once_naming_max_body() {
    // 10 x 1KiB and the envelope's 64KiB: far less than ~600 KB.
    let s = long_items("batch-max-body-too-long");
    let r = run_long(&s, "1KiB");
    assert_eq!(r.code, 3, "{}", r.stderr);
    assert_eq!(r.summary["failed"], 20, "{}", r.summary);
    for f in jsonl(&s.failures_path()) {
        let reason = f["reason"].as_str().unwrap();
        assert!(reason.contains("--max-body"), "{reason}");
        assert!(!reason.contains("--batch-results"), "{reason}");
        assert_eq!(f["status"], 200, "{f}");
    }
    // It ran and was paid: not sent again as if its outcome were unknown.
    assert_eq!(r.summary["requests"], 2, "{}", r.summary);
    let stats = s.sim().stats().await;
    assert_side_effects(&stats, 20);
    assert_eq!(stats["idempotent_replays"], 0, "{stats}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rerun_at_the_reserve_learns_the_balance_with_one_item_not_a_batch() {
    let s = Scenario::new("batch-reserve-rerun")
        .with_sim(&["--limit", "none", "--credits", "47"])
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
        "--reserve",
        "20",
        // One worker, so the balance is exact: before the first answer,
        // each worker's first call carries one item.
        "-c",
        "1",
    ];
    let r = s.run(&args);
    assert_eq!(r.code, 75, "{}", r.stderr);
    // A call is a batch of 10: it costs ~10, not ~1.
    assert!(
        r.stderr.contains("a call costs ~10 (10 items"),
        "{}",
        r.stderr
    );
    let left = |st: &serde_json::Value| st["credits_remaining"].as_u64().unwrap();
    // 1 item learns the balance, then 9, 10: the next 10 would cross it.
    let first = left(&s.sim().stats().await);
    assert_eq!(first, 27);
    // Each rerun while nobody tops up spends one item to learn the balance,
    // never a batch: the balance stays above the reserve.
    for _ in 0..2 {
        let r = s.run(&args);
        assert_eq!(r.code, 75, "{}", r.stderr);
        assert!(
            r.stderr.contains("a call of one item learns it"),
            "{}",
            r.stderr
        );
    }
    let stats = s.sim().stats().await;
    assert_eq!(left(&stats), first - 2, "{stats}");
    assert_side_effects(&stats, 47 - first + 2);
}

/// When a batch API answered, and whether that answer held an item's 429.
type Answers = std::sync::Arc<std::sync::Mutex<Vec<(std::time::Instant, bool)>>>;

/// A batch API whose items with `n` a multiple of 3 come back with their
/// own `{"status": 429, "error": "slow down"}` (and `retry_after` when
/// given) for their first `refusals` sends, the call itself a 200; the
/// others are echoed.
async fn item_429s(refusals: usize, retry_after: Option<&'static str>) -> (String, Answers) {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};
    let sent: Arc<Mutex<HashMap<u64, usize>>> = Arc::default();
    let answers: Answers = Arc::default();
    let log = answers.clone();
    let app = axum::Router::new().route(
        "/batch",
        axum::routing::post(
            move |axum::Json(items): axum::Json<Vec<serde_json::Value>>| {
                let (sent, log) = (sent.clone(), log.clone());
                async move {
                    let mut sent = sent.lock().unwrap();
                    let results: Vec<serde_json::Value> = items
                        .into_iter()
                        .map(|data| {
                            let n = data["n"].as_u64().unwrap();
                            let times = sent.entry(n).or_default();
                            *times += 1;
                            match n % 3 == 0 && *times <= refusals {
                                true => {
                                    let mut e =
                                        serde_json::json!({"status": 429, "error": "slow down"});
                                    if let Some(r) = retry_after {
                                        e["retry_after"] = r.into();
                                    }
                                    e
                                }
                                false => serde_json::json!({"status": 200, "data": data}),
                            }
                        })
                        .collect();
                    let limited = results.iter().any(|e| e["status"] == 429);
                    log.lock()
                        .unwrap()
                        .push((std::time::Instant::now(), limited));
                    axum::Json(serde_json::json!({ "results": results }))
                }
            },
        ),
    );
    (format!("http://{}/batch", serve(app).await), answers)
}

#[tokio::test(flavor = "multi_thread")]
async fn an_items_429_in_a_batch_pauses_every_worker_and_never_fails_it() {
    let s = Scenario::new("batch-item-429").numbers(20);
    let (url, answers) = item_429s(2, Some("1")).await;
    let r = s.run(&[
        "--url",
        &url,
        "--json-body",
        "--batch",
        "10",
        "--limit",
        "none",
        "-c",
        "1",
        // Each of lines 3, 6, ..., 18 is refused twice, beside items
        // accepted: its own refusals, an attempt each, and it goes a third
        // time. (An answer of nothing but 429s spends none: below.)
        "--max-attempts",
        "3",
    ]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.summary["done"], 20, "{}", r.summary);
    assert_eq!(r.summary["failed"], 0, "{}", r.summary);
    // Each item's 429 counts: 6 items, twice each.
    assert_eq!(r.summary["rate_limited"], 12, "{}", r.summary);
    assert!(jsonl(&s.failures_path()).is_empty());
    assert_each_item_once(&s.out_path(), 20);
    for row in jsonl(&s.out_path()) {
        assert_eq!(row["body"]["data"], row["input"], "{row}");
    }
    assert!(
        r.stderr.contains("rate limited: pausing every worker") && r.stderr.contains("slow down"),
        "{}",
        r.stderr
    );
    // The element's retry_after (1 s) held the next call back.
    let answers = answers.lock().unwrap().clone();
    assert_eq!(answers.len(), 6, "three calls per block of 10");
    for pair in answers.windows(2) {
        let ((at, limited), (next, _)) = (pair[0], pair[1]);
        if limited {
            let gap = next - at;
            assert!(gap >= std::time::Duration::from_millis(950), "{gap:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn items_429s_for_max_wait_halt_resumably_with_every_item_pending() {
    // Lines of multiples of 3 only: every element of the batch, forever.
    let input: String = (1..=3).map(|i| format!("{{\"n\": {}}}\n", i * 3)).collect();
    let s = Scenario::new("batch-item-429-forever").input("items.jsonl", &input);
    let (url, _) = item_429s(usize::MAX, None).await;
    let r = s.run(&[
        "--url",
        &url,
        "--json-body",
        "--batch",
        "10",
        "--limit",
        "none",
        "--max-wait",
        "2s",
    ]);
    assert_eq!(r.code, 75, "{}", r.stderr);
    assert!(
        r.stderr.contains("nothing but rate limits (429)"),
        "{}",
        r.stderr
    );
    assert_eq!(r.summary["failed"], 0, "{}", r.summary);
    assert_eq!(r.summary["done"], 0, "{}", r.summary);
    assert!(
        r.summary["rate_limited"].as_u64().unwrap() > 0,
        "{}",
        r.summary
    );
    assert!(jsonl(&s.failures_path()).is_empty());
}

/// `--batch` sent to an endpoint that takes one item a call (its answers
/// hold no array of results): every first answer unpaired stops the run
/// (exit 1), the items pending, saying what to check. Every batch was
/// retried five times (each call run and charged) and every item ended
/// failed, its outcome unknown.
#[tokio::test(flavor = "multi_thread")]
async fn batches_sent_to_an_endpoint_of_one_item_stop_the_run_at_once() {
    let s = Scenario::new("batch-wrong-endpoint")
        .with_sim(&["--limit", "none"])
        .numbers(200);
    let url = format!("{}/v1/echo", s.sim().url);
    let r = s.run(&[
        "--url",
        &url,
        "--json-body",
        "--batch",
        "10",
        "--limit",
        "none",
    ]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(
        r.stderr.contains("--url is the API's batch endpoint"),
        "{}",
        r.stderr
    );
    assert_eq!(r.summary["failed"], 0, "{}", r.summary);
    let requests = r.summary["requests"].as_u64().unwrap();
    assert!(requests <= 12, "{requests} calls: {}", r.summary);
}
