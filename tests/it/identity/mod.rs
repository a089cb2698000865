//! The everyday reruns: a changed command, a moved input, a pipe again.
//! A job is what it sends, wherever it lives, and its outputs are its own.

mod pipes;
mod regenerated;

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

/// A call of unknown outcome sent again by `--retry-failed` after its input
/// was regenerated with the fields in another order (JSONL keys, CSV
/// columns), the item being the body (`--json-body`): the same call under
/// the same key, which the API replays. Its key was the body's as sent,
/// and every such call ran twice.
#[tokio::test(flavor = "multi_thread")]
async fn a_json_body_with_its_fields_in_another_order_keeps_its_key() {
    let cases = [
        (
            "order-jsonl",
            "items.jsonl",
            "{\"id\":1,\"name\":\"a\"}\n{\"id\":2,\"name\":\"b\"}\n",
            "{\"name\":\"a\",\"id\":1}\n{\"name\":\"b\",\"id\":2}\n",
        ),
        (
            "order-csv",
            "items.csv",
            "id,name\n1,a\n2,b\n",
            "name,id\na,1\nb,2\n",
        ),
    ];
    for (tag, name, before, after) in cases {
        let s = Scenario::new(tag)
            .with_sim(&["--limit", "none", "--reset-rate", "1", "--seed", "1"])
            .input(name, before);
        let url = format!("{}/v1/echo", s.sim().url);
        let args = [
            "--limit",
            "none",
            "--max-attempts",
            "1",
            "--json-body",
            "--url",
            &url,
        ];
        let r = s.run(&args);
        assert_eq!(r.summary["failed"], 2, "{tag}: {}", r.summary);
        s.dir().write(name, after);
        let r = s.run(&[&args[..], &["--retry-failed"]].concat());
        assert_eq!(r.summary["done"], 2, "{tag}: {}", r.stderr);
        let stats = s.sim().stats().await;
        assert_eq!(stats["idempotent_replays"], 2, "{tag}: {stats}");
        assert_side_effects(&stats, 2);
    }
}
