//! How a fleet run ends when its Redis fails it: a signal while Redis is
//! away, `--redis-timeout` kept, a run refused at start leaving nothing in
//! the fleet, a full Redis at start.

use std::process::Stdio;
use std::time::Duration;

use crate::common::*;

use super::support::{fleet_name, Proxy, Redis};
use super::*;

/// Starts `cmd`, cuts Redis off once the sim accepted a few calls, and
/// returns the child and when Redis was cut.
async fn run_then_cut(s: &Scenario, proxy: &mut Proxy, mut cmd: Command) -> (Child, Instant) {
    let before = s.sim().stats().await["accepted"].as_u64().unwrap();
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn batchrun");
    let accepted = |st: &serde_json::Value| st["accepted"].as_u64().unwrap();
    wait_for_stats(s.sim(), 20, |st| accepted(st) >= before + 40).await;
    proxy.cut().await;
    (child, Instant::now())
}

/// Ctrl-C or SIGTERM while Redis is away stops the run at once, as it
/// would with Redis up: the pacer's wait for Redis (`--redis-timeout`, a
/// minute here) is given up, and the items not sent stay pending.
#[tokio::test(flavor = "multi_thread")]
async fn a_signal_while_redis_is_away_stops_the_run_at_once() {
    let redis = Redis::start();
    let mut proxy = Proxy::start(&redis.url).await;
    let s = Scenario::new("fleet-sig")
        .with_sim(&["--limit", LIMIT])
        .numbers(400);
    for (signal, code) in [(libc::SIGINT, 130), (libc::SIGTERM, 143)] {
        let name = fleet_name("sig");
        let url = proxy.url();
        let cmd = s.cmd(&fleet_args(&url, &name, &["--redis-timeout", "60s"]));
        let (child, _) = run_then_cut(&s, &mut proxy, cmd).await;
        // Long enough for the run to find Redis gone (it asks at least
        // once a second), though it stops as promptly if it has not.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let t0 = Instant::now();
        // SAFETY: sending a signal to our own child process.
        unsafe {
            libc::kill(child.id() as i32, signal);
        }
        let r = finished(child.wait_with_output().unwrap());
        assert_eq!(r.code, code, "{}", r.stderr);
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the stop took {:?} (--redis-timeout is 60s): {}",
            t0.elapsed(),
            r.stderr
        );
        assert_eq!(r.summary["state"], "interrupted", "{}", r.summary);
        assert!(r.summary["pending"].as_u64().unwrap() > 0, "{}", r.summary);
        proxy.resume().await;
    }
}

/// A run that loses Redis halts about `--redis-timeout` after it finds it
/// gone, not seconds past it.
#[tokio::test(flavor = "multi_thread")]
async fn losing_redis_halts_within_the_redis_timeout() {
    let redis = Redis::start();
    let mut proxy = Proxy::start(&redis.url).await;
    let s = Scenario::new("fleet-timeout")
        .with_sim(&["--limit", LIMIT])
        .numbers(400);
    let name = fleet_name("timeout");
    let url = proxy.url();
    let cmd = s.cmd(&fleet_args(&url, &name, &["--redis-timeout", "5s"]));
    let (child, cut) = run_then_cut(&s, &mut proxy, cmd).await;
    let r = finished(child.wait_with_output().unwrap());
    assert_eq!(r.code, 75, "{}", r.stderr);
    // 5s, the second the run may take to find Redis gone, and slack; it
    // took 10s.
    assert!(
        cut.elapsed() < Duration::from_secs(8),
        "halted {:?} after Redis went, --redis-timeout 5s: {}",
        cut.elapsed(),
        r.stderr
    );
    let why = r.summary["halt_reason"].as_str().unwrap();
    assert!(why.contains("lost Redis"), "{why}");
}

/// A fleet run refused before any call (a URL its items cannot fill) does
/// not stand in the fleet: the next run, told another limit, hears of no
/// other process.
#[tokio::test(flavor = "multi_thread")]
async fn a_run_refused_at_start_leaves_nothing_in_the_fleet() {
    let redis = Redis::start();
    let s = Scenario::new("fleet-refused")
        .with_sim(&["--limit", LIMIT])
        .numbers(5);
    let name = fleet_name("refused");
    let bad = format!("{}/v1/echo?x={{missing}}", s.sim().url);
    let r = finish(s.cmd(&[
        "--url",
        &bad,
        "--limit",
        "40/1s",
        "--redis",
        &redis.url,
        "--fleet-key",
        &name,
    ]));
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("missing"), "{}", r.stderr);
    assert!(!r.stderr.contains("sharing the limit"), "{}", r.stderr);
    let told: u64 = redis::cmd("HLEN")
        .arg(FleetKeys::named(&name).told())
        .query(&mut redis.conn())
        .unwrap();
    assert_eq!(told, 0, "the refused run stands in the fleet");
    let r = s.run(&[
        "--limit",
        "20/1s",
        "--redis",
        &redis.url,
        "--fleet-key",
        &name,
    ]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(!r.stderr.contains("another process"), "{}", r.stderr);
}

/// A Redis out of memory at start is a resumable halt that says so, not a
/// permissions problem: freed, the same command runs.
#[tokio::test(flavor = "multi_thread")]
async fn a_full_redis_at_start_halts_resumably_and_says_so() {
    let redis = Redis::start();
    let config = |name: &str, value: &str| {
        redis::cmd("CONFIG")
            .arg(&["SET", name, value])
            .query::<()>(&mut redis.conn())
            .unwrap()
    };
    config("maxmemory-policy", "noeviction");
    config("maxmemory", "1");
    let s = Scenario::new("fleet-oom")
        .with_sim(&["--limit", LIMIT])
        .numbers(5);
    let name = fleet_name("oom");
    let r = s.run(&fleet_args(&redis.url, &name, &[]));
    assert_eq!(r.code, 75, "{}", r.stderr);
    assert!(r.stderr.contains("out of memory"), "{}", r.stderr);
    assert!(!r.stderr.contains("allowed to run scripts"), "{}", r.stderr);
    assert_eq!(r.summary["exit_code"], 75, "{}", r.summary);
    assert_eq!(s.sim().stats().await["requests"], 0);
    config("maxmemory", "0");
    let r = s.run(&fleet_args(&redis.url, &name, &[]));
    assert_eq!(r.code, 0, "{}", r.stderr);
}
