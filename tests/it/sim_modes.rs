//! `batchrun sim`'s test modes over loopback: a secret limit, transit-in
//! latency, the hostile servers (rate-limited forever, echoing the key), the
//! big-body endpoint, the arrival log, and the 409's retry-after.

use std::time::{Duration, Instant};

use reqwest::{Client, Response, StatusCode};
use serde_json::Value;

use crate::common::{Sim, KEY};

fn client() -> Client {
    Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .expect("client")
}

async fn get(c: &Client, sim: &Sim, path: &str) -> Response {
    c.get(format!("{}{path}", sim.url))
        .header("x-api-key", KEY)
        .send()
        .await
        .expect("GET")
}

async fn post_idem(c: &Client, sim: &Sim, path: &str, idem: &str) -> Response {
    c.post(format!("{}{path}", sim.url))
        .header("x-api-key", KEY)
        .header("idempotency-key", idem)
        .send()
        .await
        .expect("POST")
}

fn header(r: &Response, name: &str) -> Option<String> {
    r.headers()
        .get(name)
        .map(|v| v.to_str().expect("ascii header").to_string())
}

fn stat(s: &Value, name: &str) -> u64 {
    s[name]
        .as_u64()
        .unwrap_or_else(|| panic!("stats has no {name}: {s}"))
}

/// Polls the stats until `cond` holds and returns that very snapshot, so
/// what is asserted on it was true at one instant.
async fn stats_when(sim: &Sim, cond: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let s = sim.stats().await;
        if cond(&s) {
            return s;
        }
        assert!(Instant::now() < deadline, "condition never held: {s}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn arrivals(sim: &Sim) -> Vec<f64> {
    let v: Value = reqwest::get(format!("{}/admin/arrivals", sim.url))
        .await
        .expect("GET /admin/arrivals")
        .json()
        .await
        .expect("arrivals JSON");
    v.as_array()
        .expect("an array")
        .iter()
        .map(|t| t.as_f64().expect("milliseconds"))
        .collect()
}

#[tokio::test]
async fn retry_after_can_be_said_as_the_date_it_ends_at() {
    let sim = Sim::start(&["--limit", "1/10s", "--cooldown", "0", "--retry-after-date"]);
    let c = client();
    assert_eq!(get(&c, &sim, "/v1/echo").await.status(), StatusCode::OK);
    let before = std::time::SystemTime::now();
    let r = get(&c, &sim, "/v1/echo").await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    let said = header(&r, "retry-after").expect("retry-after");
    let at = httpdate::parse_http_date(&said).unwrap_or_else(|e| panic!("{said}: {e}"));
    // The window frees within 10 s, the date rounded up to a whole second.
    let ahead = at.duration_since(before).expect("a date ahead");
    assert!(
        ahead > Duration::from_secs(8) && ahead <= Duration::from_secs(11),
        "{said}: {ahead:?}"
    );
    assert_eq!(sim.stats().await["config"]["retry_after_date"], true);
}

#[tokio::test]
async fn a_secret_limit_is_enforced_without_rate_headers() {
    let sim = Sim::start(&["--secret-limit", "--limit", "2/10s", "--cooldown", "0"]);
    let c = client();
    for _ in 0..2 {
        let r = get(&c, &sim, "/v1/echo").await;
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(header(&r, "x-rate-limit-limit"), None);
        assert_eq!(header(&r, "x-rate-limit-remaining"), None);
        assert!(header(&r, "x-api-remaining-credits").is_some());
    }
    let r = get(&c, &sim, "/v1/echo").await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&r, "x-rate-limit-limit"), None);
    assert_eq!(header(&r, "x-rate-limit-remaining"), None);
    let retry: u64 = header(&r, "retry-after")
        .expect("retry-after")
        .parse()
        .unwrap();
    assert!((1..=10).contains(&retry), "retry-after {retry}");
    let s = sim.stats().await;
    assert_eq!((stat(&s, "accepted"), stat(&s, "rejected_rate")), (2, 1));
    assert_eq!(s["config"]["secret_limit"], true);
}

#[tokio::test]
async fn transit_in_latency_delays_the_arrival_itself() {
    let sim = Sim::start(&[
        "--latency-in",
        "400ms",
        "--limit",
        "1/1m",
        "--concurrency",
        "1",
    ]);
    let c = client();
    let sent = Instant::now();
    let first = tokio::spawn({
        let c = c.clone();
        let url = format!("{}/v1/echo", sim.url);
        async move {
            let r = c.get(url).header("x-api-key", KEY).send().await;
            (r.map(|r| r.status()), sent.elapsed())
        }
    });
    // While it is in transit it holds nothing: no window slot, no
    // concurrency slot, not even a count in `requests`.
    let s = stats_when(&sim, |s| stat(s, "in_transit") == 1).await;
    assert_eq!(
        (
            stat(&s, "requests"),
            stat(&s, "accepted"),
            stat(&s, "in_flight")
        ),
        (0, 0, 0)
    );
    let (status, took) = first.await.unwrap();
    assert_eq!(status.unwrap(), StatusCode::OK);
    assert!(took >= Duration::from_millis(400), "{took:?}");
    let s = sim.stats().await;
    assert_eq!((stat(&s, "in_transit"), stat(&s, "accepted")), (0, 1));
    // Its arrival was logged after the delay: the sim started before it was
    // sent.
    let log = arrivals(&sim).await;
    assert_eq!(log.len(), 1);
    assert!(log[0] >= 400.0, "{log:?}");
}

#[tokio::test]
async fn rate_limit_forever_lets_nothing_through() {
    let sim = Sim::start(&["--rate-limit-forever"]);
    let c = client();
    for _ in 0..5 {
        let r = get(&c, &sim, "/v1/echo").await;
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(header(&r, "retry-after").as_deref(), Some("1"));
        assert_eq!(header(&r, "x-rate-limit-remaining").as_deref(), Some("0"));
        // A rate limit, not exhausted credits.
        assert_eq!(
            header(&r, "x-api-remaining-credits").as_deref(),
            Some("100000")
        );
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["error"], "rate limit exceeded");
    }
    let s = sim.stats().await;
    assert_eq!(
        (stat(&s, "rejected_rate"), stat(&s, "side_effects")),
        (5, 0)
    );
    assert_eq!(stat(&s, "rejected_cooldown"), 0);
    assert!(arrivals(&sim).await.is_empty());
}

#[tokio::test]
async fn echo_key_puts_the_key_in_every_body() {
    let sim = Sim::start(&["--echo-key", "--limit", "1/1m"]);
    let c = client();
    let r = get(&c, &sim, "/v1/echo?n=1").await;
    assert_eq!(r.status(), StatusCode::OK);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["key"], KEY);
    assert_eq!(body["data"]["n"], "1");

    let r = get(&c, &sim, "/v1/echo").await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"], format!("rate limit exceeded for key {KEY}"));

    let r = c
        .post(format!("{}/v1/echo", sim.url))
        .header("x-api-key", KEY)
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert!(r.text().await.unwrap().contains(KEY));

    let r = get(&c, &sim, "/nowhere").await;
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    assert!(r.text().await.unwrap().contains(KEY));

    // Without the flag, the same calls never carry it.
    let plain = Sim::start(&["--limit", "1/1m"]);
    for path in ["/v1/echo?n=1", "/v1/echo", "/nowhere"] {
        let text = get(&c, &plain, path).await.text().await.unwrap();
        assert!(!text.contains(KEY), "{path}: {text}");
    }
}

#[tokio::test]
async fn big_streams_a_json_body_of_the_asked_size() {
    let sim = Sim::start(&["--limit", "none"]);
    let c = client();
    let n = 3_000_000;
    let r = get(&c, &sim, &format!("/v1/big?bytes={n}")).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.content_length(), Some(n));
    assert_eq!(
        header(&r, "x-api-credits-used").as_deref(),
        Some("1"),
        "metered like any call"
    );
    let bytes = r.bytes().await.unwrap();
    assert_eq!(bytes.len() as u64, n);
    let body: Value = serde_json::from_slice(&bytes).expect("valid JSON");
    assert!(body["pad"].as_str().unwrap().bytes().all(|b| b == b'x'));

    // A retry with the same Idempotency-Key replays the same body.
    let first = post_idem(&c, &sim, "/v1/big?bytes=70000", "job-1").await;
    assert_eq!(first.status(), StatusCode::OK);
    let first = first.bytes().await.unwrap();
    let again = post_idem(&c, &sim, "/v1/big?bytes=70000", "job-1").await;
    assert_eq!(
        header(&again, "idempotent-replayed").as_deref(),
        Some("true")
    );
    assert_eq!(again.bytes().await.unwrap(), first);
    assert_eq!(first.len(), 70_000);

    for bad in ["", "?bytes=lots", "?bytes=-5", "?bytes=1073741825"] {
        let r = get(&c, &sim, &format!("/v1/big{bad}")).await;
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{bad}");
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["status"], "error", "{bad}");
    }
    let s = sim.stats().await;
    assert_eq!(
        (
            stat(&s, "side_effects"),
            stat(&s, "idempotent_replays"),
            stat(&s, "rejected_bad_request")
        ),
        (2, 1, 4)
    );
    assert_eq!(stat(&s, "credits_used"), 2);
}

#[tokio::test]
async fn the_arrival_log_holds_what_counted_in_the_window() {
    let sim = Sim::start(&["--limit", "3/1m", "--cooldown", "0"]);
    let c = client();
    let before = arrivals(&sim).await;
    assert!(before.is_empty());
    let mut ok = 0;
    for _ in 0..5 {
        if get(&c, &sim, "/v1/echo").await.status() == StatusCode::OK {
            ok += 1;
        }
    }
    assert_eq!(ok, 3);
    // A request without a key, refused at the door, is not an arrival.
    let r = c.get(format!("{}/v1/echo", sim.url)).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    let log = arrivals(&sim).await;
    assert_eq!(log.len(), 3, "{log:?}");
    assert!(log[0] >= 0.0);
    assert!(log.windows(2).all(|w| w[0] <= w[1]), "{log:?}");
}

#[tokio::test]
async fn a_repeat_of_a_key_still_executing_gets_409_with_retry_after() {
    let sim = Sim::start(&["--limit", "none", "--latency", "30s"]);
    let c = client();
    let slow = tokio::spawn({
        let c = c.clone();
        let url = format!("{}/v1/job", sim.url);
        async move {
            c.post(url)
                .header("x-api-key", KEY)
                .header("idempotency-key", "job-7")
                .send()
                .await
        }
    });
    stats_when(&sim, |s| stat(s, "in_flight") == 1).await;
    let r = post_idem(&c, &sim, "/v1/job", "job-7").await;
    assert_eq!(r.status(), StatusCode::CONFLICT);
    let retry: u64 = header(&r, "retry-after")
        .expect("a 409 carries retry-after")
        .parse()
        .expect("whole seconds");
    assert!(retry >= 1);
    // Hang up on the slow one: it is abandoned and refunded.
    slow.abort();
    let s = stats_when(&sim, |s| stat(s, "abandoned") == 1).await;
    assert_eq!(
        (stat(&s, "rejected_conflict"), stat(&s, "credits_used")),
        (1, 0)
    );
}

/// `--keep-working`: a batch whose client hangs up during its latency still
/// runs to its end, each item executed once, as a single call does (the
/// rehearsal of a killed batch run).
#[tokio::test(flavor = "multi_thread")]
async fn keep_working_runs_a_batch_whose_client_left() {
    let sim = Sim::start(&["--limit", "none", "--latency", "1s", "--keep-working"]);
    let c = client();
    let left = tokio::spawn({
        let c = c.clone();
        let url = format!("{}/batch/echo", sim.url);
        async move {
            c.post(url)
                .header("x-api-key", KEY)
                .header("idempotency-key", "b1")
                .body(r#"[{"a": 1}, {"a": 2}]"#)
                .send()
                .await
        }
    });
    stats_when(&sim, |s| stat(s, "in_flight") == 1).await;
    left.abort();
    let s = stats_when(&sim, |s| stat(s, "in_flight") == 0).await;
    assert_eq!(
        (stat(&s, "side_effects"), stat(&s, "abandoned")),
        (2, 0),
        "{s}"
    );
}
