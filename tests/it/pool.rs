//! The pool's size: `--limit` without `-c` sizes the calls in flight to what
//! the limit needs at the latency measured, within a plan's ceiling; a pool
//! that cannot keep the limit's pace says concurrency bounds the run. A
//! worker whose item the server asks to wait long goes on with the others.

use std::sync::{Arc, Mutex};

use axum::http::{HeaderMap, StatusCode, Uri};

use crate::common::*;

fn start_line(stderr: &str) -> &str {
    stderr
        .lines()
        .find(|l| l.contains("batchrun: job "))
        .expect("a start line")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_limit_without_concurrency_grows_the_pool_to_keep_its_pace() {
    // 600/6s is 100 calls a second; at 200 ms a call that needs about 20
    // in flight. One at a time (the old default) made 5 a second.
    let s = Scenario::new("poolgrows")
        .with_sim(&[
            "--limit",
            "600/6s",
            "--latency",
            "200ms",
            "--concurrency",
            "60",
        ])
        .numbers(300);
    let r = s.run(&["--limit", "600/6s"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.summary["done"], 300);
    let start = start_line(&r.stderr);
    assert!(start.contains("concurrency from 4, growing"), "{start}");
    assert!(start.contains("(at most 100)"), "{start}");
    // 100 in flight at most cannot send 300 at once.
    assert!(
        start.contains("all within the first window if calls take under 2000 ms"),
        "{start}"
    );
    assert!(
        r.stderr
            .contains("calls in flight to keep the limit's pace"),
        "{}",
        r.stderr
    );
    assert!(!r.stderr.contains("bounds this run"), "{}", r.stderr);
    let stats = s.sim().stats().await;
    // While the shape of a bare rate is unknown, its first window goes on
    // the even pace, a tenth under the limit: 91 a second, 18 in flight.
    let most = stats["in_flight_max"].as_u64().unwrap();
    assert!(
        (15..=60).contains(&most),
        "calls in flight at most: {stats}"
    );
    assert_eq!(r.summary["rate_limited"], 0, "{}", r.summary);
    assert_eq!(stats["rejected_rate"], 0, "{stats}");
    assert_eq!(stats["rejected_concurrency"], 0, "{stats}");
    assert_side_effects(&stats, 300);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_plan_ceiling_bounds_the_grown_pool_and_the_run_says_so() {
    // The starter plan allows 5 calls in flight: at 200 ms that is 25 a
    // second, a quarter of the 600/6s limit.
    let s = Scenario::new("poolceiling")
        .with_sim(&[
            "--plan",
            "starter",
            "--limit",
            "600/6s",
            "--latency",
            "200ms",
        ])
        .numbers(30);
    let r = s.run(&["--plan", "starter", "--limit", "600/6s"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let start = start_line(&r.stderr);
    assert!(start.contains("(at most 5)"), "{start}");
    assert!(
        start.contains(
            "5 call(s) in flight bound the run, not the limit, if a call takes over 50 ms"
        ),
        "{start}"
    );
    assert!(
        r.stderr
            .contains("concurrency, not the limit, bounds this run"),
        "{}",
        r.stderr
    );
    let stats = s.sim().stats().await;
    assert_eq!(stats["in_flight_max"], 5, "{stats}");
    assert_eq!(stats["rejected_concurrency"], 0, "{stats}");
    assert_side_effects(&stats, 30);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_fixed_concurrency_is_kept_and_named_as_the_bound() {
    let s = Scenario::new("poolfixed")
        .with_sim(&["--limit", "600/6s", "--latency", "20ms"])
        .numbers(12);
    let r = s.run(&["--limit", "600/6s", "-c", "1"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let start = start_line(&r.stderr);
    assert!(start.contains("concurrency 1;"), "{start}");
    // One call in flight cannot send 12 at once: no "all within the first
    // window" without its condition.
    assert!(
        start.contains("all within the first window if calls take under 500 ms"),
        "{start}"
    );
    assert!(
        start.contains(
            "1 call(s) in flight bound the run, not the limit, if a call takes over 10 ms"
        ),
        "{start}"
    );
    assert!(
        r.stderr
            .contains("concurrency, not the limit, bounds this run"),
        "{}",
        r.stderr
    );
    assert_eq!(s.sim().stats().await["in_flight_max"], 1);
}

/// The calls an API got, in order: each item's `n` and Idempotency-Key.
type Log = Arc<Mutex<Vec<(u64, String)>>>;

/// An API that answers item 1's first call 503 with `Retry-After: 3`
/// (past the two seconds a worker waits in turn) and every other call 200.
async fn busy_for_item_1() -> (String, Log) {
    let log: Log = Arc::default();
    let seen = log.clone();
    let app = axum::Router::new().fallback(move |headers: HeaderMap, uri: Uri| {
        let seen = seen.clone();
        async move {
            let n: u64 = uri
                .query()
                .unwrap()
                .trim_start_matches("n=")
                .parse()
                .unwrap();
            let key = headers["idempotency-key"].to_str().unwrap().to_string();
            let first = {
                let mut seen = seen.lock().unwrap();
                seen.push((n, key));
                seen.iter().filter(|(m, _)| *m == n).count() == 1
            };
            match (n, first) {
                (1, true) => (
                    StatusCode::SERVICE_UNAVAILABLE,
                    [("retry-after", "3")],
                    r#"{"error":"busy"}"#,
                ),
                _ => (StatusCode::OK, [("x-served", "1")], r#"{"ok":true}"#),
            }
        }
    });
    (format!("http://{}/v1/x?n={{n}}", serve(app).await), log)
}

#[tokio::test(flavor = "multi_thread")]
async fn an_item_asked_to_wait_long_lets_the_others_go_first_with_one_worker() {
    let (url, log) = busy_for_item_1().await;
    let s = Scenario::new("waitlong").numbers(5);
    let r = s.run(&["--url", &url, "--limit", "none", "-c", "1"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.summary["done"], 5, "{}", r.summary);
    assert_each_item_once(&s.out_path(), 5);
    let calls = log.lock().unwrap().clone();
    // The one worker did not hold item 1 for its wait: every other item
    // went, and was answered, before item 1's second call.
    let order: Vec<u64> = calls.iter().map(|(n, _)| *n).collect();
    assert_eq!(order, [1, 2, 3, 4, 5, 1], "{}", r.stderr);
    assert_eq!(calls[0].1, calls[5].1, "item 1 again under its key");
    assert_eq!(r.summary["retries"], 1, "{}", r.summary);
    assert_eq!(r.summary["failed"], 0, "{}", r.summary);
}
