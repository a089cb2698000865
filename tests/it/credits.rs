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

#[tokio::test(flavor = "multi_thread")]
async fn the_reserve_halts_before_the_balance_would_cross_it() {
    let s = Scenario::new("reserve")
        .with_sim(&["--limit", "200/1s", "--credits", "100"])
        .numbers(50);
    let sim = s.sim();

    // Without --allow-partial: the projection (50 credits) crosses the
    // reserve (80 of 100), so it refuses after the first call told it the balance.
    let r = s.run(&["--limit", "200/1s", "--reserve", "80"]);
    assert_eq!(r.code, 75, "{}", r.stderr);
    assert!(r.stderr.contains("projected cost"), "{}", r.stderr);
    assert!(r.stderr.contains("--allow-partial"), "{}", r.stderr);
    assert_eq!(r.summary["failed"], 0);
    // It learns the balance and the cost of a call from two calls, one at a time.
    assert!(r.summary["done"].as_u64().unwrap() <= 2, "{}", r.summary);

    let args = [
        "--limit",
        "200/1s",
        "--concurrency",
        "5",
        "--reserve",
        "80",
        "--allow-partial",
    ];
    let r = s.run(&args);
    assert_eq!(r.code, 75, "{}", r.stderr);
    assert_eq!(r.summary["state"], "halted");
    assert_eq!(r.summary["credits_remaining"], 80);
    assert_eq!(r.summary["done"], 20);
    assert_eq!(r.summary["failed"], 0);
    assert!(r.stderr.contains("reserve"), "{}", r.stderr);
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

    // The nightly rerun: the checkpoint already knows the reserve is reached,
    // so it refuses without spending a single credit of it.
    let r = s.run(&args);
    assert_eq!(r.code, 75, "{}", r.stderr);
    assert_eq!(r.summary["requests"], 0);
    assert!(r.stderr.contains("nothing was sent"), "{}", r.stderr);
    assert!(r.stderr.contains("--recheck-credits"), "{}", r.stderr);
    assert_eq!(sim.stats().await["accepted"], requests_before);

    // After a top-up, one call learns the new balance and the job finishes.
    sim.topup(100).await;
    let mut recheck = args.to_vec();
    recheck.push("--recheck-credits");
    let r = s.run(&recheck);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.summary["done"], 50);
    assert_eq!(sim.stats().await["credits_remaining"], 150);
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
    let r = s.run(&[
        "--limit",
        "200/1s",
        "--concurrency",
        "5",
        "--reserve",
        "20",
        "--allow-partial",
    ]);
    assert_eq!(r.code, 75, "{}", r.stderr);
    assert_eq!(r.summary["credits_remaining"], 21, "{}", r.summary);
    assert_eq!(r.summary["done"], 3);
    assert_eq!(s.sim().stats().await["credits_remaining"], 21);
}
