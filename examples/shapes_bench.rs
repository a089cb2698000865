//! batchrun against every shape of the sim, in every dialect, told the limit,
//! told more while the server states it, or told more against a secret one
//! (issue 19's benchmark table): wall time against the ideal, and 429s, for
//! each `--pacer`.
//!
//! For each shape (a sliding window, a fixed window, nginx's bucket with a
//! burst, SpikeArrest) at 30 a second, the sim keeps the policy and states it
//! in `--dialect`; batchrun runs `--items` items with `-c 5` and is
//! - `told`: `--limit` the policy itself (the bare rate where this build's
//!   `--limit` takes no shape);
//! - `stated`: `--limit` twice the rate, the dialect saying the truth;
//! - `secret`: `--limit` three times the rate, `--secret-limit`.
//!
//! The sim runs with `--cooldown 0`, so what is measured is the pace, not
//! the cooldown's penalty. A run over `--timeout-x` times its ideal (plus
//! 5 s) is stopped and shown as such.
//!
//! ```text
//! cargo build --release
//! cargo run --release --example shapes_bench -- --dialects batchrun,ietf,openai
//! ```

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Parser;

#[derive(Parser, Debug)]
struct Bench {
    /// Items per run.
    #[arg(long, default_value_t = 120)]
    items: u64,
    /// Shapes: sliding, fixed, bucket, spike.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "sliding,fixed,bucket,spike"
    )]
    shapes: Vec<String>,
    /// Dialects the sim states the limit in.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "batchrun,ietf,x-ratelimit,openai"
    )]
    dialects: Vec<String>,
    /// What batchrun is told: told, stated, secret.
    #[arg(long, value_delimiter = ',', default_value = "told,stated,secret")]
    modes: Vec<String>,
    /// Pacers.
    #[arg(long, value_delimiter = ',', default_value = "window,bucket,spike")]
    pacers: Vec<String>,
    /// Stop a run after this many times its ideal (plus 5 s).
    #[arg(long, default_value_t = 6.0)]
    timeout_x: f64,
}

/// The rate every shape keeps: 30 a second.
const RATE: u64 = 30;

/// A shape: the sim's options, the policy the client may be told, and the
/// ideal time of `items` (what passes at once, then the rate).
fn shape(name: &str, items: u64) -> anyhow::Result<(Vec<String>, String, f64)> {
    let rest = |at_once: u64| items.saturating_sub(at_once) as f64 / RATE as f64;
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    Ok(match name {
        // A window passes L at once, then L per window.
        "sliding" => (s(&["--limit", "30/1s"]), "30/1s".into(), rest(RATE).ceil()),
        "fixed" => (
            s(&["--limit", "30/1s,fixed"]),
            "30/1s,fixed".into(),
            rest(RATE).ceil(),
        ),
        "bucket" => (
            s(&["--limit", "30/1s,burst=5"]),
            "30/1s,burst=5".into(),
            rest(6),
        ),
        "spike" => (
            s(&["--model", "spike-arrest", "--limit", "30ps"]),
            "30ps".into(),
            rest(3),
        ),
        other => anyhow::bail!("unknown shape {other}"),
    })
}

fn binary() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    exe.parent()
        .and_then(|p| p.parent())
        .map(|p| p.join("batchrun"))
        .expect("target dir")
}

struct Sim {
    child: std::process::Child,
    url: String,
}

impl Drop for Sim {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_sim(args: &[String]) -> anyhow::Result<Sim> {
    let mut child = Command::new(binary())
        .args(["sim", "--listen", "127.0.0.1:0", "--concurrency", "1000"])
        .args(["--cooldown", "0", "--credits", "1000000000"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let mut out = BufReader::new(child.stdout.take().context("sim stdout")?);
    let mut line = String::new();
    out.read_line(&mut line)?;
    let url = line.trim().trim_start_matches("listening on ").to_string();
    std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
    Ok(Sim { child, url })
}

/// Runs batchrun; `None` when it ran out of time.
fn run_client(
    sim: &Sim,
    input: &Path,
    dir: &Path,
    limit: &str,
    pacer: &str,
    deadline: Duration,
) -> anyhow::Result<Option<(f64, i32, String)>> {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir)?;
    let started = Instant::now();
    let mut child = Command::new(binary())
        .arg(input)
        .args(["--url", &format!("{}/v1/echo?n={{n}}", sim.url)])
        .args(["--limit", limit, "-c", "5", "--pacer", pacer, "-q"])
        .arg("--state-dir")
        .arg(dir.join("state"))
        .arg("--out")
        .arg(dir.join("out.jsonl"))
        .arg("--failures")
        .arg(dir.join("failures.jsonl"))
        .env("BATCHRUN_API_KEY", "bench-key")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    loop {
        if let Some(status) = child.try_wait()? {
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                std::io::Read::read_to_string(&mut e, &mut err)?;
            }
            let code = status.code().unwrap_or(-1);
            return Ok(Some((started.elapsed().as_secs_f64(), code, err)));
        }
        if started.elapsed() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn stats(rt: &tokio::runtime::Runtime, sim: &Sim) -> anyhow::Result<serde_json::Value> {
    rt.block_on(async {
        Ok(reqwest::get(format!("{}/admin/stats", sim.url))
            .await?
            .json()
            .await?)
    })
}

/// One row: the shape in a dialect, what batchrun is told, and a pacer.
struct Case<'a> {
    shape: &'a str,
    dialect: &'a str,
    mode: &'a str,
    pacer: &'a str,
}

fn one(b: &Bench, rt: &tokio::runtime::Runtime, c: &Case, tmp: &Path) -> anyhow::Result<String> {
    let (mut sim_args, policy, ideal) = shape(c.shape, b.items)?;
    sim_args.extend(["--dialect".to_string(), c.dialect.to_string()]);
    let told = match c.mode {
        "told" => policy.clone(),
        "stated" => format!("{}/1s", 2 * RATE),
        "secret" => {
            sim_args.push("--secret-limit".into());
            format!("{}/1s", 3 * RATE)
        }
        other => anyhow::bail!("unknown mode {other}"),
    };
    let input = tmp.join("items.jsonl");
    let deadline = Duration::from_secs_f64(ideal * b.timeout_x + 5.0);
    let dir = tmp.join("run");
    let sim = start_sim(&sim_args)?;
    let mut got = run_client(&sim, &input, &dir, &told, c.pacer, deadline)?;
    let mut note = "";
    if let Some((_, 2, err)) = &got {
        if c.mode == "told" && err.contains("invalid limit") {
            // This build's --limit takes no shape: tell it the rate.
            drop(sim);
            let sim = start_sim(&sim_args)?;
            let rate = policy.split(',').next().unwrap_or(&policy).to_string();
            got = run_client(&sim, &input, &dir, &rate, c.pacer, deadline)?;
            note = " (rate only)";
            return row(c, ideal, got, &stats(rt, &sim)?, note);
        }
    }
    row(c, ideal, got, &stats(rt, &sim)?, note)
}

fn row(
    c: &Case,
    ideal: f64,
    got: Option<(f64, i32, String)>,
    s: &serde_json::Value,
    note: &str,
) -> anyhow::Result<String> {
    let refused = s["rejected_rate"].as_u64().unwrap_or(0);
    let (wall, ratio, exit) = match &got {
        Some((wall, code, _)) => (
            format!("{wall:.2}"),
            format!("{:.2}x", wall / ideal.max(0.01)),
            code.to_string(),
        ),
        None => ("timeout".into(), "-".into(), "-".into()),
    };
    Ok(format!(
        "| {} | {} | {}{note} | {} | {wall} | {ideal:.2} | {ratio} | {refused} | {exit} |",
        c.shape, c.dialect, c.mode, c.pacer
    ))
}

fn main() -> anyhow::Result<()> {
    let b = Bench::parse();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let tmp = std::env::temp_dir().join(format!("shapes_bench.{}", std::process::id()));
    std::fs::create_dir_all(&tmp)?;
    let text: String = (1..=b.items).map(|n| format!("{{\"n\": {n}}}\n")).collect();
    std::fs::write(tmp.join("items.jsonl"), text)?;
    println!("| shape | dialect | told | pacer | wall s | ideal s | ratio | 429s | exit |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for shape in &b.shapes {
        for dialect in &b.dialects {
            for mode in &b.modes {
                // The dialect says nothing to a client told the truth or
                // facing a secret limit beyond the first: one dialect will do.
                if mode != "stated" && dialect != &b.dialects[0] {
                    continue;
                }
                for pacer in &b.pacers {
                    let c = Case {
                        shape,
                        dialect,
                        mode,
                        pacer,
                    };
                    match one(&b, &rt, &c, &tmp) {
                        Ok(line) => println!("{line}"),
                        Err(e) => {
                            println!("| {shape} | {dialect} | {mode} | {pacer} | error: {e:#} |")
                        }
                    }
                }
            }
        }
    }
    let _ = std::fs::remove_dir_all(&tmp);
    Ok(())
}
