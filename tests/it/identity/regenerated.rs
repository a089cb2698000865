//! Reruns of a regenerated file: the outputs batchrun wrote are its own,
//! and a changed file resends only its changed rows.

use super::*;

/// A file at `--out` that batchrun did not write (no owner record, not
/// its format) is somebody's data: refused before any call, untouched,
/// unless `--force-outputs`. batchrun's own outputs whose owner record is
/// gone (an earlier version's) are still replaced as before.
#[tokio::test(flavor = "multi_thread")]
async fn a_file_batchrun_did_not_write_is_not_replaced_unless_forced() {
    let s = Scenario::new("precious")
        .with_sim(&["--limit", "none"])
        .numbers(5);
    let out = s.dir().path().join("precious.txt");
    std::fs::write(&out, "quarterly figures\n").unwrap();
    let out_arg = out.to_str().unwrap().to_owned();
    let r = s.run(&["--out", &out_arg]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr.contains("does not hold batchrun's outputs"),
        "{}",
        r.stderr
    );
    assert_eq!(std::fs::read(&out).unwrap(), b"quarterly figures\n");
    assert_side_effects(&s.sim().stats().await, 0);
    let r = s.run(&["--out", &out_arg, "--force-outputs"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_each_item_once(&out, 5);
    // An output named by a link is written where the link points.
    let target = s.dir().path().join("kept.jsonl");
    let link = s.dir().path().join("link.jsonl");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let r = s.run(&[
        "--out",
        link.to_str().unwrap(),
        "--limit",
        "none",
        "--fresh",
    ]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(std::fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    assert_each_item_once(&target, 5);
    // Its owner record lost, the job's own outputs are still its own.
    let owner = s.dir().path().join(".precious.txt.owner");
    std::fs::remove_file(&owner).unwrap();
    let r = s.run(&["--out", &out_arg]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.summary["requests"], 0, "{}", r.summary);
    // The forced run's five and the --fresh run's five.
    assert_side_effects(&s.sim().stats().await, 10);
    // Not even forced onto the checkpoint's own files: every result would
    // be lost with it.
    let db = s.state_dir().join("checkpoint").join("db");
    let log = std::fs::read_dir(s.state_dir().join("results"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "log"))
        .unwrap();
    for (flag, p) in [("--out", &db), ("--failures", &log)] {
        let before = std::fs::read(p).unwrap();
        let r = s.run(&[flag, p.to_str().unwrap(), "--force-outputs"]);
        assert_eq!(r.code, 2, "{}", r.stderr);
        assert!(
            r.stderr.contains("is inside the checkpoint"),
            "{}",
            r.stderr
        );
        assert_eq!(std::fs::read(p).unwrap(), before);
    }
    let r = s.run(&["--out", &out_arg]);
    assert_eq!((r.code, &r.summary["requests"]), (0, &serde_json::json!(0)));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_mistyped_rerun_leaves_the_results_byte_identical() {
    let s = Scenario::new("mistyped")
        .with_sim(&["--limit", "none"])
        .numbers(30);
    let r = s.run(&["--limit", "none"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let results = std::fs::read(s.out_path()).unwrap();
    let wrong = format!("{}/v9/echo?n={{n}}", s.sim().url);
    // The request changed under a finished job: nothing is sent.
    let r = s.run(&["--limit", "none", "--url", &wrong]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("URL: GET"), "{}", r.stderr);
    assert_eq!(std::fs::read(s.out_path()).unwrap(), results);
    assert_side_effects(&s.sim().stats().await, 30);
    // A dry run of it says so too.
    let r = s.run(&["--limit", "none", "--url", &wrong, "--dry-run", "1"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stderr.contains("the real run would stop before any call")
            && r.stderr.contains("30 of 30 item(s) done"),
        "{}",
        r.stderr
    );
    // Even told to start over, a run that fails fast replaces nothing.
    let r = s.run(&["--limit", "none", "--url", &wrong, "--fresh"]);
    assert_ne!(r.code, 0, "{}", r.stderr);
    assert!(r.stderr.contains("is left as it was"), "{}", r.stderr);
    assert_eq!(std::fs::read(s.out_path()).unwrap(), results);
}

/// `--fresh` (or `--keep-done`) with a template naming no field, or over a
/// bad row, fails its checks (exit 2, nothing sent) before it changes the
/// checkpoint: the job is still there, and the old command sends nothing
/// again.
#[tokio::test(flavor = "multi_thread")]
async fn a_fresh_that_fails_its_checks_discards_nothing() {
    let s = Scenario::new("fresh-typo")
        .with_sim(&["--limit", "none"])
        .numbers(20);
    let r = s.run(&["--limit", "none"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let typo = format!("{}/v1/echo?n={{nn}}", s.sim().url);
    let r = s.run(&["--limit", "none", "--url", &typo, "--fresh"]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("no field \"nn\""), "{}", r.stderr);
    assert!(!r.stderr.contains("sent again"), "{}", r.stderr);
    assert_eq!(s.status_json().unwrap()[0]["done"], 20);
    // Nor does --keep-done carry the job over to a request that fails.
    let r = s.run(&["--limit", "none", "--url", &typo, "--keep-done"]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(!r.stderr.contains("stay done"), "{}", r.stderr);
    let lines = std::fs::read_to_string(s.input_path()).unwrap();
    std::fs::write(s.input_path(), format!("{lines}{{not json\n")).unwrap();
    let r = s.run(&["--limit", "none", "--fresh"]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains(":21:"), "{}", r.stderr);
    std::fs::write(s.input_path(), lines).unwrap();
    let r = s.run(&["--limit", "none"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.summary["requests"], 0, "{}", r.summary);
    assert_side_effects(&s.sim().stats().await, 20);
}

#[tokio::test(flavor = "multi_thread")]
async fn skip_invalid_records_the_bad_rows_and_runs_the_rest() {
    let mut csv = String::from("n,name\n");
    for n in 1..=10 {
        match n {
            // Two ragged rows: one field too many, one too few.
            4 => csv.push_str("4,d,extra\n"),
            7 => csv.push_str("7\n"),
            _ => csv.push_str(&format!("{n},x{n}\n")),
        }
    }
    let s = Scenario::new("skip-invalid")
        .with_sim(&["--limit", "none"])
        .input("customers.csv", &csv);
    let url = format!("{}/v1/echo?n={{n}}&name={{name}}", s.sim().url);
    let args = ["--limit", "none", "--url", url.as_str()];
    // Without it, one bad row refuses the whole input before any call.
    let r = s.run(&args);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr.contains("customers.csv:5: row has 3 fields"),
        "{}",
        r.stderr
    );
    assert_side_effects(&s.sim().stats().await, 0);

    let r = s.run(&[&args[..], &["--skip-invalid"]].concat());
    assert_eq!(r.code, 3, "{}", r.stderr);
    assert_eq!(
        (r.summary["done"].as_u64(), r.summary["failed"].as_u64()),
        (Some(8), Some(2))
    );
    assert!(
        r.stderr.contains("--skip-invalid: 2 bad row(s)"),
        "{}",
        r.stderr
    );
    let failures = jsonl(&s.failures_path());
    assert_eq!(lines_of(&s.failures_path()), vec![5, 8]);
    let reason = failures[0]["reason"].as_str().unwrap();
    assert!(
        reason.contains("customers.csv:5: row has 3 fields"),
        "{reason}"
    );
    let reason = failures[1]["reason"].as_str().unwrap();
    assert!(
        reason.contains("customers.csv:8: row has 1 field,"),
        "{reason}"
    );
    assert_eq!(lines_of(&s.out_path()), vec![2, 3, 4, 6, 7, 9, 10, 11]);
    assert_side_effects(&s.sim().stats().await, 8);
    // The same command again: nothing is sent, the bad rows stay failed.
    let r = s.run(&[&args[..], &["--skip-invalid"]].concat());
    assert_eq!(
        (r.code, r.summary["requests"].as_u64()),
        (3, Some(0)),
        "{}",
        r.stderr
    );
    assert_eq!(lines_of(&s.failures_path()), vec![5, 8]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_regenerated_file_resends_only_its_changed_rows() {
    let s = Scenario::new("regenerated")
        .with_sim(&["--limit", "none"])
        .numbers(20);
    let r = s.run(&["--limit", "none"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    // The export made again: a row on top, row 5 corrected, one at the end.
    let mut text = String::from("{\"n\": 1000}\n");
    for n in 1..=21 {
        let n = if n == 5 { 500 } else { n };
        text.push_str(&format!("{{\"n\": {n}}}\n"));
    }
    s.dir().write("items.jsonl", &text);
    let r = s.run(&["--limit", "none"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stderr
            .contains("19 item(s) it still holds keep their results"),
        "{}",
        r.stderr
    );
    assert_eq!(r.summary["requests"], 3, "{}", r.summary);
    assert_eq!(r.summary["done"], 22, "{}", r.summary);
    // Every line is paired with its own item's result.
    let out = jsonl(&s.out_path());
    assert_eq!(out.len(), 22);
    for v in &out {
        let n = &v["input"]["n"];
        assert_eq!(
            v["body"]["data"]["n"].as_str(),
            Some(n.to_string().as_str()),
            "{v}"
        );
    }
    assert_side_effects(&s.sim().stats().await, 23);
    // Starting over says what it costs.
    let r = s.run(&["--limit", "none", "--fresh"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stderr
            .contains("--fresh: the 22 item(s) done are sent again"),
        "{}",
        r.stderr
    );
    assert_side_effects(&s.sim().stats().await, 45);
}

/// A regenerated export whose columns (CSV) or keys (JSONL) come in
/// another order holds the same items: a JSON object's keys are unordered,
/// and the requests they render are the same. Only the row that changed
/// is sent, whole or in shards (a row keeps its shard whatever the order
/// of its fields). Before, every row was new and ran again.
#[tokio::test(flavor = "multi_thread")]
async fn a_regenerated_input_with_its_fields_in_another_order_sends_only_what_changed() {
    let csv = |head: &str, row: &dyn Fn(u32) -> String| {
        let rows: String = (1..=12).map(|i| row(i) + "\n").collect();
        format!("{head}\n{rows}")
    };
    let jsonl = |row: &dyn Fn(u32) -> String| (1..=12).map(|i| row(i) + "\n").collect::<String>();
    let cases: [(&str, &str, String, String); 2] = [
        (
            "fields-csv",
            "items.csv",
            csv("n,name,city", &|i| format!("{i},n{i},c{i}")),
            // Columns reordered; row 7's name corrected.
            csv("city,n,name", &|i| {
                let name = if i == 7 {
                    "seven".to_string()
                } else {
                    format!("n{i}")
                };
                format!("c{i},{i},{name}")
            }),
        ),
        (
            "fields-jsonl",
            "items.jsonl",
            jsonl(&|i| format!("{{\"n\": {i}, \"tags\": {{\"a\": 1, \"b\": {i}}}}}")),
            jsonl(&|i| {
                let b = if i == 7 { 70 } else { i };
                format!("{{\"tags\": {{\"b\": {b}, \"a\": 1}}, \"n\": {i}}}")
            }),
        ),
    ];
    for (tag, name, before, after) in cases {
        for shards in [None, Some(2)] {
            let s = Scenario::new(tag)
                .with_sim(&["--limit", "none"])
                .input(name, &before);
            let runs: Vec<Vec<String>> = match shards {
                None => vec![vec![]],
                Some(n) => (1..=n)
                    .map(|i| vec!["--shard".into(), format!("{i}/{n}")])
                    .collect(),
            };
            let run_all = || {
                runs.iter()
                    .map(|extra| {
                        let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
                        let r = s.run(&[&["--limit", "none"][..], &extra].concat());
                        assert_eq!(r.code, 0, "{tag} {shards:?}: {}", r.stderr);
                        r.summary["requests"].as_u64().unwrap()
                    })
                    .sum::<u64>()
            };
            assert_eq!(run_all(), 12, "{tag} {shards:?}");
            // The checkpoint lost: the job made again from its outputs
            // fingerprints as it did (their owner record says how), so every
            // call goes under its old key and the API replays it.
            std::fs::remove_dir_all(s.state_dir()).unwrap();
            assert_eq!(run_all(), 12, "{tag} {shards:?}: sent again");
            assert_side_effects(&s.sim().stats().await, 12);
            s.dir().write(name, &after);
            assert_eq!(run_all(), 1, "{tag} {shards:?}: only the changed row");
            assert_side_effects(&s.sim().stats().await, 13);
        }
    }
}

/// Rewrites the scenario's input as the same numbers with a row on top.
fn with_a_row_on_top(s: &Scenario, n: u64) {
    let mut text = String::from("{\"n\": 1000}\n");
    for i in 1..=n {
        text.push_str(&format!("{{\"n\": {i}}}\n"));
    }
    s.dir().write("items.jsonl", &text);
}

/// Shards of a regenerated input (a row inserted on top): each row keeps
/// its shard wherever its line went, so each shard resumes its own items
/// by content. Split by line, a shard carried its results over to another
/// shard's lines and never sent its own new ones (lost), and the other
/// shard sent them again, in other batches under other keys (run twice).
#[tokio::test(flavor = "multi_thread")]
async fn shards_of_a_regenerated_input_run_every_item_once() {
    for (tag, extra) in [
        ("shards-regen", &[][..]),
        ("shards-regen-batch", &["--batch", "4"][..]),
    ] {
        let s = Scenario::new(tag)
            .with_sim(&["--limit", "none"])
            .numbers(60);
        let url = match extra.is_empty() {
            true => format!("{}/v1/echo?n={{n}}", s.sim().url),
            false => batch_url(&s),
        };
        let args = |i: u64| {
            let mut v = vec![
                "--limit".to_string(),
                "none".into(),
                "--url".into(),
                url.clone(),
            ];
            v.extend([
                "--json-body".to_string(),
                "--shard".into(),
                format!("{i}/3"),
            ]);
            v.extend(extra.iter().map(|a| a.to_string()));
            v
        };
        let run = |i| {
            let a = args(i);
            s.run(&a.iter().map(String::as_str).collect::<Vec<_>>())
        };
        let first = run(1);
        assert_eq!(first.code, 0, "{tag}");
        // A shard's batches hold its own items: nothing to say of them.
        assert!(!first.stderr.contains("blocks of"), "{}", first.stderr);
        with_a_row_on_top(&s, 60);
        for i in 1..=3 {
            let r = run(i);
            assert_eq!(r.code, 0, "{tag} shard {i}: {}", r.stderr);
        }
        let mut seen: Vec<u64> = (1..=3)
            .flat_map(|i| {
                let out = s
                    .dir()
                    .path()
                    .join(format!("items.shard-{i}-of-3.results.jsonl"));
                jsonl(&out)
            })
            .map(|r| r["input"]["n"].as_u64().unwrap())
            .collect();
        seen.sort_unstable();
        let want: Vec<u64> = (1..=60).chain([1000]).collect();
        assert_eq!(seen, want, "{tag}: every row's result, once");
        assert_side_effects(&s.sim().stats().await, 61);
    }
}

/// Calls that may have run keep their Idempotency-Keys when a regenerated
/// input moves their lines (a row inserted on top): the API replays them,
/// and only the new row runs. Items failed with their outcome unknown,
/// sent again by `--retry-failed`; and calls in flight when a run was
/// killed, sent again by the next. Identical rows are still two calls.
#[tokio::test(flavor = "multi_thread")]
async fn calls_that_may_have_run_keep_their_keys_when_lines_move() {
    // Every executed call's answer is lost: its outcome is unknown.
    let s = Scenario::new("moved-unknown")
        .with_sim(&["--limit", "none", "--reset-rate", "1", "--seed", "1"])
        .numbers(10);
    let args = ["--limit", "none", "--max-attempts", "1"];
    let r = s.run(&args);
    assert_eq!(r.summary["failed"], 10, "{}", r.summary);
    assert_side_effects(&s.sim().stats().await, 10);
    with_a_row_on_top(&s, 10);
    let r = s.run(&[&args[..], &["--retry-failed"]].concat());
    assert_eq!(r.summary["done"], 10, "{}", r.summary);
    let stats = s.sim().stats().await;
    assert_eq!(stats["idempotent_replays"], 10, "{stats}");
    assert_side_effects(&stats, 11);

    let s = Scenario::new("moved-killed")
        .with_sim(&["--limit", "none", "--reset-rate", "1", "--seed", "2"])
        .numbers(10);
    let killed = s
        .signal_when(
            &["--limit", "none"],
            |st| st["side_effects"] == 10,
            libc::SIGKILL,
        )
        .await;
    assert_ne!(killed.code, 0, "{}", killed.stderr);
    with_a_row_on_top(&s, 10);
    let r = s.run(&["--limit", "none"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.summary["done"], 11, "{}", r.summary);
    assert_side_effects(&s.sim().stats().await, 11);

    // Two rows of one content are two calls, under two keys.
    let s = Scenario::new("twice")
        .with_sim(&["--limit", "none"])
        .input("items.jsonl", "{\"n\": 1}\n{\"n\": 1}\n");
    let r = s.run(&["--limit", "none"]);
    assert_eq!(r.summary["done"], 2, "{}", r.summary);
    assert_side_effects(&s.sim().stats().await, 2);
}

/// A regenerated input after calls that may have run, the hard cases:
/// items retried under a generation of their own keep it (a 503 under the
/// first key was never stored: that key would run the call again); rows of
/// one content, some still in flight when the run was killed, are not
/// paired with another row's result (one would never run); and batches,
/// formed from blocks of lines that moved, are refused.
#[tokio::test(flavor = "multi_thread")]
async fn a_regenerated_input_never_runs_a_call_twice_nor_loses_one() {
    // Half the calls 503 (known: a new key when retried), the rest run
    // and lose their answer (unknown: the same key).
    let s = Scenario::new("regen-generations")
        .with_sim(&[
            "--limit",
            "none",
            "--fail-rate",
            "0.5",
            "--reset-rate",
            "1",
            "--seed",
            "7",
        ])
        .numbers(20);
    let args = ["--limit", "none", "--max-attempts", "1"];
    s.run(&args);
    s.run(&[&args[..], &["--retry-failed"]].concat());
    with_a_row_on_top(&s, 20);
    for _ in 0..12 {
        let r = s.run(&[&args[..], &["--retry-failed"]].concat());
        if r.summary["done"] == 21 {
            break;
        }
    }
    let st = s.status_json().unwrap();
    assert_eq!(st[0]["done"], 21, "{st}");
    assert_side_effects(&s.sim().stats().await, 21);

    // Each content twice, killed with calls in flight, a row on top.
    let mut text = String::new();
    for i in 1..=30 {
        text.push_str(&format!("{{\"n\": {i}}}\n{{\"n\": {i}}}\n"));
    }
    let s = Scenario::new("regen-twice")
        .with_sim(&[
            "--limit",
            "none",
            "--latency",
            "50ms..1500ms",
            "--seed",
            "3",
        ])
        .input("items.jsonl", &text);
    let killed = s
        .signal_when(
            &["--limit", "none", "-c", "8"],
            |st| st["side_effects"].as_u64() >= Some(20),
            libc::SIGKILL,
        )
        .await;
    assert_ne!(killed.code, 0, "{}", killed.stderr);
    s.dir()
        .write("items.jsonl", &format!("{{\"n\": 0}}\n{text}"));
    let r = s.run(&["--limit", "none", "-c", "8"]);
    assert_eq!(r.summary["done"], 61, "{}", r.summary);
    assert_side_effects(&s.sim().stats().await, 61);

    // Batches: refused after a kill.
    let s = Scenario::new("regen-batches")
        .with_sim(&[
            "--limit",
            "none",
            "--latency",
            "300ms",
            "--reset-rate",
            "1",
            "--seed",
            "1",
        ])
        .numbers(40);
    let url = batch_url(&s);
    let batched = [
        "--url",
        &url,
        "--json-body",
        "--limit",
        "none",
        "--batch",
        "5",
        "-c",
        "4",
    ];
    let killed = s
        .signal_when(
            &batched,
            |st| st["side_effects"].as_u64() >= Some(10),
            libc::SIGKILL,
        )
        .await;
    assert_ne!(killed.code, 0, "{}", killed.stderr);
    with_a_row_on_top(&s, 40);
    let r = s.run(&batched);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("may have run in batches"), "{}", r.stderr);
}

/// An input emptied (an export cut off before its first row), or holding
/// only invalid rows (an error page written in its place), is refused:
/// carrying nothing over would drop every result, and the file restored
/// would send them again. Nothing is sent or changed; restored, the job
/// resumes with its results. A file cut to one row says how many finished
/// items' results it drops. Before, the emptied file's run ended with exit 0,
/// an empty results file and the job's results gone from the checkpoint.
#[tokio::test(flavor = "multi_thread")]
async fn an_emptied_input_is_refused_and_a_shrunk_one_says_what_it_drops() {
    let s = Scenario::new("emptied")
        .with_sim(&["--limit", "none"])
        .numbers(6);
    let r = s.run(&["--limit", "none"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let whole = std::fs::read_to_string(s.dir().path().join("items.jsonl")).unwrap();
    let results = std::fs::read_to_string(s.out_path()).unwrap();

    // Emptied; then an error page in its place, every row invalid, skipped.
    for (text, skip) in [
        ("", &[][..]),
        ("<html>\n<body>error</body>\n", &["--skip-invalid"]),
    ] {
        s.dir().write("items.jsonl", text);
        let r = s.run(&[&["--limit", "none"][..], skip].concat());
        assert_eq!(r.code, 2, "{}", r.stderr);
        assert!(
            r.stderr.contains("holds no valid items now"),
            "{}",
            r.stderr
        );
        assert_eq!(std::fs::read_to_string(s.out_path()).unwrap(), results);
    }

    s.dir().write("items.jsonl", &whole);
    let r = s.run(&["--limit", "none"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.summary["requests"], 0, "{}", r.summary);
    assert_eq!(r.summary["done"], 6, "{}", r.summary);

    s.dir().write("items.jsonl", whole.lines().next().unwrap());
    let r = s.run(&["--limit", "none"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stderr
            .contains("the results of 5 finished item(s) it no longer holds leave"),
        "{}",
        r.stderr
    );
    assert_side_effects(&s.sim().stats().await, 6);
}
