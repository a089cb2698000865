//! The everyday reruns (issue 20): a rehearsal that never leaves the
//! machine, one item's refusal that fails only that item, a breaker for a
//! silent server, and the small things a rerun shows.

mod batches;
mod names;
mod rehearsals;

use crate::common::*;

/// One item the key may not touch (403) among items that go through: that
/// item fails, with its status and the server's words, and the job
/// finishes; every other item ran once.
#[tokio::test(flavor = "multi_thread")]
async fn one_items_refusal_fails_that_item_and_the_run_goes_on() {
    let s = Scenario::new("refused")
        .with_sim(&[
            "--limit", "600/1s", "--refuse", "n=7", "--refuse", "n=9:402",
        ])
        .numbers(20);
    let r = s.run(&["--limit", "600/1s", "--concurrency", "3"]);
    assert_eq!(r.code, 3, "{}", r.stderr);
    assert_eq!(r.summary["state"], "done", "{}", r.stderr);
    assert_eq!(
        (r.summary["done"].as_u64(), r.summary["failed"].as_u64()),
        (Some(18), Some(2))
    );
    // An add-on one item needs is not the account running dry: no page.
    assert_eq!(
        r.summary["alerts"].as_array().map(Vec::len),
        Some(0),
        "{}",
        r.summary
    );
    let failures = jsonl(&s.failures_path());
    assert_eq!(failures.len(), 2, "{failures:?}");
    let by_line = |l: u64| failures.iter().find(|f| f["line"] == l).unwrap();
    assert_eq!(by_line(7)["status"], 403);
    let reason = by_line(7)["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("\"this key may not access this resource\""),
        "{reason}"
    );
    assert_eq!(by_line(9)["status"], 402);
    let reason = by_line(9)["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("add-on"), "{reason}");
    let stats = s.sim().stats().await;
    assert_side_effects(&stats, 18);
    assert_eq!(stats["rejected_refused"], 2, "{stats}");
    let mut done = lines_of(&s.out_path());
    done.sort_unstable();
    let others: Vec<u64> = (1..=20).filter(|l| *l != 7 && *l != 9).collect();
    assert_eq!(done, others);
}

/// A refusal before any call got through is the key's: the run stops
/// (exit 1) with nothing marked failed, and says which line got it and what
/// the server said.
#[tokio::test(flavor = "multi_thread")]
async fn a_refusal_before_any_success_stops_the_run_naming_line_and_words() {
    let s = Scenario::new("refused-first")
        .with_sim(&[
            "--limit", "600/1s", "--refuse", "n=1:401", "--refuse", "n=2:401",
        ])
        .numbers(5);
    let r = s.run(&["--limit", "600/1s", "--concurrency", "1"]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert_eq!(r.summary["failed"], 0);
    // Line 1 was set aside; line 2, refused too, told the key's refusal.
    assert!(
        r.stderr.contains("rejected the key (HTTP 401 for line 2"),
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

/// A server that accepts calls and never answers: the run halts resumably
/// once the last calls all timed out, with nothing marked failed, and a
/// rerun against the same URL, answering again, does every item once.
#[tokio::test(flavor = "multi_thread")]
async fn a_silent_server_halts_resumably_and_a_rerun_finishes() {
    let dir = TempDir::new("silent");
    let input = numbers(&dir, "items.jsonl", 10);
    let silent = Sim::start(&["--limit", "600/1s", "--latency", "60s"]);
    let addr = silent.url.trim_start_matches("http://").to_string();
    let args = ["--limit", "600/1s", "--concurrency", "2", "--timeout", "1s"];
    let started = std::time::Instant::now();
    let r = finish(run_cmd(&silent, &dir, &input, &args));
    assert_eq!(r.code, 75, "{}", r.stderr);
    assert!(started.elapsed() < std::time::Duration::from_secs(60));
    assert_eq!(r.summary["state"], "halted");
    assert_eq!(r.summary["failed"], 0, "{}", r.stderr);
    let reason = r.summary["halt_reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("calls all timed out (--timeout 1s)"),
        "{reason}"
    );
    assert!(reason.contains("run the same command"), "{reason}");
    let failures = dir.path().join("items.failures.jsonl");
    assert!(jsonl(&failures).is_empty());
    assert_side_effects(&silent.stats().await, 0);

    drop(silent);
    let healthy = Sim::start_on(&addr, &["--limit", "600/1s"]);
    let r = finish(run_cmd(&healthy, &dir, &input, &args));
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.summary["done"], 10);
    assert_each_item_once(&dir.path().join("items.results.jsonl"), 10);
    assert_side_effects(&healthy.stats().await, 10);
}

/// A --max-failures halt says how many failed, and that is what the
/// summary and the failures file hold.
#[tokio::test(flavor = "multi_thread")]
async fn a_max_failures_halt_agrees_with_its_counts() {
    let s = Scenario::new("max-failures")
        .with_sim(&["--limit", "600/1s", "--fail-rate", "1.0"])
        .numbers(30);
    let r = s.run(&[
        "--limit",
        "600/1s",
        "--concurrency",
        "4",
        "--max-attempts",
        "1",
        "--max-failures",
        "2",
    ]);
    assert_ne!(r.code, 0, "{}", r.stderr);
    let reason = r.summary["halt_reason"].as_str().unwrap_or_default();
    let said: u64 = reason
        .split(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count in {reason:?}"));
    assert_eq!(said, 3, "{reason}");
    assert_eq!(r.summary["failed"], said, "{}", r.summary);
    assert_eq!(jsonl(&s.failures_path()).len() as u64, said);
    let pending = r.summary["pending"].as_u64().unwrap_or_default();
    assert_eq!(pending, 30 - said, "{}", r.summary);
}

/// A 429 that says the credits are gone is counted as such, not next to
/// "0 rate-limited" as if it were a rate limit.
#[tokio::test(flavor = "multi_thread")]
async fn a_credit_429_is_named_apart_from_rate_limits() {
    let s = Scenario::new("credit-429")
        .with_sim(&["--limit", "600/1s", "--credits", "5"])
        .numbers(10);
    let r = s.run(&["--limit", "600/1s", "--concurrency", "1"]);
    assert_eq!(r.code, 75, "{}", r.stderr);
    assert_eq!(r.summary["rate_limited"], 0);
    let counts = &r.summary["status_counts"];
    assert_eq!(counts["200"], 5, "{counts}");
    assert_eq!(counts["429_credits_exhausted"], 1, "{counts}");
    assert!(counts.get("429").is_none(), "{counts}");
    assert!(
        r.stderr.contains("429_credits_exhausted x1"),
        "{}",
        r.stderr
    );
}

/// A second Ctrl-C while slow calls are in flight stops at once (well
/// inside the grace the first one gives them), with exit 130, and the
/// results hold every item that finished.
#[tokio::test(flavor = "multi_thread")]
async fn a_second_ctrl_c_stops_at_once_and_keeps_what_finished() {
    let s = Scenario::new("ctrl-c-twice")
        .with_sim(&[
            "--limit",
            "600/1s",
            "--concurrency",
            "8",
            "--latency",
            "1ms..20s",
            "--seed",
            "3",
        ])
        .numbers(40);
    let args = ["--limit", "600/1s", "--concurrency", "8"];
    let (r, took) = ctrl_c_twice(&s, &args).await;
    assert!(!r.stderr.contains(KEY), "the API key leaked into output");
    assert_eq!(r.code, 130, "{}", r.stderr);
    assert!(r.stderr.contains("stopping now"), "{}", r.stderr);
    assert!(
        took < batchrun::run::INTERRUPT_GRACE,
        "took {took:?}: the second Ctrl-C waited for the grace\n{}",
        r.stderr
    );
    let done = r.summary["done"].as_u64().unwrap_or_default();
    assert!(done >= 1, "{}", r.summary);
    let mut lines = lines_of(&s.out_path());
    assert_eq!(lines.len() as u64, done, "{}", r.summary);
    lines.sort_unstable();
    lines.dedup();
    assert_eq!(lines.len() as u64, done);
    assert_eq!(r.summary["pending"].as_u64(), Some(40 - done));
    // The calls it abandoned may have run, as a killed run's may: a changed
    // request, which would send them under other keys, is refused.
    let sent = s.sim().stats().await["requests"].clone();
    let r = s.run(&[&args[..], &["--header", "X-Trace: 2", "--keep-done"]].concat());
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr
            .contains("stopped before its calls in flight came back"),
        "{}",
        r.stderr
    );
    assert_eq!(s.sim().stats().await["requests"], sent);
}

/// Runs `args` and presses Ctrl-C twice once calls are in flight (the
/// second once the run said it heard the first): what it said, and how
/// long it took from the first.
async fn ctrl_c_twice(s: &Scenario, args: &[&str]) -> (Finished, std::time::Duration) {
    let mut c = s.cmd(args);
    c.stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = c.spawn().unwrap();
    wait_for_stats(s.sim(), 30, |st| {
        st["side_effects"].as_u64() >= Some(1) && st["in_flight"].as_u64() >= Some(2)
    })
    .await;
    let pid = child.id() as i32;
    // SAFETY: signalling our own child process.
    unsafe { libc::kill(pid, libc::SIGINT) };
    let first = std::time::Instant::now();
    // The second signal goes once the run has said it heard the first (two
    // signals at once would be one).
    let (heard, heard_rx) = std::sync::mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        use std::io::BufRead;
        let mut all = String::new();
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            if line.contains("finishing the calls in flight") {
                let _ = heard.send(());
            }
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    heard_rx
        .recv_timeout(std::time::Duration::from_secs(30))
        .expect("the run said it heard the first Ctrl-C");
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGINT) };
    let out = child.wait_with_output().unwrap();
    let took = first.elapsed();
    let r = Finished {
        code: out.status.code().unwrap_or(-1),
        summary: serde_json::from_slice(&out.stdout).unwrap_or_default(),
        stderr: reader.join().unwrap(),
    };
    (r, took)
}

/// A --state-dir that names a file is said to be one, with no talk of a
/// damaged checkpoint nor advice that would send every item again; nothing
/// is sent.
#[tokio::test(flavor = "multi_thread")]
async fn a_state_dir_that_is_a_file_is_named_so_and_nothing_is_sent() {
    let s = Scenario::new("state-file")
        .with_sim(&["--limit", "600/1s"])
        .numbers(3);
    let file = s.dir().write("not-a-dir", "x");
    let mut c = bin();
    c.arg(s.input_path())
        .args(["--url", &format!("{}/v1/echo?n={{n}}", s.sim().url)])
        .args(["--limit", "600/1s", "--json"])
        .arg("--state-dir")
        .arg(&file)
        .env("BATCHRUN_API_KEY", KEY);
    let r = finish(c);
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(
        r.stderr.contains("is a file, not a directory"),
        "{}",
        r.stderr
    );
    assert!(!r.stderr.contains("is damaged"), "{}", r.stderr);
    assert!(!r.stderr.contains("Move it aside"), "{}", r.stderr);
    assert_eq!(s.sim().stats().await["requests"], 0);
}

/// A checkpoint that cannot be written when it is reopened (a file size
/// limit stands in for a full disk) is not called damaged; once there is
/// room, the same command resumes and runs nothing twice.
#[tokio::test(flavor = "multi_thread")]
async fn a_full_disk_at_reopen_is_not_a_damaged_checkpoint() {
    let s = Scenario::new("full-reopen")
        .with_sim(&["--limit", "600/1s"])
        .numbers(5);
    let input = s.input_path().to_path_buf();
    let half = s.dir().write("half.jsonl", "{\"n\": 1}\n{\"n\": 2}\n");
    std::fs::copy(&half, &input).unwrap();
    let args = ["--limit", "600/1s"];
    let first = s.run(&args);
    assert_eq!(first.code, 0, "{}", first.stderr);
    numbers(s.dir(), "items.jsonl", 5);
    let mut c = s.cmd(&args);
    with_file_size_limit(&mut c, 0);
    let r = finish(c);
    assert_ne!(r.code, 0, "{}", r.stderr);
    assert!(!r.stderr.contains("is damaged"), "{}", r.stderr);
    assert!(!r.stderr.contains("Move it aside"), "{}", r.stderr);
    assert!(
        r.stderr.contains("cannot be read or written"),
        "{}",
        r.stderr
    );
    assert_side_effects(&s.sim().stats().await, 2);
    let again = s.run(&args);
    assert_eq!(again.code, 0, "{}", again.stderr);
    assert_side_effects(&s.sim().stats().await, 5);
}

/// A --out that cannot be written is found before any call, with its path
/// and the reason (a file in the way; /proc, read-only even for root).
#[tokio::test(flavor = "multi_thread")]
async fn an_out_that_cannot_be_written_is_refused_before_any_call() {
    let s = Scenario::new("out-ro")
        .with_sim(&["--limit", "600/1s"])
        .numbers(3);
    let file = s.dir().write("plain.txt", "x");
    let under_file = file.join("results.jsonl");
    let r = s.run(&["--limit", "600/1s", "--out", under_file.to_str().unwrap()]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr
            .contains(&format!("--out {}", under_file.display())),
        "{}",
        r.stderr
    );
    assert!(
        r.stderr.contains("is a file, not a directory"),
        "{}",
        r.stderr
    );
    let r = s.run(&["--limit", "600/1s", "--out", "/proc/batchrun-results.jsonl"]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr.contains("no file can be made in /proc"),
        "{}",
        r.stderr
    );
    assert_eq!(s.sim().stats().await["requests"], 0);
}

/// `c` with a file size limit of `bytes`: past it every write fails, as on
/// a full disk.
fn with_file_size_limit(c: &mut std::process::Command, bytes: u64) {
    use std::os::unix::process::CommandExt as _;
    // SAFETY: setrlimit is async-signal-safe and touches only the child.
    unsafe {
        c.pre_exec(move || {
            let lim = libc::rlimit {
                rlim_cur: bytes as libc::rlim_t,
                rlim_max: bytes as libc::rlim_t,
            };
            if libc::setrlimit(libc::RLIMIT_FSIZE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// `batchrun man` gives run's options (the default subcommand) and the bash
/// completion offers them right after `batchrun`.
#[test]
fn the_man_page_and_completions_know_runs_options() {
    let man = bin().arg("man").output().unwrap();
    assert_eq!(man.status.code(), Some(0));
    let page = String::from_utf8_lossy(&man.stdout);
    assert!(
        page.contains("max\\-failures"),
        "no --max-failures in the page"
    );
    assert!(page.contains("BATCHRUN SIM"));
    let bash = bin().args(["completions", "bash"]).output().unwrap();
    let script = String::from_utf8_lossy(&bash.stdout);
    let top = script
        .lines()
        .skip_while(|l| l.trim() != "batchrun)")
        .find(|l| l.trim_start().starts_with("opts="))
        .unwrap_or_default();
    assert!(top.contains("--plan"), "{top}");
}

/// A pipe that grew is named as the pipe, not as its spooled copy (a
/// digest-named file the run removes), and only the added row is sent.
#[tokio::test(flavor = "multi_thread")]
async fn a_grown_pipe_is_named_as_the_pipe_and_sends_only_its_new_row() {
    let s = Scenario::new("pipe-named").with_sim(&["--limit", "none"]);
    let out = s.dir().path().join("piped.results.jsonl");
    let rows = |n: u64| -> String { (1..=n).map(|i| format!("{{\"n\": {i}}}\n")).collect() };
    let r = piped(&s, &rows(5), &out, &[]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let r = piped(&s, &rows(6), &out, &[]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stderr
            .contains("the piped input (stdin) grew by 1 item(s)"),
        "{}",
        r.stderr
    );
    assert!(!r.stderr.contains("spool"), "{}", r.stderr);
    assert_eq!(r.summary["requests"], 1, "{}", r.summary);
    assert_side_effects(&s.sim().stats().await, 6);
    // Blank lines appended add no item, and no "grew by 0".
    let r = piped(&s, &format!("{}\n\n", rows(6)), &out, &[]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(!r.stderr.contains("grew by"), "{}", r.stderr);
    // `-q` is the summary, alerts and errors alone: a row added is no news.
    let grown = format!("{}\n\n{{\"n\": 7}}\n", rows(6));
    let r = piped(&s, &grown, &out, &["-q"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(!r.stderr.contains("grew by"), "{}", r.stderr);
    assert_eq!(r.summary["requests"], 1, "{}", r.summary);
}

/// A reserve halt's reason reads as one sentence: the alert's words go on
/// after the reason's (";"), not as a sentence in lower case.
#[tokio::test(flavor = "multi_thread")]
async fn a_reserve_halt_reason_is_one_sentence() {
    let s = Scenario::new("reserve-words")
        .with_sim(&["--limit", "600/1s", "--credits", "15"])
        .numbers(10);
    let r = s.run(&["--limit", "600/1s", "--concurrency", "1", "--reserve", "10"]);
    assert_eq!(r.code, 75, "{}", r.stderr);
    assert_eq!(r.summary["failed"], 0, "{}", r.summary);
    let reason = r.summary["halt_reason"].as_str().unwrap_or_default();
    assert!(
        reason.starts_with("reserve reached: 10 credits left"),
        "{reason}"
    );
    assert!(
        reason.contains("with one call; halted to keep the reserve of 10 credits"),
        "{reason}"
    );
    assert!(!reason.contains(". halted"), "{reason}");
    assert_side_effects(&s.sim().stats().await, 5);
}

/// `--skip-invalid` with a row that parses but lacks a field the URL needs
/// (beside a row that does not parse): both are failures with their
/// reason, the rest are sent once, and the run finishes (exit 3) rather
/// than calling the untouched input changed.
#[tokio::test(flavor = "multi_thread")]
async fn skip_invalid_passes_a_row_missing_a_field_and_finishes() {
    let s = Scenario::new("skip-field")
        .with_sim(&["--limit", "none"])
        .input(
            "items.jsonl",
            "{\"n\": 1}\n{\"n\": 2\n{\"m\": 3}\n{\"n\": 4}\n{\"n\": 5}\n",
        );
    let r = s.run(&["--limit", "none", "--skip-invalid"]);
    assert_eq!(r.code, 3, "{}", r.stderr);
    assert!(
        !r.stderr.contains("changed while the job ran"),
        "{}",
        r.stderr
    );
    assert_eq!(r.summary["done"], 3, "{}", r.summary);
    assert_eq!(r.summary["failed"], 2, "{}", r.summary);
    let failures = jsonl(&s.failures_path());
    let reasons: Vec<&str> = failures
        .iter()
        .map(|f| f["reason"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(lines_of(&s.failures_path()), [2, 3], "{reasons:?}");
    assert!(reasons[1].contains("no field \"n\""), "{reasons:?}");
    assert_eq!(lines_of(&s.out_path()), [1, 4, 5]);
    assert_side_effects(&s.sim().stats().await, 3);
    // The next night, the same command: nothing is sent again.
    let r = s.run(&["--limit", "none", "--skip-invalid"]);
    assert_eq!(r.code, 3, "{}", r.stderr);
    assert_eq!(r.summary["requests"], 0, "{}", r.summary);
}

/// A new job whose state dir cannot be written (a file size limit stands
/// in for a full disk) is told so without a word about a checkpoint to
/// resume, since there is none yet; nothing is sent.
#[tokio::test(flavor = "multi_thread")]
async fn a_full_disk_for_a_new_job_speaks_of_no_checkpoint() {
    let s = Scenario::new("full-new")
        .with_sim(&["--limit", "600/1s"])
        .numbers(5);
    let mut c = s.cmd(&["--limit", "600/1s"]);
    with_file_size_limit(&mut c, 0);
    let r = finish(c);
    assert_ne!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stderr.contains("cannot be read or written"),
        "{}",
        r.stderr
    );
    assert!(
        r.stderr.contains("it holds no checkpoint yet"),
        "{}",
        r.stderr
    );
    assert!(
        !r.stderr.contains("resumes where it stopped"),
        "{}",
        r.stderr
    );
    assert!(!r.stderr.contains("is damaged"), "{}", r.stderr);
    assert_eq!(s.sim().stats().await["requests"], 0);
}

/// An input regenerated with rows removed and none changed or added sends
/// nothing, and says so plainly (not "the other 0 ... are pending").
#[tokio::test(flavor = "multi_thread")]
async fn a_shrunk_input_sends_nothing_and_says_none_is_new() {
    let s = Scenario::new("shrunk")
        .with_sim(&["--limit", "none"])
        .numbers(6);
    let r = s.run(&["--limit", "none"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    numbers(s.dir(), "items.jsonl", 4);
    let r = s.run(&["--limit", "none"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stderr
            .contains("4 item(s) it still holds keep their results (matched by content); none is changed or new"),
        "{}",
        r.stderr
    );
    assert_eq!(r.summary["requests"], 0, "{}", r.summary);
    assert_side_effects(&s.sim().stats().await, 6);
}

/// The first answer of a run refuses its item (a 402 with credits left, a
/// 403), with one call in flight: the item is set aside, the next one goes
/// and succeeds, so the refusal was the item's: it is one failure with the
/// server's words, and a nightly job is no longer blocked by it (issue 20).
#[tokio::test(flavor = "multi_thread")]
async fn a_refused_first_item_is_that_items_failure_once_the_next_goes_through() {
    for (refuse, status) in [("n=1:402", 402), ("n=1", 403)] {
        let s = Scenario::new("refused-first")
            .with_sim(&["--limit", "600/1s", "--refuse", refuse])
            .numbers(10);
        let r = s.run(&["--limit", "600/1s", "--concurrency", "1"]);
        assert_eq!(r.code, 3, "{refuse}: {}", r.stderr);
        assert_eq!(r.summary["state"], "done", "{}", r.stderr);
        assert_eq!(
            (r.summary["done"].as_u64(), r.summary["failed"].as_u64()),
            (Some(9), Some(1)),
            "{refuse}: {}",
            r.summary
        );
        let failures = jsonl(&s.failures_path());
        assert_eq!(failures.len(), 1, "{failures:?}");
        assert_eq!(failures[0]["line"], 1, "{failures:?}");
        assert_eq!(failures[0]["status"], status, "{failures:?}");
        assert_side_effects(&s.sim().stats().await, 9);
    }
}

/// A key every call refuses still halts as the key's (exit 1, nothing
/// failed), after the further calls that told it apart: one for a 401,
/// three for a 403 (which may be an item's: two items refused at the head
/// of a queue halted every rerun as the key's).
#[tokio::test(flavor = "multi_thread")]
async fn a_refused_key_still_halts_after_a_few_more_calls() {
    for (status, calls) in [("401", 2), ("403", 4)] {
        let refuse: Vec<String> = (1..=10).map(|n| format!("n={n}:{status}")).collect();
        let mut sim = vec!["--limit", "600/1s"];
        sim.extend(refuse.iter().flat_map(|r| ["--refuse", r.as_str()]));
        let s = Scenario::new("refused-key").with_sim(&sim).numbers(10);
        let r = s.run(&["--limit", "600/1s", "--concurrency", "1"]);
        assert_eq!(r.code, 1, "{status}: {}", r.stderr);
        assert_eq!(r.summary["failed"], 0, "{status}: {}", r.summary);
        assert_eq!(r.summary["requests"], calls, "{status}: {}", r.summary);
        assert!(jsonl(&s.failures_path()).is_empty());
    }
}
