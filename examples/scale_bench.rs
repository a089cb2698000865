//! Scale benchmark: reproduces every figure of the "Scale" tables of docs/performance.md.
//!
//! It drives a built `batchrun` binary (any version: pass `--bin`) against
//! `batchrun sim --limit none --concurrency 1000` processes and `wrk`, and
//! measures peak RSS with `/usr/bin/time -v`. Each repetition measures:
//!
//! * `wrk -t2 -c64 -d10s` on `/v1/echo`, then a 200k-item job with
//!   `--limit none --concurrency 64` against the same sim: items/s, the ratio
//!   to wrk, CPU µs per item, peak RSS;
//! * peak RSS of a 20k-item and a 1M-item job, the checkpoint's disk bytes per
//!   item (the state directory minus the response bodies it holds);
//! * a rerun of the finished 1M-item job (wall time; it must send nothing);
//! * a 1M-item job killed with SIGKILL at 50%: how many calls the server had
//!   performed that the checkpoint did not record, then how long the resumed
//!   run takes to send its first request, and its peak RSS.
//!
//! ```text
//! sudo apt-get install -y wrk time
//! cargo build --release
//! cargo run --release --example scale_bench -- --bin target/release/batchrun --reps 3
//! ```
//!
//! Run it on an otherwise idle machine: it prints one line per measurement
//! and a min..max summary at the end.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use clap::Parser;

#[derive(Parser, Debug)]
#[command(about = "Scale benchmark for batchrun (see docs/performance.md)")]
struct Args {
    /// The batchrun binary to measure.
    #[arg(long, default_value = "target/release/batchrun")]
    bin: PathBuf,
    /// Repetitions of every measurement.
    #[arg(long, default_value_t = 3)]
    reps: u32,
    /// Working directory (inputs, state, outputs); removed at the end.
    #[arg(long, default_value = "/tmp/batchrun-scale-bench")]
    dir: PathBuf,
    /// Items of the throughput job.
    #[arg(long, default_value_t = 200_000)]
    throughput_items: u64,
    /// Items of the large job (peak RSS, rerun, kill).
    #[arg(long, default_value_t = 1_000_000)]
    large_items: u64,
    /// Skip the kill -9 measurement.
    #[arg(long)]
    no_kill: bool,
}

/// A `batchrun sim` child process; killed on drop.
struct Sim {
    child: Child,
    url: String,
    http: reqwest::Client,
}

impl Sim {
    fn start(bin: &Path) -> anyhow::Result<Sim> {
        let mut child = Command::new(bin)
            .args(["sim", "--listen", "127.0.0.1:0", "--limit", "none"])
            .args(["--concurrency", "1000", "--credits", "1000000000"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("starting the sim")?;
        let mut out = BufReader::new(child.stdout.take().context("sim stdout")?);
        let mut line = String::new();
        out.read_line(&mut line)?;
        let url = line
            .trim()
            .strip_prefix("listening on ")
            .context("the sim did not say where it listens")?
            .to_string();
        std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
        Ok(Sim {
            child,
            url,
            http: reqwest::Client::new(),
        })
    }

    async fn stat(&self, name: &str) -> anyhow::Result<u64> {
        let v: serde_json::Value = self
            .http
            .get(format!("{}/admin/stats", self.url))
            .send()
            .await?
            .json()
            .await?;
        v[name].as_u64().context("no such stat")
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What `/usr/bin/time -v` and the `--json` summary say about one run.
#[derive(Debug, Default)]
struct RunStats {
    wall_s: f64,
    cpu_s: f64,
    max_rss_kib: u64,
    summary: serde_json::Value,
}

fn numbers(path: &Path, n: u64) -> anyhow::Result<()> {
    if std::fs::metadata(path).is_ok() {
        return Ok(());
    }
    let mut w = std::io::BufWriter::new(std::fs::File::create(path)?);
    for i in 1..=n {
        writeln!(w, "{{\"n\": {i}}}")?;
    }
    w.flush()?;
    Ok(())
}

fn job_cmd(bin: &Path, sim: &Sim, input: &Path, state: &Path) -> Command {
    let mut c = Command::new(bin);
    c.arg(input)
        .args(["--url", &format!("{}/v1/echo?n={{n}}", sim.url)])
        .args(["--limit", "none", "--concurrency", "64", "--json"])
        .arg("--state-dir")
        .arg(state)
        .arg("--out")
        .arg(&outputs(state)[0])
        .arg("--failures")
        .arg(&outputs(state)[1])
        .env("BATCHRUN_API_KEY", "bench")
        .stdin(Stdio::null());
    c
}

/// Writes every dirty page out first, so that the writeback of one job's
/// hundred-odd MB of logs and outputs does not land on the next measurement
/// (it made a job's group commits wait on the disk: some repetitions lost a
/// fifth of their rate and gained 4 µs of CPU per item).
fn settle() {
    // SAFETY: sync takes no arguments and only schedules and waits for I/O.
    unsafe { libc::sync() };
}

/// Runs `cmd` under `/usr/bin/time -v`, after [`settle`].
fn timed(cmd: &Command) -> anyhow::Result<RunStats> {
    settle();
    let mut t = Command::new("/usr/bin/time");
    t.arg("-v").arg(cmd.get_program()).args(cmd.get_args());
    for (k, v) in cmd.get_envs() {
        if let Some(v) = v {
            t.env(k, v);
        }
    }
    let out = t.stdin(Stdio::null()).output()?;
    let err = String::from_utf8_lossy(&out.stderr);
    let field = |name: &str| -> Option<String> {
        err.lines()
            .find_map(|l| l.trim().strip_prefix(name).map(|v| v.trim().to_string()))
    };
    let secs = |name: &str| {
        field(name)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let wall = field("Elapsed (wall clock) time (h:mm:ss or m:ss):")
        .map(|v| {
            v.split(':')
                .fold(0.0, |acc, p| acc * 60.0 + p.parse::<f64>().unwrap_or(0.0))
        })
        .unwrap_or(0.0);
    let summary = serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
    if summary.is_null() {
        bail!("no summary; stderr: {err}");
    }
    Ok(RunStats {
        wall_s: wall,
        cpu_s: secs("User time (seconds):") + secs("System time (seconds):"),
        max_rss_kib: field("Maximum resident set size (kbytes):")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0),
        summary,
    })
}

/// Bytes allocated on disk under `dir`, like `du`.
fn disk_bytes(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => disk_bytes(&e.path()),
            Ok(m) => m.blocks() * 512,
            Err(_) => 0,
        })
        .sum()
}

/// Total length of the response bodies in a results file, as JSON text.
fn body_bytes(out: &Path) -> anyhow::Result<u64> {
    let mut n = 0;
    for line in BufReader::new(std::fs::File::open(out)?).lines() {
        let v: serde_json::Value = serde_json::from_str(&line?)?;
        n += serde_json::to_string(&v["body"])?.len() as u64;
    }
    Ok(n)
}

fn wrk(url: &str) -> anyhow::Result<f64> {
    settle();
    let out = Command::new("wrk")
        .args(["-t2", "-c64", "-d10s", "-H", "x-api-key: bench"])
        .arg(format!("{url}/v1/echo?n=1"))
        .output()
        .context("running wrk (apt-get install -y wrk)")?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| l.strip_prefix("Requests/sec:"))
        .and_then(|v| v.trim().parse().ok())
        .context("no Requests/sec in wrk's output")
}

type Figures = BTreeMap<&'static str, Vec<f64>>;

fn note(figures: &mut Figures, name: &'static str, v: f64) {
    println!("  {name}: {v:.3}");
    figures.entry(name).or_default().push(v);
}

/// A state dir and its outputs (see [`outputs`]) as if never used.
fn fresh(dir: &Path) -> PathBuf {
    let _ = std::fs::remove_dir_all(dir);
    for out in outputs(dir) {
        let _ = std::fs::remove_file(&out);
        if let (Some(parent), Some(name)) = (out.parent(), out.file_name()) {
            let owner = format!(".{}.owner", name.to_string_lossy());
            let _ = std::fs::remove_file(parent.join(owner));
        }
    }
    dir.to_path_buf()
}

/// The results and failures files of the job in `state`: beside it, of
/// its own. Each measurement starts its own sim (another URL, so another
/// job), and a job does not replace the outputs another job wrote.
fn outputs(state: &Path) -> [PathBuf; 2] {
    [
        state.with_extension("results.jsonl"),
        state.with_extension("failures.jsonl"),
    ]
}

async fn throughput(a: &Args, input: &Path, f: &mut Figures) -> anyhow::Result<()> {
    let sim = Sim::start(&a.bin)?;
    let wrk_rps = wrk(&sim.url)?;
    note(f, "wrk requests/s", wrk_rps);
    let state = fresh(&a.dir.join("state-throughput"));
    let r = timed(&job_cmd(&a.bin, &sim, input, &state))?;
    let n = a.throughput_items as f64;
    if r.summary["done"].as_f64() != Some(n) {
        bail!("throughput job did not finish: {}", r.summary);
    }
    note(f, "throughput items/s", n / r.wall_s);
    note(f, "throughput / wrk", n / r.wall_s / wrk_rps);
    note(f, "CPU us/item", r.cpu_s * 1e6 / n);
    note(
        f,
        "peak RSS MiB (throughput job)",
        r.max_rss_kib as f64 / 1024.0,
    );
    Ok(())
}

async fn large(a: &Args, small: &Path, big: &Path, f: &mut Figures) -> anyhow::Result<()> {
    let sim = Sim::start(&a.bin)?;
    let state = fresh(&a.dir.join("state-small"));
    let r = timed(&job_cmd(&a.bin, &sim, small, &state))?;
    note(f, "peak RSS MiB (20k)", r.max_rss_kib as f64 / 1024.0);
    let state = fresh(&a.dir.join("state-large"));
    let r = timed(&job_cmd(&a.bin, &sim, big, &state))?;
    let n = a.large_items as f64;
    if r.summary["done"].as_f64() != Some(n) {
        bail!("large job did not finish: {}", r.summary);
    }
    note(f, "peak RSS MiB (large)", r.max_rss_kib as f64 / 1024.0);
    note(f, "large job items/s", n / r.wall_s);
    let bodies = body_bytes(&outputs(&state)[0])?;
    let disk = disk_bytes(&state);
    note(
        f,
        "disk bytes/item excl. bodies",
        (disk - bodies.min(disk)) as f64 / n,
    );
    let r = timed(&job_cmd(&a.bin, &sim, big, &state))?;
    if r.summary["requests"].as_u64() != Some(0) {
        bail!("the rerun sent requests: {}", r.summary);
    }
    note(f, "rerun of finished large job s", r.wall_s);
    Ok(())
}

async fn kill(a: &Args, big: &Path, f: &mut Figures) -> anyhow::Result<()> {
    let sim = Sim::start(&a.bin)?;
    let state = fresh(&a.dir.join("state-kill"));
    settle();
    let mut child = job_cmd(&a.bin, &sim, big, &state)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let half = a.large_items / 2;
    while sim.stat("side_effects").await? < half {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    child.kill()?;
    child.wait()?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let performed = sim.stat("side_effects").await?;
    let status = Command::new(&a.bin)
        .arg("status")
        .arg(big)
        .arg("--state-dir")
        .arg(&state)
        .arg("--json")
        .output()?;
    let status: serde_json::Value = serde_json::from_slice(&status.stdout)?;
    // `status --json` lists the input's jobs (older versions printed one).
    let status = match status {
        serde_json::Value::Array(mut jobs) if jobs.len() == 1 => jobs.remove(0),
        serde_json::Value::Array(jobs) => bail!("expected one job, status lists {}", jobs.len()),
        one => one,
    };
    let recorded = status["done"].as_u64().unwrap_or(0) + status["failed"].as_u64().unwrap_or(0);
    note(
        f,
        "unrecorded after kill",
        performed.saturating_sub(recorded) as f64,
    );

    let before = sim.stat("requests").await?;
    let cmd = job_cmd(&a.bin, &sim, big, &state);
    let started = Instant::now();
    let resumed = tokio::task::spawn_blocking(move || timed(&cmd));
    loop {
        if sim.stat("requests").await? > before {
            break;
        }
        if resumed.is_finished() || started.elapsed() > Duration::from_secs(120) {
            bail!("the resumed run sent nothing");
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    note(
        f,
        "first request after kill s",
        started.elapsed().as_secs_f64(),
    );
    let r = resumed.await??;
    if r.summary["done"].as_u64() != Some(a.large_items) {
        bail!("the resumed job did not finish: {}", r.summary);
    }
    note(
        f,
        "peak RSS MiB (resumed large)",
        r.max_rss_kib as f64 / 1024.0,
    );
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    std::fs::create_dir_all(&a.dir)?;
    let tp = a.dir.join(format!("in{}.jsonl", a.throughput_items));
    let small = a.dir.join("in20000.jsonl");
    let big = a.dir.join(format!("in{}.jsonl", a.large_items));
    numbers(&tp, a.throughput_items)?;
    numbers(&small, 20_000)?;
    numbers(&big, a.large_items)?;
    let mut f = Figures::new();
    for rep in 1..=a.reps {
        println!("repetition {rep}");
        throughput(&a, &tp, &mut f).await?;
        large(&a, &small, &big, &mut f).await?;
        if !a.no_kill {
            kill(&a, &big, &mut f).await?;
        }
    }
    println!("\nsummary ({} repetitions, min..max):", a.reps);
    for (name, v) in &f {
        let min = v.iter().copied().fold(f64::INFINITY, f64::min);
        let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        println!("  {name:<32} {min:.3} .. {max:.3}");
    }
    let _ = std::fs::remove_dir_all(&a.dir);
    Ok(())
}
