//! Crash safety at scale: a job killed with SIGKILL at three random points
//! still ends with every item done exactly once.
//!
//! Where each kill lands relative to a group commit (before the results
//! log is written, between the log and the sled transaction, after it) is
//! left to chance: the points are random, and a failure prints the seed to
//! replay them with `BATCHRUN_KILL_SEED`. What is checked after each kill:
//! the kill came mid-run, the checkpoint never holds more items than the
//! server performed (nothing is "done" that was not called) and never fewer
//! than after the previous kill (nothing committed is lost). At the end: the
//! results hold every line once, in input order, each with the body the
//! server returned for that very item, and the server performed each item's
//! side effect exactly once however many times it was sent.

use crate::common::*;

/// Items in the job: the 200k the issue names, hundreds of group commits
/// and more between two kills; a debug build runs the test in about 20 s.
const ITEMS: u64 = 200_000;

/// `batchrun status --json` for the scenario's job (the array has one).
fn status(s: &Scenario) -> serde_json::Value {
    s.status_json().unwrap_or_else(|e| panic!("{e}"))[0].clone()
}

#[tokio::test(flavor = "multi_thread")]
async fn killed_three_times_at_random_points_every_item_is_done_exactly_once() {
    let seed = std::env::var("BATCHRUN_KILL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..));
    let mut rng = fastrand::Rng::with_seed(seed);
    let s = Scenario::new("kill3x")
        .with_sim(&[
            "--limit",
            "none",
            "--concurrency",
            "1000",
            "--credits",
            "10000000",
        ])
        .numbers(ITEMS);
    let sim = s.sim();
    let args = ["--limit", "none", "--concurrency", "32"];
    let mut recorded_before = 0;
    for k in 0..3 {
        // Kill k lands at a random point of the k-th stretch of 5%..86%.
        let at = rng.u64(ITEMS * (5 + 27 * k) / 100..ITEMS * (5 + 27 * (k + 1)) / 100);
        let mut child = s.spawn_quiet(&args);
        wait_for_stats(sim, 60, |st| st["side_effects"].as_u64().unwrap_or(0) >= at).await;
        child.kill().unwrap(); // SIGKILL: nothing is flushed on the way out
        child.wait().unwrap();
        let performed = sim.stats().await["side_effects"].as_u64().unwrap();
        assert!(
            performed < ITEMS,
            "seed {seed}: kill {k} came after the job had finished"
        );
        let st = status(&s);
        let recorded = st["done"].as_u64().unwrap() + st["failed"].as_u64().unwrap();
        assert!(
            recorded <= performed,
            "seed {seed}: after kill {k} the checkpoint holds {recorded} items, \
             the server performed only {performed}"
        );
        assert!(
            recorded >= recorded_before,
            "seed {seed}: kill {k} lost committed items ({recorded_before} -> {recorded})"
        );
        recorded_before = recorded;
    }

    let r = s.run(&args);
    assert_eq!(r.code, 0, "seed {seed}: {}", r.stderr);
    assert_eq!(r.summary["done"], ITEMS, "seed {seed}: {}", r.summary);
    let out = s.out_path();
    assert_each_item_once(&out, ITEMS);
    for v in jsonl(&out) {
        // numbers(n) puts {"n": i} on line i; the echo endpoint returns n.
        let line = v["line"].as_u64().unwrap();
        assert_eq!(
            v["body"]["data"]["n"].as_str(),
            Some(line.to_string().as_str()),
            "seed {seed}: line {line} holds another item's body: {v}"
        );
    }
    assert_side_effects(&sim.stats().await, ITEMS);
}
