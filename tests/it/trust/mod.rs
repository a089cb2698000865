//! Never run a call twice, never lose a record: the rarer faults.

mod key;

use std::io::Write;
use std::process::Stdio;

use crate::common::*;

#[tokio::test(flavor = "multi_thread")]
async fn a_timed_out_call_is_retried_under_its_key_and_runs_once() {
    // Every call takes 1.2 s at the server; the client gives up after 0.4 s,
    // so each item's retry meets a 409 (its key still executing) with a
    // Retry-After, then the stored response. Nothing runs twice.
    let s = Scenario::new("timeout-409")
        .with_sim(&["--limit", "none", "--latency", "1200ms", "--keep-working"])
        .numbers(6);
    let r = s.run(&[
        "--limit",
        "none",
        "--timeout",
        "400ms",
        "--max-attempts",
        "10",
    ]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_each_item_once(&s.out_path(), 6);
    let st = s.sim().stats().await;
    assert_side_effects(&st, 6);
    assert!(r.summary["retries"].as_u64().unwrap() >= 6, "{}", r.summary);
}

#[test]
fn a_server_that_only_rate_limits_halts_resumably_after_max_wait() {
    let s = Scenario::new("max-wait")
        .with_sim(&["--rate-limit-forever"])
        .numbers(5);
    let r = s.run(&["--limit", "100/1s", "--max-wait", "3s"]);
    assert_eq!(r.code, 75, "{}", r.stderr);
    assert_eq!(r.summary["state"], "halted");
    let why = r.summary["halt_reason"].as_str().unwrap();
    assert!(why.contains("nothing but rate limits"), "{why}");
    assert_eq!(r.summary["failed"], 0);
    assert_eq!(r.summary["pending"], 5);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pipe_is_spooled_once_and_the_same_content_resumes_its_job() {
    let s = Scenario::new("pipe").with_sim(&["--limit", "none"]);
    let items: String = (1..=8).map(|n| format!("{{\"n\": {n}}}\n")).collect();
    let out = s.dir().path().join("piped.results.jsonl");
    // Both outputs in the test's own directory: a pipe's defaults are the
    // working directory's, here the crate's.
    let first = piped(&s, &items, &out, &[]);
    assert_eq!(first.code, 0, "{}", first.summary);
    assert_each_item_once(&out, 8);
    let again = piped(&s, &items, &out, &[]);
    assert_eq!(again.code, 0);
    assert_eq!(
        again.summary["requests"], 0,
        "the same content resumes: {}",
        again.summary
    );
    assert_side_effects(&s.sim().stats().await, 8);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lost_checkpoint_sends_the_same_keys_and_runs_nothing_twice() {
    let s = Scenario::new("lost-ckpt")
        .with_sim(&["--limit", "none"])
        .numbers(20);
    let first = s.run(&["--limit", "none"]);
    assert_eq!(first.code, 0, "{}", first.stderr);
    std::fs::remove_dir_all(s.state_dir()).unwrap();
    let again = s.run(&["--limit", "none"]);
    assert_eq!(again.code, 0, "{}", again.stderr);
    assert!(
        again.stderr.contains("knows nothing of this job"),
        "said before sending: {}",
        again.stderr
    );
    assert_each_item_once(&s.out_path(), 20);
    let stats = s.sim().stats().await;
    assert_side_effects(&stats, 20);
    assert_eq!(stats["idempotent_replays"], 20, "{stats}");
}

#[tokio::test(flavor = "multi_thread")]
async fn fresh_really_runs_the_items_again() {
    let s = Scenario::new("fresh-epoch")
        .with_sim(&["--limit", "none"])
        .numbers(5);
    assert_eq!(s.run(&["--limit", "none"]).code, 0);
    assert_eq!(s.run(&["--limit", "none", "--fresh"]).code, 0);
    assert_side_effects(&s.sim().stats().await, 10);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_huge_body_is_kept_cut_and_marked() {
    let s = Scenario::new("big-body")
        .with_sim(&["--limit", "none"])
        .input("items.jsonl", "{\"n\": 1}\n{\"n\": 2}\n");
    let url = format!("{}/v1/big?bytes=5000000&n={{n}}", s.sim().url);
    let r = s.run(&["--limit", "none", "--url", &url, "--max-body", "64KiB"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let out = jsonl(&s.out_path());
    assert_eq!(out.len(), 2);
    for line in &out {
        assert_eq!(
            line["body"]["batchrun_truncated"], true,
            "{}",
            line["status"]
        );
        assert_eq!(line["body"]["bytes_kept"], 65536);
    }
    let disk: u64 = std::fs::read_dir(s.state_dir().join("checkpoint"))
        .unwrap()
        .flatten()
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.len())
        .sum();
    assert!(disk < 2_000_000, "the checkpoint holds {disk} bytes");
}

#[tokio::test(flavor = "multi_thread")]
async fn outputs_that_differ_only_by_extension_do_not_collide() {
    let s = Scenario::new("tmp-names")
        .with_sim(&["--limit", "none"])
        .numbers(6);
    let (a, b) = (s.dir().path().join("x.a"), s.dir().path().join("x.b"));
    let bad = format!("{}/v2/missing?n={{n}}", s.sim().url);
    // Items 1-3 succeed, 4-6 fail: both files get lines.
    let items = "{\"n\": 1}\n{\"n\": 2}\n{\"n\": 3}\n";
    let input = s.dir().write("mixed.jsonl", items);
    let ok = s.run_for(
        &input,
        &[
            "--limit",
            "none",
            "--out",
            a.to_str().unwrap(),
            "--failures",
            b.to_str().unwrap(),
        ],
    );
    assert_eq!(ok.code, 0, "{}", ok.stderr);
    let fail = s.run_for(
        &input,
        &[
            "--limit",
            "none",
            "--url",
            &bad,
            "--fail-fast",
            "0",
            "--out",
            s.dir().path().join("y.a").to_str().unwrap(),
            "--failures",
            s.dir().path().join("y.b").to_str().unwrap(),
        ],
    );
    assert_eq!(fail.code, 3, "{}", fail.stderr);
    assert_eq!(jsonl(&a).len(), 3);
    assert!(jsonl(&b).is_empty());
    assert!(jsonl(&s.dir().path().join("y.a")).is_empty());
    assert_eq!(jsonl(&s.dir().path().join("y.b")).len(), 3);
    let leftovers: Vec<_> = std::fs::read_dir(s.dir().path())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_checkpoint_that_cannot_be_written_stops_the_pool_at_once() {
    const N: u64 = 600;
    const WORKERS: u64 = 8;
    let s = Scenario::new("disk-full")
        .with_sim(&["--limit", "none", "--latency", "20ms"])
        .numbers(N);
    let workers = WORKERS.to_string();
    let mut c = s.cmd(&["--limit", "none", "--concurrency", &workers]);
    // A file size limit stands in for a full disk: past 30 kB, every write
    // of the checkpoint fails, as it would with no space left.
    with_limit(&mut c, libc::RLIMIT_FSIZE, 30_000, 30_000);
    let r = finish(c);
    assert_eq!(r.code, 75, "halted resumably: {}", r.stderr);
    assert_eq!(r.summary["state"], "halted");
    let why = r.summary["halt_reason"].as_str().unwrap();
    assert!(why.contains("could not be written"), "{why}");
    assert!(
        !why.contains("Os {"),
        "the system's words, not a dump: {why}"
    );
    assert_eq!(r.summary["failed"], 0);
    let recorded = r.summary["done"].as_u64().unwrap();
    let st = s.sim().stats().await;
    let ran = st["side_effects"].as_u64().unwrap();
    assert!(ran < N, "the pool kept sending: {st}");
    // What ran but was not recorded: the calls in flight and about one
    // group, not the rest of the input.
    assert!(
        ran <= recorded + 3 * WORKERS,
        "{ran} calls ran, {recorded} recorded"
    );
    // Room again. Calls ran unrecorded: a changed request (with
    // --keep-done) would send their items under other keys, so it is
    // refused, as after a kill; the same command finishes, and nothing ran
    // twice.
    let changed = ["--limit", "none", "-H", "X-Run: 2", "--keep-done"];
    let refused = s.run(&changed);
    assert_eq!(refused.code, 2, "{}", refused.stderr);
    assert_side_effects(&s.sim().stats().await, ran);
    let again = s.run(&["--limit", "none", "--concurrency", &workers]);
    assert_eq!(again.code, 0, "{}", again.stderr);
    assert_each_item_once(&s.out_path(), N);
    assert_side_effects(&s.sim().stats().await, N);
}

#[tokio::test(flavor = "multi_thread")]
async fn retry_failed_keeps_the_key_of_a_call_whose_outcome_is_unknown() {
    let (s, _) = failed_unknown("unknown-outcome", 4);
    let failures = jsonl(&s.failures_path());
    assert_eq!(failures.len(), 4);
    for f in &failures {
        assert_eq!(f["outcome_unknown"], true, "{f}");
        assert!(f["reason"].as_str().unwrap().starts_with("outcome unknown"));
    }
    wait_for_stats(s.sim(), 10, |st| st["side_effects"] == 4).await;
    let again = s.run(&["--limit", "none", "--timeout", "5s", "--retry-failed"]);
    assert_eq!(again.code, 0, "{}", again.stderr);
    assert_each_item_once(&s.out_path(), 4);
    let st = s.sim().stats().await;
    assert_side_effects(&st, 4);
    assert_eq!(
        st["idempotent_replays"], 4,
        "the server answered from its record: {st}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn outputs_that_cannot_be_written_halt_resumably_and_leave_nothing_behind() {
    // Each output line carries its 1 KB input: the outputs outgrow a 64 kB
    // file size limit long before the checkpoint does.
    const N: u64 = 100;
    let pad = "x".repeat(1000);
    let items: String = (1..=N)
        .map(|n| format!("{{\"n\": {n}, \"pad\": \"{pad}\"}}\n"))
        .collect();
    let s = Scenario::new("outputs-full")
        .with_sim(&["--limit", "none"])
        .input("items.jsonl", &items);
    let mut c = s.cmd(&["--limit", "none"]);
    with_limit(&mut c, libc::RLIMIT_FSIZE, 64_000, 64_000);
    let r = finish(c);
    assert_eq!(r.code, 75, "{}", r.stderr);
    let why = r.summary["halt_reason"].as_str().unwrap_or_default();
    assert!(
        why.contains("outputs could not be written"),
        "{}",
        r.summary
    );
    assert_eq!(r.summary["done"], N, "every call is recorded");
    let leftovers: Vec<_> = std::fs::read_dir(s.dir().path())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");
    // Room again: the outputs are written and nothing is sent.
    let again = s.run(&["--limit", "none"]);
    assert_eq!(again.code, 0, "{}", again.stderr);
    assert_eq!(again.summary["requests"], 0, "{}", again.summary);
    assert_each_item_once(&s.out_path(), N);
}

#[tokio::test(flavor = "multi_thread")]
async fn fresh_warns_before_resending_calls_that_may_have_run() {
    let (s, _) = failed_unknown("fresh-unknown", 2);
    let fresh = s.run(&["--limit", "none", "--timeout", "5s", "--fresh"]);
    assert_eq!(fresh.code, 0, "{}", fresh.stderr);
    assert!(
        fresh
            .stderr
            .contains("2 item(s) failed with their outcome unknown"),
        "{}",
        fresh.stderr
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pool_larger_than_the_open_file_limit_is_raised_to_fit_or_refused() {
    const N: u64 = 400;
    let s = Scenario::new("nofile")
        .with_sim(&[
            "--limit",
            "none",
            "--latency",
            "50ms",
            "--concurrency",
            "1000",
        ])
        .numbers(N);
    let args = ["--limit", "none", "--concurrency", "200"];
    // A soft limit of 64 under a roomy hard one: raised, and every item
    // done (200 connections would not fit in 64 handles).
    let mut c = s.cmd(&args);
    with_limit(&mut c, libc::RLIMIT_NOFILE, 64, 4096);
    let r = finish(c);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.summary["failed"], 0, "{}", r.summary);
    assert_each_item_once(&s.out_path(), N);
    // A hard limit the pool cannot fit in: refused before any call.
    let before = s.sim().stats().await["requests"].as_u64().unwrap();
    let mut c = s.cmd(&["--limit", "none", "--concurrency", "200", "--fresh"]);
    with_limit(&mut c, libc::RLIMIT_NOFILE, 100, 100);
    let r = finish(c);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("hard limit"), "{}", r.stderr);
    assert_eq!(s.sim().stats().await["requests"].as_u64().unwrap(), before);
}

/// A server whose first call under a key runs (slowly) and whose every
/// later call under that key answers 503: its URL template, and each key
/// it saw with how often.
async fn slow_then_busy() -> (
    String,
    std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, u32>>>,
) {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};
    let runs = Arc::new(Mutex::new(HashMap::<String, u32>::new()));
    let seen = runs.clone();
    let app = axum::Router::new().fallback(move |req: axum::extract::Request| {
        let seen = seen.clone();
        async move {
            let key = req
                .headers()
                .get("idempotency-key")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string();
            let first = {
                let mut m = seen.lock().unwrap();
                let n = m.entry(key).or_insert(0);
                *n += 1;
                *n == 1
            };
            if first {
                tokio::time::sleep(std::time::Duration::from_millis(600)).await;
                (axum::http::StatusCode::OK, "{\"ran\":true}")
            } else {
                (axum::http::StatusCode::SERVICE_UNAVAILABLE, "busy")
            }
        }
    });
    (format!("http://{}/v1/x?n={{n}}", serve(app).await), runs)
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unknown_outcome_survives_a_later_run_that_gets_only_errors() {
    let (url, runs) = slow_then_busy().await;
    let s = Scenario::new("unknown-sticky").numbers(2);
    let run = |extra: &[&str]| {
        let mut args = vec!["--url", url.as_str(), "--limit", "none", "--fail-fast", "0"];
        args.extend_from_slice(extra);
        s.run(&args)
    };
    // 1. The call times out here but runs there: unknown.
    let first = run(&["--timeout", "300ms", "--max-attempts", "1"]);
    assert_eq!(first.code, 3, "{}", first.stderr);
    // 2. Sent again under its key, it meets only 503s: still unknown.
    let second = run(&["--retry-failed", "--max-attempts", "2"]);
    assert_eq!(second.code, 3, "{}", second.stderr);
    for f in jsonl(&s.failures_path()) {
        assert_eq!(f["outcome_unknown"], true, "{f}");
    }
    // 3. So a third try keeps the key too: each item ran once, under one key.
    let third = run(&["--retry-failed", "--max-attempts", "1"]);
    assert_eq!(third.code, 3, "{}", third.stderr);
    // 4. Even with the checkpoint lost: the failures file says so.
    std::fs::remove_dir_all(s.state_dir()).unwrap();
    let fourth = run(&["--max-attempts", "1"]);
    assert_eq!(fourth.code, 3, "{}", fourth.stderr);
    for f in jsonl(&s.failures_path()) {
        assert_eq!(f["outcome_unknown"], true, "{f}");
    }
    let fifth = run(&["--retry-failed", "--max-attempts", "1"]);
    assert_eq!(fifth.code, 3, "{}", fifth.stderr);
    let runs = runs.lock().unwrap();
    assert_eq!(runs.len(), 2, "one key per item: {runs:?}");
    assert!(runs.values().all(|&n| n >= 4), "{runs:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_item_that_differs_only_in_a_header_is_another_call() {
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};
    // An idempotent API that answers with the x-n header it was sent, and
    // replays that answer for a key it has seen; it counts the calls, and
    // notes one carrying edited content.
    let stored = Arc::new(Mutex::new(HashMap::<String, String>::new()));
    let calls = Arc::new(AtomicUsize::new(0));
    let edited = Arc::new(AtomicBool::new(false));
    let (seen_calls, seen_edited) = (calls.clone(), edited.clone());
    let app = axum::Router::new().fallback(move |req: axum::extract::Request| {
        let stored = stored.clone();
        let h = |name: &str| {
            req.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string()
        };
        let (n, key) = (h("x-n"), h("idempotency-key"));
        seen_calls.fetch_add(1, Ordering::SeqCst);
        if n.starts_with('9') {
            seen_edited.store(true, Ordering::SeqCst);
        }
        let body = stored
            .lock()
            .unwrap()
            .entry(key)
            .or_insert_with(|| format!("{{\"n\":\"{n}\"}}"))
            .clone();
        async move {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            body
        }
    });
    let url = format!("http://{}/v1/x", serve(app).await);

    // Lines of about 1 KB, so most of the file is read after the edit.
    const N: usize = 200;
    let pad = "x".repeat(1000);
    let text = |first: char| -> String {
        (1..=N)
            .map(|n| format!("{{\"n\":\"{first}{n:03}\",\"pad\":\"{pad}\"}}\n"))
            .collect()
    };
    let original = text('0');
    let s = Scenario::new("header-only").input("items.jsonl", &original);
    let input = s.input_path().to_path_buf();
    let args = [
        "--url",
        url.as_str(),
        "--header",
        "X-N: {n}",
        "--limit",
        "none",
        "--concurrency",
        "2",
    ];
    let child = s
        .cmd(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Once a tenth has been called, rewrite the file in place; once a line
    // has gone out with the other content, put it back.
    let out = s.out_path();
    wait_until(20, "a tenth called", || calls.load(Ordering::SeqCst) >= 20).await;
    let rewrite = |t: &str| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(&input)
            .unwrap();
        f.write_all(t.as_bytes()).unwrap();
    };
    rewrite(&text('9'));
    wait_until(20, "an edited line sent", || edited.load(Ordering::SeqCst)).await;
    rewrite(&original);
    let first = child.wait_with_output().unwrap();
    assert_ne!(first.status.code(), Some(0), "some lines went out edited");
    let mut last = s.run(&args);
    for _ in 0..3 {
        if last.code == 0 {
            break;
        }
        last = s.run(&args);
    }
    assert_eq!(last.code, 0, "{}", last.stderr);
    let lines = jsonl(&out);
    assert_eq!(lines.len(), N);
    for line in &lines {
        assert_eq!(
            line["body"]["n"], line["input"]["n"],
            "line {} paired with another content's result",
            line["line"]
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lost_checkpoint_after_fresh_resends_the_keys_of_the_fresh_epoch() {
    let s = Scenario::new("lost-after-fresh")
        .with_sim(&["--limit", "none"])
        .numbers(12);
    let args = ["--limit", "none"];
    assert_eq!(s.run(&args).code, 0);
    // Eight more lines, and then everything again under new keys.
    s.append_numbers(13..=20);
    let fresh = s.run(&["--limit", "none", "--fresh"]);
    assert_eq!(fresh.code, 0, "{}", fresh.stderr);
    assert_side_effects(&s.sim().stats().await, 32);
    for line in jsonl(&s.out_path()) {
        assert_eq!(
            line["epoch"], 1,
            "the key's epoch beside the result: {line}"
        );
    }
    // The checkpoint is lost: the keys come back from the results, and the
    // API replays all twenty instead of running the eight new lines again
    // under their first epoch's keys.
    std::fs::remove_dir_all(s.state_dir()).unwrap();
    let again = s.run(&args);
    assert_eq!(again.code, 0, "{}", again.stderr);
    assert_each_item_once(&s.out_path(), 20);
    assert_side_effects(&s.sim().stats().await, 32);
}

/// `c` with one of its resource limits set to `soft` (and `hard`) before it
/// runs: a file size limit stands in for a full disk, an open-file limit
/// for a crowded machine.
fn with_limit(
    c: &mut std::process::Command,
    resource: libc::__rlimit_resource_t,
    soft: u64,
    hard: u64,
) {
    use std::os::unix::process::CommandExt as _;
    // SAFETY: setrlimit is async-signal-safe and touches only the child.
    unsafe {
        c.pre_exec(move || {
            let lim = libc::rlimit {
                rlim_cur: soft as libc::rlim_t,
                rlim_max: hard as libc::rlim_t,
            };
            if libc::setrlimit(resource, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_kill_during_fresh_then_a_lost_checkpoint_runs_nothing_twice() {
    let s = Scenario::new("kill-in-fresh")
        .with_sim(&["--limit", "none", "--latency", "100ms"])
        .numbers(12);
    let args = ["--limit", "none", "--concurrency", "2"];
    assert_eq!(s.run(&args).code, 0);
    s.append_numbers(13..=20);
    // --fresh, killed part way: its outputs were never written, so only
    // what it saved before its first call knows its epoch.
    let fresh = ["--limit", "none", "--concurrency", "2", "--fresh"];
    act_when(
        s.cmd(&fresh),
        s.sim(),
        |st| st["side_effects"].as_u64() >= Some(18),
        |pid| {
            // SAFETY: killing our own child process.
            unsafe {
                libc::kill(pid as i32, libc::SIGKILL);
            }
        },
    )
    .await;
    std::fs::remove_dir_all(s.state_dir()).unwrap();
    let again = s.run(&args);
    assert_eq!(again.code, 0, "{}", again.stderr);
    assert_each_item_once(&s.out_path(), 20);
    // Twelve in the first epoch, then each of the twenty once in the
    // second: the calls made before the kill were replayed, not rerun.
    assert_side_effects(&s.sim().stats().await, 32);
}

/// `n` items whose calls all run at the server but fail here as of unknown
/// outcome: every call takes 1 s there, the sim keeps working after the
/// client gives up at 0.3 s, and one attempt is allowed.
fn failed_unknown(tag: &str, n: u64) -> (Scenario, Finished) {
    let s = Scenario::new(tag)
        .with_sim(&["--limit", "none", "--latency", "1s", "--keep-working"])
        .numbers(n);
    let r = s.run(&[
        "--limit",
        "none",
        "--timeout",
        "300ms",
        "--max-attempts",
        "1",
    ]);
    assert_eq!(r.code, 3, "{}", r.stderr);
    (s, r)
}
