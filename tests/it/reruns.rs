//! The everyday reruns (issue 20): a rehearsal that never leaves the
//! machine, one item's refusal that fails only that item, a breaker for a
//! silent server, and the small things a rerun shows.

use crate::common::*;

/// `--sim` with `BATCHRUN_URL` and `BATCHRUN_API_KEY` exported (as a shell
/// set up for the real runs has them): every call goes to the built-in sim,
/// the exported server gets nothing, and the start line says it is a
/// rehearsal.
#[tokio::test(flavor = "multi_thread")]
async fn a_rehearsal_sends_nothing_to_an_exported_url() {
    let s = Scenario::new("rehearsal")
        .with_sim(&["--echo-key"])
        .numbers(20);
    let real = format!("{}/v1/echo?n={{n}}", s.sim().url);
    let out = bin()
        .arg(s.input_path())
        .args(["--sim", "--limit", "600/1s", "--json"])
        .arg("--state-dir")
        .arg(s.state_dir())
        .env("BATCHRUN_URL", &real)
        .env("BATCHRUN_API_KEY", KEY)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("rehearsal on the built-in sim"), "{stderr}");
    let stats = s.sim().stats().await;
    assert_eq!(
        stats["requests"], 0,
        "the exported server was called: {stats}"
    );
    let results = jsonl(&s.out_path());
    assert_eq!(results.len(), 20);
    // The built-in sim answered (its echo carries the path it was asked).
    assert_eq!(results[0]["body"]["endpoint"], "echo", "{}", results[0]);
    assert_key_absent_from_files(s.dir().path());
}

/// One item the key may not touch (403) among items that go through: that
/// item fails, with its status and the server's words, and the job
/// finishes; every other item ran once.
#[tokio::test(flavor = "multi_thread")]
async fn one_items_refusal_fails_that_item_and_the_run_goes_on() {
    let s = Scenario::new("refused")
        .with_sim(&["--limit", "600/1s", "--refuse", "n=7"])
        .numbers(20);
    let r = s.run(&["--limit", "600/1s", "--concurrency", "3"]);
    assert_eq!(r.code, 3, "{}", r.stderr);
    assert_eq!(r.summary["state"], "done", "{}", r.stderr);
    assert_eq!(
        (r.summary["done"].as_u64(), r.summary["failed"].as_u64()),
        (Some(19), Some(1))
    );
    assert_eq!(
        r.summary["alerts"].as_array().map(Vec::len),
        Some(0),
        "{}",
        r.summary
    );
    let failures = jsonl(&s.failures_path());
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert_eq!(failures[0]["line"], 7);
    assert_eq!(failures[0]["status"], 403);
    let reason = failures[0]["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("\"this key may not access this resource\""),
        "{reason}"
    );
    let stats = s.sim().stats().await;
    assert_side_effects(&stats, 19);
    assert_eq!(stats["rejected_refused"], 1, "{stats}");
    let mut done = lines_of(&s.out_path());
    done.sort_unstable();
    assert_eq!(done, (1..=20).filter(|l| *l != 7).collect::<Vec<_>>());
}

/// A refusal before any call got through is the key's: the run stops
/// (exit 1) with nothing marked failed, and says which line got it and what
/// the server said.
#[tokio::test(flavor = "multi_thread")]
async fn a_refusal_before_any_success_stops_the_run_naming_line_and_words() {
    let s = Scenario::new("refused-first")
        .with_sim(&["--limit", "600/1s", "--refuse", "n=1:401"])
        .numbers(5);
    let r = s.run(&["--limit", "600/1s", "--concurrency", "1"]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert_eq!(r.summary["failed"], 0);
    assert!(
        r.stderr.contains("rejected the key (HTTP 401 for line 1"),
        "{}",
        r.stderr
    );
    assert!(
        r.stderr
            .contains("\"this key is not valid for this resource\""),
        "{}",
        r.stderr
    );
    assert_side_effects(&s.sim().stats().await, 0);
}

/// A 503 that used up the attempts is in the failures file with its status.
#[tokio::test(flavor = "multi_thread")]
async fn a_failure_after_503s_records_its_status() {
    let s = Scenario::new("status-503")
        .with_sim(&["--limit", "600/1s", "--fail-rate", "1.0"])
        .numbers(3);
    let r = s.run(&["--limit", "600/1s", "--max-attempts", "1"]);
    assert_eq!(r.code, 3, "{}", r.stderr);
    let failures = jsonl(&s.failures_path());
    assert_eq!(failures.len(), 3, "{failures:?}");
    for f in &failures {
        assert_eq!(f["status"], 503, "{f}");
    }
    assert_side_effects(&s.sim().stats().await, 0);
}
