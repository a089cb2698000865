//! `batchrun sim`: a faithful local model of a metered, rate-limited API, the
//! rehearsal server every other test of the project runs against.
//!
//! The behaviour lives in plain structs over an injected clock
//! ([`crate::sim::model::sliding_window::SlidingWindow`], [`crate::sim::model::spike_arrest::SpikeArrest`]
//! and [`model::Model`]); `server` is thin axum glue that reads the clock once
//! per request and holds the model behind one short-lived mutex.
//!
//! Endpoints: `GET /v1/<name>?<query>` and `POST /v1/<name>` (JSON body) are
//! metered and need `x-api-key`, and so is `/v1/big?bytes=N` (a streamed body
//! of N bytes); `POST /admin/topup?credits=N`, `POST /admin/renew`,
//! `GET /admin/stats` and `GET /admin/arrivals` are not.

pub mod model;
mod server;

use std::collections::HashMap;
use std::io::Write as _;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context as _;

use crate::rate::policy::PolicySpec;
use crate::rate::{Limit, Plan, Rate};
pub use model::{Dialect, ModelKind};

/// Options of `batchrun sim`.
///
/// Every field is public so that `batchrun run --sim` can build one in
/// process; [`SimArgs::default`] equals the command-line defaults.
#[derive(clap::Args, Debug, Clone)]
pub struct SimArgs {
    /// Address to serve on (IP:PORT); port 0 picks a free one.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8787")]
    pub listen: SocketAddr,

    /// Rate model applied to each API key.
    #[arg(long, value_enum, default_value_t = ModelKind::Window)]
    pub model: ModelKind,

    /// Published plan: sets the limit and concurrency ceiling (free: 5/min, 1;
    /// starter: 60/min, 5; pro: 180/min, 20; mega: no limit, 50).
    /// --limit and --concurrency override it. Without any of them: starter.
    #[arg(long, value_enum)]
    pub plan: Option<Plan>,

    /// A policy per key: RATE[,sliding|fixed|bucket][,burst=N][,tokens].
    /// RATE is L/W (60/1m, 600/6s, 10/2s), Nps or Npm (Apigee units), or
    /// none; sliding (the default) is a sliding window, fixed a window reset
    /// at each boundary, bucket (or burst=N) nginx's limit_req; tokens counts
    /// each request's tokens. Repeatable (--limit 20/1s --limit 1000/1h): a
    /// request must fit each; key caps and the default headers concern the
    /// first.
    #[arg(long, value_name = "POLICY", action = clap::ArgAction::Append)]
    pub limit: Vec<PolicySpec>,

    /// How responses state the limits: batchrun (x-rate-limit-limit and
    /// -remaining), ietf (RateLimit-Policy and RateLimit), ietf-old
    /// (RateLimit-Limit, -Remaining, -Reset, RateLimit-Policy), x-ratelimit
    /// (X-RateLimit-*, delta reset), github (X-RateLimit-*, epoch reset),
    /// openai (x-ratelimit-*-requests and -tokens), anthropic
    /// (anthropic-ratelimit-requests-* and -tokens-*), none (no rate headers).
    #[arg(long, value_enum, default_value_t = Dialect::Batchrun)]
    pub dialect: Dialect,

    /// Requests of one key in flight at once before 429 with
    /// x-concurrency-limit.
    #[arg(long, value_name = "N", value_parser = parse_concurrency)]
    pub concurrency: Option<usize>,

    /// Cap one key's limit below the plan's (repeatable). On a plan without a
    /// limit, the cap is per minute.
    #[arg(long = "key-cap", value_name = "KEY=N", value_parser = parse_key_cap)]
    pub key_caps: Vec<KeyCap>,

    /// Cooldown of a key after a window overrun (0 disables it).
    #[arg(long, value_name = "DUR", default_value = "50s", value_parser = parse_duration)]
    pub cooldown: Duration,

    /// The account's credit allowance per billing cycle.
    #[arg(long, value_name = "N", default_value_t = 100_000)]
    pub credits: u64,

    /// Credits per successful call: N for every endpoint, NAME=N for one
    /// (repeatable). Default 1.
    #[arg(long, value_name = "N|NAME=N", value_parser = parse_cost)]
    pub cost: Vec<Cost>,

    /// Length of a billing cycle (x-api-renewal is now + this).
    #[arg(long = "renewal-in", value_name = "DUR", default_value = "30d", value_parser = parse_renewal)]
    pub renewal_in: Duration,

    /// Injected latency per admitted request, uniform in A..B (or exactly A).
    #[arg(long, value_name = "A[..B]", value_parser = parse_latency)]
    pub latency: Option<Latency>,

    /// Fraction of admitted requests answered 503 (half of them with
    /// retry-after: 1) without executing.
    #[arg(long = "fail-rate", value_name = "F", default_value_t = 0.0, value_parser = parse_fraction)]
    pub fail_rate: f64,

    /// Fraction of executed requests whose connection is dropped without a
    /// response (the side effect happened: retry with an Idempotency-Key).
    #[arg(long = "reset-rate", value_name = "F", default_value_t = 0.0, value_parser = parse_fraction)]
    pub reset_rate: f64,

    /// A call whose client went away (it timed out) still runs to its end and
    /// stores its answer, as most real servers do; a retry under the same
    /// Idempotency-Key then meets a 409 while it runs, and its answer after.
    #[arg(long)]
    pub keep_working: bool,

    /// Seed of the fault sequence, for reproducible runs (random if absent).
    #[arg(long, value_name = "N")]
    pub seed: Option<u64>,

    /// Transit-in latency per metered request, uniform in A..B (or exactly
    /// A): the request counts as arrived (in the window, in flight) only
    /// after it. --latency stays the delay before the response.
    // Boxed: a second inline `Latency` for a rarely used option; the CLI's
    // subcommand enum boxes `SimArgs` as a whole too.
    #[arg(long = "latency-in", value_name = "A[..B]", value_parser = parse_latency_in)]
    pub latency_in: Option<Box<Latency>>,

    /// Enforce the limit as usual but never send x-rate-limit-limit or
    /// x-rate-limit-remaining (retry-after still goes out on a 429).
    #[arg(long = "secret-limit")]
    pub secret_limit: bool,

    /// Enforce the first --limit without ever stating it, the others
    /// stated in the dialect: a per-second limit a server keeps unstated
    /// beside the hourly quota it states.
    #[arg(long = "secret-first")]
    pub secret_first: bool,

    /// State every Retry-After as the HTTP-date it ends at (`Sat, 05 Dec
    /// 2026 23:40:07 GMT`, rounded up to a whole second), as some servers
    /// do, instead of a delay in seconds.
    #[arg(long = "retry-after-date")]
    pub retry_after_date: bool,

    /// Hostile: answer every metered request with a rate-limit 429 and
    /// retry-after: 1, so nothing ever gets through.
    #[arg(long = "rate-limit-forever")]
    pub rate_limit_forever: bool,

    /// Hostile: put the request's API key in every response body, success or
    /// error.
    #[arg(long = "echo-key")]
    pub echo_key: bool,

    /// Refuse the requests whose data has FIELD=VALUE (query or JSON body)
    /// with STATUS (401, 402 or 403; default 403), before admission:
    /// one item the key may not touch (repeatable).
    #[arg(long, value_name = "FIELD=VALUE[:STATUS]", value_parser = model::refusals::parse)]
    pub refuse: Vec<model::refusals::Refusal>,

    /// Items one call to the batch endpoint (`POST /batch/<name>`) may
    /// carry; a larger batch is answered 413 "batch too large".
    #[arg(long = "max-batch", value_name = "N", default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_batch: u64,
}

impl Default for SimArgs {
    fn default() -> Self {
        SimArgs {
            listen: SocketAddr::from(([127, 0, 0, 1], 8787)),
            model: ModelKind::Window,
            plan: None,
            limit: Vec::new(),
            dialect: Dialect::Batchrun,
            concurrency: None,
            key_caps: Vec::new(),
            cooldown: Duration::from_secs(50),
            credits: 100_000,
            cost: Vec::new(),
            renewal_in: Duration::from_secs(30 * 86_400),
            latency: None,
            fail_rate: 0.0,
            reset_rate: 0.0,
            seed: None,
            latency_in: None,
            secret_limit: false,
            secret_first: false,
            retry_after_date: false,
            rate_limit_forever: false,
            echo_key: false,
            keep_working: false,
            refuse: Vec::new(),
            max_batch: 100,
        }
    }
}

/// The plan used when neither --plan, --limit nor --concurrency says otherwise.
const DEFAULT_PLAN: Plan = Plan::Starter;

impl SimArgs {
    /// The first per-key limit in force: --limit, else the plan's, else
    /// Starter's 60/1m.
    pub fn limit_in_force(&self) -> Limit {
        self.limit
            .first()
            .map(|p| p.limit)
            .unwrap_or_else(|| self.plan.unwrap_or(DEFAULT_PLAN).limit())
    }

    /// Every policy in force (none for no limit): --limit, else the plan's
    /// sliding window.
    pub fn policies_in_force(&self) -> Vec<PolicySpec> {
        let given = if self.limit.is_empty() {
            vec![PolicySpec::sliding(self.limit_in_force())]
        } else {
            self.limit.clone()
        };
        given.into_iter().filter(|p| p.rate().is_some()).collect()
    }

    /// The per-key concurrency ceiling in force: --concurrency, else the
    /// plan's, else Starter's 5.
    pub fn concurrency_in_force(&self) -> usize {
        self.concurrency
            .unwrap_or_else(|| self.plan.unwrap_or(DEFAULT_PLAN).concurrency())
    }

    /// The model configuration these options describe.
    pub fn config(&self) -> model::Config {
        let mut default_cost = 1;
        let mut costs = HashMap::new();
        for c in &self.cost {
            match c {
                Cost::All(n) => default_cost = *n,
                Cost::Endpoint(name, n) => {
                    costs.insert(name.clone(), *n);
                }
            }
        }
        model::Config {
            kind: self.model,
            policies: self.policies_in_force(),
            dialect: self.dialect,
            concurrency: self.concurrency_in_force(),
            cooldown: self.cooldown,
            key_caps: self
                .key_caps
                .iter()
                .map(|k| (k.key.clone(), k.limit))
                .collect(),
            credits: self.credits,
            default_cost,
            costs,
            renewal_in: self.renewal_in,
            idempotency_ttl: Duration::from_secs(86_400),
            latency: self.latency.map(|l| (l.min, l.max)),
            fail_rate: self.fail_rate,
            reset_rate: self.reset_rate,
            seed: self.seed.unwrap_or_else(|| fastrand::u64(..)),
            latency_in: self.latency_in.as_deref().map(|l| (l.min, l.max)),
            secret_limit: self.secret_limit,
            secret_first: self.secret_first,
            retry_after_date: self.retry_after_date,
            rate_limit_forever: self.rate_limit_forever,
            echo_key: self.echo_key,
            keep_working: self.keep_working,
            refuse: self.refuse.clone(),
            max_batch: usize::try_from(self.max_batch).unwrap_or(usize::MAX),
        }
    }

    /// A one-line description for the log.
    fn describe(&self) -> String {
        let model = match self.model {
            ModelKind::Window => "window",
            ModelKind::SpikeArrest => "spike-arrest",
        };
        let policies = self.policies_in_force();
        let limit = if policies.is_empty() {
            "no limit".to_string()
        } else {
            policies
                .iter()
                .map(|p| {
                    let shape = p.to_string();
                    let rest = shape.split_once(',').map_or("", |(_, r)| r);
                    let rate = p.rate().map(|r| DisplayRate(r).to_string());
                    match rest {
                        "" => rate.unwrap_or_default(),
                        _ => format!("{},{rest}", rate.unwrap_or_default()),
                    }
                })
                .collect::<Vec<_>>()
                .join(" and ")
        };
        let mut line = format!(
            "{model} model, {limit} per key, concurrency {}, cooldown {}, {} credits",
            self.concurrency_in_force(),
            humantime::format_duration(self.cooldown),
            self.credits
        );
        for (on, mode) in [
            (self.latency_in.is_some(), "transit-in latency"),
            (self.secret_limit, "secret limit"),
            (self.retry_after_date, "Retry-After as a date"),
            (self.rate_limit_forever, "rate-limited forever"),
            (self.echo_key, "echoing the key"),
        ] {
            if on {
                line.push_str(", ");
                line.push_str(mode);
            }
        }
        line
    }
}

struct DisplayRate(Rate);

impl std::fmt::Display for DisplayRate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}/{}",
            self.0.count,
            humantime::format_duration(self.0.period)
        )
    }
}

/// A `--key-cap KEY=N`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyCap {
    /// The API key.
    pub key: String,
    /// Its limit per window (or per period, or per minute without a plan
    /// limit).
    pub limit: u64,
}

/// A `--cost` value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cost {
    /// `--cost N`: every endpoint without its own cost.
    All(u64),
    /// `--cost NAME=N`: the endpoint `/v1/NAME`.
    Endpoint(String, u64),
}

/// A `--latency A[..B]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Latency {
    /// Shortest injected latency.
    pub min: Duration,
    /// Longest injected latency.
    pub max: Duration,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s.trim())
        .map_err(|e| format!("{e} (expected a duration such as 50s, 500ms, 2m or 0)"))
}

fn parse_renewal(s: &str) -> Result<Duration, String> {
    match parse_duration(s)? {
        d if d.is_zero() => Err("the billing cycle must be longer than zero".into()),
        d => Ok(d),
    }
}

fn parse_concurrency(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err("expected a whole number of at least 1".into()),
    }
}

fn parse_key_cap(s: &str) -> Result<KeyCap, String> {
    let (key, n) = s
        .rsplit_once('=')
        .ok_or("expected KEY=N, e.g. backfill-key=30")?;
    if key.is_empty() {
        return Err("the key before '=' is empty".into());
    }
    match n.trim().parse::<u64>() {
        Ok(limit) if limit >= 1 => Ok(KeyCap {
            key: key.to_string(),
            limit,
        }),
        _ => Err(format!("{n:?} is not a whole number of at least 1")),
    }
}

fn parse_cost(s: &str) -> Result<Cost, String> {
    let n = |v: &str| {
        v.trim()
            .parse::<u64>()
            .map_err(|_| format!("{v:?} is not a whole number of credits"))
    };
    match s.rsplit_once('=') {
        None => Ok(Cost::All(n(s)?)),
        Some(("", _)) => Err("the endpoint name before '=' is empty".into()),
        Some((name, v)) => Ok(Cost::Endpoint(name.trim_matches('/').to_string(), n(v)?)),
    }
}

fn parse_latency(s: &str) -> Result<Latency, String> {
    let (a, b) = s.split_once("..").unwrap_or((s, s));
    let (min, max) = (parse_duration(a)?, parse_duration(b)?);
    if min > max {
        return Err(format!("the range is backwards: {a} is longer than {b}"));
    }
    Ok(Latency { min, max })
}

fn parse_latency_in(s: &str) -> Result<Box<Latency>, String> {
    parse_latency(s).map(Box::new)
}

fn parse_fraction(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(f) if (0.0..=1.0).contains(&f) => Ok(f),
        _ => Err("expected a fraction between 0 and 1, e.g. 0.05".into()),
    }
}

impl SimArgs {
    /// Refuses what the options cannot mean together: `none` is no limit to
    /// combine with others.
    pub fn check(&self) -> anyhow::Result<()> {
        if self.limit.len() > 1 && self.limit.iter().any(|p| p.limit == Limit::Unlimited) {
            anyhow::bail!("--limit none cannot be combined with other --limit values");
        }
        Ok(())
    }
}

/// Binds `args.listen`, prints `listening on http://IP:PORT` as the first line
/// on stdout, and serves until Ctrl-C.
pub async fn run(args: SimArgs) -> anyhow::Result<()> {
    args.check()?;
    let listener = server::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let addr = listener.local_addr()?;
    {
        // Scripts and tests wait for this exact line, so it goes out first
        // and at once, whatever stdout is connected to.
        let mut out = std::io::stdout().lock();
        writeln!(out, "listening on http://{addr}")?;
        out.flush()?;
    }
    eprintln!("batchrun sim: {}", args.describe());
    let shutdown = async {
        // If the signal handler cannot be installed, serve until killed.
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    server::serve(listener, args.config(), shutdown).await?;
    Ok(())
}

/// Binds `args.listen` and serves in the background, printing nothing; for
/// in-process use (`batchrun run --sim`) and benchmarks. Abort the handle to
/// stop accepting connections.
pub async fn spawn(args: SimArgs) -> anyhow::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    args.check()?;
    let listener = server::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let addr = listener.local_addr()?;
    let cfg = args.config();
    let handle = tokio::spawn(async move {
        let _ = server::serve(listener, cfg, std::future::pending()).await;
    });
    Ok((addr, handle))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        sim: SimArgs,
    }

    fn parse(args: &[&str]) -> Result<SimArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("sim").chain(args.iter().copied())).map(|c| c.sim)
    }

    #[test]
    fn the_defaults_are_the_starter_plan_and_match_default() {
        let a = parse(&[]).unwrap();
        let d = SimArgs::default();
        assert_eq!(format!("{a:?}"), format!("{d:?}"));
        assert_eq!(a.limit_in_force(), "60/1m".parse().unwrap());
        assert_eq!(a.concurrency_in_force(), 5);
        let c = a.config();
        assert_eq!(
            (c.credits, c.default_cost, c.cooldown),
            (100_000, 1, Duration::from_secs(50))
        );
        assert_eq!(c.renewal_in, Duration::from_secs(30 * 86_400));
    }

    #[test]
    fn limit_and_concurrency_override_the_plan() {
        let a = parse(&["--plan", "pro"]).unwrap();
        assert_eq!(
            (a.limit_in_force(), a.concurrency_in_force()),
            ("180/1m".parse().unwrap(), 20)
        );
        let a = parse(&["--plan", "mega"]).unwrap();
        assert_eq!(
            (a.limit_in_force(), a.concurrency_in_force()),
            (Limit::Unlimited, 50)
        );
        let a = parse(&["--plan", "free", "--limit", "10/2s"]).unwrap();
        assert_eq!(
            (a.limit_in_force(), a.concurrency_in_force()),
            ("10/2s".parse().unwrap(), 1)
        );
        let a = parse(&["--plan", "free", "--concurrency", "9"]).unwrap();
        assert_eq!(
            (a.limit_in_force(), a.concurrency_in_force()),
            ("5/1m".parse().unwrap(), 9)
        );
    }

    #[test]
    fn parses_every_option() {
        let a = parse(&[
            "--model",
            "spike-arrest",
            "--limit",
            "30ps",
            "--key-cap",
            "a=b=3",
            "--cooldown",
            "0",
            "--credits",
            "7",
            "--cost",
            "2",
            "--cost",
            "/pricey=5",
            "--renewal-in",
            "1h",
            "--latency",
            "10ms..20ms",
            "--fail-rate",
            "0.5",
            "--reset-rate",
            "1",
            "--seed",
            "42",
        ])
        .unwrap();
        assert_eq!(a.model, ModelKind::SpikeArrest);
        assert_eq!(
            a.key_caps,
            [KeyCap {
                key: "a=b".into(),
                limit: 3
            }]
        );
        let c = a.config();
        assert_eq!((c.default_cost, c.costs.get("pricey")), (2, Some(&5)));
        assert_eq!(c.cooldown, Duration::ZERO);
        assert_eq!(
            c.latency,
            Some((Duration::from_millis(10), Duration::from_millis(20)))
        );
        assert_eq!((c.fail_rate, c.reset_rate, c.seed), (0.5, 1.0, 42));
        let l = parse(&["--latency", "5ms"]).unwrap().latency.unwrap();
        assert_eq!(
            (l.min, l.max),
            (Duration::from_millis(5), Duration::from_millis(5))
        );
    }

    #[test]
    fn refuses_bad_options_with_a_clear_message() {
        for (args, needle) in [
            (&["--limit", "fast"][..], "invalid limit"),
            (&["--concurrency", "0"], "at least 1"),
            (&["--key-cap", "nokey"], "KEY=N"),
            (&["--key-cap", "k=0"], "at least 1"),
            (&["--cooldown", "soon"], "duration"),
            (&["--renewal-in", "0s"], "longer than zero"),
            (&["--cost", "x=cheap"], "whole number"),
            (&["--latency", "2s..1s"], "backwards"),
            (&["--fail-rate", "1.5"], "between 0 and 1"),
            (&["--reset-rate=-0.1"], "between 0 and 1"),
            (&["--plan", "gold"], "gold"),
            (&["--model", "leaky"], "leaky"),
            (&["--listen", "localhost"], "localhost"),
        ] {
            let e = parse(args).expect_err(&format!("{args:?}"));
            assert_eq!(e.exit_code(), 2, "{args:?}");
            let msg = e.to_string();
            assert!(msg.contains(needle), "{args:?}: {msg}");
        }
    }

    #[test]
    fn several_limits_and_a_dialect() {
        let a = parse(&[
            "--limit",
            "20/1s",
            "--limit",
            "50/10s",
            "--dialect",
            "ietf-old",
        ])
        .unwrap();
        let c = a.config();
        assert_eq!(
            c.policies,
            [
                "20/1s".parse::<PolicySpec>().unwrap(),
                "50/10s".parse().unwrap()
            ]
        );
        assert_eq!(c.dialect, Dialect::IetfOld);
        assert!(a.check().is_ok());
        assert!(
            a.describe().contains("20/1s and 50/10s per key"),
            "{}",
            a.describe()
        );
        assert_eq!(parse(&[]).unwrap().config().dialect, Dialect::Batchrun);
        let spike = parse(&["--model", "spike", "--limit", "30ps", "--limit", "5ps"]);
        assert!(spike.unwrap().check().is_ok());
        let shapes = parse(&["--limit", "30/1s,burst=5", "--limit", "500/1d,fixed"]).unwrap();
        assert!(
            shapes
                .describe()
                .contains("30/1s,burst=5 and 500/1day,fixed per key"),
            "{}",
            shapes.describe()
        );
        assert!(parse(&["--limit", "none"])
            .unwrap()
            .config()
            .policies
            .is_empty());
        let none = parse(&["--limit", "none", "--limit", "5ps"]).unwrap();
        assert!(none.check().unwrap_err().to_string().contains("none"));
        assert!(parse(&["--dialect", "klingon"]).is_err());
    }

    #[test]
    fn parses_the_hostile_and_transit_modes() {
        let a = parse(&[]).unwrap();
        let c = a.config();
        assert_eq!(c.latency_in, None);
        assert!(!c.secret_limit && !c.rate_limit_forever && !c.echo_key);
        let a = parse(&[
            "--latency-in",
            "10ms..30ms",
            "--secret-limit",
            "--rate-limit-forever",
            "--echo-key",
        ])
        .unwrap();
        let c = a.config();
        assert_eq!(
            c.latency_in,
            Some((Duration::from_millis(10), Duration::from_millis(30)))
        );
        assert!(c.secret_limit && c.rate_limit_forever && c.echo_key);
        let line = a.describe();
        for mode in ["transit-in", "secret limit", "forever", "echoing the key"] {
            assert!(line.contains(mode), "{line}");
        }
        let e = parse(&["--latency-in", "3s..1s"]).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(e.to_string().contains("backwards"), "{e}");
    }
}
