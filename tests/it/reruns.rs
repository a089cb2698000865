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
