//! Window utilization and 429s of each pacer against `batchrun sim`.
//!
//! For each pacer, starts `batchrun sim --limit L/W` with transit latency on
//! the way in and out, runs `batchrun` on enough items for `--windows`
//! windows, reads the sim's admitted arrivals (`/admin/arrivals`) and reports
//! the mean share of the window in use over the steady part (the first and
//! last window left out), the fullest window, the 429s, and the time against
//! the ideal `items / L × W`.
//!
//! ```text
//! cargo build --release
//! cargo run --release --example pace_bench -- --limit 600/6s --windows 12
//! ```

use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use clap::Parser;

#[derive(Parser, Debug)]
struct Bench {
    /// The limit both sides enforce.
    #[arg(long, default_value = "600/6s")]
    limit: String,
    /// How many windows of items to send.
    #[arg(long, default_value_t = 12)]
    windows: u64,
    /// Workers of the run.
    #[arg(long, default_value_t = 20)]
    concurrency: usize,
    /// Latency before the server counts a call as arrived.
    #[arg(long, default_value = "5ms..30ms")]
    latency_in: String,
    /// Latency before the server answers.
    #[arg(long, default_value = "5ms..30ms")]
    latency: String,
    /// Pacers to compare.
    #[arg(long, value_delimiter = ',', default_value = "window,bucket")]
    pacers: Vec<String>,
    /// Extra `batchrun sim` options (e.g. `--secret-limit`), space separated.
    #[arg(long, default_value = "")]
    sim_args: String,
    /// The limit the client is told, when not the server's (secret limits).
    #[arg(long)]
    client_limit: Option<String>,
}

fn binary() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    // target/release/examples/pace_bench -> target/release/batchrun
    exe.parent()
        .and_then(|p| p.parent())
        .map(|p| p.join("batchrun"))
        .expect("target dir")
}

fn parse_limit(s: &str) -> anyhow::Result<(u64, Duration)> {
    let (n, d) = s.split_once('/').context("limit as N/DURATION")?;
    Ok((n.parse()?, humantime::parse_duration(d)?))
}

struct Outcome {
    utilization: f64,
    fullest: u64,
    rate_limited: u64,
    elapsed: f64,
}

fn one(b: &Bench, pacer: &str, dir: &std::path::Path) -> anyhow::Result<Outcome> {
    let (l, w) = parse_limit(&b.limit)?;
    let items = l * b.windows;
    let input = dir.join(format!("{pacer}.jsonl"));
    let text: String = (1..=items).map(|n| format!("{{\"n\": {n}}}\n")).collect();
    std::fs::write(&input, text)?;
    let mut sim = Command::new(binary())
        .args(["sim", "--listen", "127.0.0.1:0", "--limit", &b.limit])
        .args(["--concurrency", "1000", "--cooldown", "1s"])
        .args(["--latency", &b.latency, "--latency-in", &b.latency_in])
        .args(b.sim_args.split_whitespace())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let mut out = BufReader::new(sim.stdout.take().context("sim stdout")?);
    let mut line = String::new();
    out.read_line(&mut line)?;
    let url = line.trim().trim_start_matches("listening on ").to_string();
    std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
    let started = Instant::now();
    let run = Command::new(binary())
        .arg(&input)
        .args(["--url", &format!("{url}/v1/echo?n={{n}}")])
        .args(["--limit", b.client_limit.as_deref().unwrap_or(&b.limit)])
        .args([
            "--concurrency",
            &b.concurrency.to_string(),
            "--pacer",
            pacer,
        ])
        .args(["--json", "-q", "--state-dir"])
        .arg(dir.join(format!("{pacer}.state")))
        .env("BATCHRUN_API_KEY", "bench-key")
        .output()?;
    let elapsed = started.elapsed().as_secs_f64();
    let summary: serde_json::Value = serde_json::from_slice(&run.stdout)?;
    if summary["state"] != "done" {
        bail!("{pacer}: {summary}");
    }
    let mut body = String::new();
    reqwest::blocking_get(&format!("{url}/admin/arrivals"))?.read_to_string(&mut body)?;
    let _ = sim.kill();
    let arrivals: Vec<f64> = serde_json::from_str(&body)?;
    let (fullest, utilization) = measure(&arrivals, l, w.as_secs_f64() * 1000.0);
    Ok(Outcome {
        utilization,
        fullest,
        rate_limited: summary["rate_limited"].as_u64().unwrap_or(0),
        elapsed,
    })
}

/// The fullest window, and the mean share of the window in use sampled
/// every 10 ms over the steady part.
fn measure(arrivals: &[f64], l: u64, w_ms: f64) -> (u64, f64) {
    let mut a = arrivals.to_vec();
    a.sort_by(f64::total_cmp);
    let (Some(&first), Some(&last)) = (a.first(), a.last()) else {
        return (0, 0.0);
    };
    let count_in = |t: f64| a.iter().filter(|&&x| x > t - w_ms && x <= t).count() as u64;
    let mut fullest = 0;
    let mut i = 0;
    for (j, &x) in a.iter().enumerate() {
        while a[i] <= x - w_ms {
            i += 1;
        }
        fullest = fullest.max((j - i + 1) as u64);
    }
    let (from, to) = (first + w_ms, last - w_ms);
    let mut samples = 0.0;
    let mut sum = 0.0;
    let mut t = from + w_ms;
    while t <= to {
        sum += count_in(t) as f64 / l as f64;
        samples += 1.0;
        t += 10.0;
    }
    (fullest, if samples > 0.0 { sum / samples } else { 0.0 })
}

mod reqwest {
    //! A one-shot blocking GET over a plain TCP stream: the bench needs no
    //! async runtime for it.
    use std::io::{Read, Write};

    pub fn blocking_get(url: &str) -> anyhow::Result<impl Read> {
        let rest = url.trim_start_matches("http://");
        let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
        let mut s = std::net::TcpStream::connect(host)?;
        write!(
            s,
            "GET /{path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
        )?;
        let mut all = Vec::new();
        s.read_to_end(&mut all)?;
        let split = all
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .map_or(0, |p| p + 4);
        let head = String::from_utf8_lossy(&all[..split]).to_lowercase();
        let body = all[split..].to_vec();
        let body = if head.contains("transfer-encoding: chunked") {
            dechunk(&body)
        } else {
            body
        };
        Ok(std::io::Cursor::new(body))
    }

    fn dechunk(mut b: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        while let Some(p) = b.windows(2).position(|w| w == b"\r\n") {
            let n = usize::from_str_radix(String::from_utf8_lossy(&b[..p]).trim(), 16).unwrap_or(0);
            if n == 0 {
                break;
            }
            out.extend_from_slice(&b[p + 2..p + 2 + n]);
            b = &b[p + 2 + n + 2..];
        }
        out
    }
}

fn main() -> anyhow::Result<()> {
    let b = Bench::parse();
    let dir = std::env::temp_dir().join(format!("batchrun-pace-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let (l, w) = parse_limit(&b.limit)?;
    let ideal = (l * b.windows) as f64 / l as f64 * w.as_secs_f64();
    println!(
        "limit {} for {} windows ({} items), concurrency {}, latency in {} / out {}{}",
        b.limit,
        b.windows,
        l * b.windows,
        b.concurrency,
        b.latency_in,
        b.latency,
        if b.sim_args.is_empty() {
            String::new()
        } else {
            format!(", sim {}", b.sim_args)
        }
    );
    println!("| pacer | utilization (steady) | fullest window | 429s | time / ideal |");
    println!("|---|---|---|---|---|");
    for p in &b.pacers {
        let o = one(&b, p, &dir)?;
        println!(
            "| {p} | {:.1}% | {} of {l} | {} | {:.1} s / {:.1} s ({:.2}x) |",
            o.utilization * 100.0,
            o.fullest,
            o.rate_limited,
            o.elapsed,
            ideal,
            o.elapsed / ideal
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
