//! `batchrun sim` over loopback with a real HTTP client: status codes, every
//! metered header, retry-after values, cooldown, concurrency, credits,
//! idempotent replay, faults and stats.
//!
//! Windows are scaled so that nothing waits long, and assertions are on counts
//! and headers that do not depend on scheduling; where time must pass, only
//! "at least this long" facts are checked.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use reqwest::{Client, Response, StatusCode};
use serde_json::Value;

use crate::common::{bin, Sim};

fn client() -> Client {
    Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .expect("client")
}

async fn get(c: &Client, sim: &Sim, key: &str, path: &str) -> Response {
    c.get(format!("{}{path}", sim.url))
        .header("x-api-key", key)
        .send()
        .await
        .expect("GET")
}

async fn post(c: &Client, sim: &Sim, key: &str, path: &str, idem: &str, body: &str) -> Response {
    c.post(format!("{}{path}", sim.url))
        .header("x-api-key", key)
        .header("idempotency-key", idem)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .expect("POST")
}

fn header(r: &Response, name: &str) -> Option<String> {
    r.headers()
        .get(name)
        .map(|v| v.to_str().expect("ascii header").to_string())
}

fn num(r: &Response, name: &str) -> i64 {
    header(r, name)
        .unwrap_or_else(|| panic!("no {name} header on {}", r.status()))
        .parse()
        .unwrap_or_else(|_| panic!("{name} is not a number"))
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

fn stat(s: &Value, name: &str) -> u64 {
    s[name]
        .as_u64()
        .unwrap_or_else(|| panic!("stats has no {name}: {s}"))
}

#[tokio::test]
async fn the_window_admits_the_limit_then_429s_then_cools_down() {
    let sim = Sim::start(&["--limit", "5/10s", "--cooldown", "30s"]);
    let c = client();
    for i in 0..5 {
        let r = get(&c, &sim, "k", "/v1/echo?n=7&word=a%20b").await;
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(num(&r, "x-rate-limit-limit"), 5);
        assert_eq!(num(&r, "x-rate-limit-remaining"), 4 - i);
        assert_eq!(num(&r, "x-api-remaining-credits"), 100_000 - i - 1);
        assert_eq!(num(&r, "x-api-credits-used"), i + 1);
        assert_eq!(num(&r, "x-api-max-credits"), 100_000);
        let renewal = num(&r, "x-api-renewal");
        let expected = unix_now() + 30 * 86_400;
        assert!((renewal - expected).abs() <= 120, "{renewal} vs {expected}");
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["status"], "ok");
        assert_eq!(body["data"], serde_json::json!({"n": "7", "word": "a b"}));
    }

    // The overrun: retry-after is when the oldest of the five ages out.
    let r = get(&c, &sim, "k", "/v1/echo").await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    let retry = num(&r, "retry-after");
    assert!((1..=10).contains(&retry), "retry-after {retry}");
    assert_eq!(num(&r, "x-rate-limit-remaining"), 0);
    // A rate-limit 429 is not a credits one.
    assert_eq!(num(&r, "x-api-remaining-credits"), 99_995);
    assert!(header(&r, "x-concurrency-limit").is_none());
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"], "rate limit exceeded");

    // Then the cooldown answers, with its own remaining time.
    for _ in 0..3 {
        let r = get(&c, &sim, "k", "/v1/echo").await;
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        let retry = num(&r, "retry-after");
        assert!((25..=30).contains(&retry), "cooldown retry-after {retry}");
        assert_eq!(num(&r, "x-api-remaining-credits"), 99_995);
    }

    let s = sim.stats().await;
    assert_eq!(stat(&s, "requests"), 9);
    assert_eq!(stat(&s, "accepted"), 5);
    assert_eq!(stat(&s, "side_effects"), 5);
    assert_eq!(stat(&s, "rejected_rate"), 1);
    assert_eq!(stat(&s, "rejected_cooldown"), 3);
    assert_eq!(stat(&s, "max_in_window"), 5);
    assert_eq!(stat(&s, "credits_remaining"), 99_995);
    assert_eq!(stat(&s, "in_flight_max"), 1);
    for name in [
        "rejected_credits",
        "rejected_concurrency",
        "idempotent_replays",
    ] {
        assert_eq!(stat(&s, name), 0, "{name}");
    }
}

#[tokio::test]
async fn the_cooldown_ends_and_retrying_does_not_shorten_it() {
    let sim = Sim::start(&["--limit", "1/1s", "--cooldown", "2s"]);
    let c = client();
    let started = Instant::now();
    assert_eq!(get(&c, &sim, "k", "/v1/a").await.status(), StatusCode::OK);
    let r = get(&c, &sim, "k", "/v1/a").await;
    assert_eq!(
        (r.status(), num(&r, "retry-after")),
        (StatusCode::TOO_MANY_REQUESTS, 1)
    );
    // Hammering during the cooldown keeps getting the remaining time.
    let mut cooled = 0;
    loop {
        let r = get(&c, &sim, "k", "/v1/a").await;
        if r.status() == StatusCode::OK {
            break;
        }
        assert!((1..=2).contains(&num(&r, "retry-after")));
        cooled += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "cooldown cut short"
    );
    let s = sim.stats().await;
    assert_eq!(stat(&s, "rejected_cooldown"), cooled);
    assert_eq!(stat(&s, "accepted"), 2);
}

#[tokio::test]
async fn keys_isolate_pace_but_share_credits() {
    let sim = Sim::start(&["--limit", "2/1m", "--cooldown", "1m", "--credits", "50"]);
    let c = client();
    for _ in 0..2 {
        assert_eq!(get(&c, &sim, "backfill", "/v1/a").await.status(), 200);
    }
    assert_eq!(get(&c, &sim, "backfill", "/v1/a").await.status(), 429);
    assert_eq!(get(&c, &sim, "backfill", "/v1/a").await.status(), 429);
    // The production key is not paused by the backfill's cooldown...
    let r = get(&c, &sim, "prod", "/v1/a").await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(num(&r, "x-rate-limit-remaining"), 1);
    // ...but pays from the same balance.
    assert_eq!(num(&r, "x-api-credits-used"), 3);
    assert_eq!(num(&r, "x-api-remaining-credits"), 47);
}

#[tokio::test]
async fn a_key_cap_lowers_the_limit_in_force() {
    let sim = Sim::start(&["--plan", "pro", "--key-cap", "capped=2"]);
    let c = client();
    let r = get(&c, &sim, "capped", "/v1/a").await;
    assert_eq!(num(&r, "x-rate-limit-limit"), 2);
    assert_eq!(get(&c, &sim, "capped", "/v1/a").await.status(), 200);
    let r = get(&c, &sim, "capped", "/v1/a").await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!((1..=60).contains(&num(&r, "retry-after")));
    let r = get(&c, &sim, "other", "/v1/a").await;
    assert_eq!(num(&r, "x-rate-limit-limit"), 180);
}

#[tokio::test]
async fn the_concurrency_ceiling_has_its_own_429() {
    let sim = Sim::start(&["--limit", "none", "--concurrency", "1", "--latency", "3s"]);
    let c = client();
    let url = format!("{}/v1/slow", sim.url);
    let slow = tokio::spawn({
        let c = c.clone();
        async move {
            c.get(url)
                .header("x-api-key", "k")
                .send()
                .await
                .map(|r| r.status())
        }
    });
    // Wait until the first one is in flight, then arrive beside it.
    let deadline = Instant::now() + Duration::from_secs(10);
    while stat(&sim.stats().await, "in_flight") == 0 {
        assert!(Instant::now() < deadline, "the slow request never started");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let r = get(&c, &sim, "k", "/v1/fast").await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(num(&r, "x-concurrency-limit"), 1);
    assert_eq!(num(&r, "retry-after"), 1);
    assert_eq!(num(&r, "x-api-remaining-credits"), 99_999);
    assert_eq!(slow.await.unwrap().unwrap(), StatusCode::OK);
    let s = sim.stats().await;
    assert_eq!(stat(&s, "rejected_concurrency"), 1);
    assert_eq!(stat(&s, "in_flight_max"), 1);
    assert_eq!(stat(&s, "side_effects"), 1);
}

#[tokio::test]
async fn credits_exhaust_then_top_up_and_renew() {
    let sim = Sim::start(&["--limit", "none", "--credits", "3", "--cost", "pricey=2"]);
    let c = client();
    let r = get(&c, &sim, "k", "/v1/pricey").await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(
        (
            num(&r, "x-api-remaining-credits"),
            num(&r, "x-api-credits-used")
        ),
        (1, 2)
    );
    let renewal = num(&r, "x-api-renewal");

    // One credit left, two needed: the credits-exhausted signal.
    let r = get(&c, &sim, "k", "/v1/pricey").await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(num(&r, "x-api-remaining-credits") <= 0);
    assert!(header(&r, "retry-after").is_none());
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"], "credits exhausted");

    // A cheaper endpoint still works, then the account is empty.
    assert_eq!(get(&c, &sim, "k", "/v1/cheap").await.status(), 200);
    let r = get(&c, &sim, "k", "/v1/cheap").await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(num(&r, "x-api-remaining-credits"), 0);
    assert_eq!(num(&r, "x-api-credits-used"), 3);
    assert_eq!(num(&r, "x-api-max-credits"), 3);

    sim.topup(10).await;
    let r = get(&c, &sim, "k", "/v1/pricey").await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(
        (
            num(&r, "x-api-remaining-credits"),
            num(&r, "x-api-credits-used"),
            num(&r, "x-api-max-credits")
        ),
        (8, 5, 13)
    );

    sim.renew().await;
    let r = get(&c, &sim, "k", "/v1/cheap").await;
    assert_eq!(
        (
            num(&r, "x-api-remaining-credits"),
            num(&r, "x-api-credits-used"),
            num(&r, "x-api-max-credits")
        ),
        (2, 1, 3)
    );
    assert!(num(&r, "x-api-renewal") > renewal, "renewal must move");

    let s = sim.stats().await;
    assert_eq!(stat(&s, "rejected_credits"), 2);
    assert_eq!(stat(&s, "side_effects"), 4);
    assert_eq!(stat(&s, "credits_remaining"), 2);
}

#[tokio::test]
async fn an_idempotency_key_executes_once_and_replays() {
    let sim = Sim::start(&["--limit", "none"]);
    let c = client();
    let first = post(&c, &sim, "k", "/v1/send", "order-1", r#"{"to":"a"}"#).await;
    assert_eq!(first.status(), StatusCode::OK);
    assert!(header(&first, "idempotent-replayed").is_none());
    let used = num(&first, "x-api-credits-used");
    let first_body = first.text().await.unwrap();

    let again = post(&c, &sim, "k", "/v1/send", "order-1", r#"{"to":"a"}"#).await;
    assert_eq!(again.status(), StatusCode::OK);
    assert_eq!(
        header(&again, "idempotent-replayed").as_deref(),
        Some("true")
    );
    assert_eq!(num(&again, "x-api-credits-used"), used, "a replay is free");
    assert_eq!(again.text().await.unwrap(), first_body);

    // The idempotency key is per API key.
    let other = post(&c, &sim, "k2", "/v1/send", "order-1", r#"{"to":"a"}"#).await;
    assert!(header(&other, "idempotent-replayed").is_none());

    let s = sim.stats().await;
    assert_eq!(stat(&s, "side_effects"), 2);
    assert_eq!(stat(&s, "idempotent_replays"), 1);
    assert_eq!(stat(&s, "credits_used"), 2);
}

#[tokio::test]
async fn a_reset_after_executing_is_recovered_by_replay() {
    let sim = Sim::start(&["--limit", "none", "--reset-rate", "1", "--seed", "1"]);
    let c = client();
    let res = c
        .post(format!("{}/v1/charge", sim.url))
        .header("x-api-key", "k")
        .header("idempotency-key", "pay-1")
        .body("{}")
        .send()
        .await;
    match res {
        Err(_) => {}
        Ok(r) => assert!(r.bytes().await.is_err(), "expected no response"),
    }
    let s = sim.stats().await;
    assert_eq!(
        (
            stat(&s, "side_effects"),
            stat(&s, "resets"),
            stat(&s, "credits_used")
        ),
        (1, 1, 1)
    );
    // The retry gets the stored response and is not charged again.
    let r = post(&c, &sim, "k", "/v1/charge", "pay-1", "{}").await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(header(&r, "idempotent-replayed").as_deref(), Some("true"));
    assert_eq!(num(&r, "x-api-credits-used"), 1);
}

#[tokio::test]
async fn an_injected_503_executes_nothing_and_charges_nothing() {
    let sim = Sim::start(&["--limit", "none", "--fail-rate", "1", "--seed", "3"]);
    let c = client();
    let mut with_retry_after = 0;
    for _ in 0..20 {
        let r = get(&c, &sim, "k", "/v1/a").await;
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(num(&r, "x-api-credits-used"), 0);
        if let Some(v) = header(&r, "retry-after") {
            assert_eq!(v, "1");
            with_retry_after += 1;
        }
    }
    assert!(
        (1..20).contains(&with_retry_after),
        "some, not all: {with_retry_after}"
    );
    let s = sim.stats().await;
    assert_eq!(
        (stat(&s, "injected_failures"), stat(&s, "side_effects")),
        (20, 0)
    );
}

#[tokio::test]
async fn injected_latency_delays_the_answer() {
    let sim = Sim::start(&["--limit", "none", "--latency", "300ms..400ms"]);
    let c = client();
    let t = Instant::now();
    assert_eq!(get(&c, &sim, "k", "/v1/a").await.status(), 200);
    assert!(t.elapsed() >= Duration::from_millis(300));
}

#[tokio::test]
async fn spike_arrest_has_no_cooldown_and_derives_its_bucket() {
    // 20 per 200 s: a bucket of 2, one token every 10 s.
    let sim = Sim::start(&["--model", "spike-arrest", "--limit", "20/200s"]);
    let c = client();
    for _ in 0..2 {
        let r = get(&c, &sim, "k", "/v1/a").await;
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(num(&r, "x-rate-limit-limit"), 20);
    }
    for _ in 0..3 {
        let r = get(&c, &sim, "k", "/v1/a").await;
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert!((9..=10).contains(&num(&r, "retry-after")));
    }
    let s = sim.stats().await;
    assert_eq!(
        (stat(&s, "rejected_rate"), stat(&s, "rejected_cooldown")),
        (3, 0)
    );
}

#[tokio::test]
async fn the_mega_plan_has_no_rate_headers() {
    let sim = Sim::start(&["--plan", "mega"]);
    let c = client();
    for _ in 0..30 {
        let r = get(&c, &sim, "k", "/v1/a").await;
        assert_eq!(r.status(), StatusCode::OK);
        assert!(header(&r, "x-rate-limit-limit").is_none());
        assert!(header(&r, "x-api-max-credits").is_some());
    }
    let s = sim.stats().await;
    assert_eq!(s["config"]["concurrency"], 50);
    assert_eq!(s["config"]["limit"], "none");
}

#[tokio::test]
async fn malformed_requests_get_json_4xx_and_the_sim_keeps_serving() {
    let sim = Sim::start(&[]);
    let c = client();

    let r = c.get(format!("{}/v1/a", sim.url)).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    assert!(r.json::<Value>().await.unwrap()["error"].is_string());

    let r = get(&c, &sim, "k", "/nowhere").await;
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    assert!(header(&r, "x-api-max-credits").is_none(), "not metered");
    assert!(r.json::<Value>().await.unwrap()["error"].is_string());

    let r = post(&c, &sim, "k", "/v1/a", "i", "{not json").await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert!(r.json::<Value>().await.unwrap()["error"].is_string());

    let r = c
        .post(format!("{}/v1/a", sim.url))
        .header("x-api-key", "k")
        .body(vec![b' '; 3 << 20])
        .send()
        .await;
    // The sim may answer and close before reading it all, which the client
    // sees as a transport error: either way it must not be accepted.
    if let Ok(r) = r {
        assert!(r.status().is_client_error(), "{}", r.status());
    }

    let r = c
        .get(format!("{}/v1/a", sim.url))
        .header("x-api-key", "k")
        .header("x-huge", "a".repeat(1 << 20))
        .send()
        .await;
    if let Ok(r) = r {
        assert!(r.status().is_client_error(), "{}", r.status());
    }

    let r = c
        .put(format!("{}/v1/a", sim.url))
        .header("x-api-key", "k")
        .send()
        .await
        .unwrap();
    assert!(r.status().is_client_error());

    // A query that is not UTF-8 is decoded lossily, never a crash.
    let r = get(&c, &sim, "k", "/v1/a?bad=%ff%fe&x").await;
    assert_eq!(r.status(), StatusCode::OK);
    let body = r.json::<Value>().await.unwrap();
    assert_eq!(body["data"]["bad"], "\u{fffd}\u{fffd}");

    let r = c
        .post(format!("{}/admin/topup?credits=lots", sim.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);

    // Still serving, and nothing malformed was charged.
    let r = get(&c, &sim, "k", "/v1/a").await;
    assert_eq!(r.status(), StatusCode::OK);
    let s = sim.stats().await;
    let partition: u64 = [
        "rejected_auth",
        "rejected_bad_request",
        "rejected_cooldown",
        "rejected_concurrency",
        "rejected_rate",
        "rejected_conflict",
        "rejected_credits",
        "accepted",
    ]
    .iter()
    .map(|n| stat(&s, n))
    .sum();
    assert_eq!(partition, stat(&s, "requests"));
    assert_eq!(stat(&s, "side_effects"), stat(&s, "credits_used"));
}

#[test]
fn bad_options_exit_2_with_a_clear_message() {
    for (args, needle) in [
        (&["--limit", "fast"][..], "invalid limit"),
        (&["--plan", "gold"], "gold"),
        (&["--concurrency", "0"], "at least 1"),
        (&["--cooldown", "soon"], "duration"),
        (&["--fail-rate", "2"], "between 0 and 1"),
        (&["--latency", "2s..1s"], "backwards"),
        (&["--key-cap", "k"], "KEY=N"),
        (&["--no-such-option"], "no-such-option"),
    ] {
        let out = bin().arg("sim").args(args).output().expect("run batchrun");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(out.stdout.is_empty(), "{args:?}: nothing on stdout");
    }
}

#[test]
fn a_busy_port_is_an_error_not_a_panic() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let out = bin()
        .args(["sim", "--listen", &addr])
        .output()
        .expect("run batchrun");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("error: cannot listen on"), "{err}");
}

#[tokio::test]
async fn spawn_serves_in_process_with_programmatic_options() {
    let args = batchrun::sim::SimArgs {
        listen: "127.0.0.1:0".parse().unwrap(),
        plan: Some(batchrun::rate::Plan::Free),
        concurrency: Some(3),
        credits: 10,
        ..Default::default()
    };
    let (addr, server) = batchrun::sim::spawn(args).await.expect("spawn");
    let c = client();
    let url = format!("http://{addr}/v1/a");
    let mut statuses = Vec::new();
    for _ in 0..6 {
        let r = c.get(&url).header("x-api-key", "k").send().await.unwrap();
        statuses.push(r.status().as_u16());
        assert_eq!(num(&r, "x-rate-limit-limit"), 5);
        assert_eq!(num(&r, "x-api-max-credits"), 10);
    }
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429]);
    let s: Value = reqwest::get(format!("http://{addr}/admin/stats"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(s["config"]["concurrency"], 3);
    assert_eq!(s["config"]["limit"], "5/1m");
    server.abort();
}
