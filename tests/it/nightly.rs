//! The everyday rerun (issue #20): a nightly cron job with a reserve runs
//! down to it, alerts every night it is stuck there (or out of credits),
//! and goes on by itself after a top-up, with the same command every night.
//!
//! A night is scaled down to a moment: a run after a credit or reserve
//! halt checks the balance with one call whenever it comes, so nothing
//! stands for the hours between two nights.

use crate::common::*;

/// The ids of the alerts posted to `hook` so far.
fn posted(hook: &Receiver) -> Vec<String> {
    hook.ids()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_reserve_stall_alerts_every_night_and_ends_after_a_top_up_with_no_flag_added() {
    // 30 credits, a reserve of 20: room for 10 of the 50 items.
    let s = Scenario::new("nightly")
        .with_sim(&["--limit", "200/1s", "--credits", "30"])
        .numbers(50);
    let hook = Receiver::start().await;
    let night = [
        "--limit",
        "200/1s",
        "--concurrency",
        "4",
        "--reserve",
        "20",
        "--alert-webhook",
        &hook.url,
    ];

    // Night 1: spends down to the reserve and halts with the way on.
    let r = s.run(&night);
    assert_eq!(r.code, 75, "{}", r.stderr);
    assert_eq!(r.summary["done"], 10, "{}", r.summary);
    assert_eq!(r.summary["failed"], 0);
    assert_eq!(alert_ids(&r.summary), ["reserve"], "{}", r.summary);
    let why = r.summary["halt_reason"].as_str().unwrap().to_string();
    assert!(
        why.contains("10 item(s) done this run, 40 pending"),
        "{why}"
    );
    assert!(why.contains("~40 credits more would finish them"), "{why}");
    assert!(why.contains("goes on by itself"), "{why}");
    assert_eq!(s.sim().stats().await["credits_remaining"], 20);

    // Night 2, nobody topped up: one call checks the balance, finds the
    // reserve still reached, and says so in an alert of its own.
    let r = s.run(&night);
    assert_eq!(r.code, 75, "{}", r.stderr);
    assert_eq!(r.summary["requests"], 1, "{}", r.summary);
    assert!(
        r.stderr.contains("one call learns it afresh"),
        "{}",
        r.stderr
    );
    assert_eq!(alert_ids(&r.summary), ["reserve-2"], "{}", r.summary);
    assert!(
        r.stderr
            .contains("ALERT [reserve] reserve reached: 19 credits left"),
        "{}",
        r.stderr
    );
    assert!(
        r.stderr.contains("the 2nd time this billing cycle"),
        "{}",
        r.stderr
    );
    let stats = s.sim().stats().await;
    assert_eq!(stats["credits_remaining"], 19, "{stats}");
    assert_side_effects(&stats, 11);

    // A top-up; night 3 runs the very same command and finishes.
    s.sim().topup(100).await;
    let r = s.run(&night);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.summary["done"], 50, "{}", r.summary);
    assert_eq!(alert_ids(&r.summary), Vec::<String>::new(), "{}", r.summary);
    let stats = s.sim().stats().await;
    assert_side_effects(&stats, 50);
    assert_eq!(stats["credits_remaining"], 80, "{stats}");
    assert_each_item_once(&s.out_path(), 50);

    // Each stalled night reached the webhook once, the token never the log.
    assert_eq!(posted(&hook), ["reserve", "reserve-2"]);
    assert!(!r.stderr.contains("hook-secret"));
}

/// Issue #20: "a run after a halt re-checks the balance by itself with one
/// cheap call (no flag to remember)". This test pinned the old behaviour (a
/// rerun within `--recheck-after` sent nothing); it now asserts the issue's:
/// right after the halt, one call, then the halt again with its alert.
#[tokio::test(flavor = "multi_thread")]
async fn a_rerun_right_after_a_reserve_halt_alerts_again_and_spends_one_call() {
    let s = Scenario::new("nightlysoon")
        .with_sim(&["--limit", "200/1s", "--credits", "25"])
        .numbers(20);
    let hook = Receiver::start().await;
    let args = [
        "--limit",
        "200/1s",
        "--concurrency",
        "4",
        "--reserve",
        "20",
        "--alert-webhook",
        &hook.url,
    ];
    let r = s.run(&args);
    assert_eq!(r.code, 75, "{}", r.stderr);
    assert_eq!(r.summary["done"], 5);
    let accepted = s.sim().stats().await["accepted"].as_u64().unwrap();

    // At once, nobody topped up: the first pending item goes alone (it is
    // accepted: progress), the balance is below the reserve, and it halts.
    let r = s.run(&args);
    assert_eq!(r.code, 75, "{}", r.stderr);
    assert_eq!(r.summary["requests"], 1, "{}", r.summary);
    assert_eq!(r.summary["done"], 6);
    assert_eq!(r.summary["failed"], 0);
    assert_eq!(
        s.sim().stats().await["accepted"].as_u64().unwrap(),
        accepted + 1
    );
    let why = r.summary["halt_reason"].as_str().unwrap();
    assert!(why.contains("goes on by itself"), "{why}");
    assert_eq!(alert_ids(&r.summary), ["reserve-2"], "{}", r.summary);
    assert_eq!(posted(&hook), ["reserve", "reserve-2"]);
}

/// Out of credits with no reserve: each night after the halt spends one
/// call (refused: the run halts again at once, nothing failed) and alerts,
/// saying how many runs in a row found no credits; a top-up ends it, with
/// no flag added.
#[tokio::test(flavor = "multi_thread")]
async fn an_exhaustion_stall_spends_one_call_and_alerts_every_night_until_a_top_up() {
    let s = Scenario::new("nightlyout")
        .with_sim(&["--limit", "200/1s", "--credits", "10"])
        .numbers(30);
    let hook = Receiver::start().await;
    let night = [
        "--limit",
        "200/1s",
        "--concurrency",
        "4",
        "--alert-webhook",
        &hook.url,
    ];
    let exhausted = |r: &Finished| -> Vec<String> {
        alert_ids(&r.summary)
            .into_iter()
            .filter(|i| i.starts_with("exhausted"))
            .collect()
    };
    let r = s.run(&night);
    assert_eq!(r.code, 75, "night 1: {}", r.stderr);
    assert_eq!(r.summary["done"], 10, "{}", r.summary);
    assert_eq!(r.summary["failed"], 0);
    assert_eq!(exhausted(&r), ["exhausted"], "{}", r.summary);

    for n in 2..=3 {
        let refused = s.sim().stats().await["rejected_credits"].as_u64().unwrap();
        let r = s.run(&night);
        assert_eq!(r.code, 75, "night {n}: {}", r.stderr);
        assert_eq!(r.summary["requests"], 1, "night {n}: {}", r.summary);
        assert_eq!(r.summary["done"], 10);
        assert_eq!(r.summary["failed"], 0);
        let stats = s.sim().stats().await;
        assert_eq!(stats["rejected_credits"].as_u64().unwrap(), refused + 1);
        assert_eq!(exhausted(&r), [format!("exhausted-{n}")], "{}", r.summary);
        assert!(
            r.stderr.contains("one call learns whether they are back"),
            "night {n}: {}",
            r.stderr
        );
        let said = format!(
            "the {n}{} run in a row halted on them with no item done",
            ["", "", "nd", "rd"][n]
        );
        assert!(r.stderr.contains(&said), "night {n}: {}", r.stderr);
    }

    s.sim().topup(100).await;
    let r = s.run(&night);
    assert_eq!(r.code, 0, "night 4: {}", r.stderr);
    assert_eq!(r.summary["done"], 30, "{}", r.summary);
    assert_eq!(exhausted(&r), Vec::<String>::new());
    assert_side_effects(&s.sim().stats().await, 30);
    assert_each_item_once(&s.out_path(), 30);
    let posted: Vec<String> = posted(&hook)
        .into_iter()
        .filter(|i| i.starts_with("exhausted"))
        .collect();
    assert_eq!(posted, ["exhausted", "exhausted-2", "exhausted-3"]);
    // What the page says: the input and the host, not only a job hash.
    let got = hook.got.lock().unwrap().clone();
    let last = got.iter().find(|v| v["id"] == "exhausted-3").unwrap();
    assert_eq!(last["input"], s.input_path().display().to_string().as_str());
    assert!(
        last["host"].as_str().is_some_and(|h| !h.is_empty()),
        "{last}"
    );
}

/// The README's cron line, split into its arguments after the binary (up
/// to the redirection), single quotes removed.
fn readme_cron_args() -> Vec<String> {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .expect("README.md");
    let line = readme
        .lines()
        .find(|l| l.starts_with("0 2 * * * "))
        .expect("the README's cron recipe");
    let cmd = line
        .split_once("/usr/local/bin/batchrun ")
        .expect("the recipe runs /usr/local/bin/batchrun")
        .1;
    let cmd = cmd.split(" >>").next().unwrap();
    let (mut args, mut word, mut quoted) = (Vec::new(), String::new(), false);
    for c in cmd.chars() {
        match c {
            '\'' => quoted = !quoted,
            ' ' if !quoted => {
                if !word.is_empty() {
                    args.push(std::mem::take(&mut word));
                }
            }
            c => word.push(c),
        }
    }
    if !word.is_empty() {
        args.push(word);
    }
    args
}

#[tokio::test(flavor = "multi_thread")]
async fn the_readme_cron_recipe_runs_as_written() {
    let recipe = readme_cron_args();
    assert_eq!(recipe[0], "--plan", "{recipe:?}");
    assert_eq!(recipe[2], "nightly.jsonl", "{recipe:?}");
    // Scaled: 30 items, 10 credits above the recipe's reserve, the plan's
    // minute as a second, a night as a moment.
    let reserve: u64 = recipe[recipe.iter().position(|a| a == "--reserve").unwrap() + 1]
        .parse()
        .unwrap();
    let credits = (reserve + 10).to_string();
    let s = Scenario::new("cronrecipe")
        .with_sim(&[
            "--plan",
            &recipe[1],
            "--limit",
            "180/1s",
            "--credits",
            &credits,
        ])
        .input("nightly.jsonl", &numbers_text(30));
    let hook = Receiver::start().await;
    let url = format!("{}/v1/enrich?id={{n}}", s.sim().url);
    let mut night: Vec<String> = Vec::new();
    let mut it = recipe.iter().skip(3);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--url" | "--alert-webhook" => {
                let value = it.next().unwrap();
                assert!(value.starts_with("https://"), "{value}");
                night.push(a.clone());
                night.push(if a == "--url" {
                    url.clone()
                } else {
                    hook.url.clone()
                });
            }
            _ => night.push(a.clone()),
        }
    }
    let mut args: Vec<&str> = night.iter().map(String::as_str).collect();
    // The plan's limit scaled to the sim's second; nothing else is added,
    // on any night.
    args.extend(["--limit", "180/1s"]);

    let r = s.run(&args);
    assert_eq!(r.code, 75, "night 1: {}", r.stderr);
    assert_eq!(r.summary["done"], 10, "{}", r.summary);
    assert_eq!(r.summary["failed"], 0, "{}", r.summary);
    // Night 2, the very same command: one call learns the balance.
    let r = s.run(&args);
    assert_eq!(r.code, 75, "night 2: {}", r.stderr);
    assert_eq!(r.summary["done"], 11, "{}", r.summary);
    assert_eq!(r.summary["requests"], 1, "{}", r.summary);
    assert_eq!(r.summary["failed"], 0, "{}", r.summary);
    s.sim().topup(100).await;
    let r = s.run(&args);
    assert_eq!(r.code, 0, "night 3: {}", r.stderr);
    assert_eq!(r.summary["done"], 30, "{}", r.summary);
    assert_side_effects(&s.sim().stats().await, 30);
    assert_each_item_once(&s.out_path(), 30);
    assert_eq!(posted(&hook), ["reserve", "reserve-2"]);
}

/// `{"n": 1}` to `{"n": n}`, one a line.
fn numbers_text(n: u64) -> String {
    (1..=n).map(|i| format!("{{\"n\": {i}}}\n")).collect()
}

/// A key the API rejects on the first answer of every nightly run: each
/// run stops with the documented exit code (1, fatal: the key), nothing
/// marked failed, and each one pages (not only the first), naming the
/// input and the host.
#[tokio::test(flavor = "multi_thread")]
async fn a_rejected_key_stops_every_night_with_exit_1_and_pages_each_time() {
    let s = Scenario::new("nightlykey")
        .with_sim(&[
            "--limit", "200/1s", "--refuse", "n=1:401", "--refuse", "n=2:401",
        ])
        .numbers(5);
    let hook = Receiver::start().await;
    let night = [
        "--limit",
        "200/1s",
        "--concurrency",
        "1",
        "--alert-webhook",
        &hook.url,
    ];
    for n in 1..=2 {
        let r = s.run(&night);
        assert_eq!(r.code, 1, "night {n}: {}", r.stderr);
        assert_eq!(r.summary["failed"], 0);
        assert_eq!(r.summary["done"], 0);
        assert!(
            r.stderr
                .contains("ALERT [key_rejected] the API rejected the key (HTTP 401 for line 2"),
            "night {n}: {}",
            r.stderr
        );
        assert_eq!(alert_ids(&r.summary), ["key-rejected"], "{}", r.summary);
    }
    assert_eq!(posted(&hook), ["key-rejected", "key-rejected"]);
    let got = hook.got.lock().unwrap().clone();
    let input = s.input_path().display().to_string();
    for a in &got {
        assert_eq!(a["kind"], "key_rejected", "{a}");
        assert_eq!(a["input"], input.as_str(), "{a}");
        let host = a["host"].as_str().unwrap_or_default();
        assert!(!host.is_empty() && host != "?", "{a}");
        let text = a["text"].as_str().unwrap_or_default();
        assert!(text.contains(&input) && text.contains(host), "{text}");
    }
    assert_side_effects(&s.sim().stats().await, 0);
}

/// A nightly feed written to a file and run on the file (the way
/// docs/options.md gives, where a pipe with a fixed `--out` is refused on
/// the second night): the same command every night, no flag, only the new
/// rows sent, the results file that of the rows the feed holds now.
#[tokio::test(flavor = "multi_thread")]
async fn a_nightly_feed_file_runs_each_night_with_the_same_command() {
    let s = Scenario::new("nightlyfeed")
        .with_sim(&["--limit", "none"])
        .input("feed.jsonl", &numbers_text(5));
    let r = s.run(&["--limit", "none"]);
    assert_eq!(r.code, 0, "night 1: {}", r.stderr);
    // The next night's feed: two rows kept, three new.
    let text: String = (4..=8).map(|i| format!("{{\"n\": {i}}}\n")).collect();
    s.dir().write("feed.jsonl", &text);
    let r = s.run(&["--limit", "none"]);
    assert_eq!(r.code, 0, "night 2: {}", r.stderr);
    assert_eq!(r.summary["requests"], 3, "{}", r.summary);
    // The results file holds the results of the rows the feed holds now.
    assert_eq!(lines_of(&s.out_path()).len(), 5);
    let ns: Vec<u64> = jsonl(&s.out_path())
        .iter()
        .filter_map(|v| v["input"]["n"].as_u64())
        .collect();
    assert_eq!(ns, [4, 5, 6, 7, 8]);
    assert_side_effects(&s.sim().stats().await, 8);
}
