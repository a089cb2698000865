//! The way to the server, end to end: redirects (the key never crosses to
//! another host), a proxy from the environment, a wrong path or host.

use crate::common::*;

#[tokio::test(flavor = "multi_thread")]
async fn a_redirect_to_another_host_never_carries_the_key() {
    use std::sync::{Arc, Mutex};
    // B records every request it gets; A redirects everything to B under
    // another host name (localhost instead of 127.0.0.1).
    let seen = Arc::new(Mutex::new(Vec::<String>::new()));
    let log = seen.clone();
    let b = axum::Router::new().fallback(move |req: axum::extract::Request| {
        let log = log.clone();
        async move {
            let key = req
                .headers()
                .get("x-api-key")
                .map(|v| v.to_str().unwrap_or("").to_string())
                .unwrap_or_default();
            log.lock().unwrap().push(key);
            "stolen"
        }
    });
    let b_port = serve(b).await.port();
    let a = axum::Router::new().fallback(move || async move {
        (
            axum::http::StatusCode::TEMPORARY_REDIRECT,
            [("location", format!("http://localhost:{b_port}/elsewhere"))],
        )
    });
    let a_url = format!("http://{}/v1/x?n={{n}}", serve(a).await);

    let s = Scenario::new("redirect").numbers(3);
    let r = s.run(&["--url", &a_url, "--limit", "100/1s"]);
    assert_eq!(
        r.code, 3,
        "the redirect is recorded as a failure: {}",
        r.stderr
    );
    assert_eq!(r.summary["failed"], 3);
    let failures = jsonl(&s.failures_path());
    assert_eq!(failures[0]["status"], 307);
    assert!(seen.lock().unwrap().is_empty(), "the other host was called");
}

/// A server whose `/v1/x` redirects with `status` to `/v1/y` in the same
/// origin, `/v1/loop` redirects to itself, and `/v1/y` answers the method and
/// body it got. Returns its base URL and the number of requests it got.
async fn redirecting_server(status: u16) -> (String, std::sync::Arc<std::sync::atomic::AtomicU64>) {
    use axum::http::{Method, StatusCode};
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    let hits = Arc::new(AtomicU64::new(0));
    let counter = hits.clone();
    let app =
        axum::Router::new().fallback(move |method: Method, uri: axum::http::Uri, body: String| {
            counter.fetch_add(1, Ordering::SeqCst);
            async move {
                let redirect = |to: &str| {
                    let status = StatusCode::from_u16(status).unwrap();
                    (status, [("location", to.to_string())], String::new())
                };
                match uri.path() {
                    "/v1/x" => redirect("/v1/y?via=x"),
                    "/v1/loop" => redirect("/v1/loop"),
                    _ => {
                        let answer = serde_json::json!({
                            "method": method.as_str(),
                            "body": body,
                            "query": uri.query(),
                        });
                        (
                            StatusCode::OK,
                            [("x-seen", String::new())],
                            answer.to_string(),
                        )
                    }
                }
            }
        });
    (format!("http://{}", serve(app).await), hits)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_redirect_within_the_origin_is_followed_as_reqwest_did() {
    // 307 and 308 resend the method and the body.
    for status in [307, 308] {
        let (base, _) = redirecting_server(status).await;
        let s = Scenario::new("redirect-same").numbers(2);
        let url = format!("{base}/v1/x");
        let r = s.run(&["--url", &url, "--json-body", "--limit", "100/1s"]);
        assert_eq!(r.code, 0, "{status}: {}", r.stderr);
        let out = jsonl(&s.out_path());
        assert_eq!(out[0]["body"]["method"], "POST", "{status}");
        assert_eq!(out[0]["body"]["query"], "via=x", "{status}");
        let sent: serde_json::Value =
            serde_json::from_str(out[1]["body"]["body"].as_str().unwrap()).unwrap();
        assert_eq!(sent, serde_json::json!({ "n": 2 }), "{status}");
    }
    // 303 (and 301, 302) turn a POST into a GET without its body.
    let (base, _) = redirecting_server(303).await;
    let s = Scenario::new("redirect-see-other").numbers(1);
    let url = format!("{base}/v1/x");
    let r = s.run(&["--url", &url, "--json-body", "--limit", "100/1s"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let out = jsonl(&s.out_path());
    assert_eq!(out[0]["body"]["method"], "GET");
    assert_eq!(out[0]["body"]["body"], "");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_redirect_loop_stops_after_ten_hops() {
    let (base, hits) = redirecting_server(307).await;
    let s = Scenario::new("redirect-loop").numbers(1);
    let r = s.run(&["--url", &format!("{base}/v1/loop"), "--limit", "100/1s"]);
    assert_eq!(r.code, 3, "the loop is recorded as a failure: {}", r.stderr);
    let failures = jsonl(&s.failures_path());
    assert_eq!(failures[0]["status"], 307);
    // The call and ten redirects, once: a 3xx is a permanent failure.
    assert_eq!(hits.load(std::sync::atomic::Ordering::SeqCst), 11);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_proxy_named_in_the_environment_carries_the_calls() {
    // The sim stands in for the proxy: it answers a request whose target is
    // the absolute URL of a host that does not exist.
    let s = Scenario::new("proxy")
        .with_sim(&["--limit", "100/1s"])
        .numbers(3);
    let url = "http://batchrun-proxy-test.invalid/v1/echo?n={n}";
    let mut c = s.cmd(&["--url", url]);
    c.env("HTTP_PROXY", &s.sim().url);
    let r = finish(c);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_each_item_once(&s.out_path(), 3);
    // Without the proxy the host cannot be reached.
    let s = Scenario::new("no-proxy").numbers(1);
    let r = s.run(&["--url", url, "--limit", "100/1s", "--max-attempts", "1"]);
    assert_ne!(r.code, 0, "{}", r.stderr);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_wrong_path_halts_after_a_handful_of_calls_with_nothing_failed() {
    let s = Scenario::new("wrong-path")
        .with_sim(&["--limit", "600/1s"])
        .numbers(50);
    let url = format!("{}/v2/echo?n={{n}}", s.sim().url);
    let r = s.run(&["--url", &url, "--limit", "600/1s", "--concurrency", "2"]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    let why = r.summary["halt_reason"].as_str().unwrap().to_string();
    assert!(why.contains("HTTP 404 on every item"), "{why}");
    assert!(why.contains("/v2/echo?n="), "{why}");
    assert!(why.contains("check the path"), "{why}");
    assert_eq!(r.summary["failed"], 0, "nothing marked failed");
    assert_eq!(r.summary["pending"], 50);
    let sent = r.summary["requests"].as_u64().unwrap();
    assert!((10..=12).contains(&sent), "{sent} calls");
}

#[test]
fn a_wrong_host_halts_at_once_whatever_the_plan() {
    // Nothing listens on port 9 (discard) here; the Free plan allows 5 a
    // minute, which must not stretch the proof into minutes.
    let s = Scenario::new("wrong-host").numbers(20);
    let started = std::time::Instant::now();
    let r = s.run(&[
        "--url",
        "http://127.0.0.1:9/v1/echo?n={n}",
        "--plan",
        "free",
    ]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    let why = r.summary["halt_reason"].as_str().unwrap().to_string();
    assert!(why.contains("could not connect"), "{why}");
    assert!(why.contains("host and port"), "{why}");
    assert_eq!(r.summary["failed"], 0);
    assert_eq!(r.summary["pending"], 20);
    assert!(
        started.elapsed() < std::time::Duration::from_secs(20),
        "took {:?}",
        started.elapsed()
    );
}

/// A server that reads each request's head, counts it, writes `answer`
/// as it is and closes the connection: its base URL and the requests it
/// got.
async fn raw_server(answer: String) -> (String, std::sync::Arc<std::sync::atomic::AtomicU64>) {
    use std::sync::atomic::{AtomicU64, Ordering};
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let hits = std::sync::Arc::new(AtomicU64::new(0));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let counter = hits.clone();
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            let (counter, answer) = (counter.clone(), answer.clone());
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match sock.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                counter.fetch_add(1, Ordering::SeqCst);
                let _ = sock.write_all(answer.as_bytes()).await;
                let _ = sock.shutdown().await;
            });
        }
    });
    (format!("http://{addr}"), hits)
}

/// A server that runs each call, answers `200` with its head and the start
/// of a body, then drops the connection.
async fn cutting_server() -> (String, std::sync::Arc<std::sync::atomic::AtomicU64>) {
    raw_server(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
         content-length: 100\r\n\r\n{\"ok\": tr"
            .to_string(),
    )
    .await
}

/// A 429 whose body the connection cut after its first words: the pause
/// line quotes the server's words, not the record's marking of the cut
/// (`{"batchrun_truncated":true,...`).
#[tokio::test(flavor = "multi_thread")]
async fn a_cut_429_is_quoted_in_the_servers_words() {
    let (url, hits) = raw_server(
        "HTTP/1.1 429 Too Many Requests\r\nretry-after: 0\r\n\
         content-length: 100\r\n\r\nslow down plea"
            .to_string(),
    )
    .await;
    let s = Scenario::new("cut-429").numbers(1);
    let url = format!("{url}/v1/x");
    let r = s.run(&["--limit", "none", "--url", &url, "--max-wait", "1s"]);
    assert!(hits.load(std::sync::atomic::Ordering::SeqCst) >= 1);
    assert!(
        r.stderr.contains("(the server said: slow down plea"),
        "{}",
        r.stderr
    );
    assert!(!r.stderr.contains("batchrun_truncated"), "{}", r.stderr);
}

/// A `200` whose body the connection cut: the server answered, so the
/// call ran. It is recorded done with what came of the body, marked as
/// cut, and never sent again (it was sent again, and ran twice).
#[tokio::test(flavor = "multi_thread")]
async fn a_success_whose_body_was_cut_is_kept_and_never_sent_again() {
    let (base, hits) = cutting_server().await;
    let s = Scenario::new("cut-body").numbers(6);
    let url = format!("{base}/v1/x?n={{n}}");
    let r = s.run(&["--url", &url, "--limit", "100/1s"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(hits.load(std::sync::atomic::Ordering::SeqCst), 6);
    let out = jsonl(&s.out_path());
    assert_eq!(out.len(), 6);
    for v in &out {
        assert_eq!(v["status"], 200, "{v}");
        assert_eq!(v["body"]["batchrun_truncated"], true, "{v}");
        assert_eq!(v["body"]["head"], "{\"ok\": tr", "{v}");
        assert!(
            v["body"]["cut"].as_str().is_some_and(|c| !c.is_empty()),
            "{v}"
        );
    }
}

/// A body's JSON is kept as the server wrote it: an integer beyond 64 bits
/// and a decimal's trailing digits were rounded to the nearest float.
#[tokio::test(flavor = "multi_thread")]
async fn a_json_body_is_kept_as_written_whatever_its_numbers() {
    let body = "{\n  \"id\": 12345678901234567890123,\n  \"price\": 1.10,\n  \"name\": \"a  b\"\n}";
    let app = axum::Router::new()
        .fallback(move || async move { ([("content-type", "application/json")], body) });
    let url = format!("http://{}/v1/x?n={{n}}", serve(app).await);
    let s = Scenario::new("raw-json").numbers(2);
    let r = s.run(&["--url", &url, "--limit", "100/1s"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let text = std::fs::read_to_string(s.out_path()).unwrap();
    let kept = r#""body":{"id":12345678901234567890123,"price":1.10,"name":"a  b"}"#;
    assert_eq!(text.matches(kept).count(), 2, "{text}");
    // Still one JSON object a line.
    assert_eq!(jsonl(&s.out_path()).len(), 2);
}

/// A server whose every answer is a `200` with `headers` headers.
async fn many_headers_server(
    headers: usize,
) -> (String, std::sync::Arc<std::sync::atomic::AtomicU64>) {
    let mut answer = String::from("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n");
    for i in 0..headers {
        answer.push_str(&format!("x-h{i}: {i}\r\n"));
    }
    answer.push_str("connection: close\r\n\r\n{}");
    raw_server(answer).await
}

/// An answer this client cannot read (a head of 150 headers, past the
/// HTTP library's 100) came from a server that ran the call: it is failed
/// with its outcome unknown, once, not sent again (it was sent five times,
/// and ran five times).
#[tokio::test(flavor = "multi_thread")]
async fn an_answer_that_cannot_be_read_is_never_sent_again() {
    let (base, hits) = many_headers_server(150).await;
    let s = Scenario::new("unreadable").numbers(4);
    let url = format!("{base}/v1/x?n={{n}}");
    let r = s.run(&["--url", &url, "--limit", "100/1s"]);
    assert_eq!(r.code, 3, "{}", r.stderr);
    assert_eq!(hits.load(std::sync::atomic::Ordering::SeqCst), 4);
    let failures = jsonl(&s.failures_path());
    assert_eq!(failures.len(), 4);
    for f in &failures {
        assert_eq!(f["outcome_unknown"], true, "{f}");
        let reason = f["reason"].as_str().unwrap();
        assert!(reason.contains("could not be read"), "{reason}");
    }
    assert_eq!(r.summary["status_counts"]["unreadable"], 4, "{}", r.summary);
}
