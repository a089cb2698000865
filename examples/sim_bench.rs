//! Load generator for `batchrun sim`: shows the sim is never the bottleneck.
//!
//! Spawns the sim in process (taking every `batchrun sim` option) or targets
//! a running one with `--url`, then drives `--requests` GETs from
//! `--connections` concurrent keep-alive connections, for at most `--max-time`,
//! and prints requests/s and the status counts.
//!
//! ```text
//! cargo run --release --example sim_bench -- --limit none --concurrency 1000
//! cargo run --release --example sim_bench -- --url http://127.0.0.1:8787 --client reqwest
//! ```
//!
//! The default `raw` client is a minimal HTTP/1.1 keep-alive loop, so that on
//! a small machine the client spends as little of the shared CPU as possible;
//! `reqwest` measures with the client the project itself uses.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use batchrun::sim::SimArgs;
use clap::{Parser, ValueEnum};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[derive(Parser, Debug)]
#[command(about = "Load generator for batchrun sim")]
struct Bench {
    /// Requests to send in total.
    #[arg(long, default_value_t = 200_000)]
    requests: u64,
    /// Concurrent keep-alive connections.
    #[arg(long, default_value_t = 64)]
    connections: usize,
    /// Distinct API keys, assigned to connections round-robin.
    #[arg(long, default_value_t = 1)]
    keys: usize,
    /// Stop after this long even if not every request was sent.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    max_time: Duration,
    /// HTTP client to drive the load with.
    #[arg(long, value_enum, default_value_t = ClientKind::Raw)]
    client: ClientKind,
    /// Target a running sim (http://IP:PORT) instead of spawning one.
    #[arg(long)]
    url: Option<String>,
    /// Options of the in-process sim (ignored with --url).
    #[command(flatten)]
    sim: SimArgs,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum ClientKind {
    /// A minimal HTTP/1.1 keep-alive loop over a TcpStream.
    Raw,
    /// reqwest, one client (one connection) per worker.
    Reqwest,
}

#[derive(Default)]
struct Tally {
    sent: u64,
    statuses: BTreeMap<u16, u64>,
    errors: u64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut b = Bench::parse();
    let url = match &b.url {
        Some(u) => u.trim_end_matches('/').to_string(),
        None => {
            if b.sim.listen == SimArgs::default().listen {
                b.sim.listen = "127.0.0.1:0".parse()?;
            }
            let (addr, _server) = batchrun::sim::spawn(b.sim.clone()).await?;
            format!("http://{addr}")
        }
    };
    let host = url
        .strip_prefix("http://")
        .context("--url must be http://IP:PORT")?
        .to_string();

    let next = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let deadline = Instant::now() + b.max_time;
    let start = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..b.connections {
        let key = format!("bench-{}", i % b.keys.max(1));
        let (next, host, url, total, kind) = (
            next.clone(),
            host.clone(),
            url.clone(),
            b.requests,
            b.client,
        );
        tasks.push(tokio::spawn(async move {
            let take = || {
                let n = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                (n < total && Instant::now() < deadline).then_some(n)
            };
            match kind {
                ClientKind::Raw => raw_worker(&host, &key, take).await,
                ClientKind::Reqwest => reqwest_worker(&url, &key, take).await,
            }
        }));
    }
    let mut tally = Tally::default();
    for t in tasks {
        let part = t.await?;
        tally.sent += part.sent;
        tally.errors += part.errors;
        for (s, n) in part.statuses {
            *tally.statuses.entry(s).or_default() += n;
        }
    }
    let secs = start.elapsed().as_secs_f64();

    let statuses: Vec<String> = tally
        .statuses
        .iter()
        .map(|(s, n)| format!("{s}={n}"))
        .collect();
    // Piped into `head`, stdout may close early: that is not a failure.
    let mut out = std::io::stdout().lock();
    let _ = writeln!(
        out,
        "{} requests in {secs:.2} s over {} connections ({:?} client): {:.0} requests/s",
        tally.sent,
        b.connections,
        b.client,
        tally.sent as f64 / secs
    );
    let _ = writeln!(
        out,
        "statuses: {}; transport errors: {}",
        statuses.join(" "),
        tally.errors
    );
    if let Ok(r) = reqwest::get(format!("{url}/admin/stats")).await {
        if let Ok(s) = r.json::<serde_json::Value>().await {
            let _ = writeln!(
                out,
                "sim stats: accepted={} side_effects={} rejected_concurrency={} rejected_rate={} in_flight_max={}",
                s["accepted"], s["side_effects"], s["rejected_concurrency"], s["rejected_rate"],
                s["in_flight_max"]
            );
        }
    }
    Ok(())
}

async fn reqwest_worker(url: &str, key: &str, take: impl Fn() -> Option<u64>) -> Tally {
    let mut t = Tally::default();
    let Ok(client) = reqwest::Client::builder().pool_max_idle_per_host(1).build() else {
        return t;
    };
    while let Some(n) = take() {
        t.sent += 1;
        let res = client
            .get(format!("{url}/v1/bench?n={n}"))
            .header("x-api-key", key)
            .send()
            .await;
        match res {
            Ok(r) => {
                let status = r.status().as_u16();
                if r.bytes().await.is_ok() {
                    *t.statuses.entry(status).or_default() += 1;
                } else {
                    t.errors += 1;
                }
            }
            Err(_) => t.errors += 1,
        }
    }
    t
}

async fn raw_worker(host: &str, key: &str, take: impl Fn() -> Option<u64>) -> Tally {
    let mut t = Tally::default();
    let mut conn: Option<TcpStream> = None;
    let mut buf = Vec::with_capacity(4096);
    while let Some(n) = take() {
        t.sent += 1;
        if conn.is_none() {
            conn = TcpStream::connect(host).await.ok();
            if let Some(c) = &conn {
                let _ = c.set_nodelay(true);
            }
        }
        let Some(c) = conn.as_mut() else {
            t.errors += 1;
            continue;
        };
        let req =
            format!("GET /v1/bench?n={n} HTTP/1.1\r\nhost: {host}\r\nx-api-key: {key}\r\n\r\n");
        match round_trip(c, req.as_bytes(), &mut buf).await {
            Ok(status) => *t.statuses.entry(status).or_default() += 1,
            Err(_) => {
                t.errors += 1;
                conn = None;
            }
        }
    }
    t
}

/// Sends one request and reads one response with a content-length body.
async fn round_trip(c: &mut TcpStream, req: &[u8], buf: &mut Vec<u8>) -> anyhow::Result<u16> {
    c.write_all(req).await?;
    buf.clear();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = find(buf, b"\r\n\r\n") {
            let head = std::str::from_utf8(&buf[..end])?;
            let status: u16 = head.get(9..12).context("short status line")?.parse()?;
            let len: usize = head
                .split("\r\n")
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse().ok())?
                })
                .context("no content-length")?;
            while buf.len() < end + 4 + len {
                let n = c.read(&mut chunk).await?;
                if n == 0 {
                    bail!("closed mid-body");
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            return Ok(status);
        }
        let n = c.read(&mut chunk).await?;
        if n == 0 {
            bail!("closed before the response");
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}
