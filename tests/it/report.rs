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
}
