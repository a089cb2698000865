//! Issue 19's benchmark table: shape x dialect x {told, rate, stated,
//! secret} for each `--pacer`, against `batchrun sim`, and a token budget.
//!
//! Each cell starts `batchrun sim` keeping one limit of one shape, runs
//! `batchrun` on `--items` items, and prints a Markdown row: the wall time
//! against the shape's ideal, the 429s the client saw, and whether the
//! issue's bar for that kind of knowledge holds. Knowledge is what the
//! client is told: `told` the limit and its shape (the bucket and spike
//! pacers are told only the rate: they keep no shapes; a sliding window
//! is told as `30/1s,sliding`), `rate` only the rate (`--limit 30/1s`,
//! its shape left to learn), `stated` three times the limit with
//! the server stating it in a dialect, `secret` three times the limit with
//! the server stating nothing.
//!
//! ```text
//! cargo build --release
//! target/release/examples/shapes_bench --items 150
//! ```

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Parser;

#[derive(Parser, Debug)]
struct Bench {
    /// Items per cell.
    #[arg(long, default_value_t = 150)]
    items: u64,
    /// Workers of the run.
    #[arg(long, default_value_t = 10)]
    concurrency: u64,
    /// The sim's delay before an accepted call's answer (`--latency`):
    /// its work. A 429 comes back without it, as from a limiter in front.
    #[arg(long, default_value = "5ms..30ms")]
    latency: String,
    /// The sim's transit-in delay (`--latency-in`): the network's share
    /// of a round trip, which a 429 pays as well. None by default.
    #[arg(long)]
    latency_in: Option<String>,
    /// Pacers to compare.
    #[arg(long, value_delimiter = ',', default_value = "window,bucket,spike")]
    pacers: Vec<String>,
    /// Dialects of the `stated` rows.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "batchrun,ietf,x-ratelimit,openai,anthropic"
    )]
    dialects: Vec<String>,
    /// A cell still running after this long is stopped and said so.
    #[arg(long, default_value = "90s", value_parser = humantime::parse_duration)]
    cell_timeout: Duration,
    /// Only the shapes whose name contains this (`sliding`, `fixed`,
    /// `burst 5`, `no burst`).
    #[arg(long)]
    shape: Option<String>,
    /// Only these kinds of knowledge (`told`, `rate`, `stated`, `secret`).
    #[arg(long, value_delimiter = ',')]
    knows: Vec<String>,
    /// Each cell this many times (its rows one after another).
    #[arg(long, default_value_t = 1)]
    repeat: u32,
    /// Only the token budget row.
    #[arg(long)]
    tokens_only: bool,
    /// Calls of the token budget row (a budget is judged over many
    /// windows: its first one is spent by estimates, not charges).
    #[arg(long, default_value_t = 600)]
    token_calls: u64,
    /// The token budget's window (`1m` for a tokens-per-minute job).
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    token_window: Duration,
    /// Tokens the budget allows per window.
    #[arg(long, default_value_t = 3000)]
    token_budget: u64,
}

/// A server's limit: what the sim keeps, its rate (calls per second) and
/// the calls it lets through at once.
struct Shape {
    name: &'static str,
    /// The sim's `--limit`.
    spec: &'static str,
    /// The `--limit` of a client told the limit and its shape.
    told: &'static str,
    rate: &'static str,
    per_s: f64,
    at_once: u64,
}

const SHAPES: [Shape; 4] = [
    Shape {
        name: "sliding",
        spec: "30/1s",
        told: "30/1s,sliding",
        rate: "30/1s",
        per_s: 30.0,
        at_once: 30,
    },
    Shape {
        name: "fixed",
        spec: "30/1s,fixed",
        told: "30/1s,fixed",
        rate: "30/1s",
        per_s: 30.0,
        at_once: 30,
    },
    Shape {
        name: "bucket, burst 5",
        spec: "30/1s,burst=5",
        told: "30/1s,burst=5",
        rate: "30/1s",
        per_s: 30.0,
        at_once: 6,
    },
    Shape {
        name: "bucket, no burst",
        spec: "30/1s,burst=0",
        told: "30/1s,burst=0",
        rate: "30/1s",
        per_s: 30.0,
        at_once: 1,
    },
];

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

impl Sim {
    fn start(args: &[&str]) -> anyhow::Result<Sim> {
        let mut child = Command::new(binary())
            .args(["sim", "--listen", "127.0.0.1:0", "--concurrency", "1000"])
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
}

impl Drop for Sim {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What one run came to.
struct Outcome {
    wall: f64,
    rate_limited: u64,
    state: String,
}

/// Runs `batchrun` on `input` against `url`, stopped after `timeout`.
fn run(input: &Path, url: &str, args: &[String], timeout: Duration) -> anyhow::Result<Outcome> {
    let state = input.with_extension("state");
    // Each cell is a job of its own: its outputs go, with its checkpoint.
    let _ = std::fs::remove_dir_all(&state);
    for out in ["results.jsonl", "failures.jsonl"] {
        let _ = std::fs::remove_file(input.with_extension(out));
    }
    let started = Instant::now();
    let mut child = Command::new(binary())
        .arg(input)
        .args(["--url", url])
        .args(args)
        .args(["--json", "-q", "--state-dir"])
        .arg(&state)
        .env("BATCHRUN_API_KEY", "bench-key")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    loop {
        if child.try_wait()?.is_some() {
            break;
        }
        if started.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            return Ok(Outcome {
                wall: started.elapsed().as_secs_f64(),
                rate_limited: 0,
                state: "timeout".into(),
            });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let wall = started.elapsed().as_secs_f64();
    let out = child.wait_with_output()?;
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    if summary["state"] != "done" {
        eprintln!("{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(Outcome {
        wall,
        rate_limited: summary["rate_limited"].as_u64().unwrap_or(0),
        state: summary["state"]
            .as_str()
            .unwrap_or("no summary")
            .to_string(),
    })
}

/// One row: the sim's options, the client's, and the bar that applies.
struct Cell<'a> {
    shape: &'a Shape,
    dialect: &'a str,
    knows: &'static str,
    pacer: &'a str,
}

impl Cell<'_> {
    fn sim_args(&self) -> Vec<&str> {
        let mut a = vec!["--limit", self.shape.spec, "--cooldown", "1s"];
        match self.knows {
            "secret" => a.push("--secret-limit"),
            _ => a.extend(["--dialect", self.dialect]),
        }
        a
    }

    fn told(&self) -> String {
        match self.knows {
            "told" if self.pacer == "window" => self.shape.told.to_string(),
            "told" | "rate" => self.shape.rate.to_string(),
            _ => "90/1s".to_string(),
        }
    }

    /// The ideal wall time of `n` items: those the limit lets through at
    /// once, then the rest at its rate.
    fn ideal(&self, n: u64) -> f64 {
        n.saturating_sub(self.shape.at_once) as f64 / self.shape.per_s
    }

    /// Whether the issue's bar holds, and the bar as words.
    fn bar(&self, o: &Outcome, ideal: f64, c: u64) -> (bool, String) {
        let rtt = 0.06;
        match self.knows {
            "told" => (
                o.rate_limited == 0 && o.wall <= 1.1 * ideal + rtt,
                "0 429s, ≤ 1.1x + RTT".into(),
            ),
            "stated" => (
                o.rate_limited <= c,
                format!("≤ {c} 429s (the first flight)"),
            ),
            _ => (
                o.rate_limited <= 3 && o.wall <= 1.3 * ideal + 1.5,
                "≤ 3 429s, ≤ 1.3x + 1.5 s".into(),
            ),
        }
    }
}

fn cell(b: &Bench, c: &Cell, input: &Path) -> anyhow::Result<()> {
    let mut sim_args = c.sim_args();
    sim_args.extend(["--latency", &b.latency]);
    if let Some(l) = &b.latency_in {
        sim_args.extend(["--latency-in", l]);
    }
    let sim = Sim::start(&sim_args)?;
    let args: Vec<String> = [
        "--limit",
        &c.told(),
        "--concurrency",
        &b.concurrency.to_string(),
        "--pacer",
        c.pacer,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let url = format!("{}/v1/echo?n={{n}}", sim.url);
    let o = run(input, &url, &args, b.cell_timeout)?;
    drop(sim);
    let ideal = c.ideal(b.items);
    let (ok, bar) = c.bar(&o, ideal, b.concurrency);
    let ok = ok && o.state == "done";
    println!(
        "| {} | {} | {} (`--limit {}`) | {} | {:.2} s / {:.2} s ({:.2}x) | {} | {} | {}{} |",
        c.shape.name,
        if c.knows == "secret" {
            "none"
        } else {
            c.dialect
        },
        c.knows,
        c.told(),
        c.pacer,
        o.wall,
        ideal,
        o.wall / ideal,
        o.rate_limited,
        bar,
        if ok { "yes" } else { "**no**" },
        if o.state == "done" {
            String::new()
        } else {
            format!(" ({})", o.state)
        }
    );
    Ok(())
}

/// Items with a prompt and a `max_tokens`, of varied sizes.
fn prompts(n: u64) -> String {
    (1..=n)
        .map(|i| {
            let prompt = "word ".repeat((i % 7) as usize * 8 + 4);
            let max_tokens = 20 + (i % 5) * 20;
            format!("{{\"n\": {i}, \"max_tokens\": {max_tokens}, \"prompt\": \"{prompt}\"}}\n")
        })
        .collect()
}

/// The token budget: `--token-calls` calls against `--token-budget` tokens
/// per `--token-window` (3000 a second by default), the cost estimated
/// from each item and corrected from each answer's usage; the ideal is
/// the tokens the sim charged beyond the first window's budget, at the
/// budget's rate.
fn tokens(b: &Bench, dir: &Path) -> anyhow::Result<()> {
    let budget = b.token_budget;
    let window = humantime::format_duration(b.token_window).to_string();
    let limit = format!("{budget}/{window},tokens");
    let sim = Sim::start(&[
        "--limit",
        "1000/1s",
        "--limit",
        &limit,
        "--latency",
        &b.latency,
    ])?;
    let input = dir.join("prompts.jsonl");
    std::fs::write(&input, prompts(b.token_calls))?;
    let args: Vec<String> = [
        "--limit",
        "1000/1s",
        "--limit",
        &limit,
        "--cost",
        "max_tokens + chars(prompt)/4",
        "--json-body",
        "--concurrency",
        &b.concurrency.to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let url = format!("{}/v1/echo?n={{n}}", sim.url);
    let o = run(&input, &url, &args, b.cell_timeout)?;
    let stats: serde_json::Value =
        serde_json::from_str(&http_get(&format!("{}/admin/stats", sim.url))?)?;
    let charged = stats["tokens_charged"].as_u64().unwrap_or(0);
    let most = stats["policies"][1]["max_in_window"].as_u64().unwrap_or(0);
    // The sim keeps the budget as a sliding window: no span of a window
    // holds more than the budget, so the fastest any client can go is a
    // budget at once, each window (the last window's tokens go once the
    // first's have left): ceil(charged / budget) - 1 windows. The smooth
    // rate after the first window, (charged - budget) / budget windows, is
    // lower and out of reach unless charged is a whole number of budgets.
    let w = b.token_window.as_secs_f64();
    let windows = (charged as f64 / budget as f64).ceil() - 1.0;
    let ideal = windows.max(0.0) * w;
    let smooth = charged.saturating_sub(budget) as f64 / budget as f64 * w;
    println!(
        "| token budget | tokens charged | most in any {window} | 429s | wall / ideal | smooth rate | within 1.15x |"
    );
    println!("|---|---|---|---|---|---|---|");
    println!(
        "| `{limit}` + `1000/1s`, {} calls, -c {} | {charged} | {most} of {budget} | {} | {:.2} s / {:.2} s ({:.2}x) | {:.2} s ({:.2}x) | {} |",
        b.token_calls,
        b.concurrency,
        o.rate_limited,
        o.wall,
        ideal,
        o.wall / ideal.max(1e-9),
        smooth,
        o.wall / smooth.max(1e-9),
        if o.wall <= 1.15 * ideal && most <= budget { "yes" } else { "**no**" }
    );
    Ok(())
}

/// A one-shot GET over a plain TCP stream (the sim answers admin calls
/// with a length, so no chunking to undo).
fn http_get(url: &str) -> anyhow::Result<String> {
    use std::io::{Read, Write};
    let rest = url.trim_start_matches("http://");
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    let mut s = std::net::TcpStream::connect(host)?;
    write!(
        s,
        "GET /{path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )?;
    let mut all = String::new();
    s.read_to_string(&mut all)?;
    Ok(all
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default())
}

fn main() -> anyhow::Result<()> {
    let b = Bench::parse();
    let dir = std::env::temp_dir().join(format!("batchrun-shapes-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let input = dir.join("items.jsonl");
    let text: String = (1..=b.items).map(|n| format!("{{\"n\": {n}}}\n")).collect();
    std::fs::write(&input, text)?;
    if !b.tokens_only {
        println!(
            "{} items, -c {}, sim --latency {} (an accepted call's work), --latency-in {} (transit in), --cooldown 1s",
            b.items,
            b.concurrency,
            b.latency,
            b.latency_in.as_deref().unwrap_or("0")
        );
        println!("| shape | dialect | knows | pacer | wall / ideal | 429s | bar | holds |");
        println!("|---|---|---|---|---|---|---|---|");
        let wanted = |s: &&Shape| {
            b.shape
                .as_ref()
                .map_or(true, |w| s.name.contains(w.as_str()))
        };
        for shape in SHAPES.iter().filter(wanted) {
            let mut kinds: Vec<(&str, &str)> = vec![("told", "batchrun"), ("rate", "batchrun")];
            kinds.extend(b.dialects.iter().map(|d| ("stated", d.as_str())));
            kinds.push(("secret", "batchrun"));
            kinds.retain(|(k, _)| b.knows.is_empty() || b.knows.iter().any(|w| w == k));
            for (knows, dialect) in kinds {
                for pacer in &b.pacers {
                    if knows == "rate" && pacer != "window" {
                        continue; // the same run as their "told" row
                    }
                    let c = Cell {
                        shape,
                        dialect,
                        knows,
                        pacer,
                    };
                    for _ in 0..b.repeat {
                        cell(&b, &c, &input)?;
                    }
                }
            }
        }
    }
    tokens(&b, &dir)?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
