//! Shared test harness: a real `batchrun sim` child process on port 0, and a
//! way to run the real `batchrun` binary.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// The `batchrun` binary under test.
pub fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_batchrun"));
    c.env_remove("BATCHRUN_API_KEY").env_remove("BATCHRUN_URL");
    c
}

/// A `batchrun sim` running as a child process on a free loopback port.
/// Killed when dropped.
pub struct Sim {
    child: Child,
    /// Base URL, e.g. `http://127.0.0.1:40123`.
    pub url: String,
}

impl Sim {
    /// Starts `batchrun sim --listen 127.0.0.1:0 ARGS` and waits for its
    /// `listening on` line.
    pub fn start(args: &[&str]) -> Sim {
        let mut child = bin()
            .arg("sim")
            .args(["--listen", "127.0.0.1:0"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn batchrun sim");
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).expect("read sim's first line");
        let url = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("unexpected first line from sim: {line:?}"))
            .to_string();
        // Keep draining so the sim never blocks on a full pipe.
        std::thread::spawn(move || {
            let mut sink = Vec::new();
            let _ = out.read_to_end(&mut sink);
        });
        Sim { child, url }
    }

    /// `GET /admin/stats` as JSON.
    pub async fn stats(&self) -> serde_json::Value {
        reqwest::get(format!("{}/admin/stats", self.url))
            .await
            .expect("GET /admin/stats")
            .json()
            .await
            .expect("stats JSON")
    }

    /// `POST /admin/topup?credits=N`.
    pub async fn topup(&self, credits: u64) {
        let r = reqwest::Client::new()
            .post(format!("{}/admin/topup?credits={credits}", self.url))
            .send()
            .await
            .expect("POST /admin/topup");
        assert!(r.status().is_success(), "topup: {}", r.status());
    }

    /// `POST /admin/renew`.
    pub async fn renew(&self) {
        let r = reqwest::Client::new()
            .post(format!("{}/admin/renew", self.url))
            .send()
            .await
            .expect("POST /admin/renew");
        assert!(r.status().is_success(), "renew: {}", r.status());
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A temporary directory removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    /// Creates a fresh, empty directory under the system temp dir.
    pub fn new(tag: &str) -> TempDir {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let p = std::env::temp_dir().join(format!(
            "batchrun-test-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }

    /// The directory's path.
    pub fn path(&self) -> &Path {
        &self.0
    }

    /// Writes `contents` to `name` inside the directory and returns its path.
    pub fn write(&self, name: &str, contents: &str) -> PathBuf {
        let p = self.0.join(name);
        std::fs::write(&p, contents).unwrap();
        p
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Writes `n` JSONL items `{"n": 1..=n}` and returns the path.
pub fn numbers(dir: &TempDir, name: &str, n: u64) -> PathBuf {
    let mut s = String::new();
    for i in 1..=n {
        s.push_str(&format!("{{\"n\": {i}}}\n"));
    }
    dir.write(name, &s)
}

/// The API key the tests use; no output or file may ever contain it.
pub const KEY: &str = "sk_test_SECRET_9f8e7d6c";

/// A `batchrun` command against `sim`'s echo endpoint with state and outputs
/// inside `dir`.
pub fn run_cmd(sim: &Sim, dir: &TempDir, input: &Path, extra: &[&str]) -> Command {
    let mut c = bin();
    c.arg(input);
    if !extra.contains(&"--url") {
        c.args(["--url", &format!("{}/v1/echo?n={{n}}", sim.url)]);
    }
    c.arg("--state-dir")
        .arg(dir.path().join("state"))
        .arg("--json")
        .args(extra)
        .env("BATCHRUN_API_KEY", KEY)
        .stdin(Stdio::null());
    c
}

/// The outcome of a finished `batchrun` run.
pub struct Finished {
    /// Exit code.
    pub code: i32,
    /// The `--json` summary (Null when stdout was not JSON).
    pub summary: serde_json::Value,
    /// Everything on stderr.
    pub stderr: String,
}

/// Runs to completion and parses the `--json` summary.
pub fn finish(mut c: Command) -> Finished {
    finished(c.output().expect("run batchrun"))
}

/// Starts `c`, waits until the sim's stats satisfy `cond`, sends `signal`
/// (SIGINT, SIGTERM) as a person or a scheduler would, and waits for the end.
pub async fn signal_when(
    mut c: Command,
    sim: &Sim,
    cond: impl Fn(&serde_json::Value) -> bool,
    signal: i32,
) -> Finished {
    let child = c
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn batchrun");
    wait_for_stats(sim, 30, cond).await;
    // SAFETY: sending a signal to our own child process.
    unsafe {
        libc::kill(child.id() as i32, signal);
    }
    finished(child.wait_with_output().expect("wait for batchrun"))
}

fn finished(out: std::process::Output) -> Finished {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !stdout.contains(KEY) && !stderr.contains(KEY),
        "the API key leaked into output"
    );
    Finished {
        code: out.status.code().unwrap_or(-1),
        summary: serde_json::from_str(stdout.trim()).unwrap_or(serde_json::Value::Null),
        stderr,
    }
}

/// The lines of a JSONL file, parsed (empty when the file does not exist).
pub fn jsonl(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).expect("valid JSONL"))
        .collect()
}

/// The `line` numbers of a results file, in file order.
pub fn lines_of(path: &Path) -> Vec<u64> {
    jsonl(path)
        .iter()
        .map(|v| v["line"].as_u64().expect("line number"))
        .collect()
}

/// Polls `cond` against the sim's stats until it holds (at most `secs` seconds).
pub async fn wait_for_stats(sim: &Sim, secs: u64, cond: impl Fn(&serde_json::Value) -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    loop {
        let s = sim.stats().await;
        if cond(&s) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "condition not reached in {secs}s; stats: {s}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Asserts that no file under `dir` contains the API key.
pub fn assert_key_absent_from_files(dir: &Path) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let p = entry.unwrap().path();
        if p.is_dir() {
            assert_key_absent_from_files(&p);
        } else if let Ok(bytes) = std::fs::read(&p) {
            assert!(
                !bytes.windows(KEY.len()).any(|w| w == KEY.as_bytes()),
                "the API key was written to {}",
                p.display()
            );
        }
    }
}
