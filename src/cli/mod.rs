//! The command line. `run` is the default subcommand, so
//! `batchrun --plan starter input.jsonl` works as written.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

mod parse;

pub use parse::Thresholds;
use parse::{
    parse_cost, parse_duration, parse_fleet_key, parse_header, parse_headroom,
    parse_positive_duration, parse_size, parse_thresholds, parse_usage, parse_webhook,
};

use crate::input::Format;
use crate::pace::PacerKind;
use crate::rate::Plan;

/// Push a file of items through a metered, rate-limited API as fast as the
/// plan allows, without tripping it; stop cleanly when credits run out and
/// resume exactly where it stopped.
#[derive(Parser, Debug)]
#[command(name = "batchrun", version, about, long_about = None, after_help = RUN_AFTER_HELP)]
pub struct Cli {
    /// What to do (`run` when omitted).
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Send one request per item of INPUT (the default subcommand).
    Run(Box<RunArgs>),
    /// Serve the built-in rehearsal API (a faithful model of a metered API).
    Sim(Box<crate::sim::SimArgs>),
    /// Print the plans with their derived token bucket.
    Plans,
    /// Print a job's progress from its checkpoint, without calling the API.
    Status(StatusArgs),
    /// Write a job's report: one self-contained HTML file with its charts.
    Report(ReportArgs),
    /// Print a shell completion script: batchrun completions bash > /etc/bash_completion.d/batchrun
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff): batchrun man > batchrun.1
    Man,
}

const SUBCOMMANDS: [&str; 8] = [
    "run",
    "sim",
    "plans",
    "status",
    "report",
    "completions",
    "man",
    "help",
];

impl Cli {
    /// Parses `args`, inserting the default `run` subcommand when the first
    /// argument is not a subcommand (nor a top-level --help/--version).
    pub fn parse_with_default<I: IntoIterator<Item = OsString>>(args: I) -> Cli {
        let args: Vec<OsString> = args.into_iter().collect();
        if let Some(sub) = mistyped_subcommand(&args) {
            let mut cmd = <Cli as clap::CommandFactory>::command();
            let msg = format!(
                "unrecognized subcommand '{}'\n\n  tip: a similar subcommand exists: '{sub}'\n  (an input file must exist and end in .jsonl, .ndjson or .csv)",
                args[1].to_string_lossy()
            );
            cmd.error(clap::error::ErrorKind::InvalidSubcommand, msg)
                .exit();
        }
        Cli::parse_from(with_default_subcommand(args))
    }
}

/// A first argument that is no file and no flag but within two edits of a
/// subcommand (`stauts`) is a typo, not an input file to run.
fn mistyped_subcommand(args: &[OsString]) -> Option<&'static str> {
    let first = args.get(1)?.to_str()?;
    if first.starts_with('-')
        || SUBCOMMANDS.contains(&first)
        || first.contains(['.', '/'])
        || std::path::Path::new(first).exists()
    {
        return None;
    }
    SUBCOMMANDS
        .iter()
        .find(|s| strsim::levenshtein(first, s) <= 2)
        .copied()
}

fn with_default_subcommand(mut args: Vec<OsString>) -> Vec<OsString> {
    let first = args.get(1).and_then(|a| a.to_str()).map(str::to_string);
    let insert = match first.as_deref() {
        None => false,
        Some(a) if SUBCOMMANDS.contains(&a) => false,
        Some("-h" | "--help" | "-V" | "--version") => false,
        Some(_) => true,
    };
    if insert {
        args.insert(1, OsString::from("run"));
    }
    args
}

/// Examples and the exit codes, shown by `--help`.
const RUN_AFTER_HELP: &str = "\
Examples:
  batchrun --sim --plan starter examples/numbers.jsonl      rehearse on the built-in sim, no key
  batchrun -p starter items.jsonl -u 'https://api.example.com/v1/words?number={number}'
  batchrun -p pro rows.csv -u https://api.example.com/v1/enrich --json-body -H 'X-Source: backfill'
  batchrun items.jsonl -u ... --dry-run 3                    check the input, show 3 requests, send nothing
  cmd | batchrun - --format jsonl -u ...                     read a pipe (spooled once, resumable)
  batchrun status items.jsonl                                progress from the checkpoint

Exit codes:
  0    every item done
  1    fatal: the key was rejected, the job fails the same way on every call,
       the input changed while the job ran, a damaged checkpoint, a bug
  2    bad options or bad input (file, line and reason given); nothing sent
  3    finished, but some items failed (see the failures file)
  75   halted resumably: credits exhausted, reserve reached, nothing but 429s,
       the last calls all timed out, the fleet's Redis out of reach (or out of
       memory at the start), or the checkpoint or the outputs could not be
       written; run the same command
  129  stopped by SIGHUP (the terminal closed); run the same command to resume
  130  interrupted by Ctrl-C; run the same command to resume
  143  stopped by SIGTERM; run the same command to resume";

/// Options of `batchrun run`.
#[derive(Args, Debug, Clone)]
#[command(after_help = RUN_AFTER_HELP)]
pub struct RunArgs {
    /// The items: .jsonl/.ndjson (one JSON value a line) or .csv (header row).
    #[arg(value_name = "INPUT")]
    pub input: PathBuf,

    /// Input format; by default taken from the file's extension.
    #[arg(long, value_enum, short = 'f', help_heading = "Input")]
    pub format: Option<Format>,

    /// Plan: sets the per-minute limit and the concurrency from the published
    /// table [default: free]. With --limit, its concurrency is the ceiling
    /// the pool grows to.
    #[arg(long, value_enum, short = 'p', help_heading = "Pace")]
    pub plan: Option<Plan>,

    /// Rate limit, overriding the plan: N/DURATION (60/1m, 600/6s), Nps, Npm or none,
    /// optionally shaped: RATE[,sliding|fixed|bucket][,burst=N][,tokens] (30/1s,burst=5,
    /// 1000/1d,fixed, 90000/1m,tokens). A bare rate's shape is learnt, its first
    /// window sent with few calls ahead of an even pace; name it (30/1s,sliding) to
    /// send that window at once. Repeatable (--limit 10/1s --limit 1000/1h): every
    /// call keeps each.
    #[arg(long, short = 'l', action = clap::ArgAction::Append, help_heading = "Pace")]
    pub limit: Vec<crate::rate::policy::PolicySpec>,

    /// Workers (calls in flight at once), overriding the plan. Without it,
    /// --limit sizes the pool to the measured latency.
    #[arg(long, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=10_000), short = 'c', help_heading = "Pace")]
    pub concurrency: Option<usize>,

    /// How to pace: window (exact sliding window, counting each call until W
    /// after its response), bucket (token bucket sized to the window), or
    /// spike (Apigee SpikeArrest gateways: --limit 30ps or 1800pm is the
    /// policy's messagesPerPeriod).
    #[arg(long, value_enum, default_value = "window", help_heading = "Pace")]
    pub pacer: PacerKind,

    /// A call's estimated cost in tokens, from its item, for --limit ...,tokens:
    /// numbers, field paths, chars(FIELD), or(FIELD, DEFAULT), + - * / (e.g. 'max_tokens + chars(prompt)/4').
    #[arg(long, value_name = "EXPR", value_parser = parse_cost, help_heading = "Pace")]
    pub cost: Option<crate::cost::CostExpr>,

    /// Where a response body's JSON says what a call really cost (a JSON pointer;
    /// token policies count it instead of the estimate).
    #[arg(long, value_name = "POINTER", default_value = crate::cost::DEFAULT_USAGE, value_parser = parse_usage, help_heading = "Pace")]
    pub usage: String,

    /// Token bucket capacity, for --pacer bucket only [default: max(1, limit/10)].
    #[arg(long, help_heading = "Pace")]
    pub burst: Option<u64>,

    /// Request URL template: {field} from the item (percent-encoded), {index} the line number.
    #[arg(
        long,
        env = "BATCHRUN_URL",
        value_name = "TEMPLATE",
        short = 'u',
        help_heading = "Request"
    )]
    pub url: Option<String>,

    /// HTTP method [default: GET, or POST with --body/--json-body].
    #[arg(long, short = 'X', help_heading = "Request")]
    pub method: Option<String>,

    /// Extra header 'Name: value' (templated); repeatable.
    #[arg(long = "header", value_name = "NAME: VALUE", value_parser = parse_header, short = 'H', help_heading = "Request")]
    pub headers: Vec<(String, String)>,

    /// Request body template ({field} values are JSON-escaped).
    #[arg(
        long,
        value_name = "TEMPLATE",
        conflicts_with = "json_body",
        help_heading = "Request"
    )]
    pub body: Option<String>,

    /// Send the item itself as the JSON body.
    #[arg(long, help_heading = "Request")]
    pub json_body: bool,

    /// Send up to N pending items per call to a batch endpoint: the body is
    /// the JSON array of the items' own bodies (see --batch-body).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=10_000), help_heading = "Batch")]
    pub batch: Option<u64>,

    /// The batch call's body, with {items} in place of the array and {{ }}
    /// for literal braces, e.g. '{{"requests": {items}}}'.
    #[arg(
        long,
        value_name = "TEMPLATE",
        requires = "batch",
        help_heading = "Batch"
    )]
    pub batch_body: Option<String>,

    /// JSON pointer to the per-item results in the answer, when the answer
    /// is not the array itself.
    #[arg(
        long,
        value_name = "POINTER",
        default_value = "/results",
        requires = "batch",
        help_heading = "Batch"
    )]
    pub batch_results: String,

    /// JSON pointer to a result element's status [default: its "status" or
    /// "code" field, else the call's HTTP status].
    #[arg(
        long,
        value_name = "POINTER",
        requires = "batch",
        help_heading = "Batch"
    )]
    pub batch_status: Option<String>,

    /// What a batch call counts as against the limits: one call, or one per
    /// item (an API that counts each item).
    #[arg(
        long,
        value_enum,
        default_value = "calls",
        value_name = "calls|items",
        requires = "batch",
        help_heading = "Batch"
    )]
    pub batch_weight: crate::request::BatchWeight,

    /// Environment variable holding the API key.
    #[arg(
        long,
        default_value = "BATCHRUN_API_KEY",
        value_name = "VAR",
        help_heading = "Request"
    )]
    pub api_key_env: String,

    /// Header the API key is sent in.
    #[arg(
        long,
        default_value = "x-api-key",
        value_name = "NAME",
        help_heading = "Request"
    )]
    pub api_key_header: String,

    /// Where the checkpoint lives [default: .batchrun/<input file name>
    /// beside the input, so the same input resumes the same job from anywhere].
    #[arg(long, value_name = "DIR", help_heading = "State and output")]
    pub state_dir: Option<PathBuf>,

    /// Results file [default: <input stem>.results.jsonl beside the input].
    #[arg(
        long,
        value_name = "FILE",
        short = 'o',
        help_heading = "State and output"
    )]
    pub out: Option<PathBuf>,

    /// Failures file [default: <input stem>.failures.jsonl beside the input].
    #[arg(long, value_name = "FILE", help_heading = "State and output")]
    pub failures: Option<PathBuf>,

    /// The results file's format: jsonl, or csv (a header, then line,
    /// status, the input's own columns, the body as JSON text)
    /// [default: csv for an --out ending in .csv, else jsonl].
    #[arg(
        long,
        value_enum,
        value_name = "FORMAT",
        help_heading = "State and output"
    )]
    pub out_format: Option<crate::settings::values::OutFormat>,

    /// Append one tab-separated line per call to FILE as it completes (GNU
    /// parallel's joblog: Line, Starttime, JobRuntime, Status, Attempt, Outcome).
    #[arg(long, value_name = "FILE", help_heading = "State and output")]
    pub joblog: Option<PathBuf>,

    /// Serve Prometheus metrics at http://ADDR/metrics while the run goes
    /// (e.g. 127.0.0.1:9464; port 0 picks one, said on stderr).
    #[arg(long, value_name = "ADDR", help_heading = "State and output")]
    pub metrics_addr: Option<std::net::SocketAddr>,

    /// With --metrics-addr: keep serving the final values for DUR after the
    /// summary, so a scraper's next visit sees a short run's end.
    #[arg(long, value_name = "DUR", default_value = "0s", value_parser = parse_duration, help_heading = "State and output")]
    pub metrics_linger: Duration,

    /// Calls per item for transient failures (5xx, timeouts) before it is recorded as failed.
    #[arg(long, default_value = "5", value_parser = clap::value_parser!(u32).range(1..), help_heading = "Request")]
    pub max_attempts: u32,

    /// Per-request timeout.
    #[arg(long, default_value = "30s", value_parser = parse_positive_duration, help_heading = "Request")]
    pub timeout: Duration,

    /// Halt (exit 1, nothing marked failed) when the first N calls all fail
    /// alike: refused, unknown host, TLS, 404 or 405 on every item. 0: off.
    #[arg(
        long,
        default_value = "10",
        value_name = "N",
        help_heading = "Failures"
    )]
    pub fail_fast: u32,

    /// Halt once this many items (N) or this share of them (P%) failed in this run.
    #[arg(long, value_name = "N|P%", help_heading = "Failures")]
    pub max_failures: Option<crate::settings::values::MaxFailures>,

    /// The most of a response body kept per item (e.g. 1MiB, 64KiB, 500000):
    /// a larger one is recorded cut, and marked so.
    #[arg(long, default_value = "1MiB", value_parser = parse_size, value_name = "SIZE", help_heading = "Request")]
    pub max_body: usize,

    /// Halt resumably (exit 75) after this long of nothing but rate-limit 429s.
    #[arg(long, default_value = "30m", value_parser = parse_positive_duration, help_heading = "Failures")]
    pub max_wait: Duration,

    /// Discard the checkpoint and start over.
    #[arg(long, help_heading = "State and output")]
    pub fresh: bool,

    /// Retry the items recorded as failed.
    #[arg(long, help_heading = "State and output")]
    pub retry_failed: bool,

    /// The request changed since the input's job finished items: carry
    /// those items over as done (their results kept) and send only the
    /// pending ones under the new request.
    #[arg(long, conflicts_with = "fresh", help_heading = "State and output")]
    pub keep_done: bool,

    /// Record each row that does not parse or render as a failure (with
    /// its file, line and reason) and run the rest, instead of refusing
    /// the whole input.
    #[arg(long, help_heading = "Failures")]
    pub skip_invalid: bool,

    /// Let this job write --out and --failures although another job wrote
    /// them last (they are replaced by this job's results).
    #[arg(long, help_heading = "State and output")]
    pub force_outputs: bool,

    /// Print a one-object JSON summary on stdout at exit (also on errors).
    #[arg(long, help_heading = "Logging")]
    pub json: bool,

    /// Check the whole input and print the first N rendered requests (key
    /// hidden); send nothing.
    #[arg(long, value_name = "N", num_args = 0..=1, default_missing_value = "3", help_heading = "State and output")]
    pub dry_run: Option<usize>,

    /// Only the summary, alerts and errors on stderr.
    #[arg(short, long, conflicts_with = "verbose", help_heading = "Logging")]
    pub quiet: bool,

    /// One line per request (key hidden).
    #[arg(short, long, help_heading = "Logging")]
    pub verbose: bool,

    /// Colours in the progress bar: auto (a terminal without NO_COLOR), always, never.
    #[arg(
        long,
        value_enum,
        default_value = "auto",
        value_name = "WHEN",
        help_heading = "Logging"
    )]
    pub color: crate::settings::values::ColorChoice,

    /// How often a progress line is logged when stderr is not a terminal.
    #[arg(long, default_value = "60s", value_parser = parse_positive_duration, value_name = "DURATION", help_heading = "Logging")]
    pub log_every: Duration,

    /// Start the built-in sim in-process on a free port and run against it
    /// (no key, no network). --url may then be a path on the sim, such as /v1/echo.
    #[arg(long, help_heading = "State and output")]
    pub sim: bool,

    /// Credit thresholds (fractions used) that raise an alert once per billing cycle.
    #[arg(long, default_value = "0.5,0.8,0.95", value_parser = parse_thresholds, value_name = "LIST", help_heading = "Credits")]
    pub alert_at: Thresholds,

    /// Trailing window for the burn-rate projection.
    #[arg(long, default_value = "6h", value_parser = parse_positive_duration, help_heading = "Credits")]
    pub burn_window: Duration,

    /// POST every alert as JSON to this URL.
    #[arg(long, value_name = "URL", value_parser = parse_webhook, help_heading = "Credits")]
    pub alert_webhook: Option<String>,

    /// Credits kept for production: halt before a call could take the balance below N.
    #[arg(long, value_name = "N", help_heading = "Credits")]
    pub reserve: Option<i64>,

    /// The default, kept for older command lines: with --reserve, run until
    /// the reserve and halt there.
    #[arg(long, conflicts_with = "require_full", help_heading = "Credits")]
    pub allow_partial: bool,

    /// With --reserve: halt once the balance is known (after at most two
    /// calls) if the projected cost of the remaining items would cross the
    /// reserve, instead of running until the reserve.
    #[arg(long, help_heading = "Credits")]
    pub require_full: bool,

    /// Kept for older command lines: every run after a credit or reserve
    /// halt checks the balance with one call by itself.
    #[arg(long, hide = true, help_heading = "Credits")]
    pub recheck_credits: bool,

    /// Kept for older command lines (no effect): every run after a credit
    /// or reserve halt checks the balance with one call by itself.
    #[arg(long, value_name = "DUR", hide = true, value_parser = parse_duration, help_heading = "Credits")]
    pub recheck_after: Option<Duration>,

    /// On exhaustion (or reserve reached), wait and probe instead of exiting.
    #[arg(long, help_heading = "Credits")]
    pub wait_for_credits: bool,

    /// When the server says a quota is used up until more than 15 minutes
    /// from now (a daily limit), wait for it instead of halting (exit 75).
    #[arg(long, help_heading = "Pace")]
    pub wait_for_quota: bool,

    /// How often to probe while waiting for credits.
    #[arg(long, default_value = "5m", value_parser = parse_positive_duration, help_heading = "Credits")]
    pub probe_every: Duration,

    // --- Fleet: many processes on one key (see src/fleet/) ---
    /// Share this key's limit, concurrency ceiling, pauses and alerts with
    /// every batchrun process using the same Redis: redis://HOST:PORT/DB.
    #[arg(
        help_heading = "Fleet",
        long,
        env = "BATCHRUN_REDIS_URL",
        hide_env_values = true,
        value_name = "URL",
        help_heading = "Fleet"
    )]
    pub redis: Option<String>,

    /// Share of the limit the fleet uses: 1.0 when only batchrun processes
    /// use the key, 0.9 when other traffic shares it.
    #[arg(long, value_name = "F", default_value = "1.0", value_parser = parse_headroom, requires = "redis", help_heading = "Fleet", help_heading = "Fleet")]
    pub headroom: f64,

    /// Name the fleet instead of deriving it from the API origin and key,
    /// so jobs share (or separate) their pace on purpose.
    #[arg(long, value_name = "NAME", value_parser = parse_fleet_key, requires = "redis", help_heading = "Fleet", help_heading = "Fleet")]
    pub fleet_key: Option<String>,

    /// How long Redis may stay out of reach mid-run before the run halts
    /// resumably (exit 75); no call goes out meanwhile.
    #[arg(long, value_name = "DUR", default_value = "60s", value_parser = parse_positive_duration, requires = "redis", help_heading = "Fleet", help_heading = "Fleet")]
    pub redis_timeout: Duration,

    /// Take only the items whose content's digest modulo N is I-1 (a row
    /// keeps its shard wherever a regenerated input moves it), with a
    /// checkpoint and outputs of this shard's own.
    #[arg(
        long,
        value_name = "I/N",
        help_heading = "Fleet",
        help_heading = "Fleet"
    )]
    pub shard: Option<crate::fleet::Shard>,
}

impl RunArgs {
    /// The plan asked for, or the free plan (the safest) when none was.
    pub fn plan(&self) -> Plan {
        self.plan.unwrap_or(Plan::Free)
    }
}

/// Options of `batchrun status`.
#[derive(Args, Debug, Clone)]
pub struct StatusArgs {
    /// The input file the job was started with; every job in the state
    /// directory when omitted.
    #[arg(value_name = "INPUT")]
    pub input: Option<PathBuf>,

    /// Where the checkpoint lives [default: the input's, as for run; with
    /// no input, every job under ./.batchrun].
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,

    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,

    /// Forget the input's older jobs (made by earlier requests): every job
    /// of INPUT but the one that ran last is removed, with its results.
    #[arg(long, requires = "input")]
    pub prune: bool,
}

/// Options of `batchrun report`.
#[derive(Args, Debug, Clone)]
pub struct ReportArgs {
    /// The input file the job was started with.
    #[arg(value_name = "INPUT")]
    pub input: PathBuf,

    /// Where to write the report [default: `<input stem>.report.html`
    /// (`.report.svg` with `--format svg`) beside the input].
    #[arg(short = 'o', long = "out", value_name = "FILE")]
    pub out: Option<PathBuf>,

    /// `html`: the whole report; `svg`: the pacing picture alone.
    #[arg(long, value_enum, default_value = "html")]
    pub format: crate::report::html::Format,

    /// Where the checkpoint lives [default: the input's, as for run].
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,

    /// The shard whose job to report, as its run was given it (`--shard
    /// I/N`): each shard keeps a checkpoint of its own.
    #[arg(long, value_name = "I/N")]
    pub shard: Option<crate::fleet::Shard>,
}

#[cfg(test)]
mod typo_tests {
    use super::*;

    #[test]
    fn a_mistyped_subcommand_is_caught_but_a_file_is_not() {
        let argv = |a: &str| vec![OsString::from("batchrun"), OsString::from(a)];
        assert_eq!(mistyped_subcommand(&argv("stauts")), Some("status"));
        assert_eq!(mistyped_subcommand(&argv("plan")), Some("plans"));
        assert_eq!(mistyped_subcommand(&argv("status")), None);
        assert_eq!(mistyped_subcommand(&argv("items.jsonl")), None);
        assert_eq!(mistyped_subcommand(&argv("--plan")), None);
        assert_eq!(mistyped_subcommand(&argv("zzzzzzzz")), None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Cli {
        Cli::parse_with_default(args.iter().map(OsString::from))
    }

    #[test]
    fn run_is_the_default_subcommand() {
        let cli = parse(&["batchrun", "--plan", "starter", "input.jsonl"]);
        let Command::Run(a) = cli.command else {
            panic!("expected run")
        };
        assert_eq!(a.plan(), Plan::Starter);
        assert_eq!(a.input, PathBuf::from("input.jsonl"));
        let Command::Run(a) = parse(&["batchrun", "items.csv"]).command else {
            panic!("expected run")
        };
        assert_eq!(a.plan(), Plan::Free, "free is the safest default");
        assert!(matches!(
            parse(&["batchrun", "plans"]).command,
            Command::Plans
        ));
    }

    #[test]
    fn options_parse() {
        let Command::Run(a) = parse(&[
            "batchrun",
            "in.jsonl",
            "--limit",
            "600/6s",
            "--header",
            "X-A: {id}",
            "--timeout",
            "2s",
            "--alert-at",
            "0.25,0.75",
        ])
        .command
        else {
            panic!("expected run")
        };
        assert_eq!(a.limit, vec!["600/6s".parse().unwrap()]);
        assert_eq!(a.headers, vec![("X-A".to_string(), "{id}".to_string())]);
        assert_eq!(a.timeout, Duration::from_secs(2));
        assert_eq!(a.alert_at, Thresholds(vec![0.25, 0.75]));
        assert_eq!(a.redis, None);
        assert_eq!(a.shard, None);
    }

    #[test]
    fn fleet_options_parse() {
        let Command::Run(a) = parse(&[
            "batchrun",
            "in.jsonl",
            "--redis",
            "redis://127.0.0.1:6379/0",
            "--headroom",
            "0.9",
            "--fleet-key",
            "nightly",
            "--redis-timeout",
            "5s",
            "--shard",
            "2/4",
        ])
        .command
        else {
            panic!("expected run")
        };
        assert_eq!(a.redis.as_deref(), Some("redis://127.0.0.1:6379/0"));
        assert_eq!(a.headroom, 0.9);
        assert_eq!(a.fleet_key.as_deref(), Some("nightly"));
        assert_eq!(a.redis_timeout, Duration::from_secs(5));
        assert_eq!(a.shard.map(|s| s.to_string()).as_deref(), Some("2/4"));
    }

    #[test]
    fn bad_values_are_usage_errors() {
        for bad in [
            vec!["batchrun", "in.jsonl", "--limit", "lots"],
            vec!["batchrun", "in.jsonl", "--concurrency", "0"],
            vec!["batchrun", "in.jsonl", "--header", "nocolon"],
            vec!["batchrun", "in.jsonl", "--max-attempts", "0"],
            vec!["batchrun", "in.jsonl", "--body", "x", "--json-body"],
            vec![
                "batchrun",
                "in.jsonl",
                "--redis",
                "redis://h/0",
                "--headroom",
                "1.5",
            ],
            vec![
                "batchrun",
                "in.jsonl",
                "--redis",
                "redis://h/0",
                "--fleet-key",
                "a b",
            ],
            vec!["batchrun", "in.jsonl", "--headroom", "0.9"],
            vec!["batchrun", "in.jsonl", "--shard", "5/4"],
        ] {
            let e = Cli::try_parse_from(with_default_subcommand(
                bad.iter().map(OsString::from).collect(),
            ))
            .unwrap_err();
            assert_eq!(e.exit_code(), 2, "{bad:?}");
        }
    }
}
