//! A damaged or edited record, end to end: an input changed under the run
//! is never paired with results that are not its own, damaged results or a
//! damaged index are found before any call, and a damaged sled database
//! sends nothing again that the results log holds as done.

use std::io::Write;

use crate::common::*;

#[tokio::test(flavor = "multi_thread")]
async fn an_input_edited_during_the_run_is_never_paired_with_its_results() {
    const N: u64 = 12;
    let s = Scenario::new("edited-under")
        .with_sim(&["--limit", "none", "--latency", "150ms"])
        .numbers(N);
    let input = s.input_path().to_path_buf();
    let original = std::fs::read_to_string(&input).unwrap();
    let c = s.cmd(&["--limit", "none", "--concurrency", "2"]);
    let r = act_when(
        c,
        s.sim(),
        |st| st["requests"].as_u64() >= Some(2),
        |_| {
            // As an editor saves: a new file renamed over the old one, its
            // first line changed.
            let edited = original.replacen("{\"n\": 1}", "{\"n\": 100}", 1);
            let tmp = input.with_extension("swp");
            std::fs::write(&tmp, edited).unwrap();
            std::fs::rename(&tmp, &input).unwrap();
        },
    )
    .await;
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(r.stderr.contains("while the job ran"), "{}", r.stderr);
    assert!(!s.out_path().exists(), "no output pairs lines and results");
    // Restored, the same command writes the outputs. The edited line was
    // set pending again (it no longer held its item); sent again with the
    // content it was first sent with, it is replayed, not run again.
    std::fs::write(&input, &original).unwrap();
    let again = s.run(&["--limit", "none"]);
    assert_eq!(again.code, 0, "{}", again.stderr);
    assert!(
        again.summary["requests"].as_u64() <= Some(1),
        "{}",
        again.summary
    );
    assert_each_item_once(&s.out_path(), N);
    assert_side_effects(&s.sim().stats().await, N);
}

#[tokio::test(flavor = "multi_thread")]
async fn lines_edited_in_place_under_the_run_are_never_paired_with_others_results() {
    // Lines of about 1 KB, so the feeder reads most of the file after the
    // edit; every line keeps its length, as an in-place rewrite would.
    const N: usize = 200;
    let pad = "x".repeat(1000);
    let text = |first: char| -> String {
        (1..=N)
            .map(|n| format!("{{\"n\":\"{first}{:03}\",\"pad\":\"{pad}\"}}\n", n))
            .collect()
    };
    let original = text('0');
    let s = Scenario::new("edited-in-place")
        .with_sim(&["--limit", "none", "--latency", "20ms"])
        .input("items.jsonl", &original);
    let input = s.input_path().to_path_buf();
    let args = ["--limit", "none", "--concurrency", "4"];
    let first = act_when(
        s.cmd(&args),
        s.sim(),
        |st| st["requests"].as_u64() >= Some(20),
        |_| {
            // Rewritten in place: the same file, other content.
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .open(&input)
                .unwrap();
            f.write_all(text('9').as_bytes()).unwrap();
        },
    )
    .await;
    assert_eq!(first.code, 1, "{}", first.stderr);
    assert!(
        first.stderr.contains("while the job ran"),
        "{}",
        first.stderr
    );
    assert!(!s.out_path().exists(), "no outputs from a changed file");
    // Put back: the same command, as often as it asks, ends with every
    // line paired with the result of its own content.
    std::fs::write(&input, &original).unwrap();
    let mut last = s.run(&args);
    for _ in 0..3 {
        if last.code == 0 {
            break;
        }
        assert!(last.stderr.contains("pending again"), "{}", last.stderr);
        last = s.run(&args);
    }
    assert_eq!(last.code, 0, "{}", last.stderr);
    let out = jsonl(&s.out_path());
    assert_eq!(out.len(), N);
    for (i, line) in out.iter().enumerate() {
        assert_eq!(line["line"], i as u64 + 1);
        assert_eq!(
            line["body"]["data"]["n"],
            line["input"]["n"],
            "line {} paired with another item's result",
            i + 1
        );
    }
}

/// Runs ten items, damages each results file ending in `ext` with `damage`,
/// and checks that a run with ten more items refuses before any call.
async fn damaged_results_are_found_before_any_call(
    tag: &str,
    ext: &str,
    damage: fn(&std::path::Path),
) {
    let s = Scenario::new(tag)
        .with_sim(&["--limit", "none"])
        .numbers(10);
    assert_eq!(s.run(&["--limit", "none"]).code, 0);
    for e in std::fs::read_dir(s.state_dir().join("results")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == ext) {
            damage(&p);
        }
    }
    // Ten more lines, so the run has something to send.
    s.append_numbers(11..=20);
    let before = s.sim().stats().await["requests"].as_u64().unwrap();
    let r = s.run(&["--limit", "none"]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(r.stderr.contains("is damaged"), "{}", r.stderr);
    assert!(r.stderr.contains("Nothing was sent"), "{}", r.stderr);
    assert_eq!(s.sim().stats().await["requests"].as_u64().unwrap(), before);
}

/// Rewrites `path` with `change` applied to its bytes.
fn edit(path: &std::path::Path, change: impl FnOnce(&mut Vec<u8>)) {
    let mut bytes = std::fs::read(path).unwrap();
    change(&mut bytes);
    std::fs::write(path, bytes).unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lost_results_log_is_found_before_any_call() {
    damaged_results_are_found_before_any_call("lost-log", "log", |p| {
        std::fs::remove_file(p).unwrap()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_flipped_bit_in_a_middle_result_is_found_before_any_call() {
    // Neither the first nor the last line's entry: only a check of every
    // finished line finds it.
    damaged_results_are_found_before_any_call("mid-log", "log", |p| {
        edit(p, |b| {
            let mid = b.len() / 2;
            b[mid] ^= 0x10;
        })
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_zeroed_stretch_of_the_index_is_found_before_any_call() {
    // Lines 4 to 6 lose where their results are.
    damaged_results_are_found_before_any_call("mid-idx", "idx", |p| {
        edit(p, |b| b[4 * 8..7 * 8].fill(0))
    })
    .await;
}

/// Items of the sled-damage tests, and the credits the first run has: it
/// halts (exit 75) with that many done.
const DB_ITEMS: u64 = 40;
const DB_CREDITS: &str = "20";

/// Halts a run with half its items done, damages the sled database file
/// (`checkpoint/db`) with `damage`, tops the credits up and runs the same
/// command again. sled opens such a file at an older state, or an empty
/// one, without an error; the results log still holds every result. The
/// run must end with each item done once, and must not have sent any item
/// again: the sim replays a call only when its Idempotency-Key comes back.
async fn a_damaged_database_sends_nothing_again(tag: &str, damage: impl FnOnce(&std::path::Path)) {
    let s = Scenario::new(tag)
        .with_sim(&["--limit", "none", "--credits", DB_CREDITS])
        .numbers(DB_ITEMS);
    let args = ["--limit", "none", "--concurrency", "4"];
    let first = s.run(&args);
    assert_eq!(first.code, 75, "{}", first.stderr);
    damage(&s.state_dir().join("checkpoint").join("db"));
    s.sim().topup(1000).await;
    let r = s.run(&args);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let stats = s.sim().stats().await;
    assert_eq!(
        stats["idempotent_replays"], 0,
        "items done before the damage were sent again: {stats}\n{}",
        r.stderr
    );
    assert_each_item_once(&s.out_path(), DB_ITEMS);
    assert_side_effects(&stats, DB_ITEMS);
    // And the catch-up was recorded: one more run sends nothing.
    let again = s.run(&args);
    assert_eq!(again.code, 0, "{}", again.stderr);
    assert_eq!(again.summary["requests"], 0, "{}", again.summary);
}

/// Cuts `path` to `len` bytes.
fn cut(path: &std::path::Path, len: u64) {
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.set_len(len).unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_database_cut_to_half_sends_nothing_again() {
    a_damaged_database_sends_nothing_again("db-half", |db| {
        cut(db, std::fs::metadata(db).unwrap().len() / 2)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_database_cut_to_one_page_sends_nothing_again() {
    a_damaged_database_sends_nothing_again("db-4k", |db| cut(db, 4096)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_emptied_database_sends_nothing_again() {
    a_damaged_database_sends_nothing_again("db-empty", |db| cut(db, 0)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_database_with_flipped_bytes_sends_nothing_again() {
    a_damaged_database_sends_nothing_again("db-flip", |db| {
        // Seeded, so a failure can be replayed; 200 bytes, as the report
        // that found this had it.
        let mut rng = fastrand::Rng::with_seed(7);
        edit(db, |b| {
            for _ in 0..200 {
                let i = rng.usize(..b.len());
                b[i] ^= rng.u8(1..=255);
            }
        })
    })
    .await;
}
