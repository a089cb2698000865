//! Credits against APIs the sim does not play: a bare 402 once the balance
//! is spent, renewals that wobble, cycles shown by `used` alone, a webhook
//! that never answers.

use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::Arc;

use axum::http::{HeaderMap, HeaderValue, StatusCode};

use crate::common::*;

/// The credit headers of a balance with `used` of `max` spent.
fn balance(used: u64, max: u64, renewal: Option<u64>) -> HeaderMap {
    let mut h = HeaderMap::new();
    let mut put = |k: &'static str, v: String| {
        h.insert(k, HeaderValue::from_str(&v).unwrap());
    };
    put("x-api-max-credits", max.to_string());
    put("x-api-credits-used", used.to_string());
    put(
        "x-api-remaining-credits",
        max.saturating_sub(used).to_string(),
    );
    if let Some(r) = renewal {
        put("x-api-renewal", r.to_string());
    }
    h
}

/// What an empty account answers on many APIs: a 402 with no credit
/// header and a code that does not say credits.
fn bare_402() -> (StatusCode, HeaderMap, &'static str) {
    (
        StatusCode::PAYMENT_REQUIRED,
        HeaderMap::new(),
        r#"{"error":{"message":"Your account is out of credits.","code":"payment_required"}}"#,
    )
}

/// What an API answers its `n`th call (from 0).
type Answer = (StatusCode, HeaderMap, &'static str);

/// An API answering each call as `answer` says for its number (from 0):
/// its URL template.
async fn api(answer: impl Fn(u64) -> Answer + Clone + Send + Sync + 'static) -> String {
    let calls = Arc::new(AtomicU64::new(0));
    let app = axum::Router::new().fallback(move || {
        let (calls, answer) = (calls.clone(), answer.clone());
        async move { answer(calls.fetch_add(1, SeqCst)) }
    });
    format!("http://{}/v1/x?n={{n}}", serve(app).await)
}

/// An API that states its balance on each success down to 0 of `max`, then
/// answers every call with a bare 402.
async fn bare_402_api(max: u64) -> String {
    api(move |n| match n < max {
        true => (StatusCode::OK, balance(n + 1, max, None), r#"{"ok":true}"#),
        false => bare_402(),
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bare_402_once_the_balance_read_0_halts_resumably_with_items_pending() {
    let url = bare_402_api(10).await;
    let s = Scenario::new("bare402").numbers(40);
    let r = s.run(&["--url", &url, "--limit", "none", "-c", "4"]);
    assert_eq!(r.code, 75, "{}", r.stderr);
    assert_eq!(r.summary["done"], 10, "{}", r.summary);
    assert_eq!(r.summary["failed"], 0, "{}", r.summary);
    assert_eq!(r.summary["pending"], 30, "{}", r.summary);
    assert!(jsonl(&s.failures_path()).is_empty(), "{}", r.stderr);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_probes_bare_402_keeps_the_run_waiting_for_credits() {
    // 10 credits; then the exhaustion 429 (balance 0) four times, then a
    // bare 402 three times (probes, by then), then a top-up's successes.
    let url = api(move |n| match n {
        0..=9 => (StatusCode::OK, balance(n + 1, 10, None), r#"{"ok":true}"#),
        10..=13 => (
            StatusCode::TOO_MANY_REQUESTS,
            balance(10, 10, None),
            r#"{"error":"out of credits"}"#,
        ),
        14..=16 => bare_402(),
        _ => (StatusCode::OK, balance(n, 1000, None), r#"{"ok":true}"#),
    })
    .await;
    let s = Scenario::new("probe402").numbers(30);
    let r = s.run(&[
        "--url",
        &url,
        "--limit",
        "none",
        "-c",
        "2",
        "--wait-for-credits",
        "--probe-every",
        "100ms",
    ]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.summary["done"], 30, "{}", r.summary);
    assert_eq!(r.summary["failed"], 0, "{}", r.summary);
}

/// How many alerts of `id` a run's summary holds.
fn count(summary: &serde_json::Value, id: &str) -> usize {
    alert_ids(summary).iter().filter(|i| *i == id).count()
}

#[tokio::test(flavor = "multi_thread")]
async fn renewals_a_second_apart_fire_each_threshold_once() {
    // Two backends whose x-api-renewal differ by a second, answering in
    // turn: one billing cycle, whose 50% fires once.
    let renewal = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 20 * 86_400;
    let url = api(move |n| {
        let h = balance(n + 1, 100, Some(renewal + n % 2));
        (StatusCode::OK, h, r#"{"ok":true}"#)
    })
    .await;
    let hook = Receiver::start().await;
    let s = Scenario::new("renewalflip").numbers(60);
    let r = s.run(&[
        "--url",
        &url,
        "--limit",
        "none",
        "-c",
        "2",
        "--alert-webhook",
        &hook.url,
    ]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(alert_ids(&r.summary), ["pct-0.5"], "{}", r.stderr);
    assert_eq!(r.stderr.matches("ALERT [threshold]").count(), 1);
    assert_eq!(hook.ids(), ["pct-0.5"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn without_a_renewal_a_used_that_falls_back_to_0_is_a_new_cycle() {
    // 20 credits, no x-api-renewal: the exhaustion 429 states the balance,
    // and POST /reset starts a new cycle (used back to 0).
    let used = Arc::new(AtomicU64::new(0));
    let reset = used.clone();
    let app = axum::Router::new()
        .route(
            "/reset",
            axum::routing::post(move || {
                reset.store(0, SeqCst);
                async { "ok" }
            }),
        )
        .fallback(move || {
            let used = used.clone();
            async move {
                match used.fetch_add(1, SeqCst) {
                    n @ 0..=19 => (StatusCode::OK, balance(n + 1, 20, None), "{}"),
                    _ => (StatusCode::TOO_MANY_REQUESTS, balance(20, 20, None), "{}"),
                }
            }
        });
    let addr = serve(app).await;
    let url = format!("http://{addr}/v1/x?n={{n}}");
    let s = Scenario::new("usedcycle").numbers(50);
    let args = ["--url", url.as_str(), "--limit", "none", "-c", "2"];
    let thresholds = ["pct-0.5", "pct-0.8", "pct-0.95"];
    for cycle in 1..=2 {
        let r = s.run(&args);
        assert_eq!(r.code, 75, "cycle {cycle}: {}", r.stderr);
        assert_eq!(r.summary["done"], 20 * cycle, "{}", r.summary);
        for id in thresholds {
            assert_eq!(count(&r.summary, id), 1, "cycle {cycle}: {}", r.summary);
        }
        reqwest::Client::new()
            .post(format!("http://{addr}/reset"))
            .send()
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn without_a_renewal_a_cycle_that_begins_mid_run_fires_the_thresholds_again() {
    // 100 credits, no x-api-renewal; after the 60th call the API's cycle
    // renews: used starts again from 0.
    let url = api(move |n| {
        let used = if n < 60 { n + 1 } else { n - 59 };
        (StatusCode::OK, balance(used, 100, None), "{}")
    })
    .await;
    let s = Scenario::new("usedmidrun").numbers(120);
    let r = s.run(&["--url", &url, "--limit", "none", "-c", "1"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(count(&r.summary, "pct-0.5"), 2, "{}", r.summary);
    assert_eq!(r.summary["credits_remaining"], 40, "{}", r.summary);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_webhook_that_never_answers_is_said_at_exit_and_not_timed() {
    let app = axum::Router::new().fallback(std::future::pending::<()>);
    let addr = serve(app).await;
    let hook = format!("http://user:pw@{addr}/hook?token=hook-secret");
    let s = Scenario::new("hookhang")
        .with_sim(&["--limit", "none", "--credits", "30"])
        .numbers(60);
    let began = std::time::Instant::now();
    let r = s.run(&["--limit", "none", "-c", "2", "--alert-webhook", &hook]);
    let wall = began.elapsed().as_secs_f64();
    assert_eq!(r.code, 75, "{}", r.stderr);
    let alerts = alert_ids(&r.summary).len();
    assert!(alerts >= 4, "{}", r.summary);
    let said =
        format!("batchrun: {alerts} alert(s) not delivered to the webhook at http://{addr}:");
    assert!(r.stderr.contains(&said), "{}", r.stderr);
    assert!(!r.stderr.contains("hook-secret") && !r.stderr.contains("pw@"));
    // The run waited for the webhook, and its time does not count that.
    let elapsed = r.summary["elapsed_s"].as_f64().unwrap();
    assert!(elapsed + 4.5 <= wall, "elapsed_s {elapsed}, wall {wall}");
}
