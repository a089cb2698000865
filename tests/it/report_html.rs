//! `batchrun report`: the HTML report of a real sim run.

use crate::common::*;
use batchrun::report::charts::{self, LIMITED_CLASS, PAUSE_CLASS, POLICY_CLASS, SECOND_CLASS};
use batchrun::report::timeline;

/// Checks that `xml` is well-formed enough: every element closed in order,
/// attributes quoted, one root. Returns the number of elements.
fn well_formed(xml: &str) -> Result<usize, String> {
    let mut stack: Vec<&str> = Vec::new();
    let (mut rest, mut count, mut roots) = (xml, 0, 0);
    while let Some(at) = rest.find('<') {
        let tail = &rest[at + 1..];
        let end = tail.find('>').ok_or("an unclosed tag")?;
        let tag = &tail[..end];
        rest = &tail[end + 1..];
        if let Some(name) = tag.strip_prefix('/') {
            match stack.pop() {
                Some(open) if open == name.trim() => {}
                other => return Err(format!("</{name}> closes {other:?}")),
            }
            continue;
        }
        let name = tag
            .split_whitespace()
            .next()
            .unwrap_or("")
            .trim_end_matches('/');
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
            return Err(format!("a bad tag <{tag}>"));
        }
        if tag.matches('"').count() % 2 != 0 {
            return Err(format!("an unbalanced quote in <{tag}>"));
        }
        count += 1;
        if stack.is_empty() {
            roots += 1;
        }
        if !tag.ends_with('/') {
            stack.push(name);
        }
    }
    match (stack.is_empty(), roots) {
        (true, 1) => Ok(count),
        _ => Err(format!("{roots} root(s), unclosed: {stack:?}")),
    }
}

/// Every `<svg …>…</svg>` in `html`.
fn svgs(html: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = html;
    while let Some(at) = rest.find("<svg") {
        let end = rest[at..].find("</svg>").map_or(rest.len(), |e| at + e + 6);
        out.push(&rest[at..end]);
        rest = &rest[end..];
    }
    out
}

fn class_count(svg: &str, class: &str) -> usize {
    svg.matches(&format!("class=\"{class}\"")).count()
}

/// The report's charts (pacing, latency, credits), checked to be one
/// well-formed page that fetches nothing.
fn self_contained_charts(html: &str) -> Vec<&str> {
    assert!(html.starts_with("<!DOCTYPE html>"));
    assert_eq!(html.matches("<html").count(), 1);
    assert_eq!(html.matches("</html>").count(), 1);
    // Nothing to fetch: the only URLs are the SVG namespace.
    let namespaces = html.matches("xmlns=\"http://www.w3.org/2000/svg\"").count();
    assert_eq!(html.matches("http").count(), namespaces);
    assert!(!html.contains("src="));
    let body = html
        .trim_start_matches("<!DOCTYPE html>")
        .replace("<meta charset=\"utf-8\">", "");
    well_formed(&body).expect("the page is well-formed");
    let charts = svgs(html);
    assert_eq!(charts.len(), 3, "pacing, latency, credits");
    for svg in &charts {
        assert!(well_formed(svg).unwrap() > 10);
    }
    charts
}

#[tokio::test(flavor = "multi_thread")]
async fn the_report_of_a_run_with_429s_has_a_point_per_second_and_a_band_per_pause() {
    let s = Scenario::new("report-html")
        .with_sim(&[
            "--limit",
            "20/1s",
            "--concurrency",
            "10",
            "--cooldown",
            "1s",
        ])
        .numbers(60);
    let client = reqwest::Client::new();
    // Live traffic on the same key fills the sim's window: the run meets 429s.
    for i in 0..20 {
        let r = client
            .get(format!("{}/v1/echo?live={i}", s.sim().url))
            .header("x-api-key", KEY)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    let r = s.run(&[
        "--limit",
        "100/1s",
        "--limit",
        "30000/1m,fixed",
        "--concurrency",
        "5",
        "--burst",
        "10",
    ]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.summary["rate_limited"].as_u64().unwrap() >= 1,
        "{}",
        r.summary
    );

    let report = |extra: &[&str]| {
        let out = s.tool("report").args(extra).output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    report(&[]);
    let stem = s
        .input_path()
        .file_stem()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let path = s.input_path().with_file_name(format!("{stem}.report.html"));
    let html = std::fs::read_to_string(&path).expect("the report beside the input");
    let charts = self_contained_charts(&html);

    // Against the timeline the run kept: one point per second, one band
    // per pause, one marker per second that got a 429.
    let file = std::fs::read_dir(s.state_dir())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("timeline-")
        })
        .expect("a timeline");
    let secs = timeline::read(&file).unwrap();
    let pacing = charts[0];
    assert_eq!(class_count(pacing, SECOND_CLASS), secs.len());
    let pauses = charts::pauses(&secs);
    assert!(!pauses.is_empty(), "the 429s paused the run");
    assert_eq!(class_count(pacing, PAUSE_CLASS), pauses.len());
    let limited = secs.iter().filter(|s| s.rate_limited > 0).count();
    assert!(limited >= 1);
    assert_eq!(class_count(pacing, LIMITED_CLASS), limited);
    // Every limit in force has its line, named as --limit spells it.
    // (A tick names them: a first second closed before the first tick
    // may show none.)
    let shown = secs.iter().filter(|s| s.policies.len() == 2).count();
    assert!(shown + 1 >= secs.len(), "{shown} of {}", secs.len());
    assert_eq!(class_count(pacing, POLICY_CLASS), 2);
    assert!(pacing.contains("100ps") && pacing.contains("30000/1m,fixed (right)"));
    // The runs table has the run, with its exit code and counts.
    let runs = &html[html.find("<table id=\"runs\"").unwrap()..];
    let row = runs.lines().nth(1).unwrap();
    assert!(
        row.contains("<td>done</td><td>0</td><td>60</td><td>0</td>"),
        "{row}"
    );

    // --format svg: the pacing picture alone, to -o.
    let svg_path = s.dir().path().join("pacing.svg");
    report(&["--format", "svg", "-o", svg_path.to_str().unwrap()]);
    let svg = std::fs::read_to_string(&svg_path).unwrap();
    well_formed(&svg).expect("the SVG is well-formed");
    assert_eq!(class_count(&svg, SECOND_CLASS), secs.len());

    refuses_to_replace_what_is_not_a_report(&s, &svg_path);
}

/// `report -o` replaces an earlier report and nothing else: not a joblog,
/// nor the checkpoint's files, nor the results.
fn refuses_to_replace_what_is_not_a_report(s: &Scenario, svg_path: &std::path::Path) {
    // An earlier report is replaced; a file that is not one (a joblog) is
    // refused, and left as it was.
    let again = s
        .tool("report")
        .args(["--format", "svg", "-o"])
        .arg(svg_path)
        .output()
        .unwrap();
    assert!(again.status.success(), "{again:?}");
    let joblog = s.dir().path().join("calls.joblog");
    std::fs::write(&joblog, "Line\tStarttime\tJobRuntime\n1\t1700000000\t0.1\n").unwrap();
    let kept = std::fs::read(&joblog).unwrap();

    // Never onto the checkpoint (by path, or a hard link of one of its
    // files) nor onto the results: each is refused and left as it was.
    let refused = |o: &std::path::Path, says: &str| {
        let out = s.tool("report").arg("-o").arg(o).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(err.contains(says), "{err}");
    };
    refused(&joblog, "exists and is not a report");
    assert_eq!(std::fs::read(&joblog).unwrap(), kept);
    refused(
        &s.state_dir().join("checkpoint").join("new.html"),
        "inside the checkpoint",
    );
    let db = s.state_dir().join("checkpoint").join("db");
    let before = std::fs::read(&db).unwrap();
    let link = s.dir().path().join("x.html");
    std::fs::hard_link(&db, &link).unwrap();
    refused(&link, "inside the checkpoint");
    assert_eq!(std::fs::read(&db).unwrap(), before);
    let results = std::fs::read(s.out_path()).unwrap();
    refused(&s.out_path(), "holds a job's results");
    assert_eq!(std::fs::read(s.out_path()).unwrap(), results);
    // Nor a joblog appended to a file of the checkpoint.
    let r = s.run(&["--limit", "none", "--joblog", link.to_str().unwrap()]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("inside the checkpoint"), "{}", r.stderr);
    assert_eq!(std::fs::read(&db).unwrap(), before);
}

#[test]
fn a_report_of_an_input_never_run_is_an_error_that_leaves_nothing_behind() {
    let s = Scenario::new("report-none").numbers(3);
    let out = s.tool("report").output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("batchrun report: error: no checkpoint in"),
        "{err}"
    );
    assert!(!s.state_dir().exists(), "no state dir made");
    let missing = bin()
        .args(["report", "/nonexistent/x.jsonl"])
        .output()
        .unwrap();
    assert_eq!(missing.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("no checkpoint in /nonexistent/"));
    // A state dir with an empty checkpoint folder (a first open killed
    // before it wrote): looking at it writes no store into it.
    let empty = s.state_dir().join("checkpoint");
    std::fs::create_dir_all(&empty).unwrap();
    for cmd in ["report", "status"] {
        let out = bin()
            .arg(cmd)
            .arg(s.input_path())
            .arg("--state-dir")
            .arg(s.state_dir())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{cmd}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("no checkpoint in"), "{cmd}: {err}");
        let left: Vec<_> = std::fs::read_dir(&empty).unwrap().collect();
        assert!(left.is_empty(), "{cmd} left {left:?}");
    }
    std::fs::remove_dir_all(s.state_dir()).unwrap();
    // `-o` naming the input is refused, and the items stay as they were.
    let items = std::fs::read(s.input_path()).unwrap();
    let onto = bin()
        .arg("report")
        .arg(s.input_path())
        .arg("-o")
        .arg(s.input_path())
        .output()
        .unwrap();
    assert_eq!(onto.status.code(), Some(1));
    let err = String::from_utf8_lossy(&onto.stderr);
    assert!(err.contains("is the input file"), "{err}");
    // Nor the record of who owns the outputs.
    let owner = s.dir().path().join(".items.results.jsonl.owner");
    let onto = bin()
        .arg("report")
        .arg(s.input_path())
        .arg("-o")
        .arg(&owner)
        .output()
        .unwrap();
    assert_eq!(onto.status.code(), Some(1));
    let err = String::from_utf8_lossy(&onto.stderr);
    assert!(err.contains("one of batchrun's records"), "{err}");
    assert!(!owner.exists());
    assert_eq!(std::fs::read(s.input_path()).unwrap(), items);
    // Nor a hard link to it.
    let hard = s.dir().path().join("hard.jsonl");
    std::fs::hard_link(s.input_path(), &hard).unwrap();
    let onto = bin()
        .arg("report")
        .arg(s.input_path())
        .arg("-o")
        .arg(&hard)
        .output()
        .unwrap();
    assert_eq!(onto.status.code(), Some(1));
    assert_eq!(std::fs::read(s.input_path()).unwrap(), items);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sharded_job_is_reported_shard_by_shard_and_a_piped_one_by_its_pipe() {
    let s = Scenario::new("report-shards")
        .with_sim(&["--limit", "none"])
        .numbers(12);
    for shard in ["1/2", "2/2"] {
        let r = s.run(&["--limit", "none", "--shard", shard]);
        assert_eq!(r.code, 0, "{}", r.stderr);
    }
    let report = |extra: &[&str]| s.tool("report").args(extra).output().unwrap();
    // The whole input has no checkpoint of its own: the shards are named.
    let whole = report(&[]);
    assert_eq!(whole.status.code(), Some(1));
    let err = String::from_utf8_lossy(&whole.stderr);
    assert!(err.contains("ran in shards (1/2, 2/2)"), "{err}");
    assert!(err.contains("--shard I/N"), "{err}");
    let one = report(&["--shard", "2/2"]);
    let err = String::from_utf8_lossy(&one.stderr);
    assert!(one.status.success(), "{err}");
    let stem = s.input_path().file_stem().unwrap().to_string_lossy();
    let page = s
        .input_path()
        .with_file_name(format!("{stem}.shard-2-of-2.report.html"));
    let html = std::fs::read_to_string(&page).expect("the shard's report beside the input");
    assert!(html.starts_with("<!DOCTYPE html>"), "{html}");

    // A pipe's job is found in the pipe's state dir, with no file to match.
    let out = s.dir().path().join("piped.results.jsonl");
    let r = piped(&s, "{\"n\": 1}\n{\"n\": 2}\n", &out, &[]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let page = s.dir().path().join("piped.report.html");
    let o = bin()
        .args(["report", "-", "--state-dir"])
        .arg(s.state_dir())
        .arg("-o")
        .arg(&page)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(std::fs::read_to_string(&page)
        .unwrap()
        .starts_with("<!DOCTYPE html>"));
}

/// An input deleted since its job ran: `status` and `report` read only the
/// checkpoint, and find the job by the path given (they said "cannot
/// read").
#[tokio::test(flavor = "multi_thread")]
async fn a_deleted_input_is_still_reported_from_its_checkpoint() {
    let s = Scenario::new("report-gone")
        .with_sim(&["--limit", "none"])
        .numbers(4);
    assert_eq!(s.run(&["--limit", "none"]).code, 0);
    std::fs::remove_file(s.input_path()).unwrap();
    let jobs = s.status_json().expect("status of a deleted input");
    assert_eq!(jobs[0]["done"], 4, "{jobs}");
    let page = s.dir().path().join("gone.report.html");
    let o = s.tool("report").arg("-o").arg(&page).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(page.exists());
}

/// A timeline that cannot be read (left empty by a full disk, or garbage)
/// costs the charts, not the report: the runs table is written, and the
/// run says why the charts are missing. It was an error.
#[tokio::test(flavor = "multi_thread")]
async fn a_timeline_that_cannot_be_read_leaves_the_runs_table() {
    let s = Scenario::new("report-garbled")
        .with_sim(&["--limit", "none"])
        .numbers(3);
    assert_eq!(s.run(&["--limit", "none"]).code, 0);
    let timeline = std::fs::read_dir(s.state_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("timeline-")
        })
        .expect("the job's timeline");
    for garbled in [&b""[..], b"not a timeline at all"] {
        std::fs::write(&timeline, garbled).unwrap();
        let page = s.dir().path().join("garbled.report.html");
        let o = s.tool("report").arg("-o").arg(&page).output().unwrap();
        let said = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{said}");
        assert!(said.contains("its timeline could not be read"), "{said}");
        let html = std::fs::read_to_string(&page).unwrap();
        assert!(html.contains("<table"), "the runs table: {html}");
    }
}

/// A job record that cannot be read is damage: `status` and `report` say
/// so once, with the way forward (move the checkpoint aside), where they
/// printed sled's or serde's words (twice) and asked whether the job was
/// running.
#[tokio::test(flavor = "multi_thread")]
async fn a_damaged_job_record_is_said_with_the_way_forward() {
    let s = Scenario::new("report-damaged")
        .with_sim(&["--limit", "none"])
        .numbers(3);
    assert_eq!(s.run(&["--limit", "none"]).code, 0);
    {
        let db = sled::open(s.state_dir().join("checkpoint")).unwrap();
        let jobs = db.open_tree("jobs").unwrap();
        let records: Vec<_> = jobs
            .iter()
            .keys()
            .map(Result::unwrap)
            .filter(|k| !k.starts_with(b"meter:") && !k.starts_with(b"progress:"))
            .collect();
        assert_eq!(records.len(), 1, "the job's record");
        jobs.insert(&records[0], &b"{not a job record"[..]).unwrap();
        db.flush().unwrap();
    }
    let page = s.dir().path().join("damaged.report.html");
    for cmd in ["status", "report"] {
        let mut c = s.tool(cmd);
        if cmd == "report" {
            c.arg("-o").arg(&page);
        }
        let o = c.output().unwrap();
        let said = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{cmd}: {said}");
        assert_eq!(said.matches("is damaged").count(), 1, "{cmd}: {said}");
        let advised = format!("mv {0} {0}.damaged", s.state_dir().display());
        assert!(said.contains(&advised), "{cmd}: {said}");
        assert!(!said.contains("is the job running"), "{cmd}: {said}");
    }
    assert!(!page.exists());
}
