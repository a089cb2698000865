//! Token budgets and stated limits through Redis: two processes on one
//! key, each call weighed by its estimate and corrected by its usage,
//! against a sim that keeps the budget; and the policies a sim states in
//! its headers (of the primary window, of another window, of tokens, a
//! used-up daily quota), followed by the whole fleet.

use super::support::{fleet_name, Redis};
use super::{assert_runs_clean, assert_shards_did_each_item_once, run_all};
use crate::common::*;

/// Two shards of one job on fleet `key`, each told `limits` and weighing
/// its calls by their prompts.
fn shards(s: &Scenario, limits: &[&str], redis: &str, key: &str) -> Vec<std::process::Command> {
    let mut a = limits.to_vec();
    a.extend(["--cost", "max_tokens + chars(prompt)/4", "--json-body"]);
    a.extend(["--concurrency", "8"]);
    two_shards(s, &a, redis, key)
}

/// Two shards of one job on fleet `key`, each with `args` besides.
fn two_shards(s: &Scenario, args: &[&str], redis: &str, key: &str) -> Vec<std::process::Command> {
    (1..=2)
        .map(|i| {
            let shard = format!("{i}/2");
            let mut a = args.to_vec();
            a.extend(["--redis", redis, "--fleet-key", key, "--shard", &shard]);
            s.cmd(&a)
        })
        .collect()
}

/// Two processes on one fleet key run `n` items against a sim keeping
/// 1000 calls and `tokens` a second, each process told the same; returns
/// the sim's stats after both end, having checked that neither met a 429
/// and each item was done once.
async fn two_processes_on(tokens: &str, name: &str) -> serde_json::Value {
    let redis = Redis::start();
    let n = 60;
    let limits = ["--limit", "1000/1s", "--limit", tokens];
    let mut sim = limits.to_vec();
    sim.extend(["--concurrency", "20", "--latency", "5ms..20ms"]);
    let s = Scenario::new(&format!("fleet-{name}"))
        .with_sim(&sim)
        .input("items.jsonl", &prompts(n));
    let key = fleet_name(name);
    let cmds = shards(&s, &limits, &redis.url, &key);
    let (runs, _) = run_all(cmds);
    assert_runs_clean(&runs, "fleet");
    let stats = s.sim().stats().await;
    assert_eq!(stats["rejected_rate"], 0, "{stats}");
    // Paced by tokens: more was charged than one second's budget holds.
    assert!(stats["tokens_charged"].as_u64().unwrap() > 600, "{stats}");
    assert_shards_did_each_item_once(&s, 2, n);
    stats
}

#[tokio::test(flavor = "multi_thread")]
async fn two_processes_on_one_key_never_exceed_a_token_budget() {
    let stats = two_processes_on("300/1s,tokens", "tokens").await;
    let most = stats["policies"][1]["max_in_window"].as_u64().unwrap();
    assert!(most <= 300, "{most} tokens in one window: {stats}");
}

#[tokio::test(flavor = "multi_thread")]
async fn two_processes_on_one_key_never_overflow_a_bucket_of_tokens() {
    // The sim refuses any call its bucket of tokens has no room for: no
    // 429 (checked in two_processes_on) is the bucket kept by the fleet.
    two_processes_on("300/1s,burst=100,tokens", "token-bucket").await;
}

/// Redis forgetting the fleet mid-run forgets what its token window of 3 s
/// held as well: the fleet holds for that window, not only the primary
/// window of calls (1 s), so the budget the server still counts is never
/// overrun and nothing is refused.
#[tokio::test(flavor = "multi_thread")]
async fn redis_forgetting_the_fleet_never_overruns_a_longer_token_window() {
    let redis = Redis::start();
    let n = 80;
    let items: String = (1..=n)
        .map(|i| format!("{{\"n\": {i}, \"max_tokens\": 20, \"prompt\": \"hi\"}}\n"))
        .collect();
    let limits = ["--limit", "100/1s", "--limit", "400/3s,tokens"];
    let mut sim = limits.to_vec();
    sim.extend([
        "--concurrency",
        "20",
        "--latency",
        "5ms..20ms",
        "--cooldown",
        "1s",
    ]);
    let s = Scenario::new("fleet-tokens-forgets")
        .with_sim(&sim)
        .input("items.jsonl", &items);
    let key = fleet_name("tokens-forgets");
    let cmds = shards(&s, &limits, &redis.url, &key);
    let runner = tokio::task::spawn_blocking(move || run_all(cmds));
    // Both processes have taken before Redis forgets: one that starts
    // after it takes the fleet for a new one, and cannot know better
    // (docs/fleet.md).
    let window = batchrun::fleet::FleetKeys::named(&key).window();
    let mut c = redis.conn();
    let mut both = false;
    for _ in 0..3000 {
        let ids: Vec<String> = (redis::cmd("ZRANGE").arg(&window).arg(0).arg(-1))
            .query(&mut c)
            .unwrap();
        let tags: std::collections::HashSet<&str> = (ids.iter())
            .filter_map(|id| id.rsplit_once(':').map(|(t, _)| t))
            .collect();
        if tags.len() >= 2 {
            both = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(both, "both processes took within 30 s");
    crate::common::wait_for_stats(s.sim(), 30, |st| st["accepted"].as_u64() >= Some(30)).await;
    redis::cmd("FLUSHALL")
        .query::<()>(&mut redis.conn())
        .unwrap();
    let (runs, _) = runner.await.unwrap();
    assert_runs_clean(&runs, "fleet");
    let stats = s.sim().stats().await;
    assert_eq!(stats["rejected_rate"], 0, "{stats}");
    assert_shards_did_each_item_once(&s, 2, n);
}

/// A fleet told more than the server allows follows the limit the server
/// states, in any dialect, from the first response: only calls sent
/// before it came back could be refused, and two processes of 4 workers
/// send 8, within the server's 20, so none is.
#[tokio::test(flavor = "multi_thread")]
async fn a_fleet_follows_a_limit_stated_in_every_dialect() {
    let redis = Redis::start();
    let n = 60;
    for dialect in ["ietf", "x-ratelimit", "openai", "anthropic"] {
        let s = Scenario::new(&format!("fleet-stated-{dialect}"))
            .with_sim(&[
                "--limit",
                "20/1s",
                "--dialect",
                dialect,
                "--latency",
                "5ms..20ms",
                "--cooldown",
                "1s",
            ])
            .numbers(n);
        let key = fleet_name(&format!("stated-{dialect}"));
        let cmds = two_shards(
            &s,
            &["--limit", "60/1s", "--concurrency", "4"],
            &redis.url,
            &key,
        );
        let (runs, _) = run_all(cmds);
        let mut limited = 0;
        for r in &runs {
            assert_eq!(r.code, 0, "{dialect}: {}", r.stderr);
            limited += r.summary["rate_limited"].as_u64().unwrap();
        }
        assert_eq!(limited, 0, "{dialect}: {limited} 429s");
        assert_shards_did_each_item_once(&s, 2, n);
    }
}

/// A bucket of tokens whose arrival time runs further ahead than the
/// fleet's hold (100 tokens spent at once, refilled at 10 a second) stays
/// in Redis until that time: expired sooner, the next run would find it
/// full and spend the burst again.
#[tokio::test(flavor = "multi_thread")]
async fn redis_keeps_a_bucket_of_tokens_until_it_has_refilled() {
    let redis = Redis::start();
    let items: String = (1..=4)
        .map(|i| format!("{{\"n\": {i}, \"prompt\": \"{}\"}}\n", "word ".repeat(16)))
        .collect();
    let limits = ["--limit", "1000/1s", "--limit", "600/1m,burst=100,tokens"];
    let s = Scenario::new("fleet-bucket-kept")
        .with_sim(&limits)
        .input("items.jsonl", &items);
    let key = fleet_name("bucket-kept");
    let mut a = limits.to_vec();
    // Each prompt is 20 tokens, estimated and used alike.
    a.extend(["--cost", "chars(prompt)/4", "--json-body"]);
    // A short timeout keeps the fleet's hold (timeout + window) short.
    a.extend([
        "--timeout",
        "1s",
        "--redis",
        &redis.url,
        "--fleet-key",
        &key,
    ]);
    let r = finish(s.cmd(&a));
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.summary["rate_limited"], 0, "{}", r.summary);

    let mut c = redis.conn();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("batchrun:{{name:{key}}}:gcra:*:tokens"))
        .query(&mut c)
        .unwrap();
    assert_eq!(keys.len(), 1, "{keys:?}");
    let tat_ms: i64 = redis::cmd("HGET")
        .arg(&keys[0])
        .arg("tat_ms")
        .query(&mut c)
        .unwrap();
    let ttl: i64 = redis::cmd("PTTL").arg(&keys[0]).query(&mut c).unwrap();
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query(&mut c).unwrap();
    let ahead = tat_ms - (secs * 1000 + micros / 1000);
    // 80 tokens at 100 ms each: most of 8 s of refill left.
    assert!(ahead > 4000, "the bucket is {ahead} ms ahead");
    assert!(ttl >= ahead, "kept {ttl} ms, refilled in {ahead} ms");
}

/// Two processes told only `--limit 100/1s`, against a sim keeping that
/// and `30/2s` and stating both (IETF `RateLimit-Policy`): the fleet
/// adopts the 2 s window from the first response, for both processes
/// through Redis. The 8 calls sent before it came back are within 30, so
/// nothing is refused and no 2 s window ever holds more than 30. (Not
/// adopted, the fleet met the 2 s window with 429s and learnt a lower
/// limit for its 1 s one.)
#[tokio::test(flavor = "multi_thread")]
async fn a_fleet_adopts_a_stated_window_it_was_not_told() {
    let redis = Redis::start();
    let n = 50;
    let s = Scenario::new("fleet-adopts-window")
        .with_sim(&[
            "--limit",
            "100/1s",
            "--limit",
            "30/2s",
            "--dialect",
            "ietf",
            "--concurrency",
            "20",
            "--latency",
            "5ms..20ms",
        ])
        .numbers(n);
    let key = fleet_name("adopts-window");
    let cmds = two_shards(
        &s,
        &["--limit", "100/1s", "--concurrency", "4"],
        &redis.url,
        &key,
    );
    let (runs, _) = run_all(cmds);
    assert_runs_clean(&runs, "fleet");
    assert!(
        runs.iter()
            .any(|r| r.stderr.contains("pacing to it as well")),
        "no process said it adopted the window: {}",
        runs[0].stderr
    );
    let stats = s.sim().stats().await;
    assert_eq!(stats["rejected_rate"], 0, "{stats}");
    let most = stats["policies"][1]["max_in_window"].as_u64().unwrap();
    assert!(most <= 30, "{most} calls in one 2 s window: {stats}");
    assert_shards_did_each_item_once(&s, 2, n);
}

/// A token budget the fleet was not told (`--limit 1000/1s` only, with
/// `--cost`), stated by the sim (`600/1s` of tokens, IETF `qu="tokens"`):
/// adopted from the first response, every call weighed against it through
/// Redis, the 8 calls out by then (at most 73 tokens each) among them.
/// Nothing is refused, and the budget paces the run (more is charged than
/// one second holds).
#[tokio::test(flavor = "multi_thread")]
async fn a_fleet_adopts_a_stated_token_budget_it_was_not_told() {
    let redis = Redis::start();
    let n = 60;
    let mut sim = vec!["--limit", "1000/1s", "--limit", "600/1s,tokens"];
    sim.extend([
        "--dialect",
        "ietf",
        "--concurrency",
        "20",
        "--latency",
        "5ms..20ms",
    ]);
    let s = Scenario::new("fleet-adopts-tokens")
        .with_sim(&sim)
        .input("items.jsonl", &prompts(n));
    let key = fleet_name("adopts-tokens");
    let cmds = two_shards(
        &s,
        &[
            "--limit",
            "1000/1s",
            "--concurrency",
            "4",
            "--cost",
            "max_tokens + chars(prompt)/4",
            "--json-body",
        ],
        &redis.url,
        &key,
    );
    let (runs, _) = run_all(cmds);
    assert_runs_clean(&runs, "fleet");
    let stats = s.sim().stats().await;
    assert_eq!(stats["rejected_rate"], 0, "{stats}");
    assert!(stats["tokens_charged"].as_u64().unwrap() > 600, "{stats}");
    assert_shards_did_each_item_once(&s, 2, n);
}

/// A daily quota the sim states (6 a day, IETF), the fleet told only
/// `--limit 100/1s`: adopted from the first response, it keeps the fleet
/// to 6 calls, and the response that says none is left holds the fleet
/// until the reset. Beyond the bound, each process halts resumably (exit
/// 75), saying which quota and when it resets, with no 429 and each item
/// done at most once.
#[tokio::test(flavor = "multi_thread")]
async fn a_fleet_halts_resumably_on_a_daily_quota_a_server_states() {
    let redis = Redis::start();
    let n = 20;
    let s = Scenario::new("fleet-daily-quota")
        .with_sim(&[
            "--limit",
            "100/1s",
            "--limit",
            "6/1d",
            "--dialect",
            "ietf",
            "--concurrency",
            "20",
        ])
        .numbers(n);
    let key = fleet_name("daily-quota");
    let cmds = two_shards(
        &s,
        &["--limit", "100/1s", "--concurrency", "2"],
        &redis.url,
        &key,
    );
    let (runs, _) = run_all(cmds);
    let mut done = 0;
    for r in &runs {
        assert_eq!(r.summary["rate_limited"], 0, "{}", r.summary);
        done += r.summary["done"].as_u64().unwrap();
        // A shard the quota let finish (shards follow content, so one may
        // hold 6 items or fewer) ends 0; one with items left halts.
        if r.summary["pending"] == 0 {
            assert_eq!(r.code, 0, "{}", r.stderr);
            continue;
        }
        assert_eq!(r.code, 75, "{}", r.stderr);
        let why = r.summary["halt_reason"].as_str().unwrap_or_default();
        assert!(why.contains("is used up until"), "{}", r.summary);
        assert!(r.stderr.contains("--wait-for-quota"), "{}", r.stderr);
    }
    assert!(
        runs.iter().any(|r| r.code == 75),
        "someone halts on the quota"
    );
    assert_eq!(done, 6, "the day's quota, no more");
    let stats = s.sim().stats().await;
    assert_eq!(stats["accepted"], 6, "{stats}");
    assert_eq!(stats["rejected_rate"], 0, "{stats}");
    // A halted shard rerun to wait for the quota says what it waits for
    // (it would wait a day, saying nothing).
    let halted = runs.iter().position(|r| r.code == 75).unwrap();
    let args = [
        "--limit",
        "100/1s",
        "--concurrency",
        "2",
        "--wait-for-quota",
    ];
    let mut c = two_shards(&s, &args, &redis.url, &key).remove(halted);
    c.stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    let mut child = c.spawn().unwrap();
    let said = said_within(
        child.stderr.take().unwrap(),
        "is used up: holding calls for",
    );
    let _ = child.kill();
    let _ = child.wait();
    assert!(said.is_ok(), "{}", said.unwrap_err());
}

/// Whether a line of `stderr` holds `what` within 30 s; else all it said.
fn said_within(stderr: std::process::ChildStderr, what: &str) -> Result<(), String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut all = String::new();
    while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
        match rx.recv_timeout(left) {
            Ok(line) if line.contains(what) => return Ok(()),
            Ok(line) => all.push_str(&(line + "\n")),
            Err(_) => break,
        }
    }
    Err(all)
}
