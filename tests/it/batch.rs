//! Batch endpoints (`--batch N`) against the sim's `POST /batch/<name>`:
//! every item executed once and recorded on its own, with its own element;
//! a clean stop inside a batch when credits run out; kill -9 and resume.

use std::process::Stdio;

use crate::common::*;

#[tokio::test(flavor = "multi_thread")]
async fn a_thousand_items_in_batches_of_fifty_run_once_each_with_its_own_element() {
    let s = Scenario::new("batch-thousand")
        .with_sim(&["--limit", "10/1s", "--cooldown", "0"])
        .numbers(1000);
    let url = batch_url(&s);
    let r = s.run(&[
        "--url",
        &url,
        "--json-body",
        "--batch",
        "50",
        "--limit",
        "10/1s",
    ]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.summary["done"], 1000, "{}", r.summary);
    assert_eq!(
        r.summary["requests"], 20,
        "one call per 50 items: {}",
        r.summary
    );
    assert_eq!(r.summary["rate_limited"], 0, "{}", r.summary);
    // 20 calls at 10 a window: the second window's, a second after the
    // first (counted as 1,000 calls it said about 99 s).
    let start = r
        .stderr
        .lines()
        .find(|l| l.contains("batchrun: job "))
        .unwrap();
    assert!(start.contains("; about 1s at the limit's pace"), "{start}");
    assert_each_item_once(&s.out_path(), 1000);
    assert_own_elements(&s);
    let stats = s.sim().stats().await;
    assert_side_effects(&stats, 1000);
    assert_eq!(stats["accepted"], 20, "{stats}");
}

#[tokio::test(flavor = "multi_thread")]
async fn credits_running_out_inside_a_batch_stop_cleanly_and_a_top_up_finishes() {
    let s = Scenario::new("batch-credits")
        .with_sim(&["--limit", "none", "--credits", "120"])
        .numbers(400);
    let url = batch_url(&s);
    let args = [
        "--url",
        &url,
        "--json-body",
        "--batch",
        "50",
        "--limit",
        "none",
    ];
    let r = s.run(&args);
    assert_eq!(r.code, 75, "{}", r.stderr);
    assert_eq!(r.summary["done"], 120, "{}", r.summary);
    assert_eq!(r.summary["failed"], 0, "{}", r.summary);
    assert_eq!(r.summary["pending"], 280, "{}", r.summary);
    assert_side_effects(&s.sim().stats().await, 120);
    let status = s.status_json().unwrap();
    assert_eq!(status[0]["done"], 120, "{status}");
    s.sim().topup(1000).await;
    let r = s.run(&args);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_each_item_once(&s.out_path(), 400);
    assert_own_elements(&s);
    assert_side_effects(&s.sim().stats().await, 400);
}

#[tokio::test(flavor = "multi_thread")]
async fn kill_9_at_random_moments_then_resume_runs_every_item_once() {
    const ITEMS: u64 = 600;
    let s = Scenario::new("batch-kills")
        .with_sim(&[
            "--limit",
            "none",
            "--concurrency",
            "64",
            "--latency",
            "1ms..8ms",
        ])
        .numbers(ITEMS);
    let url = batch_url(&s);
    let args = [
        "--url",
        &url,
        "--json-body",
        "--batch",
        "20",
        "--limit",
        "none",
        "-c",
        "4",
    ];
    for _ in 0..8 {
        let mut child = s.spawn_quiet(&args);
        std::thread::sleep(std::time::Duration::from_millis(fastrand::u64(20..300)));
        // SAFETY: signalling our own child.
        unsafe {
            libc::kill(child.id() as i32, libc::SIGKILL);
        }
        let _ = child.wait();
    }
    let r = s.run(&args);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_each_item_once(&s.out_path(), ITEMS);
    assert_own_elements(&s);
    assert_side_effects(&s.sim().stats().await, ITEMS);
}

#[tokio::test(flavor = "multi_thread")]
async fn per_item_failures_land_in_the_failures_file_with_their_own_status() {
    let s = Scenario::new("batch-item-failures")
        .with_sim(&["--limit", "none", "--refuse", "n=7", "--refuse", "n=33:401"])
        .numbers(60);
    let url = batch_url(&s);
    let r = s.run(&[
        "--url",
        &url,
        "--json-body",
        "--batch",
        "25",
        "--limit",
        "none",
    ]);
    assert_eq!(r.summary["done"], 58, "{}", r.summary);
    assert_eq!(r.summary["failed"], 2, "{}", r.summary);
    let failures = jsonl(&s.failures_path());
    let got: Vec<(u64, u64)> = failures
        .iter()
        .map(|f| (f["line"].as_u64().unwrap(), f["status"].as_u64().unwrap()))
        .collect();
    assert_eq!(got, [(7, 403), (33, 401)], "{failures:?}");
    assert_side_effects(&s.sim().stats().await, 58);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_batch_too_large_halves_the_size_says_so_once_and_finishes() {
    let s = Scenario::new("batch-too-large")
        .with_sim(&["--limit", "none", "--max-batch", "10"])
        .numbers(100);
    let url = batch_url(&s);
    let r = s.run(&[
        "--url",
        &url,
        "--json-body",
        "--batch",
        "40",
        "--limit",
        "none",
    ]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.stderr.matches("too large").count(), 1, "{}", r.stderr);
    // 40 halves to 20, or a tail batch of 20 is the first refused and
    // halves to 10; which comes first depends on the workers' order.
    assert!(
        r.stderr.contains("batches of at most 20 items")
            || r.stderr.contains("batches of at most 10 items"),
        "{}",
        r.stderr
    );
    assert_each_item_once(&s.out_path(), 100);
    assert_side_effects(&s.sim().stats().await, 100);
}

#[test]
fn a_dry_run_shows_the_first_batch_in_its_template() {
    let s = Scenario::new("batch-dry").numbers(5);
    let out = s
        .cmd(&[
            "--url",
            "http://127.0.0.1:9/batch/echo",
            "--json-body",
            "--batch",
            "3",
            "--batch-body",
            r#"{{"requests": {items}}}"#,
            "--dry-run",
        ])
        .output()
        .unwrap();
    // With --json the requests go to stderr, stdout being the summary's.
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("# the first batch: 3 item(s), lines 1-3"),
        "{text}"
    );
    assert!(
        text.contains(r#"{"requests": [{"n":1},{"n":2},{"n":3}]}"#),
        "{text}"
    );
    assert!(!text.contains(KEY), "{text}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_reserve_counts_the_items_of_a_batch_not_the_call() {
    let s = Scenario::new("batch-reserve")
        .with_sim(&["--limit", "none", "--credits", "1000"])
        .numbers(2000);
    let url = batch_url(&s);
    let r = s.run(&[
        "--url",
        &url,
        "--json-body",
        "--batch",
        "50",
        "--limit",
        "none",
        "--reserve",
        "300",
        "--allow-partial",
    ]);
    assert_eq!(r.code, 75, "{}", r.stderr);
    let stats = s.sim().stats().await;
    let left = stats["credits_remaining"].as_u64().unwrap();
    assert!(left >= 300, "the reserve was kept: {stats}");
    assert_eq!(r.summary["failed"], 0, "{}", r.summary);
    assert_eq!(
        r.summary["done"].as_u64().unwrap(),
        1000 - left,
        "{}",
        r.summary
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_batch_whose_answer_is_lost_is_resent_under_its_key_and_replayed() {
    let s = Scenario::new("batch-resets")
        .with_sim(&["--limit", "none", "--reset-rate", "0.3", "--seed", "7"])
        .numbers(400);
    let url = batch_url(&s);
    let r = s.run(&[
        "--url",
        &url,
        "--json-body",
        "--batch",
        "20",
        "--limit",
        "none",
        "--max-attempts",
        "20",
    ]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_each_item_once(&s.out_path(), 400);
    assert_own_elements(&s);
    let stats = s.sim().stats().await;
    assert!(stats["resets"].as_u64().unwrap() > 0, "{stats}");
    assert!(stats["idempotent_replays"].as_u64().unwrap() > 0, "{stats}");
    assert_side_effects(&stats, 400);
}

/// A batch API that answers one result fewer than the items it got, for
/// the first `short` answers of each batch key.
async fn short_answers(short: usize) -> String {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};
    let seen: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
    let app = axum::Router::new().route(
        "/batch",
        axum::routing::post(
            move |headers: axum::http::HeaderMap,
                  axum::Json(items): axum::Json<Vec<serde_json::Value>>| {
                let seen = seen.clone();
                async move {
                    let key = headers["idempotency-key"].to_str().unwrap().to_string();
                    let n = {
                        let mut seen = seen.lock().unwrap();
                        let n = seen.entry(key).or_default();
                        *n += 1;
                        *n
                    };
                    let mut results: Vec<serde_json::Value> = items
                        .into_iter()
                        .map(|data| serde_json::json!({"status": 200, "data": data}))
                        .collect();
                    if n <= short {
                        results.pop();
                    }
                    axum::Json(serde_json::json!({ "results": results }))
                }
            },
        ),
    );
    format!("http://{}/batch", serve(app).await)
}

#[tokio::test(flavor = "multi_thread")]
async fn an_answer_of_the_wrong_length_pairs_nothing_and_is_resent_under_its_key() {
    let s = Scenario::new("batch-short").numbers(30);
    let url = short_answers(1).await;
    let r = s.run(&[
        "--url",
        &url,
        "--json-body",
        "--batch",
        "10",
        "--limit",
        "none",
    ]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.summary["retries"], 3, "one per batch: {}", r.summary);
    assert_each_item_once(&s.out_path(), 30);
    for row in jsonl(&s.out_path()) {
        assert_eq!(row["body"]["data"], row["input"], "{row}");
    }
    // Never right: every item fails with the reason, its outcome unknown
    // (an array of the wrong length is the batch's, not the endpoint's).
    let s = Scenario::new("batch-short-always").numbers(20);
    let url = short_answers(usize::MAX).await;
    let r = s.run(&[
        "--url",
        &url,
        "--json-body",
        "--batch",
        "10",
        "--limit",
        "none",
        "--max-attempts",
        "2",
    ]);
    assert_eq!(r.summary["failed"], 20, "{}", r.summary);
    for f in jsonl(&s.failures_path()) {
        let reason = f["reason"].as_str().unwrap();
        assert!(reason.contains("holds 9 results for 10 items"), "{f}");
        assert!(reason.contains("outcome unknown"), "{f}");
    }
    assert!(jsonl(&s.out_path()).is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn waiting_for_credits_a_batch_run_resumes_after_a_top_up() {
    let s = Scenario::new("batch-wait")
        .with_sim(&["--limit", "none", "--credits", "120"])
        .numbers(300);
    let url = batch_url(&s);
    let child = s
        .cmd(&[
            "--url",
            &url,
            "--json-body",
            "--batch",
            "50",
            "--limit",
            "none",
            "--wait-for-credits",
            "--probe-every",
            "200ms",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_stats(s.sim(), 30, |st| st["side_effects"] == 120).await;
    s.sim().topup(1000).await;
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("waiting for credits"), "{stderr}");
    assert_each_item_once(&s.out_path(), 300);
    assert_own_elements(&s);
    assert_side_effects(&s.sim().stats().await, 300);
}

#[tokio::test(flavor = "multi_thread")]
async fn retry_failed_sends_the_failed_items_again_one_batch_per_block() {
    let s = Scenario::new("batch-retry-failed").numbers(40);
    let sim = Sim::start(&["--limit", "none", "--refuse", "n=7", "--refuse", "n=30"]);
    let url = format!("{}/batch/echo", sim.url);
    let args = [
        "--url",
        &url,
        "--json-body",
        "--batch",
        "10",
        "--limit",
        "none",
    ];
    let r = s.run(&args);
    assert_eq!(
        (r.summary["done"].as_u64(), r.summary["failed"].as_u64()),
        (Some(38), Some(2))
    );
    // The same API, without the refusals.
    let addr = sim.url.trim_start_matches("http://").to_string();
    drop(sim);
    let sim = Sim::start_on(&addr, &["--limit", "none"]);
    let mut again = args.to_vec();
    again.push("--retry-failed");
    let r = s.run(&again);
    assert_eq!(r.code, 0, "{}", r.stderr);
    // A batch holds the pending items of one block of 10 lines, so that
    // any run forms a batch of unknown outcome again from the same items:
    // lines 7 and 30 are two blocks, two calls.
    assert_eq!(
        r.summary["requests"], 2,
        "one batch per block: {}",
        r.summary
    );
    assert_each_item_once(&s.out_path(), 40);
    assert_own_elements(&s);
    assert_side_effects(&sim.stats().await, 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn batches_weigh_their_items_tokens_and_never_exceed_a_token_budget() {
    // A batch of 8 of these needs about 400 tokens, more than the budget
    // holds: batches are cut to fit, each weighed by its items' estimates.
    let items = prompts(40);
    let limits = ["--limit", "100/1s", "--limit", "300/1s,tokens"];
    let mut sim = limits.to_vec();
    sim.extend(["--cooldown", "1s"]);
    let s = Scenario::new("batch-tokens")
        .with_sim(&sim)
        .input("items.jsonl", &items);
    let url = batch_url(&s);
    let mut args = limits.to_vec();
    args.extend(["--url", &url, "--json-body", "--batch", "8"]);
    args.extend(["--cost", "max_tokens + chars(prompt)/4"]);
    let r = s.run(&args);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.summary["done"], 40, "{}", r.summary);
    assert_eq!(r.summary["rate_limited"], 0, "{}", r.summary);
    let stats = s.sim().stats().await;
    assert_eq!(stats["rejected_rate"], 0, "{stats}");
    let most = stats["policies"][1]["max_in_window"].as_u64().unwrap();
    assert!(most <= 300, "{most} tokens in one window: {stats}");
    // Charged per item, in more calls than 40 / 8: cut to fit the budget.
    assert!(stats["tokens_charged"].as_u64().unwrap() > 600, "{stats}");
    assert!(r.summary["requests"].as_u64().unwrap() > 5, "{}", r.summary);
    assert_each_item_once(&s.out_path(), 40);
}

/// Without `--cost` a call's tokens are a guess (its `max_tokens` and its
/// prompt): batches are formed as they always were without it, blocks of
/// `--batch` items, so that a job killed by an earlier build forms the
/// same batches under the same Idempotency-Keys on its resume. Cut by
/// the guess, these went in 10 calls.
#[tokio::test(flavor = "multi_thread")]
async fn a_guess_of_tokens_forms_no_batch_otherwise() {
    let items = prompts(40);
    let s = Scenario::new("batch-tokens-guessed")
        .with_sim(&["--limit", "100/1s", "--limit", "3000/1s,tokens"])
        .input("items.jsonl", &items);
    let url = batch_url(&s);
    let args = ["--limit", "100/1s", "--limit", "300/1s,tokens"];
    let mut args = args.to_vec();
    args.extend(["--url", &url, "--json-body", "--batch", "8"]);
    let r = s.run(&args);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.summary["done"], 40, "{}", r.summary);
    assert_eq!(r.summary["requests"], 5, "{}", r.summary);
    assert_each_item_once(&s.out_path(), 40);
}
