//! `--metrics-addr`: Prometheus metrics while the run goes, and its final
//! values still served after the summary for `--metrics-linger`.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read};
use std::process::Stdio;
use std::sync::mpsc;
use std::time::Duration;

use crate::common::*;

/// One scrape: every sample by its name and labels, as written.
type Samples = BTreeMap<String, f64>;

/// Parses the OpenMetrics / Prometheus text exposition strictly: every
/// line is `# HELP`, `# TYPE`, `# UNIT`, the final `# EOF`, or a sample of
/// a family whose type was declared before it. Panics on anything else.
fn parse(text: &str) -> Samples {
    let mut typed = BTreeSet::new();
    let mut samples = Samples::new();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines.last(),
        Some(&"# EOF"),
        "the exposition ends with # EOF"
    );
    for line in &lines[..lines.len() - 1] {
        if let Some(rest) = line.strip_prefix("# ") {
            let mut words = rest.splitn(3, ' ');
            let (kind, name) = (words.next().unwrap(), words.next().unwrap_or(""));
            assert!(valid_name(name), "bad metric name in {line:?}");
            match kind {
                "TYPE" => {
                    let t = words.next().unwrap_or("");
                    assert!(
                        ["counter", "gauge", "histogram", "info", "unknown"].contains(&t),
                        "bad type in {line:?}"
                    );
                    typed.insert(name.to_string());
                }
                "HELP" | "UNIT" => {}
                _ => panic!("unknown comment line {line:?}"),
            }
            continue;
        }
        let (series, value) = line.rsplit_once(' ').expect("a sample is `series value`");
        let name = series.split('{').next().unwrap();
        assert!(valid_name(name), "bad sample name in {line:?}");
        if let Some(labels) = series.strip_prefix(name).filter(|l| !l.is_empty()) {
            assert!(valid_labels(labels), "bad labels in {line:?}");
        }
        let family = ["_total", "_bucket", "_count", "_sum", "_created"]
            .iter()
            .find_map(|s| name.strip_suffix(s).filter(|f| typed.contains(*f)))
            .unwrap_or(name);
        assert!(
            typed.contains(family),
            "a sample of an undeclared family: {line:?}"
        );
        let v: f64 = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v
                .parse()
                .unwrap_or_else(|_| panic!("bad value in {line:?}")),
        };
        assert!(
            samples.insert(series.to_string(), v).is_none(),
            "a repeated series: {line:?}"
        );
    }
    samples
}

fn valid_name(n: &str) -> bool {
    let mut cs = n.chars();
    cs.next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && cs.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// `{k="v",k2="v2"}`: a value is quoted and may hold commas, spaces and
/// escaped quotes or backslashes.
fn valid_labels(l: &str) -> bool {
    let Some(mut rest) = l.strip_prefix('{').and_then(|l| l.strip_suffix('}')) else {
        return false;
    };
    while !rest.is_empty() {
        let Some((k, v)) = rest.split_once("=\"") else {
            return false;
        };
        if !valid_name(k) {
            return false;
        }
        let mut end = None;
        let mut escaped = false;
        for (i, c) in v.char_indices() {
            match (escaped, c) {
                (false, '\\') => escaped = true,
                (false, '"') => {
                    end = Some(i);
                    break;
                }
                _ => escaped = false,
            }
        }
        let Some(end) = end else { return false };
        rest = &v[end + 1..];
        if let Some(r) = rest.strip_prefix(',') {
            rest = r;
        } else if !rest.is_empty() {
            return false;
        }
    }
    true
}

/// The sim's window filled by live traffic on the same key.
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

async fn scrape(url: &str) -> Samples {
    let r = reqwest::get(url).await.expect("the metrics are served");
    assert_eq!(r.status(), 200);
    let kind = r.headers()["content-type"].to_str().unwrap().to_string();
    assert!(kind.starts_with("application/openmetrics-text"), "{kind}");
    parse(&r.text().await.unwrap())
}

/// The child's stderr, line by line as it comes.
fn stderr_lines(child: &mut std::process::Child) -> mpsc::Receiver<String> {
    let (tx, lines) = mpsc::channel();
    let stderr = BufReader::new(child.stderr.take().unwrap());
    std::thread::spawn(move || {
        for l in stderr.lines().map_while(Result::ok) {
            assert!(!l.contains(KEY), "the API key leaked into stderr");
            let _ = tx.send(l);
        }
    });
    lines
}

/// Waits (up to 30 s) for a stderr line containing `what`; returns it.
fn line_with(lines: &mpsc::Receiver<String>, what: &str) -> String {
    loop {
        let l = lines
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("no stderr line with {what:?}"));
        if l.contains(what) {
            return l;
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_metrics_parse_during_the_run_and_end_equal_to_the_summary() {
    // 60 items at 100/s against a sim that allows 20/s, its window already
    // full of live traffic: the run meets 429s and pauses, and lasts a few
    // seconds.
    let s = Scenario::new("metrics")
        .with_sim(&["--limit", "20/1s", "--cooldown", "1s"])
        .numbers(60);
    fill_window(&s, 20).await;
    let mut child = s
        .cmd(&[
            "--limit",
            "100/1s",
            "--limit",
            "30000/1m,fixed",
            "--concurrency",
            "5",
            "--burst",
            "10",
            "--metrics-addr",
            "127.0.0.1:0",
            "--metrics-linger",
            "10s",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = stderr_lines(&mut child);
    let said = line_with(&lines, "batchrun: metrics on http://");
    let url = said[said.find("http://").unwrap()..].trim().to_string();
    assert!(url.ends_with("/metrics"), "{said}");

    // During the run: said before any call, so the first scrape is of a
    // running run; scraped again until items are done, every scrape parses.
    let first = scrape(&url).await;
    assert_eq!(first["batchrun_running"], 1.0);
    assert_eq!(
        first["batchrun_items_pending"] + first["batchrun_items_done_total"],
        60.0
    );
    let mut during = first;
    while during["batchrun_running"] == 1.0 && during["batchrun_items_done_total"] == 0.0 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        during = scrape(&url).await;
    }
    assert!(during["batchrun_limit"] == 100.0 && during["batchrun_limit_window_seconds"] == 1.0);

    // After the summary, within the linger: the final values.
    line_with(&lines, "serving the final metrics for 10s");
    let end = scrape(&url).await;
    // Scraped: the rest of the linger is not needed (a signal ends it).
    // SAFETY: sending a signal to our own child process.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let mut stdout = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut stdout)
        .unwrap();
    assert!(child.wait().unwrap().success());
    let summary: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    let n = |k: &str| summary[k].as_u64().unwrap() as f64;
    assert_eq!(end["batchrun_running"], 0.0);
    assert_eq!(end["batchrun_items_done_total"], n("done"));
    assert_eq!(end["batchrun_items_failed_total"], n("failed"));
    assert_eq!(end["batchrun_items_pending"], n("pending"));
    assert_eq!(end["batchrun_requests_total"], n("requests"));
    assert_eq!(end["batchrun_rate_limited_total"], n("rate_limited"));
    assert!(n("rate_limited") > 0.0, "the run met the sim's limit");
    assert!(end["batchrun_pauses_total{cause=\"rate_limit\"}"] >= 1.0);
    assert_eq!(end["batchrun_calls_in_flight"], 0.0);
    // Every limit in force, with what occupies it: the minute's fixed window
    // holds every call of the run.
    assert_eq!(
        end["batchrun_policy_limit{policy=\"30000/1m,fixed\"}"],
        30000.0
    );
    let minute = end["batchrun_policy_used{policy=\"30000/1m,fixed\"}"];
    assert!(minute >= n("done") && minute <= n("requests"), "{minute}");
    assert!(end["batchrun_policy_limit{policy=\"100ps\"}"] <= 100.0);
    for (outcome, count) in summary["status_counts"].as_object().unwrap() {
        let series = format!("batchrun_responses_total{{outcome=\"{outcome}\"}}");
        assert_eq!(end[&series], count.as_f64().unwrap(), "{series}");
    }
    let answered: f64 = summary["status_counts"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_f64().unwrap())
        .sum();
    assert_eq!(end["batchrun_call_duration_seconds_count"], answered);
    assert_eq!(
        end["batchrun_call_duration_seconds_bucket{le=\"+Inf\"}"],
        answered
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_taken_metrics_address_is_a_usage_error_before_any_call() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let s = Scenario::new("metrics-taken").with_sim(&[]).numbers(3);
    let r = s.run(&["--metrics-addr", &addr]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("--metrics-addr"), "{}", r.stderr);
    assert_eq!(s.sim().stats().await["accepted"], 0, "nothing was sent");
    // Refused before the checkpoint is touched: a --fresh refused so
    // leaves the job whole, and the same command without it sends nothing
    // again (the job was discarded, and every item ran twice).
    assert_eq!(s.run(&[]).code, 0);
    let fresh = s.run(&["--fresh", "--metrics-addr", &addr]);
    assert_eq!(fresh.code, 2, "{}", fresh.stderr);
    let again = s.run(&[]);
    assert_eq!(again.summary["requests"], 0, "{}", again.stderr);
    assert_side_effects(&s.sim().stats().await, 3);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_signal_ends_the_linger_with_the_run_s_own_exit_code() {
    let s = Scenario::new("metrics-linger").with_sim(&[]).numbers(5);
    let mut child = s
        .cmd(&["--metrics-addr", "127.0.0.1:0", "--metrics-linger", "10m"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = stderr_lines(&mut child);
    line_with(&lines, "serving the final metrics for 10m");
    // SAFETY: sending a signal to our own child process.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("still lingering 20 s after SIGTERM");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // The run was over: its summary and its exit code stand.
    assert_eq!(status.code(), Some(0));
    let mut stdout = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut stdout)
        .unwrap();
    let summary: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(summary["done"], 5);
}
