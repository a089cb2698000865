//! The API key and every credential: never written, however a server
//! echoes, spells out or names it.

use super::*;

#[tokio::test(flavor = "multi_thread")]
async fn a_server_that_echoes_the_key_never_gets_it_written() {
    // Successes and failures both carry the key back; none of it may reach
    // the checkpoint, the results or the failures.
    let s = Scenario::new("echo-key")
        .with_sim(&["--limit", "none", "--echo-key"])
        .input("items.jsonl", "{\"n\": 1}\n{\"n\": 2}\n");
    let ok = s.run(&["--limit", "none"]);
    assert_eq!(ok.code, 0, "{}", ok.stderr);
    let bad_url = format!("{}/v2/missing?n={{n}}", s.sim().url);
    let results = std::fs::read_to_string(s.out_path()).unwrap();
    assert!(
        results.contains("\"key\":\"***\""),
        "the echo is kept, redacted: {results}"
    );
    // Said once, so that *** is not taken for the server's answer.
    let said = "a response held the API key's text: the results and failures hold ***";
    assert_eq!(ok.stderr.matches(said).count(), 1, "{}", ok.stderr);
    // Another job (another URL) whose every call fails: the reasons too.
    let fail_out = s.dir().path().join("bad.failures.jsonl");
    let bad = s.run(&[
        "--limit",
        "none",
        "--url",
        &bad_url,
        "--fail-fast",
        "0",
        "--out",
        s.dir().path().join("bad.results.jsonl").to_str().unwrap(),
        "--failures",
        fail_out.to_str().unwrap(),
    ]);
    assert_eq!(bad.code, 3, "{}", bad.stderr);
    let failures = std::fs::read_to_string(&fail_out).unwrap();
    assert!(
        failures.contains("***"),
        "the reason is kept, redacted: {failures}"
    );
    assert_key_absent_from_files(s.dir().path());
}

/// The key spelt out in the URL (`?apikey=`) and in a header (a Bearer
/// token) never reaches the checkpoint, `status`, or the changed-request
/// refusal (the checkpoint recorded the request, key and all).
#[tokio::test(flavor = "multi_thread")]
async fn a_key_spelt_out_in_the_url_or_a_header_is_never_recorded() {
    let s = Scenario::new("key-in-url")
        .with_sim(&["--limit", "none"])
        .numbers(3);
    let url = format!("{}/v1/echo?apikey={KEY}&n={{n}}", s.sim().url);
    let bearer = format!("Authorization: Bearer {KEY}");
    let r = s.run(&["--limit", "none", "--url", &url, "-H", &bearer]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(!r.stderr.contains(KEY), "{}", r.stderr);
    let status = s.tool("status").output().unwrap();
    let shown = String::from_utf8_lossy(&status.stdout);
    assert!(status.status.success(), "{shown}");
    assert!(!shown.contains(KEY), "{shown}");
    // The same command finds its job: nothing is sent again.
    let again = s.run(&["--limit", "none", "--url", &url, "-H", &bearer]);
    assert_eq!(again.summary["requests"], 0, "{}", again.stderr);
    // Another URL: refused, the difference shown without the key.
    let other = format!("{url}&x=1");
    let changed = s.run(&["--limit", "none", "--url", &other, "-H", &bearer]);
    assert_eq!(changed.code, 2, "{}", changed.stderr);
    assert!(changed.stderr.contains("***"), "{}", changed.stderr);
    assert!(!changed.stderr.contains(KEY), "{}", changed.stderr);
    assert_key_absent_from_files(s.dir().path());
}

/// A password in the URL (`http://user:PASS@host/…`, Basic credentials)
/// is kept out as the key is: it was shown by `-v`, `status` and the
/// changed-request refusal, and kept in the checkpoint.
#[tokio::test(flavor = "multi_thread")]
async fn a_password_in_the_urls_userinfo_is_never_shown_or_recorded() {
    const PASSWORD: &str = "URLPASS_s3cr3t_42";
    let s = Scenario::new("url-password")
        .with_sim(&["--limit", "none"])
        .numbers(3);
    let base = s
        .sim()
        .url
        .replacen("://", &format!("://ops:{PASSWORD}@"), 1);
    let url = format!("{base}/v1/echo?n={{n}}");
    let r = s.run(&["--limit", "none", "--url", &url, "-v"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stderr.contains("ops:***@"), "{}", r.stderr);
    assert!(!r.stderr.contains(PASSWORD), "{}", r.stderr);
    let status = s.tool("status").output().unwrap();
    let shown = String::from_utf8_lossy(&status.stdout);
    assert!(!shown.contains(PASSWORD), "{shown}");
    let changed = s.run(&["--limit", "none", "--url", &format!("{url}&x=1")]);
    assert_eq!(changed.code, 2, "{}", changed.stderr);
    assert!(!changed.stderr.contains(PASSWORD), "{}", changed.stderr);
    assert_secret_absent_from_files(s.dir().path(), PASSWORD);
}

/// A key with whitespace around it (a copy and paste) is sent trimmed, as
/// the server reads it: the server's echo of it is scrubbed.
#[tokio::test(flavor = "multi_thread")]
async fn a_key_with_spaces_around_it_is_trimmed_and_never_written() {
    let s = Scenario::new("key-spaces")
        .with_sim(&["--limit", "none", "--echo-key"])
        .numbers(2);
    let r = finish({
        let mut c = s.cmd(&["--limit", "none"]);
        c.env("BATCHRUN_API_KEY", format!(" {KEY} \t"));
        c
    });
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(!r.stderr.contains(KEY), "{}", r.stderr);
    assert_key_absent_from_files(s.dir().path());
}

/// A server answering 401 with the Authorization header's token named
/// alone, as OpenAI's errors do (`Incorrect API key provided: sk-…`).
async fn names_the_token() -> String {
    let app = axum::Router::new().fallback(|headers: axum::http::HeaderMap| async move {
        let auth = headers.get("authorization").and_then(|v| v.to_str().ok());
        let token = auth
            .unwrap_or_default()
            .rsplit(' ')
            .next()
            .unwrap_or_default();
        let said =
            format!("{{\"error\":{{\"message\":\"Incorrect API key provided: {token}.\"}}}}");
        (axum::http::StatusCode::UNAUTHORIZED, said)
    });
    format!("http://{}/v1/x", serve(app).await)
}

/// A key sent after an auth scheme (`Bearer …` in the key's variable with
/// `--api-key-header Authorization`), or given with `-H Authorization:`,
/// is kept out of every output as its token alone, which is what a
/// server's error names: stderr, the summary, the checkpoint, status and a
/// dry run.
#[tokio::test(flavor = "multi_thread")]
async fn a_bearer_token_a_server_names_alone_is_never_shown() {
    let s = Scenario::new("bearer").numbers(3);
    let url = names_the_token().await;
    let args = ["--limit", "none", "--url", &url, "--json-body"];
    let in_var = finish({
        let mut c = s.cmd(&[&args[..], &["--api-key-header", "Authorization"]].concat());
        c.env("BATCHRUN_API_KEY", format!("Bearer {KEY}"));
        c
    });
    assert_eq!(in_var.code, 1, "{}", in_var.stderr);
    assert!(
        in_var.stderr.contains("Incorrect API key provided: ***"),
        "{}",
        in_var.stderr
    );
    let bearer = format!("Authorization: Bearer {KEY}");
    let with_h = [&args[..], &["-H", &bearer]].concat();
    let other_key = |mut c: std::process::Command| {
        c.env("BATCHRUN_API_KEY", "another-key-1234");
        finish(c)
    };
    let in_header = other_key(s.cmd(&with_h));
    assert_eq!(in_header.code, 1, "{}", in_header.stderr);
    assert!(
        in_header.stderr.contains("provided: ***"),
        "{}",
        in_header.stderr
    );
    let dry = other_key(s.cmd(&[&with_h[..], &["--dry-run", "1"]].concat()));
    assert_eq!(dry.code, 0, "{}", dry.stderr);
    let shown_dry = format!("{}{}", dry.stderr, dry.summary);
    assert!(shown_dry.contains("Bearer ***"), "{shown_dry}");
    let status = s.tool("status").output().unwrap();
    let shown = String::from_utf8_lossy(&status.stdout);
    assert!(shown.contains("Authorization: Bearer ***"), "{shown}");
    for out in [&in_var, &in_header, &dry] {
        assert!(!out.stderr.contains(KEY), "{}", out.stderr);
        assert!(!out.summary.to_string().contains(KEY), "{}", out.summary);
    }
    assert!(!shown.contains(KEY), "{shown}");
    assert_key_absent_from_files(s.dir().path());
}
