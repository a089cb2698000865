//! Credits: alerts once per cycle, the reserve, waiting for a top-up, status.

use std::process::Stdio;

use crate::common::*;

#[tokio::test(flavor = "multi_thread")]
async fn thresholds_fire_exactly_once_over_a_halt_and_a_resume_and_reach_the_webhook() {
    let s = Scenario::new("thresholds")
        .with_sim(&["--limit", "200/1s", "--credits", "40"])
        .numbers(60);
    let hook = Receiver::start().await;
    let args = [
        "--limit",
        "200/1s",
        "--concurrency",
        "2",
        "--alert-at",
        "0.5,0.8",
        "--alert-webhook",
        &hook.url,
    ];
    let first = s.run(&args);
    assert_eq!(first.code, 75, "{}", first.stderr);
    let ids = alert_ids(&first.summary);
    assert!(ids.contains(&"pct-0.5".to_string()), "{ids:?}");
    assert!(ids.contains(&"pct-0.8".to_string()), "{ids:?}");
    assert!(ids.contains(&"exhausted".to_string()), "{ids:?}");
    assert!(
        first.stderr.contains("ALERT [threshold]"),
        "{}",
        first.stderr
    );
    assert!(
        !first.stderr.contains("hook-secret"),
        "webhook token leaked"
    );

    // The halt's webhook deliveries finished before the process exited.
    let got = hook.got.lock().unwrap().clone();
    let exhausted = got
        .iter()
        .find(|v| v["id"] == "exhausted")
        .expect("exhausted alert posted");
    assert_eq!(exhausted["kind"], "exhausted");
    assert_eq!(exhausted["remaining"], 0);
    assert_eq!(exhausted["max"], 40);
    assert!(exhausted["renewal"].as_u64().is_some());
    assert!(exhausted["job"].as_str().is_some_and(|j| !j.is_empty()));
    // Whoever is paged learns what ran and where, not just a job hash.
    let input = s.input_path().display().to_string();
    assert_eq!(exhausted["input"], input.as_str());
    let host = exhausted["host"].as_str().unwrap_or_default();
    assert!(!host.is_empty() && host != "?", "{exhausted}");
    let text = exhausted["text"].as_str().unwrap_or_default();
    assert!(text.contains(&input) && text.contains(host), "{text}");
    assert!(exhausted["message"]
        .as_str()
        .unwrap()
        .contains("credits renew"));

    // A top-up in the same cycle: the rerun finishes and fires nothing again.
    s.sim().topup(100).await;
    let second = s.run(&args);
    assert_eq!(second.code, 0, "{}", second.stderr);
    let again = alert_ids(&second.summary);
    assert!(!again.iter().any(|i| i.starts_with("pct-")), "{again:?}");
    let ids = hook.ids();
    for id in ["pct-0.5", "pct-0.8", "exhausted"] {
        assert_eq!(
            ids.iter().filter(|i| *i == id).count(),
            1,
            "{id} in {ids:?}"
        );
    }
}

/// Issue #20: "with a reserve, a job runs until the reserve and halts with
/// the way on; a run after a halt re-checks the balance by itself with one
/// cheap call (no flag to remember)". This test pinned the old behaviour (a
/// refusal up front unless `--allow-partial`, and a rerun that sent nothing
/// until `--recheck-credits`); it now asserts the issue's.
#[tokio::test(flavor = "multi_thread")]
async fn the_reserve_halts_before_the_balance_would_cross_it() {
    let s = Scenario::new("reserve")
        .with_sim(&["--limit", "200/1s", "--credits", "100"])
        .numbers(50);
    let sim = s.sim();

    // No flag but the reserve: the projection crosses it (50 credits, 80 of
    // 100 kept), and the run spends down to it, then halts with the way on.
    // (The projection is made once two calls told the balance and the cost.)
    let args = ["--limit", "200/1s", "--concurrency", "5", "--reserve", "80"];
    let r = s.run(&args);
    assert_eq!(r.code, 75, "{}", r.stderr);
    assert!(
        r.stderr.contains("48 remaining item(s): ~48 credits at ~1.0/item; balance 98, reserve 80; it runs until the reserve (about 18 of them)"),
        "{}",
        r.stderr
    );
    assert_eq!(r.summary["state"], "halted");
    assert_eq!(r.summary["credits_remaining"], 80);
    assert_eq!(r.summary["done"], 20);
    assert_eq!(r.summary["failed"], 0);
    let why = r.summary["halt_reason"].as_str().unwrap_or_default();
    assert!(
        why.contains("20 item(s) done this run, 30 pending"),
        "{why}"
    );
    assert!(
        why.contains("the next run checks the balance with one call"),
        "{why}"
    );
    let stats = sim.stats().await;
    assert_eq!(stats["credits_remaining"], 80, "{stats}");

    // status reads the checkpoint without calling the API.
    let requests_before = sim.stats().await["accepted"].clone();
    let out = bin()
        .args(["status", "--state-dir"])
        .arg(s.state_dir())
        .arg(s.input_path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("20 done, 0 failed, 30 pending of 50"),
        "{text}"
    );
    assert!(text.contains("80 remaining of 100"), "{text}");
    assert!(text.contains("reserve"), "{text}");
    assert_eq!(sim.stats().await["accepted"], requests_before);

    // The rerun right after, nobody topped up: exactly one call (the first
    // pending item, so it is progress) learns the balance, then it halts.
    let r = s.run(&args);
    assert_eq!(r.code, 75, "{}", r.stderr);
    assert_eq!(r.summary["requests"], 1, "{}", r.summary);
    assert_eq!(r.summary["done"], 21);
    assert_eq!(r.summary["failed"], 0);
    assert!(
        r.stderr.contains("one call learns it afresh"),
        "{}",
        r.stderr
    );
    assert_eq!(sim.stats().await["credits_remaining"], 79);

    // After a top-up the very same command finishes: no flag added.
    sim.topup(100).await;
    let r = s.run(&args);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.summary["done"], 50);
    let stats = sim.stats().await;
    assert_eq!(stats["credits_remaining"], 150);
    assert_side_effects(&stats, 50);
    assert_each_item_once(&s.out_path(), 50);
}

/// `--allow-partial`, the old way to run until the reserve, is the default
/// now and still accepted (older cron lines keep working); the up-front
/// refusal has its own flag, `--require-full`, which halts as soon as the
/// balance and the cost of a call are known.
#[tokio::test(flavor = "multi_thread")]
async fn allow_partial_is_the_default_and_require_full_refuses_once_the_balance_is_known() {
    let s = Scenario::new("requirefull")
        .with_sim(&["--limit", "200/1s", "--credits", "100"])
        .numbers(50);
    let r = s.run(&["--limit", "200/1s", "--reserve", "80", "--require-full"]);
    assert_eq!(r.code, 75, "{}", r.stderr);
    assert_eq!(r.summary["failed"], 0);
    // It learns the balance and the cost of a call from two calls, one at a time.
    assert!(r.summary["done"].as_u64().unwrap() <= 2, "{}", r.summary);
    let why = r.summary["halt_reason"].as_str().unwrap_or_default();
    assert!(why.contains("--require-full: the remaining"), "{why}");
    assert!(why.contains("drop --require-full"), "{why}");
    assert!(!r.stderr.contains("runs until the reserve"), "{}", r.stderr);

    // The old flag: accepted, and the same as leaving it out.
    let r = s.run(&["--limit", "200/1s", "--reserve", "80", "--allow-partial"]);
    assert_eq!(r.code, 75, "{}", r.stderr);
    assert_eq!(r.summary["done"], 20, "{}", r.summary);
    assert_eq!(s.sim().stats().await["credits_remaining"], 80);
    // And the old re-check flags too.
    let r = s.run(&[
        "--limit",
        "200/1s",
        "--reserve",
        "80",
        "--recheck-credits",
        "--recheck-after",
        "1h",
    ]);
    assert_eq!(r.code, 75, "{}", r.stderr);
    assert_eq!(r.summary["requests"], 1, "{}", r.summary);

    let r = s.run(&["--reserve", "80", "--allow-partial", "--require-full"]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("--require-full"), "{}", r.stderr);
}

#[tokio::test(flavor = "multi_thread")]
async fn wait_for_credits_resumes_by_itself_after_a_top_up() {
    let s = Scenario::new("wait")
        .with_sim(&["--limit", "200/1s", "--credits", "10"])
        .numbers(25);
    let child = s
        .cmd(&[
            "--limit",
            "200/1s",
            "--concurrency",
            "3",
            "--wait-for-credits",
            "--probe-every",
            "200ms",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Exhausted, and probing: at least two rejected probes after the halt.
    wait_for_stats(s.sim(), 30, |st| {
        // Three workers' first refusals, then at least two probes.
        st["side_effects"] == 10 && st["rejected_credits"].as_u64().unwrap_or(0) >= 3 + 2
    })
    .await;
    s.sim().topup(100).await;
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["done"], 25);
    let ids = alert_ids(&summary);
    assert!(ids.contains(&"waiting".to_string()), "{ids:?}");
    assert!(ids.contains(&"resumed".to_string()), "{ids:?}");
    assert_eq!(
        ids.iter().filter(|i| *i == "waiting").count(),
        1,
        "alerted once: {ids:?}"
    );
    assert_side_effects(&s.sim().stats().await, 25);
    assert_each_item_once(&s.out_path(), 25);
}

#[tokio::test(flavor = "multi_thread")]
async fn ctrl_c_while_waiting_for_credits_exits_130() {
    let s = Scenario::new("waitctrlc")
        .with_sim(&["--limit", "200/1s", "--credits", "3"])
        .numbers(10);
    let r = s
        .signal_when(
            &[
                "--limit",
                "200/1s",
                "--wait-for-credits",
                "--probe-every",
                "1h",
            ],
            |st| st["rejected_credits"].as_u64().unwrap_or(0) >= 1,
            libc::SIGINT,
        )
        .await;
    assert_eq!(r.code, 130, "{}", r.stderr);
    let summary = r.summary;
    assert_eq!(summary["done"], 3);
    assert_eq!(summary["failed"], 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_reserve_holds_when_a_call_costs_several_credits() {
    // Three credits a call, slow calls, five workers: the cost must be learnt
    // before the pool opens up, or the calls in flight overshoot the reserve.
    let s = Scenario::new("reservecost")
        .with_sim(&[
            "--limit",
            "200/1s",
            "--credits",
            "30",
            "--cost",
            "3",
            "--latency",
            "50ms",
        ])
        .numbers(20);
    let r = s.run(&["--limit", "200/1s", "--concurrency", "5", "--reserve", "20"]);
    assert_eq!(r.code, 75, "{}", r.stderr);
    assert_eq!(r.summary["credits_remaining"], 21, "{}", r.summary);
    assert_eq!(r.summary["done"], 3);
    assert_eq!(s.sim().stats().await["credits_remaining"], 21);
}
