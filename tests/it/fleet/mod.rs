//! Fleets: many `batchrun` processes on one key sharing one limit through a
//! real Redis. Each test starts its own `redis-server` on a free port when
//! the binary is on PATH, or uses `BATCHRUN_TEST_REDIS_URL` (with keys of
//! its own) otherwise.

mod drip;
mod drip_rule;
mod emptied;
mod even;
mod faults;
mod fixed;
mod pacer;
mod refill;
mod rule;
mod scenarios;
mod stated_tokens;
mod stops;
mod support;
mod tokens;
mod unstated;

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use batchrun::fleet::FleetKeys;

use crate::common::*;
use support::{fleet_name, Redis};

/// What a fleet's job must show at its end: the sim saw no window over
/// `limit`, ran each of the `n` items once, and the results files of the
/// `shards` shards hold each item once.
async fn fleet_job_held(s: &Scenario, limit: u64, n: u64, shards: u64) {
    let stats = s.sim().stats().await;
    assert_never_limited(&stats, limit);
    assert_side_effects(&stats, n);
    assert_shards_did_each_item_once(s, shards, n);
}

/// Every process of a fleet (`what` says which case) ended 0 with no 429.
fn assert_runs_clean(runs: &[Finished], what: &str) {
    for r in runs {
        assert_eq!(r.code, 0, "{what}: {}", r.stderr);
        assert_eq!(r.summary["rate_limited"], 0, "{what}: {}", r.summary);
    }
}

/// Every results file of the shards of `n_shards`, merged: each line of
/// `1..=n` must appear exactly once.
fn assert_shards_did_each_item_once(s: &Scenario, n_shards: u64, n: u64) {
    let mut seen = BTreeMap::<u64, usize>::new();
    for i in 1..=n_shards {
        let out = s
            .input_path()
            .with_file_name(format!("items.shard-{i}-of-{n_shards}.results.jsonl"));
        // Which shard takes a line follows its content: only the union is
        // fixed.
        for line in lines_of(&out) {
            *seen.entry(line).or_default() += 1;
        }
    }
    let missing: Vec<u64> = (1..=n).filter(|l| !seen.contains_key(l)).collect();
    let repeated: Vec<u64> = seen
        .iter()
        .filter(|(_, c)| **c > 1)
        .map(|(l, _)| *l)
        .collect();
    assert!(
        missing.is_empty() && repeated.is_empty() && seen.len() as u64 == n,
        "missing {missing:?}, repeated {repeated:?}"
    );
}

/// The sim's counters that must stay zero for a fleet that keeps the limit.
fn assert_never_limited(stats: &serde_json::Value, limit: u64) {
    for k in ["rejected_rate", "rejected_cooldown", "rejected_concurrency"] {
        assert_eq!(stats[k], 0, "{k}: {stats}");
    }
    let most = stats["max_in_window"].as_u64().unwrap();
    assert!(
        most <= limit,
        "{most} calls in one window, limit {limit}: {stats}"
    );
}

/// Runs `cmds` at once; returns each outcome and the wall time from the
/// first start to the last exit.
fn run_all(cmds: Vec<Command>) -> (Vec<Finished>, Duration) {
    let t0 = Instant::now();
    let children: Vec<Child> = cmds
        .into_iter()
        .map(|mut c| {
            c.stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn batchrun")
        })
        .collect();
    let done = children
        .into_iter()
        .map(|c| finished_output(c.wait_with_output().expect("wait for batchrun")))
        .collect();
    (done, t0.elapsed())
}

fn finished_output(out: std::process::Output) -> Finished {
    Finished {
        code: out.status.code().unwrap_or(-1),
        summary: serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Runs `cmds` at once like [`run_all`], and measures at the sim the span
/// from the first call it accepted to the `n`th: process start-up and exit
/// are not pacing, and on a busy machine they would drown the difference
/// being measured.
async fn run_measured(sim: &Sim, cmds: Vec<Command>, n: u64) -> (Vec<Finished>, Duration) {
    let runner = tokio::task::spawn_blocking(move || run_all(cmds));
    let mut first = None;
    let span = loop {
        let accepted = sim.stats().await["accepted"].as_u64().unwrap();
        let now = Instant::now();
        if accepted > 0 {
            first.get_or_insert(now);
        }
        if accepted >= n {
            break first.map(|f| now - f).unwrap_or_default();
        }
        if runner.is_finished() {
            let (runs, _) = runner.await.unwrap();
            let errs: Vec<&String> = runs.iter().map(|r| &r.stderr).collect();
            panic!("the runs ended with {accepted} of {n} calls accepted: {errs:?}");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    (runner.await.unwrap().0, span)
}

/// Share of the limit a run used after its first window, from the span
/// between its first and last call: `(n - L) calls / (L × span / W)`.
fn utilization(n: u64, limit: u64, window: Duration, took: Duration) -> f64 {
    (n - limit) as f64 / (limit as f64 * took.as_secs_f64() / window.as_secs_f64())
}

const LIMIT: &str = "40/1s";

fn fleet_args<'a>(redis: &'a str, name: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec![
        "--limit",
        LIMIT,
        "--concurrency",
        "8",
        "--redis",
        redis,
        "--fleet-key",
        name,
    ];
    v.extend_from_slice(extra);
    v
}

/// The concurrency leases of the fleet `name` not yet expired by Redis's
/// clock (an expired one is only removed by the next take).
fn leases_of(c: &mut redis::Connection, name: &str) -> Vec<String> {
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query(c).unwrap();
    redis::cmd("ZRANGEBYSCORE")
        .arg(FleetKeys::named(name).leases())
        .arg(format!("({}", secs * 1000 + micros / 1000))
        .arg("+inf")
        .query(c)
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn four_shards_keep_one_limit_and_use_it_as_well_as_one_process() {
    let redis = Redis::start();
    let sim_args = [
        "--limit",
        LIMIT,
        "--concurrency",
        "8",
        "--cooldown",
        "1s",
        "--latency",
        "1ms..10ms",
    ];
    let n = 200;

    // One process alone on the same limit: the baseline.
    let one = Scenario::new("fleet-one").with_sim(&sim_args).numbers(n);
    let name = fleet_name("one");
    let (r, took_one) = run_measured(
        one.sim(),
        vec![one.cmd(&fleet_args(&redis.url, &name, &[]))],
        n,
    )
    .await;
    assert_eq!(r[0].code, 0, "{}", r[0].stderr);
    assert_never_limited(&one.sim().stats().await, 40);

    // Four processes, one shard each, on one key.
    let s = Scenario::new("fleet-four").with_sim(&sim_args).numbers(n);
    let name = fleet_name("four");
    let cmds = (1..=4)
        .map(|i| {
            let shard = format!("{i}/4");
            s.cmd(&fleet_args(&redis.url, &name, &["--shard", &shard]))
        })
        .collect();
    let (runs, took_four) = run_measured(s.sim(), cmds, n).await;
    let mut done = Vec::new();
    for r in &runs {
        assert_eq!(r.code, 0, "{}", r.stderr);
        assert_eq!(r.summary["rate_limited"], 0, "{}", r.summary);
        // About a quarter each: shards follow the items' content.
        let own = r.summary["done"].as_u64().unwrap();
        assert!((25..=75).contains(&own), "{}", r.summary);
        done.push(own);
        // Its estimate counts the siblings' calls under the shared limit:
        // about four times its own, 40 a window, the first at once.
        let eta = format!("about {}s at the limit's pace", (own * 4).div_ceil(40) - 1);
        assert!(r.stderr.contains(&eta), "{eta}: {}", r.stderr);
    }
    assert_eq!(done.iter().sum::<u64>(), n);
    fleet_job_held(&s, 40, n, 4).await;

    let w = Duration::from_secs(1);
    let (u1, u4) = (
        utilization(n, 40, w, took_one),
        utilization(n, 40, w, took_four),
    );
    eprintln!("utilization: one process {u1:.3} ({took_one:?}), four {u4:.3} ({took_four:?})");
    assert!(
        u4 >= u1 - 0.03,
        "four processes used {:.1}% of the limit, one process {:.1}% ({took_four:?} vs {took_one:?})",
        u4 * 100.0,
        u1 * 100.0
    );

    // Every shard shows in the job's status.
    let v = s.status_json().unwrap_or_else(|e| panic!("{e}"));
    let shards: Vec<(String, u64)> = v
        .as_array()
        .expect("one entry per shard")
        .iter()
        .map(|j| {
            (
                j["shard"].as_str().unwrap().to_string(),
                j["done"].as_u64().unwrap(),
            )
        })
        .collect();
    let want: Vec<(String, u64)> = (1..=4).map(|i| format!("{i}/4")).zip(done).collect();
    assert_eq!(shards, want);

    // Nothing in Redis names the key, and everything left expires.
    let mut c = redis.conn();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("batchrun:{{name:{name}}}:*"))
        .query(&mut c)
        .unwrap();
    assert!(!keys.is_empty());
    for k in keys {
        assert!(!k.contains(KEY), "{k}");
        let ttl: i64 = redis::cmd("PTTL").arg(&k).query(&mut c).unwrap();
        assert!(ttl > 0, "{k} never expires");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_process_killed_mid_run_keeps_the_limit_and_its_leases_expire() {
    let redis = Redis::start();
    let s = Scenario::new("fleet-kill")
        .with_sim(&[
            "--limit",
            "30/1s",
            "--concurrency",
            "4",
            "--cooldown",
            "1s",
            "--latency",
            "100ms..200ms",
        ])
        .numbers(90);
    let name = fleet_name("kill");
    let args = |shard: &str| -> Vec<String> {
        ["--limit", "30/1s", "--concurrency", "4", "--timeout", "1s"]
            .iter()
            .map(|a| a.to_string())
            .chain([
                "--redis".into(),
                redis.url.clone(),
                "--fleet-key".into(),
                name.clone(),
            ])
            .chain(["--shard".into(), shard.into()])
            .collect()
    };
    let spawn = |shard: &str| {
        let a = args(shard);
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        s.cmd(&a)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let others = [spawn("1/3"), spawn("3/3")];
    let mut victim = spawn("2/3");
    // Kill it while it holds a concurrency lease, as a crash would.
    let mut c = redis.conn();
    let tag = format!("{}-", victim.id());
    let deadline = Instant::now() + Duration::from_secs(10);
    let held = loop {
        let mine: Vec<String> = leases_of(&mut c, &name)
            .into_iter()
            .filter(|m| m.starts_with(&tag))
            .collect();
        if !mine.is_empty() {
            victim.kill().unwrap();
            break mine;
        }
        assert!(Instant::now() < deadline, "the process never held a lease");
        std::thread::sleep(Duration::from_millis(2));
    };
    let killed_at = Instant::now();
    victim.wait().unwrap();
    // Its leases outlive it by at most the lease (3 x the 1 s timeout).
    loop {
        let left: Vec<String> = leases_of(&mut c, &name)
            .into_iter()
            .filter(|m| held.contains(m))
            .collect();
        if left.is_empty() {
            break;
        }
        assert!(
            killed_at.elapsed() < Duration::from_millis(3500),
            "leases {left:?} of the killed process outlived their lease"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    for o in others {
        let r = finished_output(o.wait_with_output().unwrap());
        assert_eq!(r.code, 0, "{}", r.stderr);
    }
    assert_never_limited(&s.sim().stats().await, 30);

    // The killed shard resumes from its checkpoint and finishes.
    let a = args("2/3");
    let a: Vec<&str> = a.iter().map(String::as_str).collect();
    let r = s.run(&a);
    assert_eq!(r.code, 0, "{}", r.stderr);
    fleet_job_held(&s, 30, 90, 3).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_threshold_alert_fires_once_across_the_fleet() {
    let redis = Redis::start();
    let s = Scenario::new("fleet-alert")
        .with_sim(&["--limit", LIMIT, "--credits", "100", "--cooldown", "1s"])
        .numbers(60);
    let name = fleet_name("alert");
    let cmds = (1..=3)
        .map(|i| {
            let shard = format!("{i}/3");
            s.cmd(&fleet_args(
                &redis.url,
                &name,
                &["--shard", &shard, "--alert-at", "0.5"],
            ))
        })
        .collect();
    let (runs, _) = run_all(cmds);
    let mut sent = 0;
    for r in &runs {
        assert_eq!(r.code, 0, "{}", r.stderr);
        sent += r
            .stderr
            .matches("ALERT [threshold] 50% of credits used")
            .count();
    }
    assert_eq!(
        sent,
        1,
        "{:?}",
        runs.iter().map(|r| &r.stderr).collect::<Vec<_>>()
    );
}

/// Script runs Redis has served so far (EVALSHA and EVAL).
fn script_calls(c: &mut redis::Connection) -> u64 {
    let info: String = redis::cmd("INFO").arg("commandstats").query(c).unwrap();
    info.lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .filter_map(|l| {
            l.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// The fleet figures of docs/fleet.md: utilization for 1, 2, 4 and 8 processes on
/// one key, and Redis round trips per call. Run with
/// `cargo test --test it fleet_benchmark -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "a benchmark: about half a minute"]
async fn fleet_benchmark() {
    let (limit, n) = (100u64, 600u64);
    let sim = [
        "--limit",
        "100/1s",
        "--concurrency",
        "16",
        "--cooldown",
        "1s",
        "--latency",
        "5ms..15ms",
    ];
    let base = ["--limit", "100/1s", "--concurrency", "16"];
    let mut rows = Vec::new();
    for procs in [1u64, 2, 4, 8] {
        let redis = Redis::start();
        let mut c = redis.conn();
        let before = script_calls(&mut c);
        let s = Scenario::new("bench-fleet").with_sim(&sim).numbers(n);
        let name = fleet_name("bench");
        let cmds = (1..=procs)
            .map(|i| {
                let shard = format!("{i}/{procs}");
                let mut a: Vec<&str> = base.to_vec();
                a.extend([
                    "--redis",
                    &redis.url,
                    "--fleet-key",
                    &name,
                    "--shard",
                    &shard,
                ]);
                s.cmd(&a)
            })
            .collect();
        let (runs, took) = run_measured(s.sim(), cmds, n).await;
        for r in &runs {
            assert_eq!(r.code, 0, "{}", r.stderr);
        }
        let trips = (script_calls(&mut c) - before) as f64 / n as f64;
        rows.push((procs, took, s.sim().stats().await, trips));
    }
    println!(
        "| processes | first to last call | utilization | max in window | 429s | round trips per call |"
    );
    println!("|---|---|---|---|---|---|");
    for (what, took, stats, trips) in rows {
        let rejected = ["rejected_rate", "rejected_cooldown", "rejected_concurrency"]
            .iter()
            .map(|k| stats[k].as_u64().unwrap())
            .sum::<u64>();
        println!(
            "| {what} | {:.2} s | {:.1}% | {} | {rejected} | {trips:.2} |",
            took.as_secs_f64(),
            utilization(n, limit, Duration::from_secs(1), took) * 100.0,
            stats["max_in_window"],
        );
    }
}

/// More workers than the limit allows (`-c 4` on 2 calls a window): a fleet
/// waiter told the window is full of calls in flight looks again within a
/// window, not at their provisional end (timeout + W + 1 s), so the fleet
/// keeps the key as full as one process does.
#[tokio::test(flavor = "multi_thread")]
async fn a_fleet_with_more_workers_than_the_limit_keeps_pace_with_one_process() {
    let redis = Redis::start();
    let sim_args = ["--limit", "2/200ms", "--latency", "1ms..5ms"];
    let n = 24;
    let args = ["--limit", "2/200ms", "--concurrency", "4"];
    let alone = Scenario::new("fleet-c4-alone")
        .with_sim(&sim_args)
        .numbers(n);
    let (r, took_alone) = run_measured(alone.sim(), vec![alone.cmd(&args)], n).await;
    assert_eq!(r[0].code, 0, "{}", r[0].stderr);
    let s = Scenario::new("fleet-c4").with_sim(&sim_args).numbers(n);
    let name = fleet_name("c4");
    let mut fleet = args.to_vec();
    fleet.extend(["--redis", &redis.url, "--fleet-key", &name]);
    let (r, took_fleet) = run_measured(s.sim(), vec![s.cmd(&fleet)], n).await;
    assert_eq!(r[0].code, 0, "{}", r[0].stderr);
    assert_eq!(r[0].summary["rate_limited"], 0, "{}", r[0].summary);
    assert_never_limited(&s.sim().stats().await, 2);
    eprintln!("in process {took_alone:?}, through Redis {took_fleet:?}");
    assert!(
        took_fleet.as_secs_f64() <= took_alone.as_secs_f64() * 1.1 + 0.05,
        "through Redis {took_fleet:?}, in process {took_alone:?}"
    );
}

/// A process of another build (one from before the build mark, whose
/// record says only what it paces to) in the fleet: a process told the
/// same limit is warned of the build, not of a limit.
#[tokio::test(flavor = "multi_thread")]
async fn a_process_of_another_build_in_the_fleet_is_warned() {
    let redis = Redis::start();
    let s = Scenario::new("fleet-build")
        .with_sim(&["--limit", "none"])
        .numbers(5);
    let name = fleet_name("build");
    let until = batchrun::util::unix_now().as_millis() as u64 + 60_000;
    let _: i64 = redis::cmd("HSET")
        .arg(batchrun::fleet::FleetKeys::named(&name).told())
        .arg("4242\t--pacer window --limit 40ps")
        .arg(until)
        .query(&mut redis.conn())
        .unwrap();
    let r = s.run(&fleet_args(&redis.url, &name, &[]));
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stderr
            .contains("runs another batchrun build (this one's fleet script "),
        "{}",
        r.stderr
    );
    assert!(!r.stderr.contains("paces to"), "{}", r.stderr);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_process_told_another_limit_than_the_running_fleet_is_warned() {
    let redis = Redis::start();
    let s = Scenario::new("fleet-told")
        .with_sim(&["--limit", "none", "--latency", "20ms"])
        .numbers(60);
    // Another job (its own state dir) on the same fleet key.
    let t = Scenario::new("fleet-told-other")
        .with_sim(&["--limit", "none"])
        .numbers(5);
    let name = fleet_name("told");
    let fleet = |limit: &'static str| {
        let mut v = fleet_args(&redis.url, &name, &[]);
        v[1] = limit;
        v
    };
    // While the first process runs at 20 a second, a second one told 40.
    let mut during = None;
    let first = act_when(
        s.cmd(&fleet("20/1s")),
        s.sim(),
        |st| st["accepted"] == 1,
        |_| {
            // One told alike joins and leaves first: its leaving takes
            // out its own record, not the running one's.
            let alike = t.run(&fleet("20/1s"));
            assert_eq!(alike.code, 0, "{}", alike.stderr);
            during = Some(t.run(&fleet("40/1s")));
        },
    )
    .await;
    assert_eq!(first.code, 0, "{}", first.stderr);
    let during = during.unwrap();
    assert_eq!(during.code, 0, "{}", during.stderr);
    let warned = |r: &Finished| {
        r.stderr
            .contains("fleet: warning: another process of this fleet")
    };
    assert!(warned(&during), "{}", during.stderr);
    assert!(
        during.stderr.contains(
            "paces to --pacer window --limit 20ps, this one to --pacer window --limit 40ps"
        ),
        "{}",
        during.stderr
    );
    // Both ended cleanly and took their records out: a process told
    // either limit now joins unwarned.
    for limit in ["40/1s", "20/1s"] {
        let r = t.run(&[&fleet(limit)[..], &["--fresh"]].concat());
        assert_eq!(r.code, 0, "{}", r.stderr);
        assert!(!warned(&r), "{}", r.stderr);
    }
}
