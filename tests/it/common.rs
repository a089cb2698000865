//! Shared test harness: a real `batchrun sim` child process on port 0, and a
//! way to run the real `batchrun` binary.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

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
        Sim::start_on("127.0.0.1:0", args)
    }

    /// Like [`Sim::start`], listening on `addr` (say, the address of a sim
    /// just stopped, so a rerun meets the same URL).
    pub fn start_on(addr: &str, args: &[&str]) -> Sim {
        let mut child = bin()
            .arg("sim")
            .args(["--listen", addr])
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
    /// Removes the directory, unless `BATCHRUN_TEST_KEEP` is set (to look
    /// at a failed test's state, inputs and outputs).
    fn drop(&mut self) {
        if std::env::var_os("BATCHRUN_TEST_KEEP").is_none() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
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

/// One test's world: an optional `batchrun sim`, a temp dir, an input file in
/// it, and `batchrun` commands against them. Built with
/// `Scenario::new(tag).with_sim(args).numbers(n)`; everything is removed (and
/// the sim killed) when it drops.
pub struct Scenario {
    sim: Option<Sim>,
    dir: TempDir,
    input: Option<PathBuf>,
}

impl Scenario {
    /// A fresh temp dir tagged `tag`, with no sim and no input yet.
    pub fn new(tag: &str) -> Scenario {
        Scenario {
            sim: None,
            dir: TempDir::new(tag),
            input: None,
        }
    }

    /// Starts `batchrun sim ARGS` (see [`Sim::start`]) for this scenario.
    pub fn with_sim(mut self, args: &[&str]) -> Scenario {
        self.sim = Some(Sim::start(args));
        self
    }

    /// Makes `items.jsonl` with `n` items `{"n": 1..=n}` the input.
    pub fn numbers(mut self, n: u64) -> Scenario {
        self.input = Some(numbers(&self.dir, "items.jsonl", n));
        self
    }

    /// Appends the lines `{"n": N}` for `ns` to the input.
    pub fn append_numbers(&self, ns: std::ops::RangeInclusive<u64>) {
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(self.input_path())
            .unwrap();
        for n in ns {
            writeln!(f, "{{\"n\": {n}}}").unwrap();
        }
    }

    /// Makes `name` inside the dir, holding `contents`, the input.
    pub fn input(mut self, name: &str, contents: &str) -> Scenario {
        self.input = Some(self.dir.write(name, contents));
        self
    }

    /// The sim; panics when the scenario was built without one.
    pub fn sim(&self) -> &Sim {
        self.sim
            .as_ref()
            .expect("this scenario has no sim: build it with .with_sim(args)")
    }

    /// The temp dir (write more files with `.dir().write(name, contents)`).
    pub fn dir(&self) -> &TempDir {
        &self.dir
    }

    /// The input file; panics when none was set.
    pub fn input_path(&self) -> &Path {
        self.input
            .as_deref()
            .expect("this scenario has no input: use .numbers(n) or .input(name, contents)")
    }

    /// The default `--out`: `<input stem>.results.jsonl` beside the input.
    pub fn out_path(&self) -> PathBuf {
        self.beside_input("results")
    }

    /// The default `--failures`: `<input stem>.failures.jsonl` beside the input.
    pub fn failures_path(&self) -> PathBuf {
        self.beside_input("failures")
    }

    /// The `--state-dir` every command of this scenario uses.
    pub fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    /// `batchrun status INPUT --state-dir ... --json`: the array of jobs, or
    /// `Err(stderr)` when status fails (before the run made its checkpoint).
    pub fn status_json(&self) -> Result<serde_json::Value, String> {
        let out = bin()
            .arg("status")
            .arg(self.input_path())
            .arg("--state-dir")
            .arg(self.state_dir())
            .arg("--json")
            .output()
            .unwrap();
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        Ok(serde_json::from_slice(&out.stdout).expect("status --json is JSON"))
    }

    fn beside_input(&self, kind: &str) -> PathBuf {
        let input = self.input_path();
        let stem = input.file_stem().unwrap().to_string_lossy();
        input.with_file_name(format!("{stem}.{kind}.jsonl"))
    }

    /// `batchrun INPUT --url <sim>/v1/echo?n={n} --state-dir DIR/state --json
    /// EXTRA` with the test key in the environment; an `--url` in `extra`
    /// replaces the default one (and is required when there is no sim).
    pub fn cmd(&self, extra: &[&str]) -> Command {
        self.cmd_for(self.input_path(), extra)
    }

    /// Like [`Scenario::cmd`], on another input file.
    pub fn cmd_for(&self, input: &Path, extra: &[&str]) -> Command {
        match &self.sim {
            Some(sim) => run_cmd(sim, &self.dir, input, extra),
            None => {
                assert!(
                    extra.contains(&"--url"),
                    "a scenario without a sim needs --url in its arguments"
                );
                let mut c = bin();
                c.arg(input)
                    .arg("--state-dir")
                    .arg(self.state_dir())
                    .arg("--json")
                    .args(extra)
                    .env("BATCHRUN_API_KEY", KEY)
                    .stdin(Stdio::null());
                c
            }
        }
    }

    /// `batchrun SUB INPUT --state-dir DIR` (`status`, `report`) for this
    /// scenario's job.
    pub fn tool(&self, sub: &str) -> Command {
        let mut c = bin();
        c.arg(sub)
            .arg(self.input_path())
            .arg("--state-dir")
            .arg(self.state_dir());
        c
    }

    /// Starts [`Scenario::cmd`] with its output dropped: a run to kill.
    pub fn spawn_quiet(&self, extra: &[&str]) -> Child {
        self.cmd(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn batchrun")
    }

    /// Runs [`Scenario::cmd`] to completion.
    pub fn run(&self, extra: &[&str]) -> Finished {
        finish(self.cmd(extra))
    }

    /// Runs [`Scenario::cmd_for`] to completion.
    pub fn run_for(&self, input: &Path, extra: &[&str]) -> Finished {
        finish(self.cmd_for(input, extra))
    }

    /// Starts [`Scenario::cmd`] and sends `signal` once the sim's stats
    /// satisfy `cond` (see the free [`signal_when`]).
    pub async fn signal_when(
        &self,
        extra: &[&str],
        cond: impl Fn(&serde_json::Value) -> bool,
        signal: i32,
    ) -> Finished {
        signal_when(self.cmd(extra), self.sim(), cond, signal).await
    }
}

/// Asserts that the results file `out` holds the lines 1..=n, each exactly
/// once and in input order: every item of a `numbers(n)` input done once.
pub fn assert_each_item_once(out: &Path, n: u64) {
    let got = lines_of(out);
    let want: Vec<u64> = (1..=n).collect();
    if got == want {
        return;
    }
    let mut seen = std::collections::BTreeMap::<u64, usize>::new();
    for l in &got {
        *seen.entry(*l).or_default() += 1;
    }
    let missing: Vec<u64> = want
        .iter()
        .copied()
        .filter(|l| !seen.contains_key(l))
        .collect();
    let repeated: Vec<u64> = seen
        .iter()
        .filter(|(_, c)| **c > 1)
        .map(|(l, _)| *l)
        .collect();
    let stray: Vec<u64> = seen
        .keys()
        .copied()
        .filter(|l| !(1..=n).contains(l))
        .collect();
    panic!(
        "{}: expected lines 1..={n} once each in order; {} lines, missing {missing:?}, \
         repeated {repeated:?}, out of range {stray:?}, order {got:?}",
        out.display(),
        got.len()
    );
}

/// Asserts that the sim performed exactly `n` side effects (one per item:
/// a replay or a retry never repeats one).
pub fn assert_side_effects(stats: &serde_json::Value, n: u64) {
    assert_eq!(
        stats["side_effects"], n,
        "expected exactly {n} side effects: {stats}"
    );
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
    c: Command,
    sim: &Sim,
    cond: impl Fn(&serde_json::Value) -> bool,
    signal: i32,
) -> Finished {
    act_when(c, sim, cond, |pid| {
        // SAFETY: sending a signal to our own child process.
        unsafe {
            libc::kill(pid as i32, signal);
        }
    })
    .await
}

/// Starts `c`, waits until the sim's stats satisfy `cond`, does `act` with
/// the child's pid while it runs, and waits for the end.
pub async fn act_when(
    mut c: Command,
    sim: &Sim,
    cond: impl Fn(&serde_json::Value) -> bool,
    act: impl FnOnce(u32),
) -> Finished {
    let child = c
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn batchrun");
    wait_for_stats(sim, 30, cond).await;
    act(child.id());
    finished(child.wait_with_output().expect("wait for batchrun"))
}

/// What a finished run of `batchrun` showed (the key never in it).
pub fn finished(out: std::process::Output) -> Finished {
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

/// Serves `app` on a free loopback port for the rest of the test; returns
/// where.
pub async fn serve(app: axum::Router) -> std::net::SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(l, app).await });
    addr
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

/// Waits (on tokio's timer, never blocking a runtime thread) until `cond`
/// holds, failing after `secs` seconds.
pub async fn wait_until(secs: u64, what: &str, cond: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while !cond() {
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: not reached in {secs}s"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

/// Asserts that no file under `dir` contains the API key.
pub fn assert_key_absent_from_files(dir: &Path) {
    assert_secret_absent_from_files(dir, KEY);
}

/// Asserts that no file under `dir` contains `secret`.
pub fn assert_secret_absent_from_files(dir: &Path, secret: &str) {
    // As is, and as a JSON string may carry it (`\u0073\u006b...`).
    let escaped: String = secret
        .chars()
        .map(|c| format!("\\u{:04x}", c as u32))
        .collect();
    for entry in std::fs::read_dir(dir).unwrap() {
        let p = entry.unwrap().path();
        if p.is_dir() {
            assert_secret_absent_from_files(&p, secret);
        } else if let Ok(bytes) = std::fs::read(&p) {
            for form in [secret, escaped.as_str()] {
                assert!(
                    !bytes.windows(form.len()).any(|w| w == form.as_bytes()),
                    "a secret was written to {} ({form})",
                    p.display()
                );
            }
        }
    }
}

/// A webhook receiver on 127.0.0.1:0 that keeps every JSON body it gets.
pub struct Receiver {
    /// Where to POST (it carries a token that must never be printed).
    pub url: String,
    /// Every body received, in order.
    pub got: Arc<Mutex<Vec<serde_json::Value>>>,
    _task: tokio::task::JoinHandle<()>,
}

impl Receiver {
    /// Starts listening.
    pub async fn start() -> Receiver {
        let got = Arc::new(Mutex::new(Vec::new()));
        let store = got.clone();
        let app = axum::Router::new().route(
            "/hook",
            axum::routing::post(move |axum::Json(v): axum::Json<serde_json::Value>| {
                let store = store.clone();
                async move {
                    store.lock().unwrap().push(v);
                    "ok"
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!(
            "http://{}/hook?token=hook-secret",
            listener.local_addr().unwrap()
        );
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Receiver {
            url,
            got,
            _task: task,
        }
    }

    /// The `id` of every alert received, in order.
    pub fn ids(&self) -> Vec<String> {
        self.got
            .lock()
            .unwrap()
            .iter()
            .map(|v| v["id"].as_str().unwrap_or("").to_string())
            .collect()
    }
}

/// The ids of the alerts in a `--json` summary.
pub fn alert_ids(summary: &serde_json::Value) -> Vec<String> {
    summary["alerts"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|x| x["id"].as_str().unwrap_or("").to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// Pipes `items` into `batchrun - --format jsonl --out OUT EXTRA`, the
/// failures beside OUT.
pub fn piped(s: &Scenario, items: &str, out: &std::path::Path, extra: &[&str]) -> Finished {
    piped_as(s, "-", items, out, extra)
}

/// [`piped`], the pipe named `input` (`/dev/stdin`, `/proc/self/fd/0`:
/// what `<(cmd)` gives is such a path).
pub fn piped_as(
    s: &Scenario,
    input: &str,
    items: &str,
    out: &std::path::Path,
    extra: &[&str],
) -> Finished {
    let mut c = s.cmd_for(
        std::path::Path::new(input),
        &[&["--limit", "none"], extra].concat(),
    );
    c.args(["--format", "jsonl", "--out"])
        .arg(out)
        .arg("--failures")
        .arg(out.with_extension("failures"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(items.as_bytes())
        .unwrap();
    let o = child.wait_with_output().unwrap();
    Finished {
        code: o.status.code().unwrap_or(-1),
        summary: serde_json::from_slice(&o.stdout).unwrap_or_default(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

/// The sim's batch endpoint that echoes each item.
pub fn batch_url(s: &Scenario) -> String {
    format!("{}/batch/echo", s.sim().url)
}

/// Every result line holds its own item's element: the sim echoes the
/// item's data in it.
pub fn assert_own_elements(s: &Scenario) {
    for r in jsonl(&s.out_path()) {
        assert_eq!(r["body"]["data"], r["input"], "{r}");
        assert_eq!(r["body"]["status"], 200, "{r}");
    }
}

/// Items with a prompt and a `max_tokens`, of varied sizes, as an LLM
/// API's requests are.
pub fn prompts(n: u64) -> String {
    (1..=n)
        .map(|i| {
            let prompt = "word ".repeat((i % 7) as usize * 4 + 1);
            let max_tokens = 10 + (i % 5) * 8;
            format!("{{\"n\": {i}, \"max_tokens\": {max_tokens}, \"prompt\": \"{prompt}\"}}\n")
        })
        .collect()
}
