//! The run, end to end: the real binary against a real `batchrun sim`.

use std::process::Stdio;

use crate::common::*;

#[tokio::test(flavor = "multi_thread")]
async fn clean_run_never_trips_the_limit_and_writes_every_item_in_order() {
    let s = Scenario::new("clean")
        .with_sim(&[
            "--limit",
            "120/4s",
            "--concurrency",
            "5",
            "--cooldown",
            "1s",
        ])
        .numbers(120);
    let args = ["--limit", "120/4s", "--concurrency", "5"];
    let r = s.run(&args);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.summary["state"], "done");
    assert_eq!(r.summary["done"], 120);
    assert_eq!(r.summary["rate_limited"], 0);
    assert_eq!(r.summary["exit_code"], 0);

    let stats = s.sim().stats().await;
    assert_eq!(stats["rejected_rate"], 0, "{stats}");
    assert_eq!(stats["rejected_cooldown"], 0, "{stats}");
    assert_eq!(stats["rejected_concurrency"], 0, "{stats}");
    assert_side_effects(&stats, 120);

    let out = s.out_path();
    assert_each_item_once(&out, 120);
    let first = &jsonl(&out)[0];
    assert_eq!(first["input"]["n"], 1);
    assert_eq!(first["status"], 200);
    assert_eq!(first["body"]["status"], "ok");
    assert!(jsonl(&s.failures_path()).is_empty());
    assert_key_absent_from_files(s.dir().path());

    // The same command again resends nothing.
    let again = s.run(&args);
    assert_eq!(again.code, 0, "{}", again.stderr);
    assert_eq!(again.summary["requests"], 0);
    assert_side_effects(&s.sim().stats().await, 120);
    assert_each_item_once(&out, 120);
}

#[tokio::test(flavor = "multi_thread")]
async fn overdriven_run_sees_429s_pauses_and_still_does_every_item_once() {
    let s = Scenario::new("overdriven")
        .with_sim(&[
            "--limit",
            "20/1s",
            "--concurrency",
            "10",
            "--cooldown",
            "1s",
        ])
        .numbers(60);
    // Live traffic on the same key has just filled the window.
    let client = reqwest::Client::new();
    for i in 0..20 {
        let r = client
            .get(format!("{}/v1/echo?live={i}", s.sim().url))
            .header("x-api-key", KEY)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    let r = s.run(&["--limit", "100/1s", "--concurrency", "5", "--burst", "10"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.summary["rate_limited"].as_u64().unwrap() >= 1,
        "{}",
        r.summary
    );
    assert!(r.stderr.contains("pausing every worker"), "{}", r.stderr);
    assert!(
        r.stderr.contains("--burst applies to --pacer bucket only"),
        "the window pacer says it ignores --burst: {}",
        r.stderr
    );
    assert_eq!(r.summary["done"], 60);
    assert_eq!(r.summary["failed"], 0);
    assert_each_item_once(&s.out_path(), 60);
    // 60 items + 20 live calls, each once.
    assert_side_effects(&s.sim().stats().await, 60 + 20);
}

#[tokio::test(flavor = "multi_thread")]
async fn credit_exhaustion_halts_resumably_and_a_top_up_finishes_the_job() {
    let s = Scenario::new("credits")
        .with_sim(&["--limit", "100/1s", "--credits", "30"])
        .numbers(50);
    let args = ["--limit", "100/1s", "--concurrency", "5"];
    let r = s.run(&args);
    assert_eq!(r.code, 75, "{}", r.stderr);
    assert_eq!(r.summary["state"], "halted");
    assert_eq!(r.summary["done"], 30);
    assert_eq!(
        r.summary["failed"], 0,
        "exhaustion never marks an item failed"
    );
    assert_eq!(r.summary["pending"], 20);
    assert!(r.summary["renewal"].as_u64().is_some());
    assert!(r.stderr.contains("credits exhausted"), "{}", r.stderr);
    assert!(r.stderr.contains("credits renew"), "{}", r.stderr);
    assert_eq!(lines_of(&s.out_path()).len(), 30);
    assert!(jsonl(&s.failures_path()).is_empty());

    s.sim().topup(100).await;
    let r = s.run(&args);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.summary["done"], 50);
    assert_each_item_once(&s.out_path(), 50);
    assert_side_effects(&s.sim().stats().await, 50);
}

#[tokio::test(flavor = "multi_thread")]
async fn kill_9_mid_run_then_resume_does_every_item_exactly_once() {
    let s = Scenario::new("kill9")
        .with_sim(&[
            "--limit",
            "200/1s",
            "--concurrency",
            "5",
            "--latency",
            "5ms..15ms",
            "--cooldown",
            "2s",
        ])
        .numbers(400);
    let sim = s.sim();
    let args = ["--limit", "200/1s", "--concurrency", "5"];
    let mut child = s.spawn_quiet(&args);
    wait_for_stats(sim, 30, |st| st["side_effects"].as_u64().unwrap_or(0) >= 40).await;
    child.kill().unwrap(); // SIGKILL: no chance to flush anything
    child.wait().unwrap();
    let before = sim.stats().await["side_effects"].as_u64().unwrap();
    assert!(before < 400, "the run finished before it could be killed");

    let r = s.run(&args);
    assert_eq!(r.code, 0, "{}", r.stderr);
    // Resumed within the window: it starts with an empty bucket, so its calls
    // and the killed run's never overrun the window together.
    assert_eq!(r.summary["rate_limited"], 0, "{}", r.summary);
    assert_eq!(r.summary["done"], 400);
    assert_each_item_once(&s.out_path(), 400);
    // Replays never repeat a side effect.
    assert_side_effects(&sim.stats().await, 400);
}

#[tokio::test(flavor = "multi_thread")]
async fn ctrl_c_saves_the_checkpoint_exits_130_and_the_rerun_completes() {
    let s = Scenario::new("ctrlc")
        .with_sim(&["--limit", "20/1s", "--concurrency", "2"])
        .numbers(60);
    let args = ["--limit", "20/1s", "--concurrency", "2"];
    let r = s
        .signal_when(
            &args,
            |st| st["side_effects"].as_u64().unwrap_or(0) >= 5,
            libc::SIGINT,
        )
        .await;
    assert_eq!(r.code, 130, "{}", r.stderr);
    let summary = r.summary;
    assert_eq!(summary["state"], "interrupted");
    let done = summary["done"].as_u64().unwrap();
    assert!((5..60).contains(&done), "{summary}");
    assert_eq!(
        lines_of(&s.out_path()).len() as u64,
        done,
        "outputs written at exit"
    );

    let r = s.run(&["--limit", "100/1s", "--concurrency", "2"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_each_item_once(&s.out_path(), 60);
    assert_side_effects(&s.sim().stats().await, 60);
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_input_stops_before_any_request_naming_file_and_line() {
    let s = Scenario::new("badinput").with_sim(&[]);
    let dir = s.dir();
    let bad = dir.write("bad.jsonl", "{\"n\": 1}\n\n{\"n\": 2\n{\"n\": 3}\n");
    let r = s.run_for(&bad, &[]);
    assert_eq!(r.code, 2);
    assert!(r.stderr.contains("bad.jsonl:3:"), "{}", r.stderr);

    let ragged = dir.write("ragged.csv", "n,word\n1,one\n2\n");
    let r = s.run_for(&ragged, &[]);
    assert_eq!(r.code, 2);
    assert!(r.stderr.contains("ragged.csv:3:"), "{}", r.stderr);

    // A field the URL needs but an item lacks is bad input too.
    let missing = dir.write("missing.jsonl", "{\"n\": 1}\n{\"m\": 2}\n");
    let r = s.run_for(&missing, &[]);
    assert_eq!(r.code, 2);
    assert!(r.stderr.contains("missing.jsonl:2:"), "{}", r.stderr);
    assert!(r.stderr.contains("\"n\""), "{}", r.stderr);

    // A URL that is not http(s) is caught in the same pass.
    let good = numbers(dir, "good.jsonl", 3);
    let r = s.run_for(&good, &["--url", "localhost:8080/v1/x?n={n}"]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("good.jsonl:1:"), "{}", r.stderr);
    assert!(r.stderr.contains("not http or https"), "{}", r.stderr);

    let stats = s.sim().stats().await;
    assert_eq!(stats["accepted"], 0, "no request was sent: {stats}");
    assert_side_effects(&stats, 0);

    let empty = dir.write("empty.jsonl", "");
    let r = s.run_for(&empty, &[]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.summary["total"], 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rejected_key_halts_with_exit_1_and_marks_nothing_failed() {
    let s = Scenario::new("auth").with_sim(&[]).numbers(10);
    // The key goes in a header the API does not read: it answers 401.
    let r = s.run(&["--api-key-header", "x-wrong-header", "--limit", "100/1s"]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert_eq!(r.summary["state"], "failed");
    assert_eq!(r.summary["failed"], 0);
    assert_eq!(r.summary["done"], 0);
    assert!(r.stderr.contains("rejected the key"), "{}", r.stderr);
    assert!(r.stderr.contains("BATCHRUN_API_KEY"), "{}", r.stderr);
    assert_key_absent_from_files(s.dir().path());

    // No key at all is a usage error before anything is sent.
    let out = bin()
        .arg(s.input_path())
        .args(["--url", &format!("{}/v1/echo", s.sim().url)])
        .arg("--state-dir")
        .arg(s.state_dir())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("BATCHRUN_API_KEY"));
}

/// A 403 for the first two items of the queue, before any call got
/// through: the items after them tell it from the key's (they go through),
/// and the two are recorded as their own refusals. The second refusal
/// halted the run as a rejected key, on every rerun, the same two items
/// going first each time. Four refused alike, none through, are the key's.
#[tokio::test(flavor = "multi_thread")]
async fn items_a_403_refuses_first_are_their_own_once_the_next_go_through() {
    for c in ["1", "4"] {
        let s = Scenario::new("refused-first")
            .with_sim(&["--limit", "none", "--refuse", "n=1", "--refuse", "n=2"])
            .numbers(20);
        let r = s.run(&["--limit", "none", "-c", c]);
        assert_eq!(r.code, 3, "-c {c}: {}", r.stderr);
        assert_eq!(r.summary["done"], 18, "-c {c}: {}", r.summary);
        assert_eq!(lines_of(&s.failures_path()), [1, 2], "-c {c}");
    }
    let refuse: Vec<String> = (1..=4).map(|n| format!("n={n}")).collect();
    let mut sim = vec!["--limit", "none"];
    sim.extend(refuse.iter().flat_map(|r| ["--refuse", r.as_str()]));
    let s = Scenario::new("refused-all").with_sim(&sim).numbers(4);
    let r = s.run(&["--limit", "none", "-c", "1"]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert_eq!(r.summary["failed"], 0, "{}", r.summary);
    assert!(r.stderr.contains("rejected the key"), "{}", r.stderr);
}

/// A key revoked mid-run: after the first calls got through, every call
/// is a 401. A lone 401 fails its item; three in a row stop the run (exit
/// 1), the rest of the items pending, where every item left was failed.
#[tokio::test(flavor = "multi_thread")]
async fn a_key_revoked_mid_run_stops_the_run_with_the_rest_pending() {
    let items: String = (1..=20)
        .map(|i| {
            let key = if i <= 5 { "good" } else { "revoked" };
            format!("{{\"n\": {i}, \"key\": \"{key}\"}}\n")
        })
        .collect();
    let s = Scenario::new("revoked")
        .with_sim(&["--limit", "none", "--refuse", "key=revoked:401"])
        .input("items.jsonl", &items);
    let url = format!("{}/v1/echo?n={{n}}&key={{key}}", s.sim().url);
    let r = s.run(&["--url", &url, "--limit", "none", "-c", "1"]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert_eq!(r.summary["done"], 5, "{}", r.summary);
    assert_eq!(r.summary["failed"], 2, "the two refused before the third");
    assert_eq!(r.summary["pending"], 13, "{}", r.summary);
    assert!(
        r.stderr
            .contains("calls in a row) after earlier calls got through"),
        "{}",
        r.stderr
    );
    assert!(r.stderr.contains("--retry-failed"), "{}", r.stderr);
}

#[tokio::test(flavor = "multi_thread")]
async fn transient_failures_retry_and_permanent_ones_are_recorded() {
    let mut items = String::new();
    for i in 1..=40 {
        // /v9/... is not an API path: the sim answers 404.
        let ver = if i % 10 == 0 { "v9" } else { "v1" };
        items.push_str(&format!("{{\"n\": {i}, \"ver\": \"{ver}\"}}\n"));
    }
    let s = Scenario::new("faults")
        .with_sim(&["--limit", "500/1s", "--fail-rate", "0.3", "--seed", "7"])
        .input("items.jsonl", &items);
    let url = format!("{}/{{ver}}/echo?n={{n}}", s.sim().url);
    let args = [
        "--url",
        &url,
        "--limit",
        "500/1s",
        "--concurrency",
        "4",
        "--max-attempts",
        "12",
    ];
    let r = s.run(&args);
    assert_eq!(r.code, 3, "some items failed: {}", r.stderr);
    assert_eq!(r.summary["state"], "done");
    assert_eq!(r.summary["done"], 36);
    assert_eq!(r.summary["failed"], 4);
    assert!(r.summary["retries"].as_u64().unwrap() >= 1, "{}", r.summary);
    let failures = jsonl(&s.failures_path());
    assert_eq!(lines_of(&s.failures_path()), [10, 20, 30, 40]);
    assert_eq!(failures[0]["status"], 404);
    assert!(failures[0]["reason"].as_str().unwrap().contains("404"));

    // --retry-failed sends only those again (they fail again: still exit 3).
    let r = s.run(&[&args[..], &["--retry-failed"][..]].concat());
    assert_eq!(r.code, 3, "{}", r.stderr);
    assert_eq!(
        r.summary["requests"], 4,
        "only the failed items are sent again"
    );
    assert_eq!(r.summary["done"], 36);
}

#[tokio::test(flavor = "multi_thread")]
async fn dropped_connections_are_retried_without_repeating_side_effects() {
    let s = Scenario::new("reset")
        .with_sim(&["--limit", "500/1s", "--reset-rate", "0.2", "--seed", "3"])
        .numbers(40);
    let r = s.run(&["--limit", "500/1s", "--max-attempts", "12"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.summary["done"], 40);
    let stats = s.sim().stats().await;
    assert_side_effects(&stats, 40);
    assert!(
        stats["idempotent_replays"].as_u64().unwrap() >= 1,
        "{stats}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_changed_input_resumes_by_content_and_fresh_resends_all() {
    let s = Scenario::new("changed")
        .with_sim(&["--limit", "500/1s"])
        .numbers(5);
    let args = ["--limit", "500/1s"];
    assert_eq!(s.run(&args).code, 0);
    // An old line edited, and one appended: only those two are new.
    let edited: String = (1..=6)
        .map(|i| format!("{{\"n\": {}}}\n", if i == 1 { 100 } else { i }))
        .collect();
    s.dir().write("items.jsonl", &edited);
    let r = s.run(&args);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stderr.contains("changed since its checkpoint"),
        "{}",
        r.stderr
    );
    assert_eq!(r.summary["requests"], 2, "{}", r.summary);
    assert_eq!(r.summary["done"], 6);
    let r = s.run(&["--limit", "500/1s", "--fresh"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.summary["done"], 6);
    assert_eq!(r.summary["requests"], 6, "--fresh starts over");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_built_in_sim_runs_a_real_job_with_no_key() {
    let src = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/numbers.jsonl"
    ))
    .unwrap();
    let s = Scenario::new("demo").input("numbers.jsonl", &src);
    // Not `s.cmd`: this run has no key and no --url.
    let out = bin()
        .args(["--plan", "starter", "--limit", "600/1s", "--sim", "--json"])
        .arg(s.input_path())
        .arg("--state-dir")
        .arg(s.state_dir())
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["done"], 20);
    let results = jsonl(&s.out_path());
    assert_eq!(results.len(), 20);
    assert_eq!(results[2]["body"]["data"]["word"], "three");
}

#[test]
fn plans_prints_the_derived_bucket() {
    let out = bin().arg("plans").output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>()
                == ["starter", "60/min", "5", "6", "0.897"]),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_from_a_scheduler_is_a_clean_stop_too() {
    let s = Scenario::new("sigterm")
        .with_sim(&["--limit", "10/1s", "--concurrency", "1"])
        .numbers(40);
    let r = s
        .signal_when(
            &["--limit", "10/1s", "--concurrency", "1"],
            |st| st["side_effects"].as_u64().unwrap_or(0) >= 2,
            libc::SIGTERM,
        )
        .await;
    // 128 + SIGTERM, and named as such: a scheduler's log must not say Ctrl-C.
    assert_eq!(r.code, 143, "{}", r.stderr);
    assert!(r.stderr.contains("SIGTERM"), "{}", r.stderr);
    let summary = r.summary;
    assert_eq!(summary["state"], "interrupted");
    assert_eq!(
        lines_of(&s.out_path()).len() as u64,
        summary["done"].as_u64().unwrap()
    );
}

/// A closed terminal or ssh session (SIGHUP) takes the SIGTERM path: the
/// calls in flight finish, the outputs and the summary are written, the
/// exit code says resumable, and the same command then finishes the job
/// with every item executed once.
#[tokio::test(flavor = "multi_thread")]
async fn sighup_from_a_closed_terminal_is_a_clean_stop_and_resumes_exactly() {
    let s = Scenario::new("sighup")
        .with_sim(&["--limit", "10/1s", "--concurrency", "1"])
        .numbers(30);
    let args = ["--limit", "10/1s", "--concurrency", "1"];
    let r = s
        .signal_when(
            &args,
            |st| st["side_effects"].as_u64().unwrap_or(0) >= 2,
            libc::SIGHUP,
        )
        .await;
    assert_eq!(r.code, 129, "{}", r.stderr);
    assert!(r.stderr.contains("SIGHUP"), "{}", r.stderr);
    assert_eq!(r.summary["state"], "interrupted", "{}", r.summary);
    let done = r.summary["done"].as_u64().unwrap();
    assert!(done < 30, "{}", r.summary);
    assert_eq!(lines_of(&s.out_path()).len() as u64, done);
    let again = s.run(&args);
    assert_eq!(again.code, 0, "{}", again.stderr);
    assert_eq!(lines_of(&s.out_path()).len(), 30);
    assert_side_effects(&s.sim().stats().await, 30);
}

#[tokio::test(flavor = "multi_thread")]
async fn calls_abandoned_at_a_stop_are_counted_as_unanswered() {
    // Calls that take longer than the grace after SIGTERM are abandoned:
    // they got nothing back, and the counts still add up to the requests.
    let s = Scenario::new("abandoned")
        .with_sim(&["--limit", "none", "--latency", "20s"])
        .numbers(2);
    let r = s
        .signal_when(
            &["--limit", "none", "--concurrency", "2"],
            |st| st["requests"].as_u64() >= Some(2),
            libc::SIGTERM,
        )
        .await;
    assert_eq!(r.code, 143, "{}", r.stderr);
    assert_eq!(r.summary["requests"], 2, "{}", r.summary);
    assert_eq!(r.summary["status_counts"]["no_answer"], 2, "{}", r.summary);
    assert_eq!(r.summary["pending"], 2, "abandoned calls stay pending");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_closed_stderr_does_not_crash_the_run() {
    use std::os::fd::FromRawFd;
    let s = Scenario::new("nostderr")
        .with_sim(&["--limit", "500/1s"])
        .numbers(10);
    let mut fds = [0; 2];
    // SAFETY: a fresh pipe whose read end we close at once, so every write to
    // the child's stderr fails with EPIPE, as under `2>&1 | head -1`.
    let write_end = unsafe {
        assert_eq!(libc::pipe(fds.as_mut_ptr()), 0);
        libc::close(fds[0]);
        std::fs::File::from_raw_fd(fds[1])
    };
    let out = s
        .cmd(&["--limit", "500/1s"])
        .stderr(Stdio::from(write_end))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["done"], 10);
    assert_eq!(lines_of(&s.out_path()).len(), 10);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_key_capped_below_its_plan_slows_the_run_to_the_cap() {
    let cap = format!("{KEY}=20");
    let s = Scenario::new("keycap")
        .with_sim(&["--limit", "60/4s", "--key-cap", &cap, "--cooldown", "1s"])
        .numbers(20);
    let r = s.run(&["--limit", "60/4s", "--concurrency", "5"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stderr.contains("reports a limit of 20"), "{}", r.stderr);
    assert_eq!(r.summary["rate_limited"], 0, "{}", r.summary);
    let stats = s.sim().stats().await;
    assert_eq!(stats["rejected_rate"], 0, "{stats}");
    assert_side_effects(&stats, 20);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_client_alone_keeps_every_window_under_its_limit() {
    // The sim allows far more than the client's limit, so the sim's
    // max_in_window measures the client's pacing, not the sim's refusals.
    let s = Scenario::new("pacing")
        .with_sim(&["--limit", "1000/2s", "--concurrency", "10"])
        .numbers(60);
    let r = s.run(&["--limit", "40/2s", "--concurrency", "10"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let stats = s.sim().stats().await;
    let max = stats["max_in_window"].as_u64().unwrap();
    assert!(
        max <= 40,
        "the client let {max} calls into one 2 s window: {stats}"
    );
    assert!(max >= 30, "and it used most of the window: {stats}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_csv_input_with_a_body_template_and_a_custom_out_file() {
    let s = Scenario::new("csv").with_sim(&["--limit", "500/1s"]).input(
        "people.csv",
        "name,n\n\"Ada, Countess\",1\n\"say \"\"hi\"\"\",2\n",
    );
    let out = s.dir().path().join("custom").join("out.jsonl");
    let url = format!("{}/v1/greet", s.sim().url);
    let r = s.run(&[
        "--url",
        &url,
        "--limit",
        "500/1s",
        "--body",
        r#"{{"name": "{name}", "n": {n}}}"#,
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let results = jsonl(&out);
    assert_eq!(results.len(), 2);
    // CSV rows arrive as objects of strings; the body template JSON-escapes them.
    assert_eq!(results[0]["line"], 2);
    assert_eq!(results[0]["input"]["name"], "Ada, Countess");
    assert_eq!(results[0]["body"]["data"]["name"], "Ada, Countess");
    assert_eq!(results[0]["body"]["data"]["n"], 1);
    assert_eq!(results[1]["body"]["data"]["name"], "say \"hi\"");
    assert_side_effects(&s.sim().stats().await, 2);
}

#[test]
fn json_answers_even_on_a_usage_error() {
    let s = Scenario::new("json-error").input("items.jsonl", "{\"n\": 1}\n{oops\n");
    let r = s.run(&["--url", "http://127.0.0.1:9/v1/echo?n={n}"]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert_eq!(r.summary["state"], "error");
    assert_eq!(r.summary["exit_code"], 2);
    assert!(
        r.summary["message"]
            .as_str()
            .unwrap()
            .contains("items.jsonl:2"),
        "{}",
        r.summary
    );
}

#[test]
fn a_mistyped_subcommand_says_what_was_meant() {
    let out = bin().arg("stauts").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("'status'"), "{err}");
}

#[test]
fn completions_and_a_man_page_are_generated() {
    let out = bin().args(["completions", "bash"]).output().unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("batchrun"));
    let man = bin().arg("man").output().unwrap();
    assert!(man.status.success());
    assert!(String::from_utf8_lossy(&man.stdout).contains(".TH batchrun"));
}

/// The same job copied into another directory (the same file name,
/// request and rows: the same Idempotency-Keys) is answered from the API's
/// record: nothing runs again, and the summary says how many answers were
/// replays, where before it showed 200s as if the calls had run.
#[tokio::test(flavor = "multi_thread")]
async fn answers_the_api_replayed_are_counted_and_said() {
    let s = Scenario::new("replayed")
        .with_sim(&["--limit", "none"])
        .numbers(5);
    let r = s.run(&["--limit", "none"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.summary["replayed"], 0, "{}", r.summary);
    assert!(!r.stderr.contains("replayed:"), "{}", r.stderr);
    // A copy elsewhere: a checkpoint and outputs of its own.
    let copy = s.dir().path().join("copy");
    std::fs::create_dir(&copy).unwrap();
    std::fs::copy(s.dir().path().join("items.jsonl"), copy.join("items.jsonl")).unwrap();
    let out = copy.join("items.results.jsonl");
    let state = copy.join("state");
    let (out, state) = (out.to_str().unwrap(), state.to_str().unwrap());
    let mut c = bin();
    c.arg(copy.join("items.jsonl"))
        .args(["--url", &format!("{}/v1/echo?n={{n}}", s.sim().url)])
        .args(["--limit", "none", "--json", "-o", out, "--state-dir", state])
        .env("BATCHRUN_API_KEY", KEY)
        .stdin(Stdio::null());
    let r = finish(c);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.summary["replayed"], 5, "{}", r.summary);
    assert!(
        r.stderr.contains("replayed: 5 call(s) were answered"),
        "{}",
        r.stderr
    );
    assert_side_effects(&s.sim().stats().await, 5);
}
