//! `--pacer spike` and `--pacer bucket` (with `--burst`) through Redis:
//! the fleet keeps the rule asked for, never the window rule instead.
//! Each test runs the real binary against the sim and a `redis-server` of
//! its own, and asserts what the API saw: no 429, every item executed once.

use std::time::Duration;

use crate::common::*;

use super::support::{fleet_name, Redis};
use super::{assert_runs_clean, assert_shards_did_each_item_once, fleet_job_held, run_all};

/// The fleet's args for one process on `name`, of shard `shard` ("": none).
fn spike_args<'a>(
    redis: &'a str,
    name: &'a str,
    limit: &'a str,
    shard: &'a str,
    concurrency: &'a str,
) -> Vec<&'a str> {
    let mut v = vec![
        "--pacer",
        "spike",
        "--limit",
        limit,
        "--concurrency",
        concurrency,
        "--redis",
        redis,
        "--fleet-key",
        name,
    ];
    if !shard.is_empty() {
        v.extend(["--shard", shard]);
    }
    v
}

/// Runs `n` items through `procs` processes keeping `--pacer spike` on
/// one fleet against a SpikeArrest sim at `limit`; asserts no 429 and each
/// item executed once. Returns the wall time, first start to last exit.
async fn spike_fleet(redis: &Redis, limit: &str, procs: u64, n: u64) -> Duration {
    let sim = [
        "--model",
        "spike-arrest",
        "--limit",
        limit,
        "--latency",
        "1ms..10ms",
    ];
    let s = Scenario::new(&format!("fleet-spike-{procs}"))
        .with_sim(&sim)
        .numbers(n);
    let name = fleet_name("spike");
    let shards: Vec<String> = if procs == 1 {
        vec![String::new()]
    } else {
        (1..=procs).map(|i| format!("{i}/{procs}")).collect()
    };
    let cmds = shards
        .iter()
        .map(|sh| s.cmd(&spike_args(&redis.url, &name, limit, sh, "5")))
        .collect();
    let (runs, took) = run_all(cmds);
    for r in &runs {
        assert_eq!(r.code, 0, "{}", r.stderr);
        assert_eq!(r.summary["rate_limited"], 0, "{}", r.summary);
        assert!(!r.stderr.contains("cannot be kept"), "{}", r.stderr);
    }
    let stats = s.sim().stats().await;
    assert_eq!(stats["rejected_rate"], 0, "{procs} processes: {stats}");
    assert_side_effects(&stats, n);
    if procs == 1 {
        assert_each_item_once(&s.out_path(), n);
    } else {
        assert_shards_did_each_item_once(&s, procs, n);
    }
    took
}

/// `--pacer spike` through Redis, one process and two: a SpikeArrest
/// gateway refuses nothing, and every item is executed once. (Issue #21
/// saw 109-217 429s when the fleet swapped in the window rule.)
#[tokio::test(flavor = "multi_thread")]
async fn the_spike_pacer_through_redis_is_never_refused_with_one_or_two_processes() {
    let redis = Redis::start();
    for procs in [1, 2] {
        let took = spike_fleet(&redis, "50ps", procs, 100).await;
        eprintln!("spike through Redis, {procs} process(es): {took:?}");
    }
}

/// `--pacer bucket --burst 4` through Redis, two processes on one key
/// against a sliding window of 40/1 s: one bucket for the fleet, so no
/// window sees more than the limit, and nothing is refused.
#[tokio::test(flavor = "multi_thread")]
async fn the_bucket_with_its_burst_through_redis_keeps_one_limit_for_two_processes() {
    let redis = Redis::start();
    let n = 100;
    let s = Scenario::new("fleet-bucket")
        .with_sim(&["--limit", "40/1s", "--latency", "1ms..10ms"])
        .numbers(n);
    let name = fleet_name("bucket");
    let cmds = (1..=2)
        .map(|i| {
            let shard = format!("{i}/2");
            s.cmd(&[
                "--pacer",
                "bucket",
                "--burst",
                "4",
                "--limit",
                "40/1s",
                "--concurrency",
                "4",
                "--redis",
                &redis.url,
                "--fleet-key",
                &name,
                "--shard",
                &shard,
            ])
        })
        .collect();
    let (runs, _) = run_all(cmds);
    assert_runs_clean(&runs, "fleet");
    fleet_job_held(&s, 40, n, 2).await;
    // The bucket's state is the fleet's, in its limit hash.
    let mut c = redis.conn();
    let cap: Option<String> = redis::cmd("HGET")
        .arg(batchrun::fleet::FleetKeys::named(&name).limit())
        .arg("b_cap")
        .query(&mut c)
        .unwrap();
    assert_eq!(cap.as_deref(), Some("4"));
}

/// The issue's own numbers: a SpikeArrest gateway at 10ps (one call per
/// 100 ms), 100 items, in process and through Redis with one and two
/// processes. Prints the wall times for docs/fleet.md; run with
/// `cargo test --test it spike_fleet_benchmark -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "a benchmark: about 30 s"]
async fn spike_fleet_benchmark() {
    let redis = Redis::start();
    let sim = [
        "--model",
        "spike-arrest",
        "--limit",
        "10ps",
        "--latency",
        "1ms..10ms",
    ];
    let s = Scenario::new("spike-alone").with_sim(&sim).numbers(100);
    let (r, alone) = run_all(vec![s.cmd(&[
        "--pacer",
        "spike",
        "--limit",
        "10ps",
        "--concurrency",
        "5",
    ])]);
    assert_eq!(r[0].code, 0, "{}", r[0].stderr);
    assert_eq!(s.sim().stats().await["rejected_rate"], 0);
    eprintln!("spike in process: {alone:?}");
    for procs in [1, 2] {
        let took = spike_fleet(&redis, "10ps", procs, 100).await;
        eprintln!("spike through Redis, {procs} process(es): {took:?}");
    }
}

/// Redis forgetting a `--pacer spike` fleet mid-run (a `FLUSHALL`, or a
/// `DEL` of the limit hash that holds the mirror's state): the processes
/// notice, the mirror starts again empty after a window's hold, they put
/// their calls in flight back, and the gateway refuses nothing.
#[tokio::test(flavor = "multi_thread")]
async fn redis_forgetting_a_spike_fleet_mid_run_never_gets_a_429() {
    let redis = Redis::start();
    // A bucket of 10, and calls that reach the gateway up to 80 ms after
    // their send: were the fleet to start again full with its calls in
    // flight forgotten, they would clump with a bucket's worth of new ones.
    let n = 200;
    let sim = [
        "--model",
        "spike-arrest",
        "--limit",
        "100ps",
        "--concurrency",
        "20",
        "--latency-in",
        "0ms..80ms",
        "--latency",
        "1ms..5ms",
    ];
    for forget in ["flushall", "del"] {
        let s = Scenario::new(&format!("fleet-spike-forgets-{forget}"))
            .with_sim(&sim)
            .numbers(n);
        let name = fleet_name(forget);
        let limit_key = batchrun::fleet::FleetKeys::named(&name).limit();
        let cmds = (1..=2)
            .map(|i| {
                let shard = format!("{i}/2");
                s.cmd(&spike_args(&redis.url, &name, "100ps", &shard, "20"))
            })
            .collect();
        let runner = tokio::task::spawn_blocking(move || run_all(cmds));
        let out = s
            .input_path()
            .with_file_name("items.shard-1-of-2.results.jsonl");
        wait_until(30, "30 results of shard 1", || {
            std::fs::read_to_string(&out).is_ok_and(|t| t.lines().count() >= 30)
        })
        .await;
        redis.forget(forget, &limit_key);
        assert_runs_clean(&runner.await.unwrap().0, forget);
        let stats = s.sim().stats().await;
        assert_eq!(stats["rejected_rate"], 0, "{forget}: {stats}");
        assert_side_effects(&stats, n);
        assert_shards_did_each_item_once(&s, 2, n);
    }
}

/// Two limits at once through Redis (`--limit 20/1s --limit 30/3s`), two
/// processes on one key against a sim that keeps both: a call goes only
/// when both fleet-wide windows have room, so neither limit refuses one.
#[tokio::test(flavor = "multi_thread")]
async fn several_limits_through_redis_keep_every_window_for_two_processes() {
    let redis = Redis::start();
    let n = 90;
    let limits = ["--limit", "20/1s", "--limit", "30/3s"];
    let mut sim = limits.to_vec();
    sim.extend(["--concurrency", "8", "--latency", "1ms..10ms"]);
    let s = Scenario::new("fleet-two-limits").with_sim(&sim).numbers(n);
    let name = fleet_name("limits");
    let cmds = (1..=2)
        .map(|i| {
            let shard = format!("{i}/2");
            let mut args = limits.to_vec();
            args.extend(["--concurrency", "8", "--redis", &redis.url]);
            args.extend(["--fleet-key", &name, "--shard", &shard]);
            s.cmd(&args)
        })
        .collect();
    let (runs, _) = run_all(cmds);
    assert_runs_clean(&runs, "fleet");
    fleet_job_held(&s, 20, n, 2).await;
    // The faster limit has a window of its own in Redis (the slower one,
    // 10 a second, is the primary).
    let mut c = redis.conn();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(batchrun::fleet::FleetKeys::named(&name).further(20, 1000))
        .query(&mut c)
        .unwrap();
    assert_eq!(keys.len(), 1, "{keys:?}");
}

/// A GCRA bucket through Redis (`--limit 30/1s,burst=5`, nginx's
/// `limit_req` with a burst), two processes on one key against a sim that
/// keeps that bucket: the fleet keeps one TAT for both, so the bucket
/// never refuses a call, and every item is done once.
#[tokio::test(flavor = "multi_thread")]
async fn a_bucket_through_redis_is_kept_for_two_processes() {
    let redis = Redis::start();
    let n = 90;
    let limit = ["--limit", "30/1s,burst=5"];
    // No rate headers: the fleet keeps only what it is told.
    let mut sim = limit.to_vec();
    sim.extend([
        "--concurrency",
        "8",
        "--latency",
        "1ms..10ms",
        "--dialect",
        "none",
    ]);
    let s = Scenario::new("fleet-bucket").with_sim(&sim).numbers(n);
    let name = fleet_name("bucket");
    let cmds = (1..=2)
        .map(|i| {
            let shard = format!("{i}/2");
            let mut args = limit.to_vec();
            args.extend(["--concurrency", "8", "--redis", &redis.url]);
            args.extend(["--fleet-key", &name, "--shard", &shard]);
            s.cmd(&args)
        })
        .collect();
    let (runs, _) = run_all(cmds);
    assert_runs_clean(&runs, "fleet");
    // A bucket of 30 a second with a burst of 5 lets 36 into a second.
    fleet_job_held(&s, 36, n, 2).await;
    // The bucket has a key of its own in Redis, beside the primary window
    // (the bucket's envelope, 36 a second).
    let mut c = redis.conn();
    let rate = batchrun::rate::Rate {
        count: 30,
        period: Duration::from_secs(1),
    };
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(batchrun::fleet::FleetKeys::named(&name).bucket(
            rate,
            5,
            batchrun::rate::policy::Unit::Calls,
        ))
        .query(&mut c)
        .unwrap();
    assert_eq!(keys.len(), 1, "{keys:?}");
}

/// A fixed window through Redis (`--limit 20/1s,fixed`, as
/// express-rate-limit keeps it), two processes on one key against a sim
/// that keeps it and states nothing: the fleet keeps it as a sliding
/// window of 20 a second (no reset to align to, as in-process before one
/// is heard), which no fixed window of the server can overrun.
#[tokio::test(flavor = "multi_thread")]
async fn a_fixed_window_through_redis_is_kept_for_two_processes() {
    let redis = Redis::start();
    let n = 60;
    let limit = ["--limit", "20/1s,fixed"];
    // No rate headers: the fleet keeps only what it is told.
    let mut sim = limit.to_vec();
    sim.extend([
        "--concurrency",
        "8",
        "--latency",
        "1ms..10ms",
        "--dialect",
        "none",
    ]);
    let s = Scenario::new("fleet-fixed").with_sim(&sim).numbers(n);
    let name = fleet_name("fixed");
    let cmds = (1..=2)
        .map(|i| {
            let shard = format!("{i}/2");
            let mut args = limit.to_vec();
            args.extend(["--concurrency", "8", "--redis", &redis.url]);
            args.extend(["--fleet-key", &name, "--shard", &shard]);
            s.cmd(&args)
        })
        .collect();
    let (runs, _) = run_all(cmds);
    assert_runs_clean(&runs, "fleet");
    fleet_job_held(&s, 20, n, 2).await;
    // The fixed window of 20 a second has a key of its own, beside the
    // primary window (its envelope, 40 a second).
    let mut c = redis.conn();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(batchrun::fleet::FleetKeys::named(&name).fixed(20, 1000))
        .query(&mut c)
        .unwrap();
    assert_eq!(keys.len(), 1, "{keys:?}");
}
