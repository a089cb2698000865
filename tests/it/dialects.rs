//! Every header dialect, and several limits at once, end to end: the real
//! binary against a `batchrun sim` stating its limits in each dialect.

use crate::common::*;

/// Told three times what the server allows (60/1s against 20/1s), with the
/// server stating its limit in `dialect`: only the calls sent before the
/// first response came back may be refused, so at most `-c` 429s, and the
/// operator hears the server's limit once.
async fn follows_the_limit_stated_in(dialect: &str, said: &str) {
    let s = Scenario::new(&format!("dialect-{dialect}"))
        .with_sim(&["--limit", "20/1s", "--cooldown", "0s", "--dialect", dialect])
        .numbers(60);
    let r = s.run(&["--limit", "60/1s", "--concurrency", "3"]);
    assert_eq!(r.code, 0, "{dialect}: {}", r.stderr);
    let limited = r.summary["rate_limited"].as_u64().unwrap();
    assert!(limited <= 3, "{dialect}: {limited} 429s: {}", r.stderr);
    let stats = s.sim().stats().await;
    assert!(
        stats["rejected_rate"].as_u64().unwrap() <= 3,
        "{dialect}: {stats}"
    );
    assert_eq!(
        r.stderr.matches(said).count(),
        1,
        "{dialect}: the limit is said once: {}",
        r.stderr
    );
    assert!(!r.stderr.contains("learnt"), "{dialect}: {}", r.stderr);
    assert_each_item_once(&s.out_path(), 60);
    assert_side_effects(&stats, 60);
}

const STATED: &str = "the server announces a limit";
const REPORTED: &str = "the server reports a limit of 20";

#[tokio::test(flavor = "multi_thread")]
async fn the_ietf_policy_fields_are_followed_from_the_first_response() {
    follows_the_limit_stated_in("ietf", STATED).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_older_ietf_fields_are_followed_from_the_first_response() {
    follows_the_limit_stated_in("ietf-old", STATED).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn x_ratelimit_headers_are_followed_from_the_first_response() {
    follows_the_limit_stated_in("x-ratelimit", REPORTED).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn github_headers_with_an_epoch_reset_are_followed_from_the_first_response() {
    follows_the_limit_stated_in("github", REPORTED).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn openai_headers_are_followed_from_the_first_response() {
    follows_the_limit_stated_in("openai", REPORTED).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn anthropic_headers_are_followed_from_the_first_response() {
    follows_the_limit_stated_in("anthropic", REPORTED).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn batchruns_own_headers_are_still_followed_from_the_first_response() {
    follows_the_limit_stated_in("batchrun", REPORTED).await;
}

/// Two limits at once, both known to the client: not one 429.
async fn keeps_two_limits(dialect: &str) {
    let s = Scenario::new(&format!("two-limits-{dialect}"))
        .with_sim(&[
            "--limit",
            "30/3s",
            "--limit",
            "20/1s",
            "--cooldown",
            "0s",
            "--dialect",
            dialect,
        ])
        .numbers(45);
    let r = s.run(&["--limit", "20/1s", "--limit", "30/3s", "--concurrency", "5"]);
    assert_eq!(r.code, 0, "{dialect}: {}", r.stderr);
    assert_eq!(r.summary["rate_limited"], 0, "{dialect}: {}", r.stderr);
    let stats = s.sim().stats().await;
    assert_eq!(stats["rejected_rate"], 0, "{dialect}: {stats}");
    assert!(
        r.stderr.contains("limit 30/3s (--limit, with 20ps too"),
        "{dialect}: {}",
        r.stderr
    );
    assert_each_item_once(&s.out_path(), 45);
    assert_side_effects(&stats, 45);
}

#[tokio::test(flavor = "multi_thread")]
async fn two_limits_are_both_kept_with_no_429() {
    keeps_two_limits("batchrun").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn two_limits_stated_as_ietf_policies_are_both_kept_with_no_429() {
    keeps_two_limits("ietf").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn two_limits_stated_one_at_a_time_without_a_window_are_both_kept_with_no_429() {
    // X-RateLimit-* names the limit with the least left, and no window:
    // each is read against the nearest configured limit.
    keeps_two_limits("x-ratelimit").await;
}

/// Runs the client with `extra` against nothing: it must refuse to start.
fn refused(tag: &str, extra: &[&str]) -> String {
    let dir = TempDir::new(tag);
    let input = numbers(&dir, "items.jsonl", 1);
    let out = bin()
        .arg(&input)
        .args(["--limit", "10/1s", "--limit", "100/1m"])
        .args(extra)
        .args(["--url", "http://127.0.0.1:9/v1/x"])
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .env("BATCHRUN_API_KEY", KEY)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{tag}");
    assert!(!dir.path().join("state").exists() || out.stdout.is_empty());
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn several_limits_are_refused_where_they_cannot_be_kept() {
    let e = refused("limits-bucket", &["--pacer", "bucket"]);
    assert!(e.contains("window pacer only"), "{e}");
    let e = refused("limits-none", &["--limit", "none"]);
    assert!(e.contains("--limit none cannot be combined"), "{e}");
}

/// nginx's `limit_req` as installed refuses with a 503 and its own page,
/// no `Retry-After` and nothing stated (the sim's `nginx` dialect, a
/// bucket of 20 a second with no burst). Told three times that, every
/// refusal is a rate limit: the workers pause and the bucket is learnt,
/// no refusal is spent as an item's attempt, and nothing fails. Taken for
/// passing failures, 195 refusals in 120 calls failed 5 items (exit 3).
#[tokio::test(flavor = "multi_thread")]
async fn nginx_refusing_with_its_503_page_is_paced_as_a_rate_limit() {
    let s = Scenario::new("dialect-nginx")
        .with_sim(&[
            "--limit",
            "20/1s,burst=0",
            "--cooldown",
            "0s",
            "--dialect",
            "nginx",
        ])
        .numbers(40);
    let r = s.run(&["--limit", "60/1s", "--concurrency", "5"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.summary["failed"], 0, "{}", r.summary);
    let limited = r.summary["rate_limited"].as_u64().unwrap();
    assert!(limited >= 1, "the first burst is refused: {}", r.summary);
    assert_eq!(r.summary["retries"], 0, "{}", r.summary);
    let counts = &r.summary["status_counts"];
    assert_eq!(counts["503"].as_u64(), Some(limited), "{}", r.summary);
    assert!(
        r.stderr
            .contains("(the server said: 503 Service Temporarily Unavailable)"),
        "{}",
        r.stderr
    );
    let stats = s.sim().stats().await;
    assert_each_item_once(&s.out_path(), 40);
    assert_side_effects(&stats, 40);
}
