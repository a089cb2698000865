//! The sim's shapes over loopback (`batchrun sim --limit POLICY`): nginx's
//! bucket, a fixed window reset at its boundary, a token policy, a daily
//! quota, and every dialect read back by the client's own reader to the
//! policies the sim keeps.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use batchrun::rate::announce::{read, Announced, Unit};
use reqwest::{Client, Response, StatusCode};
use serde_json::{json, Value};

use crate::common::{Sim, KEY};

fn client() -> Client {
    Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("client")
}

async fn call(c: &Client, sim: &Sim, key: &str) -> Response {
    c.get(format!("{}/v1/echo", sim.url))
        .header("x-api-key", key)
        .send()
        .await
        .expect("GET")
}

async fn post(c: &Client, sim: &Sim, body: Value) -> Response {
    c.post(format!("{}/v1/complete", sim.url))
        .header("x-api-key", KEY)
        .json(&body)
        .send()
        .await
        .expect("POST")
}

fn unix_now() -> Duration {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap()
}

/// The policies `r`'s headers state, as the client reads them.
fn said(r: &Response) -> Vec<Announced> {
    read(r.headers(), unix_now())
}

#[tokio::test]
async fn a_bucket_with_burst_five_refuses_the_seventh_of_seven_instant_calls() {
    // One call drains in 10 s: seven sequential calls are "at once".
    let sim = Sim::start(&["--limit", "1/10s,burst=5", "--cooldown", "50s"]);
    let c = client();
    let mut statuses = Vec::new();
    for _ in 0..7 {
        statuses.push(call(&c, &sim, KEY).await.status().as_u16());
    }
    assert_eq!(statuses, [200, 200, 200, 200, 200, 200, 429]);
    let s = sim.stats().await;
    assert_eq!(s["policies"][0]["policy"], "1/10s,burst=5");
    assert_eq!(s["policies"][0]["max_excess"], 5);
    // A bucket has no cooldown: the refusal was the rate's.
    assert_eq!(
        (s["rejected_rate"].as_u64(), s["rejected_cooldown"].as_u64()),
        (Some(1), Some(0))
    );
}

/// Fills key `k`'s fixed window (3 calls) and sees the fourth refused;
/// false if a boundary passed meanwhile.
async fn fill(c: &Client, sim: &Sim, k: &str) -> bool {
    let mut codes = Vec::new();
    for _ in 0..4 {
        codes.push(call(c, sim, k).await.status());
    }
    codes.last() == Some(&StatusCode::TOO_MANY_REQUESTS)
}

#[tokio::test]
async fn a_fixed_window_resets_every_key_at_its_boundary() {
    let sim = Sim::start(&["--limit", "3/2s,fixed", "--concurrency", "50"]);
    let c = client();
    // Key a fills its window, then b fills its own 300 ms later. In a
    // fixed window both reset at the same boundary; in a sliding one b
    // would wait 300 ms longer than a.
    let mut attempt = 0;
    loop {
        attempt += 1;
        assert!(attempt <= 5, "a boundary passed during every attempt");
        let (ka, kb) = (format!("a{attempt}"), format!("b{attempt}"));
        if !fill(&c, &sim, &ka).await {
            continue;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        if !fill(&c, &sim, &kb).await || call(&c, &sim, &ka).await.status() == StatusCode::OK {
            continue;
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while call(&c, &sim, &ka).await.status() != StatusCode::OK {
            assert!(Instant::now() < deadline, "a's window never reset");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let b = call(&c, &sim, &kb).await;
        assert_eq!(b.status(), StatusCode::OK, "b reset at the same boundary");
        break;
    }
    let s = sim.stats().await;
    assert_eq!(s["policies"][0]["max_in_fixed_window"], 3);
}

#[tokio::test]
async fn a_token_policy_refuses_an_estimate_that_does_not_fit_and_reports_usage() {
    let sim = Sim::start(&[
        "--limit",
        "100/1m,tokens",
        "--dialect",
        "openai",
        "--seed",
        "3",
    ]);
    let c = client();
    // 200 + 1 tokens may be needed: more than the budget holds.
    let r = post(&c, &sim, json!({"max_tokens": 200, "prompt": "hi"})).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    let r = post(&c, &sim, json!({"max_tokens": 50, "prompt": "abcdefgh"})).await;
    assert_eq!(r.status(), StatusCode::OK);
    let tokens = said(&r);
    let body: Value = r.json().await.unwrap();
    let u = &body["usage"];
    let (p, done) = (
        u["prompt_tokens"].as_u64().unwrap(),
        u["completion_tokens"].as_u64().unwrap(),
    );
    assert_eq!(p, 2, "8 characters");
    assert!(done <= 50);
    assert_eq!(u["total_tokens"].as_u64(), Some(p + done));
    let t = tokens
        .iter()
        .find(|a| a.unit == Unit::Tokens)
        .expect("tokens stated");
    assert_eq!((t.quota, t.remaining), (Some(100), Some(100 - p - done)));
    let s = sim.stats().await;
    assert_eq!(s["tokens_charged"].as_u64(), Some(p + done));
    assert_eq!(s["policies"][0]["max_in_window"].as_u64(), Some(p + done));
}

#[tokio::test]
async fn a_daily_quota_used_up_states_remaining_zero_and_a_far_reset() {
    let sim = Sim::start(&["--limit", "2/1d,fixed", "--dialect", "openai"]);
    let c = client();
    for _ in 0..2 {
        assert_eq!(call(&c, &sim, KEY).await.status(), StatusCode::OK);
    }
    let r = call(&c, &sim, KEY).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    let got = said(&r);
    let q = got
        .iter()
        .find(|a| a.unit == Unit::Calls)
        .expect("requests stated");
    assert_eq!((q.quota, q.remaining), (Some(2), Some(0)));
    let reset = q.reset_in.expect("a reset");
    assert!(reset > Duration::from_secs(23 * 3600), "{reset:?}");
}

/// The sim's three policies (a bucket, a fixed window, tokens) after one
/// request, as `dialect` states them.
async fn stated(dialect: &str) -> Vec<Announced> {
    let sim = Sim::start(&[
        "--limit",
        "10/1s,burst=4",
        "--limit",
        "50/1m,fixed",
        "--limit",
        "1000/1m,tokens",
        "--dialect",
        dialect,
        "--seed",
        "1",
    ]);
    let r = post(&client(), &sim, json!({"max_tokens": 0, "prompt": "abcd"})).await;
    assert_eq!(r.status(), StatusCode::OK, "{dialect}");
    said(&r)
}

fn summary(got: &[Announced]) -> Vec<(Unit, Option<u64>, Option<u64>)> {
    got.iter().map(|a| (a.unit, a.quota, a.remaining)).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn every_dialect_reads_back_as_the_policies_the_sim_keeps() {
    // After one call of one token: the bucket has 4 calls left (burst 4,
    // one used), the fixed window 49, the token budget 999. The tightest
    // calls policy is the bucket.
    let bucket = (Unit::Calls, Some(10), Some(4));
    let tokens = (Unit::Tokens, Some(1000), Some(999));
    let got = stated("ietf").await;
    assert_eq!(
        summary(&got),
        [bucket, (Unit::Calls, Some(50), Some(49)), tokens]
    );
    let windows: Vec<_> = got.iter().map(|a| a.window.map(|w| w.as_secs())).collect();
    assert_eq!(windows, [Some(1), Some(60), Some(60)]);
    // A fixed window's reset is its boundary, within the minute.
    assert!(got[1].reset_in.unwrap() <= Duration::from_secs(60));
    for d in ["ietf-old", "x-ratelimit", "github"] {
        let got = stated(d).await;
        let calls: Vec<_> = summary(&got)
            .into_iter()
            .filter(|a| a.0 == Unit::Calls)
            .collect();
        assert_eq!(calls.first(), Some(&bucket), "{d}: {got:?}");
        assert!(got.iter().all(|a| a.unit == Unit::Calls), "{d}: {got:?}");
    }
    for d in ["openai", "anthropic"] {
        assert_eq!(summary(&stated(d).await), [bucket, tokens], "{d}");
    }
    assert!(stated("none").await.is_empty());
}
