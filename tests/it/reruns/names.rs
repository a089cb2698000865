//! Inputs of one file name and one `--state-dir`.

use crate::common::*;

/// Two inputs named alike in two folders (a cron job's dated folders)
/// and one `--state-dir`: the second, while the first is still there, is
/// refused before it sends anything, and the first's job is left as it
/// was. It was taken for the first regenerated: the first's 100 results
/// left the checkpoint, and a rerun of the first sent them all again.
/// Moved, the first's job resumes from its new folder as ever.
#[tokio::test(flavor = "multi_thread")]
async fn a_state_dir_shared_by_two_inputs_of_one_name_refuses_the_second() {
    let s = Scenario::new("one-name").with_sim(&["--limit", "none"]);
    for d in ["d1", "d2"] {
        std::fs::create_dir_all(s.dir().path().join(d)).unwrap();
    }
    let d1 = numbers(s.dir(), "d1/items.jsonl", 10);
    let d2 = numbers(s.dir(), "d2/items.jsonl", 12);
    let first = s.run_for(&d1, &["--limit", "none"]);
    assert_eq!(first.code, 0, "{}", first.stderr);
    let second = s.run_for(&d2, &["--limit", "none"]);
    assert_eq!(second.code, 2, "{}", second.stderr);
    assert!(
        second.stderr.contains("another file named items.jsonl"),
        "{}",
        second.stderr
    );
    let again = s.run_for(&d1, &["--limit", "none"]);
    assert_eq!(again.code, 0, "{}", again.stderr);
    assert_eq!(again.summary["requests"], 0, "{}", again.summary);
    assert_side_effects(&s.sim().stats().await, 10);
    // The first moved into a new folder: the same job, nothing sent.
    std::fs::create_dir_all(s.dir().path().join("d3")).unwrap();
    let d3 = s.dir().path().join("d3/items.jsonl");
    std::fs::rename(&d1, &d3).unwrap();
    let moved = s.run_for(&d3, &["--limit", "none"]);
    assert_eq!(moved.code, 0, "{}", moved.stderr);
    assert_eq!(moved.summary["requests"], 0, "{}", moved.summary);
    assert_side_effects(&s.sim().stats().await, 10);
}
