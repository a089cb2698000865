//! The crash suite: kill -9 at random moments, damaged checkpoints. Every
//! item must end in `--out` exactly once, and the API must have run each
//! exactly once.

use std::process::Stdio;

use crate::common::*;

const ITEMS: u64 = 400;

fn sim_args() -> Vec<&'static str> {
    vec![
        "--limit",
        "none",
        "--concurrency",
        "64",
        "--latency",
        "1ms..8ms",
    ]
}

fn run_args() -> Vec<&'static str> {
    vec!["--limit", "none", "--concurrency", "8"]
}

/// Starts the run and SIGKILLs it after a random moment (or lets it end).
fn run_and_kill(s: &Scenario, within_ms: u64) {
    let mut child = s
        .cmd(&run_args())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(fastrand::u64(
        20..within_ms,
    )));
    // SAFETY: signalling our own child.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGKILL);
    }
    let _ = child.wait();
}

/// Runs to the end, moving a checkpoint the run calls damaged aside as its
/// message says, and checks exactly-once.
async fn finish_and_check(s: &Scenario) {
    let mut r = s.run(&run_args());
    if r.code == 1 && r.stderr.contains("is damaged") {
        let aside = s.state_dir().with_extension("damaged");
        std::fs::rename(s.state_dir(), aside).unwrap();
        r = s.run(&run_args());
    }
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_each_item_once(&s.out_path(), ITEMS);
    assert_side_effects(&s.sim().stats().await, ITEMS);
}

#[tokio::test(flavor = "multi_thread")]
async fn twenty_kill_9s_at_random_moments_lose_and_repeat_nothing() {
    let s = Scenario::new("crash-kills")
        .with_sim(&sim_args())
        .numbers(ITEMS);
    for _ in 0..20 {
        run_and_kill(&s, 400);
    }
    finish_and_check(&s).await;
}

/// Damages every file of the checkpoint with `damage`, after a killed run.
async fn damaged_checkpoint(tag: &str, damage: fn(&std::path::Path)) {
    let s = Scenario::new(tag).with_sim(&sim_args()).numbers(ITEMS);
    run_and_kill(&s, 300);
    let files: Vec<_> = walk(&s.state_dir().join("checkpoint"));
    assert!(!files.is_empty());
    for f in files {
        damage(&f);
    }
    finish_and_check(&s).await;
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn an_emptied_checkpoint_repeats_nothing() {
    damaged_checkpoint("crash-empty", |f| std::fs::write(f, b"").unwrap()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_truncated_checkpoint_repeats_nothing() {
    damaged_checkpoint("crash-trunc", |f| {
        let len = std::fs::metadata(f).unwrap().len();
        let f = std::fs::OpenOptions::new().write(true).open(f).unwrap();
        f.set_len(len / 2).unwrap();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_checkpoint_with_flipped_bytes_repeats_nothing() {
    damaged_checkpoint("crash-flip", |f| {
        let mut bytes = std::fs::read(f).unwrap();
        for _ in 0..16.min(bytes.len()) {
            let i = fastrand::usize(..bytes.len());
            bytes[i] ^= 1 << fastrand::u8(0..8);
        }
        std::fs::write(f, bytes).unwrap();
    })
    .await;
}
