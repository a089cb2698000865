//! A shard's batches (`--batch N --shard I/M`): N of its own items a call,
//! formed again under the same keys after kill -9; a shard's job begun
//! with batches of blocks of input lines keeps them while calls so formed
//! may be unsettled.

use std::collections::BTreeSet;

use crate::common::*;

/// The arguments of shard `i` of 3 in batches of `n` on the sim's batch
/// endpoint, with no limit.
fn shard_args(s: &Scenario, i: u64, n: u64) -> Vec<String> {
    [
        "--url",
        &batch_url(s),
        "--json-body",
        "--batch",
        &n.to_string(),
        "--shard",
        &format!("{i}/3"),
        "--limit",
        "none",
        "-c",
        "4",
    ]
    .map(String::from)
    .to_vec()
}

fn run_shard(s: &Scenario, args: &[String]) -> Finished {
    s.run(&args.iter().map(String::as_str).collect::<Vec<_>>())
}

/// The `n` of every result of shard `i` of 3, in the order written.
fn shard_results(s: &Scenario, i: u64) -> Vec<u64> {
    shard_output(s, i, "results")
}

/// The `n` of every line of shard `i`'s output `kind`, in the order written.
fn shard_output(s: &Scenario, i: u64, kind: &str) -> Vec<u64> {
    let out = s
        .dir()
        .path()
        .join(format!("items.shard-{i}-of-3.{kind}.jsonl"));
    jsonl(&out)
        .iter()
        .map(|r| r["input"]["n"].as_u64().unwrap())
        .collect()
}

async fn requests(s: &Scenario) -> u64 {
    s.sim().stats().await["requests"].as_u64().unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_shards_batches_hold_n_of_its_own_items() {
    let s = Scenario::new("shard-batches")
        .with_sim(&["--limit", "none"])
        .numbers(120);
    let r = run_shard(&s, &shard_args(&s, 1, 10));
    assert_eq!(r.code, 0, "{}", r.stderr);
    let mine = shard_results(&s, 1);
    let k = mine.len() as u64;
    // Split by content: about a third of the items, and more than a batch.
    assert!((20..=60).contains(&k), "{k} items in shard 1 of 3");
    let stats = s.sim().stats().await;
    // Every call but the last carries 10 of the shard's items (blocks of
    // 10 input lines held about 3 of them: about 12 calls).
    assert_eq!(stats["requests"], k.div_ceil(10), "{k} items: {stats}");
    assert_side_effects(&stats, k);
    assert!(!r.stderr.contains("blocks of"), "{}", r.stderr);
}

#[tokio::test(flavor = "multi_thread")]
async fn kill_9_then_resume_runs_each_of_a_shards_items_once() {
    const ITEMS: u64 = 1200;
    // Every 37th item is refused: it fails in its batch while the rest of
    // the batch is done.
    let refused: Vec<String> = (1..=ITEMS / 37).map(|k| format!("n={}", 37 * k)).collect();
    let mut sim = vec!["--limit", "none", "--concurrency", "64"];
    sim.extend(["--latency", "20ms..80ms"]);
    sim.extend(refused.iter().flat_map(|r| ["--refuse", r.as_str()]));
    let s = Scenario::new("shard-batch-kills")
        .with_sim(&sim)
        .numbers(ITEMS);
    let first = shard_args(&s, 1, 20);
    let args: Vec<&str> = first.iter().map(String::as_str).collect();
    // Shard 1 holds about 400 items (by content): kill k lands at a random
    // point of the k-th stretch of 5%..80% of 400, with batches in flight.
    for k in 0..3 {
        let at = fastrand::u64(400 * (5 + 25 * k) / 100..400 * (5 + 25 * (k + 1)) / 100);
        let mut child = s.spawn_quiet(&args);
        wait_for_stats(s.sim(), 60, |st| {
            st["side_effects"].as_u64().unwrap_or(0) >= at
        })
        .await;
        child.kill().unwrap(); // SIGKILL: nothing is flushed on the way out
        child.wait().unwrap();
    }
    // --retry-failed: the refused items are pending again, beside the
    // batches the kills left unrecorded, which go again under their keys.
    for i in 1..=3 {
        let mut args = shard_args(&s, i, 20);
        args.push("--retry-failed".into());
        let r = run_shard(&s, &args);
        // 3: finished, with items failed (the refused ones).
        let code = match shard_output(&s, i, "failures").is_empty() {
            true => 0,
            false => 3,
        };
        assert_eq!(r.code, code, "shard {i}: {}", r.stderr);
    }
    let done: Vec<u64> = (1..=3).flat_map(|i| shard_results(&s, i)).collect();
    let failed: Vec<u64> = (1..=3)
        .flat_map(|i| shard_output(&s, i, "failures"))
        .collect();
    assert!(failed.iter().all(|n| n % 37 == 0), "{failed:?}");
    assert_eq!(failed.len() as u64, ITEMS / 37);
    let mut seen = [&done[..], &failed[..]].concat();
    seen.sort_unstable();
    assert_eq!(seen, (1..=ITEMS).collect::<Vec<_>>(), "every item once");
    assert_side_effects(&s.sim().stats().await, done.len() as u64);
}

/// Makes shard 1's job look as the earlier build left it when killed with
/// calls in flight: its batches formed from blocks of input lines (`how`
/// recorded without this build's note of the shard's own items), unsettled.
fn as_if_begun_by_lines(s: &Scenario, how: &str) {
    let dir = [s.state_dir().join("shard-1-of-3"), s.state_dir()]
        .into_iter()
        .find(|d| batchrun::checkpoint::held(d))
        .expect("shard 1's checkpoint");
    let store = batchrun::checkpoint::Store::open(&dir).unwrap();
    let mut meta = store.jobs().unwrap().pop().expect("shard 1's job");
    let own = format!("{how} (blocks of this shard's items)");
    assert_eq!(meta.batching.as_deref(), Some(own.as_str()));
    meta.batching = Some(how.to_string());
    meta.unsettled = true;
    store.save_job(&meta).unwrap();
    store.flush().unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_shards_job_begun_with_blocks_of_lines_keeps_them_while_unsettled() {
    let s = Scenario::new("shard-lines")
        .with_sim(&["--limit", "none", "--credits", "0"])
        .numbers(60);
    let args = shard_args(&s, 1, 4);
    let first = run_shard(&s, &args);
    assert_eq!(first.code, 75, "{}", first.stderr);
    as_if_begun_by_lines(&s, "--batch 4");
    s.sim().topup(1000).await;
    let before = requests(&s).await;
    let second = run_shard(&s, &args);
    assert_eq!(second.code, 0, "{}", second.stderr);
    assert!(
        second
            .stderr
            .contains("began forming --batch 4 from blocks of 4 input lines"),
        "{}",
        second.stderr
    );
    // One call per block of 4 lines holding any of the shard's items: the
    // keys of calls that may have run are the same.
    let mine = shard_results(&s, 1);
    let blocks: BTreeSet<u64> = mine.iter().map(|n| (n - 1) / 4).collect();
    let stats = s.sim().stats().await;
    assert_eq!(requests(&s).await - before, blocks.len() as u64, "{stats}");
    assert_side_effects(&stats, mine.len() as u64);
    // Settled: rows added since go 4 of the shard's own items a call, the
    // first block shared with the items before them.
    s.append_numbers(61..=120);
    let before = requests(&s).await;
    let third = run_shard(&s, &args);
    assert_eq!(third.code, 0, "{}", third.stderr);
    assert!(!third.stderr.contains("blocks of"), "{}", third.stderr);
    let (k, all) = (mine.len() as u64, shard_results(&s, 1).len() as u64);
    assert!(all > k + 4, "{k} then {all} items in shard 1");
    let calls = (all - 1) / 4 - k / 4 + 1;
    assert_eq!(requests(&s).await - before, calls, "{k} then {all} items");
}
