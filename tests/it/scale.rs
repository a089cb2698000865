//! Crash safety at scale: a job killed with SIGKILL at three random points
//! still ends with every item done exactly once.
//!
//! Where each kill lands relative to a group commit (before the results
//! log is written, between the log and the sled transaction, after it) is
//! left to chance: the points are random, and a failure prints the seed to
//! replay them with `BATCHRUN_KILL_SEED`. What is checked after each kill:
//! the kill came mid-run, the checkpoint never holds more items than the
//! server performed (nothing is "done" that was not called) and never fewer
//! than after the previous kill (nothing committed is lost). At the end: the
//! results hold every line once, in input order, each with the body the
//! server returned for that very item, and the server performed each item's
//! side effect exactly once however many times it was sent.

use std::process::Stdio;

use crate::common::*;

/// Items in the job: the 200k the issue names, hundreds of group commits
/// and more between two kills; a debug build runs the test in about 20 s.
const ITEMS: u64 = 200_000;

/// `batchrun status --json` for the scenario's job (the array has one).
fn status(s: &Scenario) -> serde_json::Value {
    s.status_json().unwrap_or_else(|e| panic!("{e}"))[0].clone()
}

#[tokio::test(flavor = "multi_thread")]
async fn killed_three_times_at_random_points_every_item_is_done_exactly_once() {
    let seed = std::env::var("BATCHRUN_KILL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..));
    let mut rng = fastrand::Rng::with_seed(seed);
    let s = Scenario::new("kill3x")
        .with_sim(&[
            "--limit",
            "none",
            "--concurrency",
            "1000",
            "--credits",
            "10000000",
        ])
        .numbers(ITEMS);
    let sim = s.sim();
    let args = ["--limit", "none", "--concurrency", "32"];
    let mut recorded_before = 0;
    for k in 0..3 {
        // Kill k lands at a random point of the k-th stretch of 5%..86%.
        let at = rng.u64(ITEMS * (5 + 27 * k) / 100..ITEMS * (5 + 27 * (k + 1)) / 100);
        let mut child = s
            .cmd(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        wait_for_stats(sim, 60, |st| st["side_effects"].as_u64().unwrap_or(0) >= at).await;
        child.kill().unwrap(); // SIGKILL: nothing is flushed on the way out
        child.wait().unwrap();
        let performed = sim.stats().await["side_effects"].as_u64().unwrap();
        assert!(
            performed < ITEMS,
            "seed {seed}: kill {k} came after the job had finished"
        );
        let st = status(&s);
        let recorded = st["done"].as_u64().unwrap() + st["failed"].as_u64().unwrap();
        assert!(
            recorded <= performed,
            "seed {seed}: after kill {k} the checkpoint holds {recorded} items, \
             the server performed only {performed}"
        );
        assert!(
            recorded >= recorded_before,
            "seed {seed}: kill {k} lost committed items ({recorded_before} -> {recorded})"
        );
        recorded_before = recorded;
    }

    let r = s.run(&args);
    assert_eq!(r.code, 0, "seed {seed}: {}", r.stderr);
    assert_eq!(r.summary["done"], ITEMS, "seed {seed}: {}", r.summary);
    let out = s.out_path();
    assert_each_item_once(&out, ITEMS);
    for v in jsonl(&out) {
        // numbers(n) puts {"n": i} on line i; the echo endpoint returns n.
        let line = v["line"].as_u64().unwrap();
        assert_eq!(
            v["body"]["data"]["n"].as_str(),
            Some(line.to_string().as_str()),
            "seed {seed}: line {line} holds another item's body: {v}"
        );
    }
    assert_side_effects(&sim.stats().await, ITEMS);
}

/// A run keeps chunks over 128 bytes out of glibc's per-thread malloc caches
/// by starting itself again in place (they kept a long run's memory
/// growing): the process the job runs in, same pid, carries the tunable and
/// the arguments it was given, and a user's own setting of the caches
/// stands.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[tokio::test(flavor = "multi_thread")]
async fn a_run_keeps_larger_chunks_out_of_glibcs_thread_caches_unless_told_otherwise() {
    let cases = [
        (None, "glibc.malloc.tcache_max=128"),
        (
            Some("glibc.malloc.arena_max=2"),
            "glibc.malloc.arena_max=2:glibc.malloc.tcache_max=128",
        ),
        (
            Some("glibc.malloc.tcache_max=1032"),
            "glibc.malloc.tcache_max=1032",
        ),
    ];
    for (given, expected) in cases {
        let s = Scenario::new("tcache")
            .with_sim(&["--limit", "10/1s", "--concurrency", "1"])
            .numbers(40);
        let mut c = s.cmd(&["--limit", "10/1s", "--concurrency", "1"]);
        match given {
            Some(v) => c.env("GLIBC_TUNABLES", v),
            None => c.env_remove("GLIBC_TUNABLES"),
        };
        let mut argv = vec![c.get_program().to_os_string()];
        argv.extend(c.get_args().map(|a| a.to_os_string()));
        let mut seen = None;
        let r = act_when(
            c,
            s.sim(),
            |st| st["side_effects"].as_u64().unwrap_or(0) >= 2,
            |pid| {
                let read = |what: &str| std::fs::read(format!("/proc/{pid}/{what}")).unwrap();
                seen = Some((read("environ"), read("cmdline"), read("comm")));
                // SAFETY: sending a signal to our own child process.
                unsafe {
                    libc::kill(pid as i32, libc::SIGINT);
                }
            },
        )
        .await;
        assert_eq!(r.code, 130, "{}", r.stderr);
        let (environ, cmdline, comm) = seen.unwrap();
        // glibc ends each tunable it reads with a NUL in place, so the
        // entry is read back across those.
        let at = environ
            .windows(15)
            .position(|w| w == b"GLIBC_TUNABLES=")
            .expect("GLIBC_TUNABLES in the run's environment")
            + 15;
        let value: Vec<u8> = environ[at..]
            .iter()
            .take(expected.len() + 1)
            .map(|&b| if b == 0 { b':' } else { b })
            .collect();
        assert_eq!(
            String::from_utf8_lossy(&value),
            format!("{expected}:"),
            "given {given:?}"
        );
        use std::os::unix::ffi::OsStrExt;
        let args: Vec<&[u8]> = cmdline
            .strip_suffix(&[0])
            .unwrap()
            .split(|&b| b == 0)
            .collect();
        let want: Vec<&[u8]> = argv.iter().map(|a| a.as_bytes()).collect();
        assert_eq!(args, want);
        // Still named after the binary it was started as (`pgrep batchrun`).
        assert_eq!(comm, b"batchrun\n");
        // The job itself went on as ever: what was done is in the outputs.
        let done = r.summary["done"].as_u64().unwrap();
        assert!(done >= 2, "{}", r.summary);
        assert_eq!(lines_of(&s.out_path()).len() as u64, done);
    }
}

/// Started through the dynamic loader by hand (`ld.so batchrun ...`, as on
/// a noexec mount), a run does not start itself again (that would start the
/// loader with the run's arguments, which takes the input file for the
/// program) and works as ever.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[test]
fn started_through_the_loader_by_hand_a_run_works_as_ever() {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let loader = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.contains("/ld-linux"))
        .expect("this test runs under glibc's dynamic loader")
        .to_string();
    let dir = TempDir::new("loader");
    let input = dir.write("in.jsonl", "{\"n\": 1}\n{\"n\": 2}\n");
    let mut c = std::process::Command::new(loader);
    c.arg(env!("CARGO_BIN_EXE_batchrun"))
        .arg(&input)
        .args(["--url", "http://127.0.0.1:9/v1/echo?n={n}", "--dry-run"])
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .env("BATCHRUN_API_KEY", KEY)
        .env_remove("GLIBC_TUNABLES")
        .env_remove("BATCHRUN_MALLOC_TUNED");
    let out = c.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("/v1/echo?n=2"), "{stdout}");
}
