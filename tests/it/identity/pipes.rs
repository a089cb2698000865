//! Reruns through a pipe: standard input, a FIFO, a process substitution,
//! read once, spooled, and resumed by content.

use super::*;

/// A FIFO beside the state dir of a name that is gone: finding whether
/// the FIFO is that input renamed read it, and the run then waited for a
/// writer that had already gone, for ever, with the items read away.
#[tokio::test(flavor = "multi_thread")]
async fn a_fifo_beside_a_gone_names_state_is_read_once_and_run() {
    let s = Scenario::new("fifo-gone").with_sim(&["--limit", "none"]);
    let dir = s.dir().path();
    let in_dir = |input: &str| {
        let mut c = bin();
        c.current_dir(dir)
            .args([input, "--limit", "none", "--json", "--format", "jsonl"])
            .args(["--url", &format!("{}/v1/echo?n={{n}}", s.sim().url)])
            .env("BATCHRUN_API_KEY", KEY)
            .stdin(Stdio::null());
        c
    };
    numbers(s.dir(), "old.jsonl", 3);
    assert_eq!(finish(in_dir("old.jsonl")).code, 0);
    std::fs::remove_file(dir.join("old.jsonl")).unwrap();
    let fifo = dir.join("items.jsonl");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status();
    assert!(made.unwrap().success());
    let writer = std::thread::spawn(move || std::fs::write(fifo, rows(1..=5)).unwrap());
    let mut child = in_dir("items.jsonl")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // A deadline, not a timing claim: the run takes milliseconds.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("the run on the FIFO never ended");
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let r = finished(child.wait_with_output().unwrap());
    writer.join().unwrap();
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.summary["done"], 5, "{}", r.summary);
    assert_each_item_once(&dir.join("items.results.jsonl"), 5);
}

fn rows(range: std::ops::RangeInclusive<u64>) -> String {
    range.map(|n| format!("{{\"n\": {n}}}\n")).collect()
}

/// A bad line of a pipe is named as standard input's, not by the spooled
/// copy's path in the state dir, which is gone when the run ends.
#[tokio::test(flavor = "multi_thread")]
async fn a_bad_line_of_a_pipe_is_named_as_standard_inputs() {
    let s = Scenario::new("pipe-bad-line").with_sim(&["--limit", "none"]);
    let out = s.dir().path().join("piped.results.jsonl");
    let items = "{\"n\": 1}\nnot json\n";
    let r = piped(&s, items, &out, &[]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr.contains("standard input:2: invalid JSON") && !r.stderr.contains("spool"),
        "{}",
        r.stderr
    );
    let r = piped(&s, items, &out, &["--skip-invalid"]);
    assert_eq!(r.code, 3, "{}", r.stderr);
    let failed = jsonl(&out.with_extension("failures"));
    let reason = failed[0]["reason"].as_str().unwrap();
    assert!(
        reason.starts_with("standard input:2: invalid JSON"),
        "{reason}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pipe_with_a_row_added_sends_only_that_row_and_leaves_no_spool() {
    let s = Scenario::new("pipe-grown").with_sim(&["--limit", "none"]);
    let out = s.dir().path().join("piped.results.jsonl");
    let r = piped(&s, &rows(1..=20), &out, &[]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let r = piped(&s, &rows(1..=21), &out, &[]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.summary["requests"], 1, "{}", r.summary);
    assert_each_item_once(&out, 21);
    assert_side_effects(&s.sim().stats().await, 21);
    // The spooled copies go with the run that needed them.
    let spool = s.state_dir().join("spool");
    let left: Vec<_> = std::fs::read_dir(&spool)
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "spool not cleaned: {left:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn another_days_pipe_does_not_overwrite_the_results_of_the_last() {
    let s = Scenario::new("pipe-daily").with_sim(&["--limit", "none"]);
    let out = s.dir().path().join("stdin.results.jsonl");
    let r = piped(&s, &rows(1..=5), &out, &[]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let yesterday = std::fs::read(&out).unwrap();
    let r = piped(&s, &rows(6..=10), &out, &[]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr.contains("holds the outputs of another job")
            && r.stderr.contains("on a piped input)")
            && !r.stderr.contains("spool"),
        "{}",
        r.stderr
    );
    assert!(r.stderr.contains("--force-outputs"), "{}", r.stderr);
    assert_eq!(std::fs::read(&out).unwrap(), yesterday, "untouched");
    assert_side_effects(&s.sim().stats().await, 5);
    // Told to, it replaces them.
    let r = piped(&s, &rows(6..=10), &out, &["--force-outputs"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(lines_of(&out), vec![1, 2, 3, 4, 5]);
    assert_side_effects(&s.sim().stats().await, 10);
}

/// A pipe's rows in another order (a query without ORDER BY), or with a
/// row inserted, are its job regenerated: resumed by content, nothing sent
/// again, calls of unknown outcome under their keys; a pipe that lost rows
/// is another job, as above.
#[tokio::test(flavor = "multi_thread")]
async fn a_pipe_whose_rows_come_in_another_order_resumes_its_job_by_content() {
    let s = Scenario::new("pipe-order").with_sim(&["--limit", "none"]);
    let out = s.dir().path().join("stdin.results.jsonl");
    let r = piped(&s, &rows(1..=20), &out, &[]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let reversed: String = rows(1..=20)
        .lines()
        .rev()
        .map(|l| format!("{l}\n"))
        .collect();
    let r = piped(&s, &reversed, &out, &[]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.summary["requests"], 0, "{}", r.summary);
    assert!(
        r.stderr.contains("the piped input (stdin) changed"),
        "{}",
        r.stderr
    );
    let r = piped(&s, &format!("{{\"n\": 99}}\n{reversed}"), &out, &[]);
    assert_eq!(r.summary["requests"], 1, "{}", r.summary);
    assert_each_item_once(&out, 21);
    assert_side_effects(&s.sim().stats().await, 21);

    // Every call ran and its answer was lost: reordered, and retried,
    // each goes under its key again and is replayed.
    let s = Scenario::new("pipe-order-unknown").with_sim(&[
        "--limit",
        "none",
        "--reset-rate",
        "1",
        "--seed",
        "3",
    ]);
    let out = s.dir().path().join("stdin.results.jsonl");
    let r = piped(&s, &rows(1..=10), &out, &["--max-attempts", "1"]);
    assert_eq!(r.summary["failed"], 10, "{}", r.summary);
    let reversed: String = rows(1..=10)
        .lines()
        .rev()
        .map(|l| format!("{l}\n"))
        .collect();
    let r = piped(&s, &reversed, &out, &["--retry-failed"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let stats = s.sim().stats().await;
    assert_eq!(stats["idempotent_replays"], 10, "{stats}");
    assert_side_effects(&stats, 10);
}

/// A pipe killed with calls in flight, then run with one finished row
/// changed (a row updated between two queries): it resumes its job by
/// content, its calls under their keys, rather than a new job sending
/// every call again.
#[tokio::test(flavor = "multi_thread")]
async fn a_killed_pipe_with_a_row_changed_runs_no_call_twice() {
    let s = Scenario::new("pipe-killed-changed").with_sim(&[
        "--limit",
        "none",
        "--latency",
        "100ms",
        "--keep-working",
    ]);
    let out = s.dir().path().join("stdin.results.jsonl");
    let first = s.dir().write("first.jsonl", &rows(1..=30));
    let mut c = s.cmd_for(
        Path::new("-"),
        &["--limit", "none", "-c", "4", "--format", "jsonl"],
    );
    c.arg("--out")
        .arg(&out)
        .arg("--failures")
        .arg(out.with_extension("failures"));
    c.stdin(std::fs::File::open(&first).unwrap());
    let killed = act_when(
        c,
        s.sim(),
        |st| side_effects(st) >= 8,
        |pid| {
            // SAFETY: a signal to our own child.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        },
    )
    .await;
    assert_ne!(killed.code, 0);
    wait_for_stats(s.sim(), 30, |st| st["in_flight"] == 0).await;
    let changed = rows(1..=30).replacen("{\"n\": 1}", "{\"n\": 1, \"note\": \"updated\"}", 1);
    let r = piped(&s, &changed, &out, &[]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    // The 30 rows once each, and the changed row as a call of its own.
    assert_side_effects(&s.sim().stats().await, 31);
}

/// `status -` shows a pipe's jobs (there is no file to match them by):
/// it said "-: cannot read".
#[tokio::test(flavor = "multi_thread")]
async fn status_of_a_pipe_shows_its_jobs() {
    let s = Scenario::new("pipe-status").with_sim(&["--limit", "none"]);
    let out = s.dir().path().join("stdin.results.jsonl");
    assert_eq!(piped(&s, &rows(1..=5), &out, &[]).code, 0);
    let status = bin()
        .args(["status", "-", "--json", "--state-dir"])
        .arg(s.state_dir())
        .output()
        .unwrap();
    assert!(
        status.status.success(),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
    let jobs: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(jobs[0]["done"], 5, "{jobs}");
    // Named as what it was, not as its spooled copy (removed at the end).
    assert_eq!(jobs[0]["input"], "the piped input (stdin)", "{jobs}");
    let text = bin()
        .args(["status", "-", "--state-dir"])
        .arg(s.state_dir())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("(the piped input (stdin))"), "{text}");
    assert!(!text.contains("spool"), "{text}");
}

/// `<(cmd)` is `/dev/fd/N`, N whatever the shell picks that time: the
/// same content through another number is the same job, found by content
/// as a pipe is, not a new job under new keys.
#[tokio::test(flavor = "multi_thread")]
async fn a_process_substitution_is_the_same_job_whatever_its_fd_number() {
    let s = Scenario::new("fd-number").with_sim(&["--limit", "none"]);
    let out = s.dir().path().join("subst.results.jsonl");
    let r = piped_as(&s, "/proc/self/fd/0", &rows(1..=10), &out, &[]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let r = piped_as(&s, "/dev/stdin", &rows(1..=10), &out, &[]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.summary["requests"], 0, "{}", r.summary);
    assert_side_effects(&s.sim().stats().await, 10);
}

/// A pipe whose last line ends without a newline (what a writer that died
/// mid-line leaves) is run, with a warning that its last item may be cut
/// short; a pipe ending in a newline gets none.
#[tokio::test(flavor = "multi_thread")]
async fn a_pipe_cut_mid_line_is_warned_of() {
    let s = Scenario::new("pipe-cut").with_sim(&["--limit", "none"]);
    let out = s.dir().path().join("cut.results.jsonl");
    let cut = piped(&s, "{\"n\": 1}\n{\"n\": 2}", &out, &[]);
    assert_eq!(cut.code, 0, "{}", cut.stderr);
    let warning = "standard input's last line ends without a newline";
    assert!(cut.stderr.contains(warning), "{}", cut.stderr);
    let whole = piped(&s, "{\"n\": 1}\n{\"n\": 2}\n{\"n\": 3}\n", &out, &[]);
    assert_eq!(whole.code, 0, "{}", whole.stderr);
    assert!(!whole.stderr.contains(warning), "{}", whole.stderr);
}
