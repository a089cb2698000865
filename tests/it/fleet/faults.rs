//! A fleet's Redis at fault, end to end: out of reach at the start, lost
//! mid-run, refusing the script, forgetting the fleet, free to evict.

use std::process::Stdio;
use std::time::Duration;

use crate::common::*;

use super::support::{fleet_name, free_port, Proxy, Redis};
use super::*;

#[tokio::test(flavor = "multi_thread")]
async fn losing_redis_mid_run_halts_resumably_and_the_resume_finishes() {
    let redis = Redis::start();
    let mut proxy = Proxy::start(&redis.url).await;
    let s = Scenario::new("fleet-lost")
        .with_sim(&[
            "--limit",
            LIMIT,
            "--concurrency",
            "8",
            "--cooldown",
            "1s",
            "--latency",
            "1ms..5ms",
        ])
        .numbers(160);
    let name = fleet_name("lost");
    let url = proxy.url();
    let cmd = |shard: &str| {
        s.cmd(&fleet_args(
            &url,
            &name,
            &["--shard", shard, "--redis-timeout", "2s"],
        ))
    };
    let children: Vec<Child> = [cmd("1/2"), cmd("2/2")]
        .into_iter()
        .map(|mut c| {
            c.stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    wait_for_stats(s.sim(), 20, |st| st["accepted"].as_u64().unwrap() >= 50).await;
    proxy.cut().await;
    // The calls in flight end; after that nothing goes out without a slot.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let sent_before = s.sim().stats().await["requests"].as_u64().unwrap();
    let t0 = Instant::now();
    for c in children {
        let r = finished_output(c.wait_with_output().unwrap());
        assert_eq!(r.code, 75, "{}", r.stderr);
        assert_eq!(r.summary["state"], "halted", "{}", r.summary);
        let why = r.summary["halt_reason"].as_str().unwrap();
        assert!(why.contains("Redis") && why.contains("resume"), "{why}");
        // Lost for at least --redis-timeout, however it was found.
        let lost_for = (why.split(" for ").nth(1))
            .and_then(|r| r.split(" (").next())
            .and_then(|d| humantime::parse_duration(d).ok());
        assert!(lost_for >= Some(Duration::from_secs(2)), "{why}");
    }
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    let stats = s.sim().stats().await;
    assert_eq!(
        stats["requests"], sent_before,
        "a call went out without a slot"
    );
    assert_never_limited(&stats, 40);
    assert!(stats["side_effects"].as_u64().unwrap() < 160);

    // Redis is back: the same commands finish every item once.
    proxy.resume().await;
    let (runs, _) = run_all(vec![cmd("1/2"), cmd("2/2")]);
    for r in &runs {
        assert_eq!(r.code, 0, "{}", r.stderr);
    }
    fleet_job_held(&s, 40, 160, 2).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn redis_out_of_reach_at_start_is_a_clear_error_before_any_request() {
    let s = Scenario::new("fleet-none")
        .with_sim(&["--limit", LIMIT])
        .numbers(5);
    let url = format!("redis://:s3cret@127.0.0.1:{}/0", free_port());
    let r = s.run(&["--limit", LIMIT, "--redis", &url]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(
        r.stderr
            .contains("cannot reach Redis at redis://127.0.0.1:"),
        "{}",
        r.stderr
    );
    assert!(!r.stderr.contains("s3cret"), "{}", r.stderr);
    assert_eq!(s.sim().stats().await["requests"], 0);
}

/// A Redis that will not run the fleet's script (an ACL user without
/// script rights) or takes no writes (a read-only replica) is a
/// configuration error: exit 1 before any call, with the cause, not the
/// resumable exit 75 that running the same command again could never cure.
#[tokio::test(flavor = "multi_thread")]
async fn a_redis_that_refuses_the_script_is_a_configuration_error_before_any_call() {
    let redis = Redis::start();
    let mut c = redis.conn();
    redis::cmd("ACL")
        .arg(&[
            "SETUSER",
            "noscript",
            "on",
            ">pw",
            "~*",
            "&*",
            "+@all",
            "-@scripting",
        ])
        .query::<()>(&mut c)
        .unwrap();
    let port = redis.url.trim_start_matches("redis://127.0.0.1:");
    let limited = format!("redis://noscript:pw@127.0.0.1:{port}");
    let replica = Redis::start();
    let (host_port, _) = port.split_once('/').unwrap();
    redis::cmd("REPLICAOF")
        .arg(&["127.0.0.1", host_port])
        .query::<()>(&mut replica.conn())
        .unwrap();
    let s = Scenario::new("fleet-noscript").with_sim(&[]).numbers(3);
    for (url, cause) in [
        (limited.as_str(), "NOPERM"),
        (replica.url.as_str(), "READONLY"),
    ] {
        let name = fleet_name("noscript");
        let r = s.run(&fleet_args(url, &name, &[]));
        assert_eq!(r.code, 1, "{url}: {}", r.stderr);
        assert!(
            r.stderr.contains("refused the fleet's script"),
            "{}",
            r.stderr
        );
        assert!(r.stderr.to_uppercase().contains(cause), "{}", r.stderr);
        assert!(
            !r.stderr.contains(":pw@"),
            "the password stays out of output"
        );
    }
    let st = s.sim().stats().await;
    assert_eq!(st["requests"], 0, "nothing sent: {st}");
}

/// Redis forgetting the fleet's keys with the connection up (a FLUSHALL, a
/// DEL of the window key: what eviction does) is noticed at the next take:
/// the fleet holds one window while every process puts its calls back, so
/// no window of the key is ever over its limit and nothing is refused.
#[tokio::test(flavor = "multi_thread")]
async fn redis_forgetting_the_fleet_mid_run_never_overruns_a_window() {
    let redis = Redis::start();
    let sim_args = [
        "--limit",
        "20/1s",
        "--concurrency",
        "8",
        "--cooldown",
        "1s",
        "--latency",
        "50ms..150ms",
    ];
    let n = 160;
    for forget in ["flushall", "del"] {
        let s = Scenario::new(&format!("fleet-forgets-{forget}"))
            .with_sim(&sim_args)
            .numbers(n);
        let name = fleet_name(forget);
        let window_key = FleetKeys::named(&name).pacer()[0].clone();
        let cmds = (1..=4)
            .map(|i| {
                let shard = format!("{i}/4");
                let mut args = vec!["--limit", "20/1s", "--concurrency", "8"];
                args.extend(["--redis", &redis.url, "--fleet-key", &name]);
                args.extend(["--shard", &shard]);
                s.cmd(&args)
            })
            .collect();
        let runner = tokio::task::spawn_blocking(move || run_all(cmds));
        wait_for_stats(s.sim(), 30, |st| st["accepted"].as_u64() >= Some(50)).await;
        redis.forget(forget, &window_key);
        assert_runs_clean(&runner.await.unwrap().0, forget);
        fleet_job_held(&s, 20, n, 4).await;
    }
}

/// A Redis that may evict keys is said at join: the fleet's keys carry
/// expiries, so only noeviction keeps them whatever the memory pressure.
#[tokio::test(flavor = "multi_thread")]
async fn a_redis_that_may_evict_is_warned_of_at_join() {
    let redis = Redis::start();
    let mut c = redis.conn();
    redis::cmd("CONFIG")
        .arg(&[
            "SET",
            "maxmemory",
            "100mb",
            "maxmemory-policy",
            "allkeys-lru",
        ])
        .query::<()>(&mut c)
        .unwrap();
    let s = Scenario::new("fleet-evicts").with_sim(&[]).numbers(3);
    let r = s.run(&fleet_args(&redis.url, &fleet_name("evicts"), &[]));
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stderr
            .contains("may evict keys (maxmemory-policy allkeys-lru)"),
        "{}",
        r.stderr
    );
}

/// What a fleet learnt is in its checkpoint, with its shape, and a resumed
/// fleet whose Redis forgot it puts it back with its first take: a secret
/// bucket with no burst, told its bare rate, refuses the first run's
/// start and is paced evenly after; the run halts when credits run out;
/// Redis forgets everything; the resume says the bucket on its start line
/// and starts paced as it, so no burst of it is refused (else it would
/// learn the bucket again from one). The rate learnt is the first run's:
/// 20/1s on an idle machine, lower where a loaded one delayed a call
/// enough for the bucket to refuse the next; and a bucket with no burst
/// refuses a call a few milliseconds early, so a loaded machine may see a
/// 429 later in the resume too: counted in benchmarks, not here.
#[tokio::test(flavor = "multi_thread")]
async fn a_resumed_fleet_puts_back_what_its_checkpoint_learnt() {
    let redis = Redis::start();
    let name = fleet_name("recall");
    let s = Scenario::new("fleet-recall")
        .with_sim(&[
            "--limit",
            "20/1s,burst=0",
            "--secret-limit",
            "--cooldown",
            "0s",
            "--credits",
            "70",
            "--latency",
            "1ms..3ms",
        ])
        .numbers(140);
    let args = [
        "--limit",
        "20/1s",
        "--concurrency",
        "4",
        "--redis",
        &redis.url,
        "--fleet-key",
        &name,
    ];
    let first = s.run(&args);
    assert_eq!(first.code, 75, "halted on credits: {}", first.stderr);
    assert!(
        first.summary["rate_limited"].as_u64().unwrap() >= 1,
        "the start's burst refused: {}",
        first.stderr
    );
    redis.forget("flushall", "");
    s.sim().topup(100).await;
    let again = s.run(&args);
    assert_eq!(again.code, 0, "{}", again.stderr);
    let start = again
        .stderr
        .lines()
        .find(|l| l.contains("batchrun: job "))
        .unwrap_or_default();
    let learnt = start
        .split_once("learnt earlier: a bucket of ")
        .and_then(|(_, rest)| rest.split_once("/1s with burst 0)"))
        .and_then(|(rate, _)| rate.parse::<u64>().ok());
    assert!(
        learnt.is_some_and(|r| (1..=20).contains(&r)),
        "{}",
        again.stderr
    );
    assert!(
        !again.stderr.contains("a burst was refused"),
        "{}",
        again.stderr
    );
    assert_each_item_once(&s.out_path(), 140);
    assert_side_effects(&s.sim().stats().await, 140);
}

/// A job that ran lately resumes into a fleet Redis forgot (a FLUSHALL, a
/// restart without persistence): but for its checkpoint, its first take
/// could not tell that from a fleet never begun. It holds one window, as a
/// process that heard the loss would: processes still running, or its own
/// run before, may have filled the server's window, as here (15 calls
/// before the credits ran out, then 15 more of the 20 the window holds).
#[tokio::test(flavor = "multi_thread")]
async fn a_job_resumed_into_a_forgotten_fleet_holds_a_window() {
    let redis = Redis::start();
    let name = fleet_name("forgot-resume");
    let s = Scenario::new("fleet-forgot-resume")
        .with_sim(&["--limit", "20/2s", "--cooldown", "0s", "--credits", "15"])
        .numbers(30);
    let args = [
        "--limit",
        "20/2s,sliding",
        "--concurrency",
        "10",
        "--redis",
        &redis.url,
        "--fleet-key",
        &name,
    ];
    let first = s.run(&args);
    assert_eq!(first.code, 75, "halted on credits: {}", first.stderr);
    redis.forget("flushall", "");
    s.sim().topup(100).await;
    let again = s.run(&args);
    assert_eq!(again.code, 0, "{}", again.stderr);
    assert_eq!(again.summary["rate_limited"], 0, "{}", again.stderr);
    assert_each_item_once(&s.out_path(), 30);
    assert_side_effects(&s.sim().stats().await, 30);
}
