//! A batch size changed between runs: calls of unknown outcome are never
//! sent again under other keys.

use super::*;

/// A batch's Idempotency-Key is made of its items': a rerun that forms its
/// batches otherwise while calls may have run unanswered would send those
/// items under other keys, and the API would run them twice. It is refused
/// before any call: after items failed with their outcome unknown (sent
/// again by `--retry-failed`), and after a run killed with calls in flight.
/// Run as before, the calls go under their old keys and nothing runs twice.
#[tokio::test(flavor = "multi_thread")]
async fn a_changed_batch_size_never_sends_calls_of_unknown_outcome_again() {
    // Every executed call's connection drops: its outcome is unknown.
    let s = Scenario::new("rerun-batch-size")
        .with_sim(&["--limit", "none", "--reset-rate", "1", "--seed", "1"])
        .numbers(10);
    let url = batch_url(&s);
    let run = |size: &str, extra: &[&str]| {
        let args = [
            &[
                "--url",
                &url,
                "--json-body",
                "--limit",
                "none",
                "--max-attempts",
                "1",
            ][..],
            &["--batch", size],
            extra,
        ]
        .concat();
        s.run(&args)
    };
    let r = run("5", &[]);
    assert_eq!(r.summary["failed"], 10, "{}", r.summary);
    assert_side_effects(&s.sim().stats().await, 10);
    // Not sent by this run, still refused: a run that took the new
    // batching would let a later --retry-failed by.
    let r = run("4", &[]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    let r = run("4", &["--retry-failed"]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr
            .contains("10 item(s) failed with their outcome unknown")
            && r.stderr.contains("in batches (--batch 5)")
            && r.stderr.contains("Nothing was sent"),
        "{}",
        r.stderr
    );
    // One item per call is another way of forming them too.
    let r = s.run(&[
        "--url",
        &url,
        "--json-body",
        "--limit",
        "none",
        "--retry-failed",
    ]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("one item per call"), "{}", r.stderr);
    let stats = s.sim().stats().await;
    assert_eq!(stats["requests"], 2, "nothing sent: {stats}");
    // As before: the same batches, replayed (a replay's answer is not
    // lost), never run again.
    let r = run("5", &["--retry-failed"]);
    assert_eq!(r.summary["requests"], 2, "{}", r.summary);
    assert_eq!(r.summary["done"], 10, "{}", r.summary);
    let stats = s.sim().stats().await;
    assert_side_effects(&stats, 10);
    assert_eq!(stats["idempotent_replays"], 10, "{stats}");
}

/// Killed while its batches are retried (each answer lost), then run in
/// batches of another size: refused; as before: the old keys.
#[tokio::test(flavor = "multi_thread")]
async fn a_batch_size_changed_after_a_kill_is_refused_and_the_old_keys_go_again() {
    let s = Scenario::new("rerun-batch-killed")
        .with_sim(&["--limit", "none", "--reset-rate", "1", "--seed", "2"])
        .numbers(10);
    let url = batch_url(&s);
    let args = |size: &'static str| {
        vec![
            "--url".to_string(),
            url.clone(),
            "--json-body".into(),
            "--limit".into(),
            "none".into(),
            "--batch".into(),
            size.into(),
        ]
    };
    let five = args("5");
    let first: Vec<&str> = five.iter().map(String::as_str).collect();
    let killed = s
        .signal_when(&first, |st| st["side_effects"] == 10, libc::SIGKILL)
        .await;
    assert_ne!(killed.code, 0, "{}", killed.stderr);
    let other = args("10");
    let other: Vec<&str> = other.iter().map(String::as_str).collect();
    let r = s.run(&[&other[..], &["--max-attempts", "1"]].concat());
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr.contains("a run of this job was killed"),
        "{}",
        r.stderr
    );
    assert_side_effects(&s.sim().stats().await, 10);
    let r = s.run(&[&first[..], &["--max-attempts", "1"]].concat());
    assert_ne!(r.code, 2, "{}", r.stderr);
    assert_side_effects(&s.sim().stats().await, 10);
}

/// Rows appended while the last block's batch is of unknown outcome would
/// join it under another key: refused until it settles.
#[tokio::test(flavor = "multi_thread")]
async fn rows_appended_to_a_batch_of_unknown_outcome_are_refused() {
    let s = Scenario::new("rerun-batch-grown")
        .with_sim(&["--limit", "none", "--reset-rate", "1", "--seed", "3"])
        .numbers(7);
    let url = batch_url(&s);
    let args = [
        "--url",
        &url,
        "--json-body",
        "--limit",
        "none",
        "--batch",
        "5",
        "--max-attempts",
        "1",
    ];
    let r = s.run(&args);
    assert_eq!(r.summary["failed"], 7, "{}", r.summary);
    s.append_numbers(8..=8);
    let r = s.run(&[&args[..], &["--retry-failed"]].concat());
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr
            .contains("grew while calls of this job may have run in batches"),
        "{}",
        r.stderr
    );
    assert_side_effects(&s.sim().stats().await, 7);
}

/// `--keep-done` sends the pending items under the changed request's keys:
/// after a run killed with calls in flight (which may have run under the
/// earlier request's keys), it is refused before any call; run as before,
/// the job settles, and the change is then taken.
#[tokio::test(flavor = "multi_thread")]
async fn keep_done_after_a_killed_run_is_refused_until_it_settles() {
    let s = Scenario::new("keep-done-killed")
        .with_sim(&["--limit", "none", "--latency", "300ms"])
        .numbers(20);
    let before = ["--limit", "none", "-H", "X-Source: a"];
    let killed = s
        .signal_when(
            &before,
            |st| st["side_effects"].as_u64() >= Some(4),
            libc::SIGKILL,
        )
        .await;
    assert_ne!(killed.code, 0, "{}", killed.stderr);
    let after = ["--limit", "none", "-H", "X-Source: b", "--keep-done"];
    let r = s.run(&after);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr.contains("was killed with items pending"),
        "{}",
        r.stderr
    );
    // Without --keep-done too: the killed run finished nothing, and a job
    // that finished nothing is otherwise replaced.
    let r = s.run(&["--limit", "none", "-H", "X-Source: b"]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    let r = s.run(&before);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_side_effects(&s.sim().stats().await, 20);
    let r = s.run(&after);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_side_effects(&s.sim().stats().await, 20);
}

/// A run halted because its calls timed out (every call runs 1.5 s at the
/// server, which keeps working; the client gives up at 0.3 s): its items
/// stay pending, but the calls may have run. A rerun that forms its
/// batches otherwise, or changes the request with --keep-done, would send
/// them under other keys: refused before any call, as after a kill. Run
/// as before, each item runs once. Before, only calls abandoned at a stop
/// marked the job unsettled: a changed batch size ran 20 items 30 times.
#[tokio::test(flavor = "multi_thread")]
async fn a_rerun_after_a_timeout_halt_never_sends_its_calls_under_other_keys() {
    let s = Scenario::new("rerun-after-timeouts")
        .with_sim(&["--limit", "none", "--latency", "1500ms", "--keep-working"])
        .numbers(20);
    let url = batch_url(&s);
    let args = |size: &str, timeout: &str, extra: &[&str]| -> Vec<String> {
        let base = [
            "--url",
            &url,
            "--json-body",
            "--limit",
            "none",
            "-c",
            "2",
            "--batch",
            size,
            "--timeout",
            timeout,
        ];
        base.iter().chain(extra).map(|a| a.to_string()).collect()
    };
    let run = |a: Vec<String>| s.run(&a.iter().map(String::as_str).collect::<Vec<_>>());
    let halted = run(args("5", "300ms", &[]));
    assert_eq!(halted.code, 75, "{}", halted.stderr);
    assert_eq!(halted.summary["done"], 0, "{}", halted.summary);
    // The calls it gave up on finish at the server.
    let mut stats = s.sim().stats().await;
    for _ in 0..200 {
        if stats["in_flight"] == 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        stats = s.sim().stats().await;
    }
    assert_eq!(stats["in_flight"], 0, "{stats}");
    let ran = stats["side_effects"].as_u64().unwrap();
    assert!(ran > 0, "no call ran at the server");

    let other_size = run(args("4", "5s", &[]));
    assert_eq!(other_size.code, 2, "{}", other_size.stderr);
    let keep_done = run(args("5", "5s", &["-H", "X-Run: 2", "--keep-done"]));
    assert_eq!(keep_done.code, 2, "{}", keep_done.stderr);
    assert!(
        keep_done.stderr.contains("Nothing was sent"),
        "{}",
        keep_done.stderr
    );
    assert_side_effects(&s.sim().stats().await, ran);

    let settled = run(args("5", "5s", &[]));
    assert_eq!(settled.code, 0, "{}", settled.stderr);
    assert_side_effects(&s.sim().stats().await, 20);
}

/// Connections reset after the server ran two calls, each item retried
/// under its key and answered, then a halt (credits out) with items
/// pending: nothing is in doubt, so a changed request with --keep-done is
/// taken (it halts on the credits again), where a review found it refused
/// for good: every timeout or lost connection of the run marked the job
/// unsettled, though its item had finished.
#[tokio::test(flavor = "multi_thread")]
async fn a_lost_answer_retried_and_answered_leaves_nothing_unsettled() {
    let s = Scenario::new("retried-answered")
        .with_sim(&[
            "--limit",
            "none",
            "--reset-rate",
            "0.3",
            "--seed",
            "3",
            "--credits",
            "12",
        ])
        .numbers(20);
    let r = s.run(&["--limit", "none", "-c", "1"]);
    assert_eq!(r.code, 75, "{}", r.stderr);
    assert!(
        r.summary["status_counts"]["transport_error"].as_u64() >= Some(1),
        "no connection was lost: {}",
        r.summary
    );
    let r = s.run(&[
        "--limit",
        "none",
        "-c",
        "1",
        "-H",
        "X-Run: 2",
        "--keep-done",
    ]);
    assert_eq!(r.code, 75, "{}", r.stderr);
    assert_side_effects(&s.sim().stats().await, 12);
}

/// Items failed with their outcome unknown (their connection reset after
/// the server ran them, one attempt allowed) may have run under the
/// earlier request's keys: --keep-done on a changed request, which would
/// send them under its own with --retry-failed, is refused before any
/// call. Retried with the earlier request, they settle (the API replays
/// them) and the change is then taken. A review found them run twice.
#[tokio::test(flavor = "multi_thread")]
async fn keep_done_never_sends_items_of_unknown_outcome_under_new_keys() {
    let s = Scenario::new("keep-done-unknown")
        .with_sim(&["--limit", "none", "--reset-rate", "0.2", "--seed", "2"])
        .numbers(20);
    let earlier = ["--limit", "none", "--max-attempts", "1"];
    let r = s.run(&earlier);
    assert_eq!(r.code, 3, "{}", r.stderr);
    assert!(r.summary["failed"].as_u64() >= Some(1), "{}", r.summary);
    let changed = [&earlier[..], &["-H", "X-Tag: v2", "--keep-done"]].concat();
    let r = s.run(&[&changed[..], &["--retry-failed"]].concat());
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr.contains("failed with their outcome unknown"),
        "{}",
        r.stderr
    );
    assert_side_effects(&s.sim().stats().await, 20);
    let r = s.run(&["--limit", "none", "--max-attempts", "9", "--retry-failed"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let r = s.run(&changed);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_side_effects(&s.sim().stats().await, 20);
}
