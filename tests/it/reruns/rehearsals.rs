//! Rehearsals with `--sim`: nothing leaves the machine, nothing of the real
//! job is touched, and a real run replaces a rehearsal's outputs.

use super::*;

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

/// A rehearsal (`--sim`) of a half-done real job keeps a job of its own:
/// it is refused the real job's outputs before any call, with or without
/// `--keep-done` or `--fresh` (which once carried the real job over to the
/// sim, marking done items the API never ran, or discarded it); given its
/// own outputs it rehearses every item; and the real run then sends its
/// pending items to the API, each once.
#[tokio::test(flavor = "multi_thread")]
async fn a_rehearsal_of_a_half_done_job_never_touches_the_real_one() {
    let s = Scenario::new("rehearse-half")
        .with_sim(&["--credits", "10"])
        .numbers(20);
    let limit = ["--limit", "1000/1s"];
    assert_eq!(s.run(&limit).code, 75, "the real job halts half done");
    for flag in [None, Some("--keep-done"), Some("--fresh")] {
        let mut args = vec!["--sim", "--limit", "1000/1s"];
        args.extend(flag);
        let r = s.run(&args);
        assert_eq!(r.code, 2, "{flag:?}: {}", r.stderr);
        assert!(
            r.stderr.contains("holds the outputs of another job"),
            "{flag:?}: {}",
            r.stderr
        );
    }
    let own = s.dir().path().join("rehearsal.jsonl");
    let own_failures = s.dir().path().join("rehearsal.failures.jsonl");
    let mut rehearse = s.cmd(&["--sim", "--limit", "1000/1s"]);
    rehearse
        .arg("--out")
        .arg(&own)
        .arg("--failures")
        .arg(&own_failures);
    let r = finish(rehearse);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(jsonl(&own).len(), 20, "the rehearsal ran every item");
    s.sim().topup(100).await;
    let r = s.run(&limit);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.summary["requests"], 10, "{}", r.summary);
    assert_side_effects(&s.sim().stats().await, 20);
    assert_each_item_once(&s.out_path(), 20);
}

/// A wrong limit is the command's error (exit 2) with `--sim` as without:
/// the built-in sim is started with the command's limits only once they
/// are checked.
#[test]
fn a_wrong_limit_is_a_usage_error_with_sim_too() {
    let dir = TempDir::new("sim-usage");
    let input = numbers(&dir, "items.jsonl", 3);
    for sim in [true, false] {
        let mut c = bin();
        c.arg(&input).args(["--limit", "none", "--limit", "10/1s"]);
        match sim {
            true => c.arg("--sim"),
            false => c.args(["--url", "http://127.0.0.1:9/v1/echo"]),
        };
        let out = c.env("BATCHRUN_API_KEY", KEY).output().unwrap();
        let said = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "--sim {sim}: {said}");
        assert!(said.contains("cannot be combined"), "--sim {sim}: {said}");
    }
}

/// Rehearse, then run for real, with the same outputs: the real run
/// replaces the rehearsal's results (the sim's answers) and says so, and
/// sends every item to the API once; a rehearsal never replaces a real
/// run's results.
#[tokio::test(flavor = "multi_thread")]
async fn a_real_run_replaces_its_rehearsals_outputs() {
    let s = Scenario::new("rehearse-then-real")
        .with_sim(&["--limit", "none"])
        .numbers(12);
    let r = s.run(&["--sim", "--limit", "1000/1s"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let r = s.run(&["--limit", "1000/1s"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stderr.contains("held a rehearsal's results"),
        "{}",
        r.stderr
    );
    assert!(!r.stderr.contains("--force-outputs"), "{}", r.stderr);
    assert_side_effects(&s.sim().stats().await, 12);
    assert_each_item_once(&s.out_path(), 12);
    let r = s.run(&["--sim", "--limit", "1000/1s"]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr.contains("holds the outputs of another job"),
        "{}",
        r.stderr
    );
}
