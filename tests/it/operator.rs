//! The operator's view: what the run says before, during and after.

use crate::common::*;

#[tokio::test(flavor = "multi_thread")]
async fn a_dry_run_shows_requests_with_the_key_hidden_and_sends_nothing() {
    let s = Scenario::new("dry-run").with_sim(&[]).numbers(5);
    let url = format!("{}/v1/echo?n={{n}}&k={KEY}", s.sim().url);
    // The key is templated into the URL on purpose: it must still be hidden.
    let f = finish(s.cmd(&["--url", &url, "--dry-run", "2"]));
    assert_eq!(f.code, 0, "{}", f.stderr);
    assert_eq!(f.summary["state"], "checked");
    assert_eq!(f.summary["requests"], 0);
    assert!(f.stderr.contains("GET "), "{}", f.stderr);
    assert!(f.stderr.contains("?n=2&k=***"), "{}", f.stderr);
    assert!(!f.stderr.contains("?n=3"), "only two shown");
    let st = s.sim().stats().await;
    assert_eq!(st["requests"], 0, "nothing sent: {st}");
    assert!(
        !s.state_dir().join("checkpoint").exists(),
        "no job was opened"
    );
    assert!(!f.stderr.contains("no API key"), "{}", f.stderr);
    // Checking a job needs no key: nothing is sent. It says the real run
    // would stop there (it passed silently, and the real run failed).
    let plain = format!("{}/v1/echo?n={{n}}", s.sim().url);
    let mut c = s.cmd(&["--url", &plain, "--dry-run", "1"]);
    c.env_remove("BATCHRUN_API_KEY");
    let f = finish(c);
    assert_eq!(f.code, 0, "{}", f.stderr);
    assert_eq!(f.summary["state"], "checked");
    assert!(
        f.stderr
            .contains("no usable API key is set: the real run stops there"),
        "{}",
        f.stderr
    );
}

#[test]
fn a_jsonl_file_run_as_csv_is_refused_before_any_call() {
    let s = Scenario::new("csv-json").numbers(3);
    let r = s.run(&[
        "--url",
        "http://127.0.0.1:9/v1/echo?n={n}",
        "--format",
        "csv",
    ]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("looks like JSON"), "{}", r.stderr);
}

#[tokio::test(flavor = "multi_thread")]
async fn logs_on_a_pipe_start_with_what_the_run_will_do_and_carry_timestamps() {
    let s = Scenario::new("logs")
        .with_sim(&["--limit", "20/1s"])
        .numbers(30);
    let r = s.run(&["--limit", "20/1s", "--log-every", "1s"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let lines: Vec<&str> = r.stderr.lines().collect();
    let start = lines[0];
    assert!(start.contains("30 of 30 items pending"), "{start}");
    assert!(start.contains("limit 20ps (--limit)"), "{start}");
    assert!(start.contains("concurrency"), "{start}");
    assert!(start.contains("about 1s at the limit's pace"), "{start}");
    // Every line that starts a log entry carries an ISO-8601 UTC time.
    let entries: Vec<&&str> = lines.iter().filter(|l| !l.starts_with(' ')).collect();
    assert!(entries.len() >= 3, "{}", r.stderr);
    for l in entries {
        let ts = l.split(' ').next().unwrap();
        assert!(
            ts.len() == 20 && ts.ends_with('Z') && ts.as_bytes()[10] == b'T',
            "no timestamp: {l}"
        );
    }
    assert!(r.stderr.contains("done  "), "a progress line: {}", r.stderr);
}

#[test]
fn quiet_prints_the_summary_alone() {
    let s = Scenario::new("quiet")
        .with_sim(&["--limit", "none"])
        .numbers(3);
    let r = s.run(&["--limit", "none", "-q"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stderr.contains("batchrun: done"), "{}", r.stderr);
    assert!(!r.stderr.contains("items pending"), "{}", r.stderr);
}

#[test]
fn verbose_prints_one_line_per_call_with_the_key_hidden() {
    let s = Scenario::new("verbose")
        .with_sim(&["--limit", "none"])
        .numbers(3);
    let url = format!("{}/v1/echo?n={{n}}&k={KEY}", s.sim().url);
    let r = s.run(&["--url", &url, "--limit", "none", "-v"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let calls: Vec<&str> = r
        .stderr
        .lines()
        .filter(|l| l.contains(" -> HTTP 200 in "))
        .collect();
    assert_eq!(calls.len(), 3, "{}", r.stderr);
    assert!(calls.iter().all(|l| l.contains("k=***")), "{}", r.stderr);
}

/// Runs `batchrun ARGS` inside a pseudo-terminal (util-linux `script`), for
/// at most `secs` seconds, and returns everything it drew.
fn in_a_terminal(s: &Scenario, args: &[&str], secs: u64) -> String {
    let cmd = s.cmd(args);
    let mut line = format!("exec '{}'", cmd.get_program().to_string_lossy());
    for a in cmd.get_args() {
        line.push_str(&format!(" '{}'", a.to_string_lossy()));
    }
    let out = std::process::Command::new("timeout")
        .arg(secs.to_string())
        .args(["script", "-qfec", &line, "/dev/null"])
        .env("BATCHRUN_API_KEY", KEY)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("script(1) from util-linux runs the pty tests");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn the_bar_on_a_terminal_shows_a_pause_and_its_end() {
    let s = Scenario::new("bar-pause")
        .with_sim(&["--rate-limit-forever"])
        .numbers(5);
    let screen = in_a_terminal(&s, &["--limit", "100/1s", "--max-wait", "3s"], 30);
    assert!(screen.contains("0/5"), "no bar: {screen}");
    assert!(
        screen.contains("PAUSED 1s (until "),
        "no pause shown: {screen}"
    );
    assert!(screen.contains("halted"), "{screen}");
    assert!(!screen.contains(KEY));
}

#[test]
fn the_bar_on_a_terminal_gives_a_long_wait_its_true_eta() {
    // One call an hour: the first goes at once, and the bar must say the
    // other four take four hours, not seconds.
    let s = Scenario::new("bar-eta").with_sim(&[]).numbers(5);
    let screen = in_a_terminal(&s, &["--limit", "1/1h"], 3);
    assert!(screen.contains("1/5"), "no bar: {screen}");
    assert!(screen.contains("ETA 4h00m"), "{screen}");
}

#[tokio::test(flavor = "multi_thread")]
async fn status_works_while_the_job_runs_and_always_prints_an_array() {
    let s = Scenario::new("status-live")
        .with_sim(&["--limit", "4/1s"])
        .numbers(24);
    let mut child = s
        .cmd(&["--limit", "4/1s"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Until the run has made its checkpoint there is nothing to show.
    let status = || s.status_json().ok();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    let live = loop {
        let v = status().unwrap_or_default();
        if let Some(job) = v.as_array().and_then(|a| a.first()) {
            if job["running"] == true && job["done"].as_u64().unwrap_or(0) >= 1 {
                break job.clone();
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never seen running: {v}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    assert_eq!(live["total"], 24);
    assert!(live["pid"].as_u64().is_some());
    assert!(child.wait().unwrap().success());
    let after = status().expect("status after the run");
    assert_eq!(
        after.as_array().unwrap().len(),
        1,
        "one job, still an array: {after}"
    );
    assert_eq!(after[0]["done"], 24);
    assert_eq!(after[0]["running"], false, "{after}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_default_state_belongs_to_the_input_not_the_current_directory() {
    let s = Scenario::new("state-beside")
        .with_sim(&["--limit", "none"])
        .numbers(4);
    let other = s.dir().write("other.jsonl", "{\"n\": 9}\n");
    let elsewhere = s.dir().path().join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    let url = format!("{}/v1/echo?n={{n}}", s.sim().url);
    let run = |input: &std::path::Path, cwd: &std::path::Path| {
        let mut c = bin();
        c.arg(input)
            .args(["--url", &url, "--limit", "none", "--json"])
            .env("BATCHRUN_API_KEY", KEY)
            .current_dir(cwd);
        finish(c)
    };
    let items = s.dir().path().join("items.jsonl");
    let first = run(&items, s.dir().path());
    assert_eq!(first.code, 0, "{}", first.stderr);
    assert!(
        first.stderr.contains(".batchrun/items.jsonl"),
        "{}",
        first.stderr
    );
    // From another directory, the same input resumes the same job.
    let again = run(&items, &elsewhere);
    assert_eq!(again.code, 0, "{}", again.stderr);
    assert_eq!(again.summary["requests"], 0, "{}", again.stderr);
    // Another input in the same folder has its own checkpoint.
    let second = run(&other, &elsewhere);
    assert_eq!(second.code, 0, "{}", second.stderr);
    assert!(s
        .dir()
        .path()
        .join(".batchrun/other.jsonl/checkpoint")
        .exists());
    assert_side_effects(&s.sim().stats().await, 5);
}

#[test]
fn one_overrun_hitting_many_workers_is_announced_once_not_per_worker() {
    let s = Scenario::new("pause-once")
        .with_sim(&[
            "--limit",
            "10/1s",
            "--cooldown",
            "1s",
            "--secret-limit",
            "--latency",
            "50ms",
        ])
        .numbers(30);
    // A burst far over the server's limit: many workers meet the same pause.
    let r = s.run(&[
        "--limit",
        "100/1s",
        "--pacer",
        "bucket",
        "--burst",
        "50",
        "--concurrency",
        "8",
    ]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let limited = r.summary["rate_limited"].as_u64().unwrap();
    let lines = r.stderr.matches("pausing every worker").count() as u64;
    assert!(limited >= 3, "{}", r.summary);
    assert!(
        lines < limited,
        "{lines} lines for {limited} 429s: {}",
        r.stderr
    );
    // Each pause line carries what the server said about it.
    for line in r
        .stderr
        .lines()
        .filter(|l| l.contains("pausing every worker"))
    {
        assert!(
            line.contains("(the server said: rate limit exceeded"),
            "{line}"
        );
    }
    // The 429s are in the summary's counts too, beside the 200s.
    let counts = &r.summary["status_counts"];
    assert_eq!(counts["200"], 30, "{}", r.summary);
    assert_eq!(counts["429"].as_u64(), Some(limited), "{}", r.summary);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_summary_counts_every_call_by_status_with_its_latency() {
    let s = Scenario::new("status-counts")
        .with_sim(&["--limit", "none", "--latency", "20ms"])
        // Items 1-2 go to the echo endpoint, 3-4 to one that does not exist.
        .input(
            "mixed.jsonl",
            "{\"n\": 1, \"v\": 1}\n{\"n\": 2, \"v\": 1}\n{\"n\": 3, \"v\": 9}\n{\"n\": 4, \"v\": 9}\n",
        );
    let url = format!("{}/v{{v}}/echo?n={{n}}", s.sim().url);
    let r = s.run(&["--limit", "none", "--url", &url, "--fail-fast", "0"]);
    assert_eq!(r.code, 3, "{}", r.stderr);
    let counts = r.summary["status_counts"].as_object().unwrap();
    assert_eq!(counts["200"], 2, "{}", r.summary);
    assert_eq!(counts["404"], 2, "{}", r.summary);
    let calls: u64 = counts.values().map(|v| v.as_u64().unwrap()).sum();
    assert_eq!(
        Some(calls),
        r.summary["requests"].as_u64(),
        "every call counted once"
    );
    let p50 = r.summary["latency_p50_ms"].as_f64().unwrap();
    let p99 = r.summary["latency_p99_ms"].as_f64().unwrap();
    // The sim holds each echo call 20 ms: the slowest cannot be below that.
    assert!(
        p50 > 0.0 && p99 >= 19.0 && p99 >= p50,
        "p50 {p50} p99 {p99}"
    );
    assert!(
        r.stderr.contains("responses: 200 x2, 404 x2; latency p50"),
        "{}",
        r.stderr
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_grown_input_resumes_and_sends_only_the_appended_lines() {
    let s = Scenario::new("grown")
        .with_sim(&["--limit", "none"])
        .numbers(5);
    assert_eq!(s.run(&["--limit", "none"]).code, 0);
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(s.input_path())
        .unwrap();
    use std::io::Write;
    f.write_all(b"{\"n\": 6}\n{\"n\": 7}\n{\"n\": 8}\n")
        .unwrap();
    drop(f);
    let r = s.run(&["--limit", "none"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stderr.contains("grew by 3 item(s)"), "{}", r.stderr);
    assert_eq!(r.summary["requests"], 3, "{}", r.summary);
    assert_each_item_once(&s.out_path(), 8);
    assert_side_effects(&s.sim().stats().await, 8);
    // An edit of the old lines: matched by content, only the new item goes.
    std::fs::write(s.input_path(), "{\"n\": 7}\n{\"n\": 100}\n").unwrap();
    let edited = s.run(&["--limit", "none"]);
    assert_eq!(edited.code, 0, "{}", edited.stderr);
    assert!(
        edited.stderr.contains("changed since its checkpoint"),
        "{}",
        edited.stderr
    );
    assert_eq!(edited.summary["requests"], 1, "{}", edited.summary);
    assert_eq!(lines_of(&s.out_path()), vec![1, 2]);
}

/// A key the environment holds but no header can carry is named for what
/// it is, not reported missing; an empty one is called empty.
#[test]
fn a_key_that_is_not_utf8_or_empty_is_named_so() {
    use std::os::unix::ffi::OsStrExt;
    let s = Scenario::new("bad-key").numbers(2);
    let url = "http://127.0.0.1:9/v1/echo?n={n}";
    let mut c = s.cmd(&["--url", url]);
    c.env("BATCHRUN_API_KEY", std::ffi::OsStr::from_bytes(b"k\xffey"));
    let f = finish(c);
    assert_eq!(f.code, 2, "{}", f.stderr);
    assert!(
        f.stderr
            .contains("the API key in BATCHRUN_API_KEY is not valid UTF-8"),
        "{}",
        f.stderr
    );
    let mut c = s.cmd(&["--url", url]);
    c.env("BATCHRUN_API_KEY", "");
    let f = finish(c);
    assert_eq!(f.code, 2, "{}", f.stderr);
    assert!(
        f.stderr
            .contains("no API key: the environment variable BATCHRUN_API_KEY is empty"),
        "{}",
        f.stderr
    );
}

/// `--joblog` naming the input would append a line per call to the items
/// (after every call was paid for, the next run would refuse the input):
/// refused before anything is sent, the input untouched.
#[test]
fn a_joblog_onto_the_input_is_refused_before_any_call() {
    let s = Scenario::new("joblog-input").numbers(3);
    let items = std::fs::read(s.input_path()).unwrap();
    let input = s.input_path().to_str().unwrap().to_owned();
    let r = s.run(&[
        "--url",
        "http://127.0.0.1:9/v1/echo?n={n}",
        "--joblog",
        &input,
    ]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("is the input file"), "{}", r.stderr);
    assert_eq!(std::fs::read(s.input_path()).unwrap(), items);
}

/// An API that states no credits (many do not meter them): once items
/// are done, `status` says the API states none, not that no metered
/// response came yet.
#[tokio::test(flavor = "multi_thread")]
async fn status_says_when_the_api_states_no_credits() {
    let app =
        axum::Router::new().fallback(|| async { axum::Json(serde_json::json!({"ok": true})) });
    let url = format!("http://{}/v1/x?n={{n}}", serve(app).await);
    let s = Scenario::new("status-no-credits").numbers(3);
    let r = s.run(&["--url", &url, "--limit", "none"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let out = s.tool("status").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("credits:  not stated by this API"), "{text}");
}
