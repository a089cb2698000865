//! The everyday reruns: a changed command, a moved input, a pipe again.
//! A job is what it sends, wherever it lives, and its outputs are its own.

use std::path::Path;
use std::process::{Command, Stdio};

use crate::common::*;

fn side_effects(st: &serde_json::Value) -> u64 {
    st["side_effects"].as_u64().unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_changed_header_stops_before_any_call_and_keep_done_sends_only_the_pending() {
    // 40 a second: the run takes 5 s, so the interrupt at 120 executed
    // lands well before its end even on a loaded machine.
    let s = Scenario::new("changed-header")
        .with_sim(&["--limit", "40/1s"])
        .numbers(200);
    let args = ["--limit", "40/1s", "--concurrency", "4"];
    let r = s
        .signal_when(&args, |st| side_effects(st) >= 120, libc::SIGINT)
        .await;
    assert_eq!(r.code, 130, "{}", r.stderr);
    let done = r.summary["done"].as_u64().unwrap();
    assert!((120..200).contains(&done), "{}", r.summary);
    let before = side_effects(&s.sim().stats().await);

    let changed = [&args[..], &["--header", "X-Trace: nightly"]].concat();
    let r = s.run(&changed);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr.contains("header X-Trace: nightly (added)"),
        "{}",
        r.stderr
    );
    assert!(
        r.stderr.contains("--keep-done") && r.stderr.contains("--fresh"),
        "{}",
        r.stderr
    );
    assert!(
        r.stderr.contains(&format!("{done} of 200 item(s) done")),
        "{}",
        r.stderr
    );
    assert_eq!(side_effects(&s.sim().stats().await), before, "no call");

    let r = s.run(&[&changed[..], &["--keep-done"]].concat());
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.summary["done"], 200, "{}", r.summary);
    assert_each_item_once(&s.out_path(), 200);
    // Executions equal items: the done ones were not sent again.
    assert_side_effects(&s.sim().stats().await, 200);
    // The carried job is now the new request's: the same command resumes it.
    let r = s.run(&changed);
    assert_eq!(
        (r.code, r.summary["requests"].as_u64()),
        (0, Some(0)),
        "{}",
        r.stderr
    );
}

/// `batchrun INPUT` with the state dir and the outputs in their default
/// places, beside the input.
fn beside(sim: &Sim, input: &Path) -> Command {
    let mut c = bin();
    c.arg(input)
        .args(["--url", &format!("{}/v1/echo?n={{n}}", sim.url)])
        .args(["--limit", "none", "--json"])
        .env("BATCHRUN_API_KEY", KEY)
        .stdin(Stdio::null());
    c
}

/// The advice for a damaged checkpoint works as printed: moved aside to
/// `DIR.damaged` beside the others, it is not taken for a renamed input's
/// state, and the run sends every item again under the same keys.
#[tokio::test(flavor = "multi_thread")]
async fn a_damaged_checkpoint_moved_aside_as_advised_is_left_alone() {
    let s = Scenario::new("moved-aside").with_sim(&["--limit", "none"]);
    let input = numbers(s.dir(), "items.jsonl", 10);
    let r = finish(beside(s.sim(), &input));
    assert_eq!(r.code, 0, "{}", r.stderr);
    let state = s.dir().path().join(".batchrun").join("items.jsonl");
    for e in std::fs::read_dir(state.join("results")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "log") {
            std::fs::remove_file(p).unwrap();
        }
    }
    let r = finish(beside(s.sim(), &input));
    assert_eq!(r.code, 1, "{}", r.stderr);
    let advised = format!("mv {0} {0}.damaged", state.display());
    assert!(r.stderr.contains(&advised), "{}", r.stderr);
    std::fs::rename(&state, state.with_extension("jsonl.damaged")).unwrap();
    let r = finish(beside(s.sim(), &input));
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.summary["done"], 10, "{}", r.summary);
    assert_side_effects(&s.sim().stats().await, 10);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_moved_directory_keeps_its_job_and_sends_nothing_again() {
    let s = Scenario::new("moved").with_sim(&["--limit", "none"]);
    let a = s.dir().path().join("a");
    std::fs::create_dir_all(&a).unwrap();
    let input = numbers(s.dir(), "a/items.jsonl", 50);
    let r = finish(beside(s.sim(), &input));
    assert_eq!(r.code, 0, "{}", r.stderr);
    let b = s.dir().path().join("b");
    std::fs::rename(&a, &b).unwrap();
    // Looked at before it runs again, the job is found where it moved.
    for what in ["status", "report"] {
        let out = bin()
            .current_dir(&b)
            .args([what, "items.jsonl"])
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{what}: {said}");
        assert!(!said.contains("no job"), "{what}: {said}");
        if what == "status" {
            let shown = String::from_utf8_lossy(&out.stdout);
            let now = std::fs::canonicalize(b.join("items.jsonl")).unwrap();
            assert!(shown.contains(&format!("({})", now.display())), "{shown}");
            assert!(shown.contains("moved:    from "), "{shown}");
        }
    }
    let r = finish(beside(s.sim(), &b.join("items.jsonl")));
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.summary["requests"], 0, "{}", r.summary);
    assert!(!r.stderr.contains("WARNING"), "{}", r.stderr);
    assert_each_item_once(&b.join("items.results.jsonl"), 50);
    assert_side_effects(&s.sim().stats().await, 50);
}

/// A renamed input, and a link of another name to it, are the same job
/// (issue 20: "reached by another path"): found by content, nothing sent
/// twice, the results written beside the name given.
#[tokio::test(flavor = "multi_thread")]
async fn a_renamed_input_and_a_link_of_another_name_keep_the_job() {
    let s = Scenario::new("renamed").with_sim(&["--limit", "none"]);
    let a = s.dir().path().join("a");
    std::fs::create_dir_all(&a).unwrap();
    let input = numbers(s.dir(), "a/items.jsonl", 50);
    let r = finish(beside(s.sim(), &input));
    assert_eq!(r.code, 0, "{}", r.stderr);
    let renamed = a.join("items-2026-12.jsonl");
    std::fs::rename(&input, &renamed).unwrap();
    let r = finish(beside(s.sim(), &renamed));
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.summary["requests"], 0, "{}", r.summary);
    assert_each_item_once(&a.join("items-2026-12.results.jsonl"), 50);
    let link = a.join("latest.jsonl");
    std::os::unix::fs::symlink(&renamed, &link).unwrap();
    let r = finish(beside(s.sim(), &link));
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.summary["requests"], 0, "{}", r.summary);
    assert_each_item_once(&a.join("latest.results.jsonl"), 50);
    // Links in other folders, of the same name and of another (relative):
    // the state dir beside the file they point at is found.
    for (dir, name, to) in [
        ("b", "items-2026-12.jsonl", renamed.clone()),
        (
            "c",
            "other.jsonl",
            std::path::PathBuf::from("../a/items-2026-12.jsonl"),
        ),
    ] {
        std::fs::create_dir_all(s.dir().path().join(dir)).unwrap();
        let link = s.dir().path().join(dir).join(name);
        std::os::unix::fs::symlink(&to, &link).unwrap();
        let r = finish(beside(s.sim(), &link));
        assert_eq!(r.code, 0, "{}", r.stderr);
        assert_eq!(r.summary["requests"], 0, "{dir}: {}", r.summary);
        assert!(r.stderr.contains("a/.batchrun/"), "{}", r.stderr);
    }
    assert_side_effects(&s.sim().stats().await, 50);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_symlinked_release_directory_is_the_same_job() {
    let s = Scenario::new("symlink").with_sim(&["--limit", "none"]);
    for release in ["release-1", "release-2"] {
        std::fs::create_dir_all(s.dir().path().join(release)).unwrap();
        numbers(s.dir(), &format!("{release}/items.jsonl"), 40);
    }
    let current = s.dir().path().join("current");
    let out = s.dir().path().join("results.jsonl");
    let via_current = |release: &str| {
        let _ = std::fs::remove_file(&current);
        std::os::unix::fs::symlink(s.dir().path().join(release), &current).unwrap();
        let mut c = s.cmd_for(&current.join("items.jsonl"), &["--limit", "none"]);
        c.arg("--out").arg(&out);
        finish(c)
    };
    let r = via_current("release-1");
    assert_eq!(r.code, 0, "{}", r.stderr);
    // The next release, the same items: the link now leads elsewhere.
    let r = via_current("release-2");
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.summary["requests"], 0, "{}", r.summary);
    assert_each_item_once(&out, 40);
    assert_side_effects(&s.sim().stats().await, 40);
}

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

/// A file at `--out` that batchrun did not write (no owner record, not
/// its format) is somebody's data: refused before any call, untouched,
/// unless `--force-outputs`. batchrun's own outputs whose owner record is
/// gone (an earlier version's) are still replaced as before.
#[tokio::test(flavor = "multi_thread")]
async fn a_file_batchrun_did_not_write_is_not_replaced_unless_forced() {
    let s = Scenario::new("precious")
        .with_sim(&["--limit", "none"])
        .numbers(5);
    let out = s.dir().path().join("precious.txt");
    std::fs::write(&out, "quarterly figures\n").unwrap();
    let out_arg = out.to_str().unwrap().to_owned();
    let r = s.run(&["--out", &out_arg]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr.contains("does not hold batchrun's outputs"),
        "{}",
        r.stderr
    );
    assert_eq!(std::fs::read(&out).unwrap(), b"quarterly figures\n");
    assert_side_effects(&s.sim().stats().await, 0);
    let r = s.run(&["--out", &out_arg, "--force-outputs"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_each_item_once(&out, 5);
    // An output named by a link is written where the link points.
    let target = s.dir().path().join("kept.jsonl");
    let link = s.dir().path().join("link.jsonl");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let r = s.run(&[
        "--out",
        link.to_str().unwrap(),
        "--limit",
        "none",
        "--fresh",
    ]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(std::fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    assert_each_item_once(&target, 5);
    // Its owner record lost, the job's own outputs are still its own.
    let owner = s.dir().path().join(".precious.txt.owner");
    std::fs::remove_file(&owner).unwrap();
    let r = s.run(&["--out", &out_arg]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.summary["requests"], 0, "{}", r.summary);
    // The forced run's five and the --fresh run's five.
    assert_side_effects(&s.sim().stats().await, 10);
    // Not even forced onto the checkpoint's own files: every result would
    // be lost with it.
    let db = s.state_dir().join("checkpoint").join("db");
    let log = std::fs::read_dir(s.state_dir().join("results"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "log"))
        .unwrap();
    for (flag, p) in [("--out", &db), ("--failures", &log)] {
        let before = std::fs::read(p).unwrap();
        let r = s.run(&[flag, p.to_str().unwrap(), "--force-outputs"]);
        assert_eq!(r.code, 2, "{}", r.stderr);
        assert!(
            r.stderr.contains("is inside the checkpoint"),
            "{}",
            r.stderr
        );
        assert_eq!(std::fs::read(p).unwrap(), before);
    }
    let r = s.run(&["--out", &out_arg]);
    assert_eq!((r.code, &r.summary["requests"]), (0, &serde_json::json!(0)));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_mistyped_rerun_leaves_the_results_byte_identical() {
    let s = Scenario::new("mistyped")
        .with_sim(&["--limit", "none"])
        .numbers(30);
    let r = s.run(&["--limit", "none"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let results = std::fs::read(s.out_path()).unwrap();
    let wrong = format!("{}/v9/echo?n={{n}}", s.sim().url);
    // The request changed under a finished job: nothing is sent.
    let r = s.run(&["--limit", "none", "--url", &wrong]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("URL: GET"), "{}", r.stderr);
    assert_eq!(std::fs::read(s.out_path()).unwrap(), results);
    assert_side_effects(&s.sim().stats().await, 30);
    // A dry run of it says so too.
    let r = s.run(&["--limit", "none", "--url", &wrong, "--dry-run", "1"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stderr.contains("the real run would stop before any call")
            && r.stderr.contains("30 of 30 item(s) done"),
        "{}",
        r.stderr
    );
    // Even told to start over, a run that fails fast replaces nothing.
    let r = s.run(&["--limit", "none", "--url", &wrong, "--fresh"]);
    assert_ne!(r.code, 0, "{}", r.stderr);
    assert!(r.stderr.contains("is left as it was"), "{}", r.stderr);
    assert_eq!(std::fs::read(s.out_path()).unwrap(), results);
}

/// `--fresh` (or `--keep-done`) with a template naming no field, or over a
/// bad row, fails its checks (exit 2, nothing sent) before it changes the
/// checkpoint: the job is still there, and the old command sends nothing
/// again.
#[tokio::test(flavor = "multi_thread")]
async fn a_fresh_that_fails_its_checks_discards_nothing() {
    let s = Scenario::new("fresh-typo")
        .with_sim(&["--limit", "none"])
        .numbers(20);
    let r = s.run(&["--limit", "none"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let typo = format!("{}/v1/echo?n={{nn}}", s.sim().url);
    let r = s.run(&["--limit", "none", "--url", &typo, "--fresh"]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("no field \"nn\""), "{}", r.stderr);
    assert!(!r.stderr.contains("sent again"), "{}", r.stderr);
    assert_eq!(s.status_json().unwrap()[0]["done"], 20);
    // Nor does --keep-done carry the job over to a request that fails.
    let r = s.run(&["--limit", "none", "--url", &typo, "--keep-done"]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(!r.stderr.contains("stay done"), "{}", r.stderr);
    let lines = std::fs::read_to_string(s.input_path()).unwrap();
    std::fs::write(s.input_path(), format!("{lines}{{not json\n")).unwrap();
    let r = s.run(&["--limit", "none", "--fresh"]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains(":21:"), "{}", r.stderr);
    std::fs::write(s.input_path(), lines).unwrap();
    let r = s.run(&["--limit", "none"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.summary["requests"], 0, "{}", r.summary);
    assert_side_effects(&s.sim().stats().await, 20);
}

#[tokio::test(flavor = "multi_thread")]
async fn skip_invalid_records_the_bad_rows_and_runs_the_rest() {
    let mut csv = String::from("n,name\n");
    for n in 1..=10 {
        match n {
            // Two ragged rows: one field too many, one too few.
            4 => csv.push_str("4,d,extra\n"),
            7 => csv.push_str("7\n"),
            _ => csv.push_str(&format!("{n},x{n}\n")),
        }
    }
    let s = Scenario::new("skip-invalid")
        .with_sim(&["--limit", "none"])
        .input("customers.csv", &csv);
    let url = format!("{}/v1/echo?n={{n}}&name={{name}}", s.sim().url);
    let args = ["--limit", "none", "--url", url.as_str()];
    // Without it, one bad row refuses the whole input before any call.
    let r = s.run(&args);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr.contains("customers.csv:5: row has 3 fields"),
        "{}",
        r.stderr
    );
    assert_side_effects(&s.sim().stats().await, 0);

    let r = s.run(&[&args[..], &["--skip-invalid"]].concat());
    assert_eq!(r.code, 3, "{}", r.stderr);
    assert_eq!(
        (r.summary["done"].as_u64(), r.summary["failed"].as_u64()),
        (Some(8), Some(2))
    );
    assert!(
        r.stderr.contains("--skip-invalid: 2 bad row(s)"),
        "{}",
        r.stderr
    );
    let failures = jsonl(&s.failures_path());
    assert_eq!(lines_of(&s.failures_path()), vec![5, 8]);
    let reason = failures[0]["reason"].as_str().unwrap();
    assert!(
        reason.contains("customers.csv:5: row has 3 fields"),
        "{reason}"
    );
    let reason = failures[1]["reason"].as_str().unwrap();
    assert!(
        reason.contains("customers.csv:8: row has 1 field,"),
        "{reason}"
    );
    assert_eq!(lines_of(&s.out_path()), vec![2, 3, 4, 6, 7, 9, 10, 11]);
    assert_side_effects(&s.sim().stats().await, 8);
    // The same command again: nothing is sent, the bad rows stay failed.
    let r = s.run(&[&args[..], &["--skip-invalid"]].concat());
    assert_eq!(
        (r.code, r.summary["requests"].as_u64()),
        (3, Some(0)),
        "{}",
        r.stderr
    );
    assert_eq!(lines_of(&s.failures_path()), vec![5, 8]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_regenerated_file_resends_only_its_changed_rows() {
    let s = Scenario::new("regenerated")
        .with_sim(&["--limit", "none"])
        .numbers(20);
    let r = s.run(&["--limit", "none"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    // The export made again: a row on top, row 5 corrected, one at the end.
    let mut text = String::from("{\"n\": 1000}\n");
    for n in 1..=21 {
        let n = if n == 5 { 500 } else { n };
        text.push_str(&format!("{{\"n\": {n}}}\n"));
    }
    s.dir().write("items.jsonl", &text);
    let r = s.run(&["--limit", "none"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stderr
            .contains("19 item(s) it still holds keep their results"),
        "{}",
        r.stderr
    );
    assert_eq!(r.summary["requests"], 3, "{}", r.summary);
    assert_eq!(r.summary["done"], 22, "{}", r.summary);
    // Every line is paired with its own item's result.
    let out = jsonl(&s.out_path());
    assert_eq!(out.len(), 22);
    for v in &out {
        let n = &v["input"]["n"];
        assert_eq!(
            v["body"]["data"]["n"].as_str(),
            Some(n.to_string().as_str()),
            "{v}"
        );
    }
    assert_side_effects(&s.sim().stats().await, 23);
    // Starting over says what it costs.
    let r = s.run(&["--limit", "none", "--fresh"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stderr
            .contains("--fresh: the 22 item(s) done are sent again"),
        "{}",
        r.stderr
    );
    assert_side_effects(&s.sim().stats().await, 45);
}

/// A regenerated export whose columns (CSV) or keys (JSONL) come in
/// another order holds the same items: a JSON object's keys are unordered,
/// and the requests they render are the same. Only the row that changed
/// is sent, whole or in shards (a row keeps its shard whatever the order
/// of its fields). Before, every row was new and ran again.
#[tokio::test(flavor = "multi_thread")]
async fn a_regenerated_input_with_its_fields_in_another_order_sends_only_what_changed() {
    let csv = |head: &str, row: &dyn Fn(u32) -> String| {
        let rows: String = (1..=12).map(|i| row(i) + "\n").collect();
        format!("{head}\n{rows}")
    };
    let jsonl = |row: &dyn Fn(u32) -> String| (1..=12).map(|i| row(i) + "\n").collect::<String>();
    let cases: [(&str, &str, String, String); 2] = [
        (
            "fields-csv",
            "items.csv",
            csv("n,name,city", &|i| format!("{i},n{i},c{i}")),
            // Columns reordered; row 7's name corrected.
            csv("city,n,name", &|i| {
                let name = if i == 7 {
                    "seven".to_string()
                } else {
                    format!("n{i}")
                };
                format!("c{i},{i},{name}")
            }),
        ),
        (
            "fields-jsonl",
            "items.jsonl",
            jsonl(&|i| format!("{{\"n\": {i}, \"tags\": {{\"a\": 1, \"b\": {i}}}}}")),
            jsonl(&|i| {
                let b = if i == 7 { 70 } else { i };
                format!("{{\"tags\": {{\"b\": {b}, \"a\": 1}}, \"n\": {i}}}")
            }),
        ),
    ];
    for (tag, name, before, after) in cases {
        for shards in [None, Some(2)] {
            let s = Scenario::new(tag)
                .with_sim(&["--limit", "none"])
                .input(name, &before);
            let runs: Vec<Vec<String>> = match shards {
                None => vec![vec![]],
                Some(n) => (1..=n)
                    .map(|i| vec!["--shard".into(), format!("{i}/{n}")])
                    .collect(),
            };
            let run_all = || {
                runs.iter()
                    .map(|extra| {
                        let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
                        let r = s.run(&[&["--limit", "none"][..], &extra].concat());
                        assert_eq!(r.code, 0, "{tag} {shards:?}: {}", r.stderr);
                        r.summary["requests"].as_u64().unwrap()
                    })
                    .sum::<u64>()
            };
            assert_eq!(run_all(), 12, "{tag} {shards:?}");
            // The checkpoint lost: the job made again from its outputs
            // fingerprints as it did (their owner record says how), so every
            // call goes under its old key and the API replays it.
            std::fs::remove_dir_all(s.state_dir()).unwrap();
            assert_eq!(run_all(), 12, "{tag} {shards:?}: sent again");
            assert_side_effects(&s.sim().stats().await, 12);
            s.dir().write(name, &after);
            assert_eq!(run_all(), 1, "{tag} {shards:?}: only the changed row");
            assert_side_effects(&s.sim().stats().await, 13);
        }
    }
}

/// Rewrites the scenario's input as the same numbers with a row on top.
fn with_a_row_on_top(s: &Scenario, n: u64) {
    let mut text = String::from("{\"n\": 1000}\n");
    for i in 1..=n {
        text.push_str(&format!("{{\"n\": {i}}}\n"));
    }
    s.dir().write("items.jsonl", &text);
}

/// Shards of a regenerated input (a row inserted on top): each row keeps
/// its shard wherever its line went, so each shard resumes its own items
/// by content. Split by line, a shard carried its results over to another
/// shard's lines and never sent its own new ones (lost), and the other
/// shard sent them again, in other batches under other keys (run twice).
#[tokio::test(flavor = "multi_thread")]
async fn shards_of_a_regenerated_input_run_every_item_once() {
    for (tag, extra) in [
        ("shards-regen", &[][..]),
        ("shards-regen-batch", &["--batch", "4"][..]),
    ] {
        let s = Scenario::new(tag)
            .with_sim(&["--limit", "none"])
            .numbers(60);
        let url = match extra.is_empty() {
            true => format!("{}/v1/echo?n={{n}}", s.sim().url),
            false => batch_url(&s),
        };
        let args = |i: u64| {
            let mut v = vec![
                "--limit".to_string(),
                "none".into(),
                "--url".into(),
                url.clone(),
            ];
            v.extend([
                "--json-body".to_string(),
                "--shard".into(),
                format!("{i}/3"),
            ]);
            v.extend(extra.iter().map(|a| a.to_string()));
            v
        };
        let run = |i| {
            let a = args(i);
            s.run(&a.iter().map(String::as_str).collect::<Vec<_>>())
        };
        let first = run(1);
        assert_eq!(first.code, 0, "{tag}");
        // A shard's batches hold its own items: nothing to say of them.
        assert!(!first.stderr.contains("blocks of"), "{}", first.stderr);
        with_a_row_on_top(&s, 60);
        for i in 1..=3 {
            let r = run(i);
            assert_eq!(r.code, 0, "{tag} shard {i}: {}", r.stderr);
        }
        let mut seen: Vec<u64> = (1..=3)
            .flat_map(|i| {
                let out = s
                    .dir()
                    .path()
                    .join(format!("items.shard-{i}-of-3.results.jsonl"));
                jsonl(&out)
            })
            .map(|r| r["input"]["n"].as_u64().unwrap())
            .collect();
        seen.sort_unstable();
        let want: Vec<u64> = (1..=60).chain([1000]).collect();
        assert_eq!(seen, want, "{tag}: every row's result, once");
        assert_side_effects(&s.sim().stats().await, 61);
    }
}

/// Calls that may have run keep their Idempotency-Keys when a regenerated
/// input moves their lines (a row inserted on top): the API replays them,
/// and only the new row runs. Items failed with their outcome unknown,
/// sent again by `--retry-failed`; and calls in flight when a run was
/// killed, sent again by the next. Identical rows are still two calls.
#[tokio::test(flavor = "multi_thread")]
async fn calls_that_may_have_run_keep_their_keys_when_lines_move() {
    // Every executed call's answer is lost: its outcome is unknown.
    let s = Scenario::new("moved-unknown")
        .with_sim(&["--limit", "none", "--reset-rate", "1", "--seed", "1"])
        .numbers(10);
    let args = ["--limit", "none", "--max-attempts", "1"];
    let r = s.run(&args);
    assert_eq!(r.summary["failed"], 10, "{}", r.summary);
    assert_side_effects(&s.sim().stats().await, 10);
    with_a_row_on_top(&s, 10);
    let r = s.run(&[&args[..], &["--retry-failed"]].concat());
    assert_eq!(r.summary["done"], 10, "{}", r.summary);
    let stats = s.sim().stats().await;
    assert_eq!(stats["idempotent_replays"], 10, "{stats}");
    assert_side_effects(&stats, 11);

    let s = Scenario::new("moved-killed")
        .with_sim(&["--limit", "none", "--reset-rate", "1", "--seed", "2"])
        .numbers(10);
    let killed = s
        .signal_when(
            &["--limit", "none"],
            |st| st["side_effects"] == 10,
            libc::SIGKILL,
        )
        .await;
    assert_ne!(killed.code, 0, "{}", killed.stderr);
    with_a_row_on_top(&s, 10);
    let r = s.run(&["--limit", "none"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.summary["done"], 11, "{}", r.summary);
    assert_side_effects(&s.sim().stats().await, 11);

    // Two rows of one content are two calls, under two keys.
    let s = Scenario::new("twice")
        .with_sim(&["--limit", "none"])
        .input("items.jsonl", "{\"n\": 1}\n{\"n\": 1}\n");
    let r = s.run(&["--limit", "none"]);
    assert_eq!(r.summary["done"], 2, "{}", r.summary);
    assert_side_effects(&s.sim().stats().await, 2);
}

/// A regenerated input after calls that may have run, the hard cases:
/// items retried under a generation of their own keep it (a 503 under the
/// first key was never stored: that key would run the call again); rows of
/// one content, some still in flight when the run was killed, are not
/// paired with another row's result (one would never run); and batches,
/// formed from blocks of lines that moved, are refused.
#[tokio::test(flavor = "multi_thread")]
async fn a_regenerated_input_never_runs_a_call_twice_nor_loses_one() {
    // Half the calls 503 (known: a new key when retried), the rest run
    // and lose their answer (unknown: the same key).
    let s = Scenario::new("regen-generations")
        .with_sim(&[
            "--limit",
            "none",
            "--fail-rate",
            "0.5",
            "--reset-rate",
            "1",
            "--seed",
            "7",
        ])
        .numbers(20);
    let args = ["--limit", "none", "--max-attempts", "1"];
    s.run(&args);
    s.run(&[&args[..], &["--retry-failed"]].concat());
    with_a_row_on_top(&s, 20);
    for _ in 0..12 {
        let r = s.run(&[&args[..], &["--retry-failed"]].concat());
        if r.summary["done"] == 21 {
            break;
        }
    }
    let st = s.status_json().unwrap();
    assert_eq!(st[0]["done"], 21, "{st}");
    assert_side_effects(&s.sim().stats().await, 21);

    // Each content twice, killed with calls in flight, a row on top.
    let mut text = String::new();
    for i in 1..=30 {
        text.push_str(&format!("{{\"n\": {i}}}\n{{\"n\": {i}}}\n"));
    }
    let s = Scenario::new("regen-twice")
        .with_sim(&[
            "--limit",
            "none",
            "--latency",
            "50ms..1500ms",
            "--seed",
            "3",
        ])
        .input("items.jsonl", &text);
    let killed = s
        .signal_when(
            &["--limit", "none", "-c", "8"],
            |st| st["side_effects"].as_u64() >= Some(20),
            libc::SIGKILL,
        )
        .await;
    assert_ne!(killed.code, 0, "{}", killed.stderr);
    s.dir()
        .write("items.jsonl", &format!("{{\"n\": 0}}\n{text}"));
    let r = s.run(&["--limit", "none", "-c", "8"]);
    assert_eq!(r.summary["done"], 61, "{}", r.summary);
    assert_side_effects(&s.sim().stats().await, 61);

    // Batches: refused after a kill.
    let s = Scenario::new("regen-batches")
        .with_sim(&[
            "--limit",
            "none",
            "--latency",
            "300ms",
            "--reset-rate",
            "1",
            "--seed",
            "1",
        ])
        .numbers(40);
    let url = batch_url(&s);
    let batched = [
        "--url",
        &url,
        "--json-body",
        "--limit",
        "none",
        "--batch",
        "5",
        "-c",
        "4",
    ];
    let killed = s
        .signal_when(
            &batched,
            |st| st["side_effects"].as_u64() >= Some(10),
            libc::SIGKILL,
        )
        .await;
    assert_ne!(killed.code, 0, "{}", killed.stderr);
    with_a_row_on_top(&s, 40);
    let r = s.run(&batched);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("may have run in batches"), "{}", r.stderr);
}

#[tokio::test(flavor = "multi_thread")]
async fn fresh_after_a_changed_url_says_what_it_resends_and_replaces_the_old_job() {
    let s = Scenario::new("fresh-changed")
        .with_sim(&["--limit", "none"])
        .numbers(12);
    let r = s.run(&["--limit", "none"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let other = format!("{}/v1/other?n={{n}}", s.sim().url);
    let r = s.run(&["--limit", "none", "--url", &other, "--fresh"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stderr
            .contains("the 12 item(s) done under the earlier request"),
        "{}",
        r.stderr
    );
    assert_eq!(r.summary["requests"], 12, "{}", r.summary);
    // Nothing left of the old job to stop the next run of this command.
    let r = s.run(&["--limit", "none", "--url", &other]);
    assert_eq!(
        (r.code, r.summary["requests"].as_u64()),
        (0, Some(0)),
        "{}",
        r.stderr
    );
    assert_side_effects(&s.sim().stats().await, 24);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_new_job_on_the_same_api_starts_from_the_window_the_last_one_left() {
    let s = Scenario::new("window-carried")
        .with_sim(&["--limit", "10/2s", "--cooldown", "1s"])
        .numbers(10);
    let args = ["--limit", "10/2s", "--concurrency", "5"];
    // The first job fills the window.
    let r = s.run(&args);
    assert_eq!(r.code, 0, "{}", r.stderr);
    // A changed command's new job, at once: it waits for the window
    // instead of meeting the server's 429s.
    let r = s.run(&[&args[..], &["--header", "X-Trace: nightly", "--fresh"]].concat());
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.summary["rate_limited"], 0, "{}", r.summary);
    let stats = s.sim().stats().await;
    assert_eq!(stats["rejected_rate"], 0, "{stats}");
    assert_eq!(stats["max_in_window"], 10, "{stats}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_changed_command_from_another_directory_is_still_stopped() {
    let s = Scenario::new("changed-cwd")
        .with_sim(&["--limit", "none"])
        .numbers(8);
    let r = s.run(&["--limit", "none"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    // The same outputs, named relative to the input's directory this time.
    let mut c = s.cmd_for(
        Path::new("items.jsonl"),
        &["--limit", "none", "--header", "X-Trace: nightly"],
    );
    c.current_dir(s.dir().path());
    let r = finish(c);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr.contains("header X-Trace: nightly (added)"),
        "{}",
        r.stderr
    );
    assert_side_effects(&s.sim().stats().await, 8);
}

/// An input run as shards, then run whole (`--shard` dropped) or as shards
/// of another count, would start a job of its own in that layout and send
/// every done item again: it stops before any call and says where they
/// were done; `--fresh` sends them again on purpose.
#[tokio::test(flavor = "multi_thread")]
async fn a_sharded_job_run_in_another_layout_sends_nothing_again() {
    let s = Scenario::new("layouts")
        .with_sim(&["--limit", "none"])
        .numbers(12);
    for i in 1..=3 {
        let r = s.run(&["--limit", "100/1s", "--shard", &format!("{i}/3")]);
        assert_eq!(r.code, 0, "{}", r.stderr);
    }
    assert_side_effects(&s.sim().stats().await, 12);
    for other in [&[][..], &["--shard", "1/2"][..]] {
        let mut args = vec!["--limit", "100/1s"];
        args.extend(other);
        let r = s.run(&args);
        assert_eq!(r.code, 2, "{other:?}: {}", r.stderr);
        assert!(
            r.stderr.contains("item(s) done as shard 2/3")
                && r.stderr.contains("12 item(s) again")
                && r.stderr.contains("Nothing was sent"),
            "{other:?}: {}",
            r.stderr
        );
    }
    assert_side_effects(&s.sim().stats().await, 12);
    let r = s.run(&["--limit", "100/1s", "--fresh"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.summary["requests"], 12, "{}", r.summary);
}

/// A shard killed with its first batches in flight (nothing recorded
/// done), then the input run whole: that layout's job would form other
/// batches, under other keys, of calls that may have run. Refused.
#[tokio::test(flavor = "multi_thread")]
async fn a_killed_shard_with_calls_in_flight_stops_another_layout() {
    let s = Scenario::new("layout-killed")
        .with_sim(&["--limit", "none", "--latency", "2s", "--keep-working"])
        .numbers(40);
    let url = batch_url(&s);
    let args = [
        "--limit",
        "none",
        "--url",
        &url,
        "--json-body",
        "--batch",
        "5",
    ];
    let shard = s.cmd(&[&args[..], &["--shard", "1/2"]].concat());
    let killed = act_when(
        shard,
        s.sim(),
        |st| st["in_flight"].as_u64() >= Some(1),
        |pid| {
            // SAFETY: a signal to our own child.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        },
    )
    .await;
    assert_ne!(killed.code, 0);
    let before = s.sim().stats().await["requests"].clone();
    let r = s.run(&args);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr.contains("with calls that may have run"),
        "{}",
        r.stderr
    );
    assert_eq!(
        s.sim().stats().await["requests"],
        before,
        "nothing sent whole"
    );
}

/// A shard running now holds its checkpoint: a run of the same input in
/// another layout cannot read what it has done, and would send it all
/// again; it stops before any call, naming the shard that runs.
#[tokio::test(flavor = "multi_thread")]
async fn a_run_in_another_layout_while_a_shard_runs_sends_nothing() {
    let s = Scenario::new("layout-running")
        .with_sim(&["--limit", "none", "--latency", "100ms"])
        .numbers(20);
    let shard = s.cmd(&["--limit", "100/1s", "-c", "1", "--shard", "1/2"]);
    let mut whole = None;
    let r = act_when(
        shard,
        s.sim(),
        |st| st["requests"].as_u64() >= Some(1),
        |_| {
            whole = Some(s.run(&["--limit", "100/1s"]));
        },
    )
    .await;
    assert_eq!(r.code, 0, "the shard: {}", r.stderr);
    let whole = whole.expect("ran while the shard ran");
    assert_eq!(whole.code, 2, "{}", whole.stderr);
    assert!(
        whole.stderr.contains("running now as shard 1/2"),
        "{}",
        whole.stderr
    );
    // Only the shard's own items ran (about half: shards follow content).
    let done = r.summary["done"].as_u64().unwrap();
    assert!((1..20).contains(&done), "{}", r.summary);
    assert_side_effects(&s.sim().stats().await, done);
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
