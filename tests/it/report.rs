//! Seeing a run afterwards: the job log and the results as CSV.

use crate::common::*;

/// The sim's window filled by live traffic on the same key, so the run
/// meets 429s (calls that are not an item's last).
async fn fill_window(s: &Scenario, n: usize) {
    let client = reqwest::Client::new();
    for i in 0..n {
        let r = client
            .get(format!("{}/v1/echo?live={i}", s.sim().url))
            .header("x-api-key", KEY)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
}

/// The job log's rows below its header, split at the tabs.
fn joblog_rows(path: &std::path::Path) -> (Vec<String>, Vec<Vec<String>>) {
    let text = std::fs::read_to_string(path).expect("the job log exists");
    let mut lines = text.lines();
    let header = lines.next().unwrap_or_default();
    let headers = header.split('\t').map(String::from).collect();
    let rows = lines
        .map(|l| l.split('\t').map(String::from).collect())
        .collect();
    (headers, rows)
}

/// A run killed with -9: every item its checkpoint holds done has its
/// line in the job log (a resume does not call it again, so a line lost
/// then is lost for good). Lines were flushed once a second, and the last
/// second's were lost while their results were committed.
#[tokio::test(flavor = "multi_thread")]
async fn a_kill_9_loses_no_joblog_line_of_a_committed_result() {
    let s = Scenario::new("joblog-kill")
        .with_sim(&["--limit", "none"])
        .numbers(3000);
    let log = s.dir().path().join("calls.tsv");
    let log_arg = log.to_string_lossy().into_owned();
    let args = ["--limit", "none", "--joblog", &log_arg];
    let killed = s
        .signal_when(
            &args,
            |st| st["side_effects"].as_u64() >= Some(300),
            libc::SIGKILL,
        )
        .await;
    assert_ne!(killed.code, 0);
    let r = s.run(&args);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_each_item_once(&s.out_path(), 3000);
    let (_, rows) = joblog_rows(&log);
    let logged: std::collections::HashSet<u64> = rows
        .iter()
        .filter(|r| r.len() == 6 && r[5] == "ok")
        .filter_map(|r| r[0].parse().ok())
        .collect();
    let missing: Vec<u64> = (1..=3000).filter(|n| !logged.contains(n)).collect();
    assert!(
        missing.is_empty(),
        "{} done items with no line: {:?}",
        missing.len(),
        &missing[..missing.len().min(10)]
    );
}

/// `retries` counts calls sent again: a run stopped (here by
/// `--max-failures`) while items wait out their backoff sent none of
/// theirs. It counted retries scheduled (9 where 6 went).
#[tokio::test(flavor = "multi_thread")]
async fn retries_count_the_calls_sent_again() {
    let s = Scenario::new("retries-sent")
        .with_sim(&["--limit", "none", "--fail-rate", "1.0"])
        .numbers(30);
    let log = s.dir().path().join("calls.tsv");
    let r = s.run(&[
        "--limit",
        "none",
        "-c",
        "4",
        "--max-attempts",
        "2",
        "--max-failures",
        "5",
        "--joblog",
        &log.to_string_lossy(),
    ]);
    assert_ne!(r.code, 0, "{}", r.stderr);
    let (_, rows) = joblog_rows(&log);
    let again = rows.iter().filter(|r| r[4] != "1").count() as u64;
    assert!(again > 0, "{rows:?}");
    assert_eq!(r.summary["retries"].as_u64(), Some(again), "{}", r.summary);
    assert_eq!(r.summary["requests"].as_u64(), Some(rows.len() as u64));
}

#[tokio::test(flavor = "multi_thread")]
async fn the_joblog_has_one_line_per_call_appended_across_resumes() {
    let s = Scenario::new("joblog")
        .with_sim(&[
            "--limit",
            "20/1s",
            "--concurrency",
            "10",
            "--cooldown",
            "1s",
        ])
        .numbers(40);
    fill_window(&s, 20).await;
    let log = s.dir().path().join("logs/calls.tsv");
    let log_arg = log.to_string_lossy().into_owned();
    let args = ["--limit", "100/1s", "--concurrency", "5", "--burst", "10"];
    let r = s.run(&[&args[..], &["--joblog", &log_arg]].concat());
    assert_eq!(r.code, 0, "{}", r.stderr);
    let first_requests = r.summary["requests"].as_u64().unwrap();
    let (headers, rows) = joblog_rows(&log);
    assert_eq!(
        headers,
        [
            "Line",
            "Starttime",
            "JobRuntime",
            "Status",
            "Attempt",
            "Outcome"
        ]
    );
    assert_eq!(rows.len() as u64, first_requests, "one line per call");
    let limited = rows.iter().filter(|r| r[5] == "rate_limited").count();
    assert!(limited >= 1, "the window was full: some calls got a 429");
    assert_eq!(limited as u64, r.summary["rate_limited"].as_u64().unwrap());
    // Every item's last call is its one success, and a retried item's
    // attempts count up from 1.
    let mut ok: Vec<u64> = rows
        .iter()
        .filter(|r| r[5] == "ok")
        .map(|r| r[0].parse().unwrap())
        .collect();
    ok.sort();
    assert_eq!(ok, (1..=40).collect::<Vec<u64>>());
    for row in &rows {
        assert_eq!(row.len(), 6, "{row:?}");
        let start: f64 = row[1].parse().unwrap();
        let took: f64 = row[2].parse().unwrap();
        assert!(start > 1.7e9 && (0.0..30.0).contains(&took), "{row:?}");
        assert!(row[4].parse::<u32>().unwrap() >= 1, "{row:?}");
    }

    // More items appended: the resume appends to the same log, under the
    // one header.
    let more: String = (41..=50).map(|i| format!("{{\"n\": {i}}}\n")).collect();
    let mut input = std::fs::read_to_string(s.input_path()).unwrap();
    input.push_str(&more);
    std::fs::write(s.input_path(), input).unwrap();
    let again = s.run(&[&args[..], &["--joblog", &log_arg]].concat());
    assert_eq!(again.code, 0, "{}", again.stderr);
    let (_, rows) = joblog_rows(&log);
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(text.matches("Line\tStarttime").count(), 1, "one header");
    assert_eq!(
        rows.len() as u64,
        first_requests + again.summary["requests"].as_u64().unwrap()
    );
    assert_key_absent_from_files(s.dir().path());
}

#[tokio::test(flavor = "multi_thread")]
async fn results_as_csv_read_back_to_the_same_items_as_the_jsonl() {
    // Fields that need quoting: commas, quotes, a newline; and a key only
    // some items have.
    let mut items = String::new();
    for i in 1..=12 {
        let extra = if i % 4 == 0 { ",\"only\":true" } else { "" };
        items.push_str(&format!(
            "{{\"n\":{i},\"text\":\"a, \\\"b\\\"\\nline {i}\"{extra}}}\n"
        ));
    }
    let s = Scenario::new("csv")
        .with_sim(&["--limit", "100/1s"])
        .input("items.jsonl", &items);
    let csv_path = s.dir().path().join("results.csv");
    let r = s.run(&["--limit", "100/1s", "--out", &csv_path.to_string_lossy()]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.summary["done"], 12);
    // The same job, its results written again as JSONL: nothing is sent.
    let again = s.run(&["--limit", "100/1s"]);
    assert_eq!(again.code, 0, "{}", again.stderr);
    assert_eq!(again.summary["requests"], 0);
    let want = jsonl(&s.out_path());
    assert_eq!(want.len(), 12);

    let mut rd = csv::Reader::from_path(&csv_path).unwrap();
    let headers: Vec<String> = rd.headers().unwrap().iter().map(String::from).collect();
    assert_eq!(headers, ["line", "status", "n", "text", "only", "body"]);
    let rows: Vec<csv::StringRecord> = rd.records().map(Result::unwrap).collect();
    assert_eq!(rows.len(), want.len());
    for (row, j) in rows.iter().zip(&want) {
        assert_eq!(row[0], j["line"].to_string());
        assert_eq!(row[1], j["status"].to_string());
        assert_eq!(row[2], j["input"]["n"].to_string());
        assert_eq!(&row[3], j["input"]["text"].as_str().unwrap());
        let only = j["input"].get("only").map(|v| v.to_string());
        assert_eq!(row[4], only.unwrap_or_default());
        let body: serde_json::Value = serde_json::from_str(&row[5]).unwrap();
        assert_eq!(body, j["body"]);
    }
    // The finished job asked for CSV where it wrote JSON lines: the file
    // is written again, as CSV, and nothing is sent; and back.
    for (format, first) in [("csv", "line,status,n,text,only,body"), ("jsonl", "{")] {
        let r = s.run(&["--limit", "100/1s", "--out-format", format]);
        assert_eq!((r.code, &r.summary["requests"]), (0, &serde_json::json!(0)));
        let text = std::fs::read_to_string(s.out_path()).unwrap();
        assert!(text.starts_with(first), "{format}: {text}");
    }
}

/// The keys of a `status --json` job object.
fn keys(v: &serde_json::Value) -> Vec<String> {
    let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
    k.sort();
    k
}

#[tokio::test(flavor = "multi_thread")]
async fn status_shows_the_runs_in_one_shape_running_or_not_and_prune_forgets_old_jobs() {
    let s = Scenario::new("status-runs")
        .with_sim(&["--limit", "4/1s"])
        .numbers(24);
    let mut child = s
        .cmd(&["--limit", "4/1s"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    let live = loop {
        let v = s.status_json().unwrap_or_default();
        if let Some(job) = v.as_array().and_then(|a| a.first()) {
            if job["running"] == true && job["last_run"]["done"].as_u64().unwrap_or(0) >= 2 {
                break job.clone();
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never seen running: {v}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    let prune = || s.tool("status").arg("--prune").output().unwrap();
    // Pruning while the run holds the checkpoint says it cannot (it said
    // nothing, and pruned nothing). Four seconds of the run are left.
    // Not done, so no success (exit 1, as for a checkpoint in use).
    let busy = prune();
    let said = String::from_utf8_lossy(&busy.stderr);
    assert!(
        said.contains("not pruned: a run holds the checkpoint"),
        "{said}"
    );
    assert_eq!(busy.status.code(), Some(1), "{said}");
    assert!(child.wait().unwrap().success());
    assert_eq!(live["last_run"]["state"], "running");
    assert!(live["last_run"]["ended_unix_ms"].is_null());
    assert!(live["rate_per_min"].as_f64().unwrap() > 0.0, "{live}");
    assert!(live["eta_s"].as_f64().is_some(), "{live}");
    let after = s.status_json().unwrap()[0].clone();
    // The sim says when its credits renew: a running job says it too.
    assert!(after["renewal"].as_u64().is_some(), "{after}");
    assert_eq!(live["renewal"], after["renewal"], "{live} / {after}");
    assert_eq!(keys(&live), keys(&after), "one shape: {live} / {after}");
    assert_eq!(
        keys(&live["last_run"]),
        keys(&after["last_run"]),
        "one shape"
    );
    let run = &after["last_run"];
    assert_eq!(after["running"], false);
    assert_eq!(run["state"], "done");
    assert_eq!(run["exit_code"], 0);
    assert_eq!(run["done"], 24);
    assert_eq!(run["requests"], after["requests"]);
    let (start, end) = (
        run["started_unix_ms"].as_u64().unwrap(),
        run["ended_unix_ms"].as_u64().unwrap(),
    );
    assert!(end >= start, "{run}");
    let took = run["duration_s"].as_f64().unwrap();
    assert!((took - (end - start) as f64 / 1000.0).abs() < 0.01, "{run}");
    assert!(took >= 4.0, "24 items at 4/s take over 4 seconds: {run}");

    // Another job on the same input (another endpoint, its own outputs).
    let other_out = s.dir().path().join("other.results.jsonl");
    let url = format!("{}/v1/echo?m={{n}}", s.sim().url);
    let r = s.run(&[
        "--limit",
        "100/1s",
        "--url",
        &url,
        "--out",
        &other_out.to_string_lossy(),
        "--failures",
        &s.dir()
            .path()
            .join("other.failures.jsonl")
            .to_string_lossy(),
    ]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let both = s.status_json().unwrap();
    assert_eq!(both.as_array().unwrap().len(), 2, "{both}");
    let newest = both
        .as_array()
        .unwrap()
        .iter()
        .max_by_key(|j| j["last_run"]["started_unix_ms"].as_u64())
        .unwrap()["job"]
        .clone();
    let pruned = prune();
    let text = String::from_utf8_lossy(&pruned.stdout);
    assert!(pruned.status.success(), "{text}");
    assert!(text.contains("forgot job"), "{text}");
    let left = s.status_json().unwrap();
    assert_eq!(left.as_array().unwrap().len(), 1, "{left}");
    assert_eq!(left[0]["job"], newest);
    let timelines: Vec<String> = std::fs::read_dir(s.state_dir())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("timeline-"))
        .collect();
    let kept = format!("timeline-{}.bin", newest.as_str().unwrap());
    assert_eq!(timelines, [kept], "the forgotten job's timeline goes too");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_timeline_has_one_record_per_second_and_marks_every_pause() {
    use batchrun::report::timeline::{self, pause};
    let s = Scenario::new("timeline")
        .with_sim(&[
            "--limit",
            "20/1s",
            "--concurrency",
            "10",
            "--cooldown",
            "1s",
        ])
        .numbers(60);
    fill_window(&s, 20).await;
    let r = s.run(&["--limit", "100/1s", "--concurrency", "5", "--burst", "10"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let dir = s.state_dir();
    let file = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            name.starts_with("timeline-") && name.ends_with(".bin")
        })
        .expect("a timeline in the state dir");
    let secs = timeline::read(&file).unwrap();
    let elapsed = r.summary["elapsed_s"].as_f64().unwrap();
    // One record per second the run lasted, no second missing.
    assert!(
        (secs.len() as f64 - elapsed).abs() <= 2.0,
        "{} records for {elapsed}s",
        secs.len()
    );
    for w in secs.windows(2) {
        assert_eq!(w[1].t, w[0].t + 1, "contiguous seconds");
    }
    let sum = |f: fn(&timeline::Second) -> u32| secs.iter().map(f).sum::<u32>() as u64;
    assert_eq!(sum(|s| s.sent), r.summary["requests"].as_u64().unwrap());
    assert_eq!(sum(|s| s.ok), 60);
    let limited = r.summary["rate_limited"].as_u64().unwrap();
    assert!(limited >= 1, "{}", r.summary);
    assert_eq!(sum(|s| s.rate_limited), limited);
    // Every pause the run announced is marked in the second it began.
    let announced = r.stderr.matches("pausing every worker").count();
    let marked = secs
        .iter()
        .filter(|s| s.pause & pause::RATE_LIMIT != 0)
        .count();
    assert!(
        marked >= announced && announced >= 1,
        "{marked} < {announced}"
    );
    for s in secs.iter().filter(|s| s.rate_limited > 0) {
        assert!(s.pause & pause::RATE_LIMIT != 0, "{s:?}");
    }
    assert!(secs.iter().all(|s| s.limit == Some(100)));
    assert!(secs
        .iter()
        .any(|s| s.p50_us.is_some() && s.credits.is_some()));
}

/// A run killed with `kill -9` says what it did up to about a second before:
/// `status` shows its calls (in the run and the job's totals), and once the
/// next run opens the job it is closed as `killed`, its calls in the totals.
/// Its items are counted as far as the checkpoint recorded them: its own
/// record, saved once a second, had lagged (60 done where the items said
/// 80), and the text's totals left its calls out (0 requests). Its calls
/// are as last saved.
#[tokio::test(flavor = "multi_thread")]
async fn a_killed_run_is_counted_in_status_and_closed_as_killed() {
    let s = Scenario::new("killed-status")
        .with_sim(&["--limit", "40/1s"])
        .numbers(120);
    // Past the first second: its record has been saved with counts.
    let killed = s
        .signal_when(
            &["--limit", "40/1s"],
            |st| st["side_effects"].as_u64() >= Some(60),
            libc::SIGKILL,
        )
        .await;
    assert_ne!(killed.code, 0, "{}", killed.stderr);
    let st = s.status_json().unwrap();
    let run = &st[0]["last_run"];
    assert!(run["state"].is_null(), "{st}");
    let sent = run["requests"].as_u64().unwrap_or(0);
    assert!(sent > 0, "the killed run's calls: {st}");
    assert_eq!(st[0]["requests"], sent, "{st}");
    assert_eq!(run["done"], st[0]["done"], "{st}");
    let text = bin()
        .arg("status")
        .arg(s.input_path())
        .arg("--state-dir")
        .arg(s.state_dir())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains(&format!("totals:   {sent} requests")),
        "{text}"
    );
    let r = s.run(&["--limit", "40/1s"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let st = s.status_json().unwrap();
    let again = r.summary["requests"].as_u64().unwrap_or(0);
    assert_eq!(st[0]["requests"], sent + again, "{st}");
}

/// `status` with no input lists every job under `./.batchrun`, the shards
/// of a sharded one (`<input>/shard-I-of-N/`) included: they were left
/// out, and with only a sharded job there status said no checkpoint.
#[tokio::test(flavor = "multi_thread")]
async fn status_with_no_input_lists_the_shards_of_a_sharded_job() {
    let s = Scenario::new("status-shards")
        .with_sim(&["--limit", "none"])
        .numbers(6);
    let in_dir = |args: &[&str]| {
        let mut c = bin();
        c.current_dir(s.dir().path())
            .args(args)
            .env("BATCHRUN_API_KEY", KEY)
            .stdin(std::process::Stdio::null());
        c.output().unwrap()
    };
    let url = format!("{}/v1/echo?n={{n}}", s.sim().url);
    for shard in ["1/2", "2/2"] {
        let out = in_dir(&[
            "items.jsonl",
            "--limit",
            "none",
            "--url",
            &url,
            "--shard",
            shard,
            "-q",
        ]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let out = in_dir(&["status", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let jobs: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let shards: Vec<&str> = jobs
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|j| j["shard"].as_str())
        .collect();
    assert_eq!(shards, ["1/2", "2/2"], "{jobs}");
}

/// What cannot be written to stdout (a full disk) is said, not dropped: a
/// status exits 1; a run keeps its own exit code and says its summary was
/// lost.
#[tokio::test(flavor = "multi_thread")]
async fn output_that_cannot_be_written_is_said() {
    let s = Scenario::new("dev-full")
        .with_sim(&["--limit", "none"])
        .numbers(2);
    let full = || {
        std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap()
    };
    let mut run = s.cmd(&["--limit", "none"]);
    let r = finish({
        run.stdout(full());
        run
    });
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stderr
            .contains("the summary could not be written to stdout"),
        "{}",
        r.stderr
    );
    let status = s.tool("status").stdout(full()).output().unwrap();
    let said = String::from_utf8_lossy(&status.stderr);
    assert_eq!(status.status.code(), Some(1), "{said}");
    assert!(
        said.contains("the status could not be written to stdout"),
        "{said}"
    );
}
