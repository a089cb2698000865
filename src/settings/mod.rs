//! Validated settings, built once from the command line.
//!
//! The run takes [`Settings`], never clap types: every option has been
//! checked and defaulted here, so a bad one fails before anything is read
//! or sent.

mod limits;
mod places;
mod request;
pub mod values;

pub use limits::{
    all_limits, checked_limits, plan_limits, pool_size, PoolSize, GROWN_POOL_CAP, GROWN_POOL_START,
};
use places::places;
pub use places::{piped, recorded_input, shard_checkpoints, state_dir_for};
use request::{api_key, batch_spec, identity, request_spec, url_source};
pub use request::{DRY_RUN_KEY, SIM_KEY};

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::cli::RunArgs;
use crate::exit::RunError;
use crate::fleet::{FleetKeys, FleetSettings, Shard};
use crate::input::{self, Format};
use crate::pace::PacerKind;
use crate::rate::bucket::TokenBucket;
use crate::rate::policy::{PolicySpec, Unit};
use crate::rate::Limit;
use crate::request::RequestSpec;
use crate::util::{resolved, same_file};

/// What the credit features were asked to do.
#[derive(Debug, Clone)]
pub struct CreditSettings {
    /// Fractions of the allowance that raise an alert.
    pub alert_at: Vec<f64>,
    /// Trailing window of the burn-rate projection.
    pub burn_window: Duration,
    /// Where alerts are POSTed, if anywhere.
    pub webhook: Option<String>,
    /// Credits kept for production, if any.
    pub reserve: Option<i64>,
    /// Halt once the balance is known if the projection crosses the
    /// reserve, instead of running until the reserve (`--require-full`).
    pub require_full: bool,
    /// Wait and probe instead of halting on exhaustion.
    pub wait_for_credits: bool,
    /// How often to probe while waiting.
    pub probe_every: Duration,
}

/// The settled options of a run.
#[derive(Debug)]
pub struct Settings {
    /// Whose credits these are: the API's origin ("sim" for the built-in one).
    pub origin: String,
    /// `--sim`: every call goes to the built-in sim, none leaves the machine.
    pub rehearsal: bool,
    /// The rate limit to pace to.
    pub limit: Limit,
    /// Workers: the most calls in flight at once.
    pub concurrency: usize,
    /// Whether the calls in flight start at `concurrency` or grow to it.
    pub pool: PoolSize,
    /// Every policy a call must keep (`--limit`, possibly several, with
    /// their shapes), the primary one (whose rate is `limit`) first: the
    /// window pacer keeps them all.
    pub policies: Vec<PolicySpec>,
    /// Whether the primary policy is a bare rate (`--limit 30/1s`), its
    /// shape not named (`30/1s,sliding`, a plan's window are named).
    pub shape_unknown: bool,
    /// How calls are weighed in tokens: by `--cost`, else by what each
    /// item requests (see [`costing`]).
    pub costing: crate::cost::Costing,
    /// `--wait-for-quota`: wait for a used-up quota however far its reset.
    pub wait_for_quota: bool,
    /// Which pacer paces a limited run.
    pub pacer: PacerKind,
    /// Token bucket capacity, when given (the bucket pacer only).
    pub burst: Option<u64>,
    /// What identifies the job besides the input, the key's text hidden
    /// (`***`) where a URL or header spelt it out: what the checkpoint
    /// keeps, compares and shows.
    pub identity: String,
    /// [`Settings::identity`] as first made, the key's text and all, when
    /// the key was hidden from it: the job's id is a hash of this, so a job
    /// made before keeps its id (and its Idempotency-Keys).
    pub id_basis: Option<String>,
    /// The input's format.
    pub format: Format,
    /// The input file.
    pub input: PathBuf,
    /// The results file.
    pub out: PathBuf,
    /// The failures file.
    pub failures: PathBuf,
    /// The results file's format.
    pub out_format: crate::settings::values::OutFormat,
    /// `--joblog`: one line per call, appended.
    pub joblog: Option<PathBuf>,
    /// `--metrics-addr`: where Prometheus metrics are served.
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// `--metrics-linger`: how long the final metrics stay served.
    pub metrics_linger: std::time::Duration,
    /// Where the checkpoint lives.
    pub state_dir: PathBuf,
    /// What to send for each item.
    pub request: Arc<RequestSpec>,
    /// Per-call timeout.
    pub timeout: Duration,
    /// Calls per item for transient failures.
    pub max_attempts: u32,
    /// How long a run may get nothing but rate-limit 429s before it halts.
    pub max_wait: Duration,
    /// The most of a response body kept.
    pub max_body: usize,
    /// Identical job-wide failures from the start that halt the run (0: off).
    pub fail_fast: u32,
    /// The failures a run may pile up.
    pub max_failures: Option<crate::settings::values::MaxFailures>,
    /// Discard the checkpoint first.
    pub fresh: bool,
    /// Re-open failed items.
    pub retry_failed: bool,
    /// `--keep-done`: a changed request carries the done items over.
    pub keep_done: bool,
    /// `--force-outputs`: write outputs another job wrote last.
    pub force_outputs: bool,
    /// `--skip-invalid`: a bad row is a failure, not a refusal.
    pub skip_invalid: bool,
    /// The input's name, as the job knows it: its file name (`stdin` for
    /// `-`). Never its directory, so a moved or symlinked input keeps its job.
    pub input_name: String,
    /// For an input that could be read only once (a pipe): the SHA-256 of
    /// the content spooled from it this run.
    pub spooled: Option<String>,
    /// The environment variable the key came from, for messages.
    pub api_key_env: String,
    /// Credit alerts, reserve and waiting.
    pub credits: CreditSettings,
    /// Where the limit came from ("plan starter", "--limit"), for the start line.
    pub limit_source: String,
    /// `--dry-run N`: check and show N requests, send nothing.
    pub dry_run: Option<usize>,
    /// `--batch N`: many items per call.
    pub batch: Option<crate::request::BatchSpec>,
    /// One line per request.
    pub verbose: bool,
    /// `--json`: stdout carries only the summary.
    pub json: bool,
    /// How the run talks on stderr.
    pub style: crate::settings::values::Style,
    /// The fleet this process paces with (`--redis`), if any.
    pub fleet: Option<FleetSettings>,
    /// The part of the input this process takes (`--shard`), if not all.
    pub shard: Option<Shard>,
}

fn default_output(input: &Path, suffix: &str) -> PathBuf {
    // Standard input and special files (`<(cmd)` is /dev/fd/N) have no
    // folder of their own to write beside: their outputs go to the current one.
    if input == Path::new("-") {
        return PathBuf::from(format!("stdin.{suffix}.jsonl"));
    }
    if places::special(input) {
        return PathBuf::from(format!("batchrun.{suffix}.jsonl"));
    }
    let stem = input
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "batchrun".into());
    input.with_file_name(format!("{stem}.{suffix}.jsonl"))
}

fn usage(msg: String) -> RunError {
    RunError::Usage(msg)
}

impl Settings {
    /// `text` with the key's text hidden (`***`): a job record made before
    /// the key was hidden from it still spells it out.
    pub fn keyless(&self, text: &str) -> String {
        match &self.request.key {
            Some(k) => k.redact(text),
            None => text.to_string(),
        }
    }

    /// Whether a job recorded with `template` was made for this request
    /// (recorded as it is now, or before the key was hidden from it).
    pub fn same_request(&self, template: &str) -> bool {
        template == self.identity || self.id_basis.as_deref() == Some(template)
    }

    /// Validates `args`. `sim_base` is the built-in sim's URL when `--sim`
    /// started one: `--url` may then be a path on it, and no key is needed.
    pub fn from_cli(args: &RunArgs, sim_base: Option<&str>) -> Result<Settings, RunError> {
        let (limit, concurrency) = plan_limits(args);
        let policies = checked_limits(args)?;
        if let (Some(b), Limit::Rate(r), PacerKind::Bucket) = (args.burst, limit, args.pacer) {
            TokenBucket::for_limit(r, Some(b), false, std::time::Instant::now())
                .map_err(|e| usage(e.to_string()))?;
        }
        let (url_src, identity_url, json_default) = url_source(args, sim_base)?;
        let key = api_key(args, sim_base.is_some())?;
        let request = request_spec(args, &url_src, json_default, key)?;
        let format = input::detect_format(&args.input, args.format)?;
        // A format other than the extension's is part of what the job is;
        // the usual case keeps the identity it always had.
        let format_note = match input::detect_format(&args.input, None) {
            Ok(f) if f == format => None,
            _ => Some(format),
        };
        let origin = origin(sim_base.is_some(), &identity_url, &url_src);
        let fleet = fleet_settings(args, &origin, &request)?;
        let (identity, id_basis) = identity(args, &request, &identity_url, format_note);
        let (state_dir, out, failures) = places(args)?;
        Ok(Settings {
            origin,
            rehearsal: sim_base.is_some(),
            limit,
            concurrency,
            pool: pool_size(args, concurrency),
            pacer: args.pacer,
            burst: args.burst,
            identity,
            id_basis,
            format,
            input: args.input.clone(),
            out_format: crate::settings::values::OutFormat::for_out(args.out_format, &out),
            joblog: args.joblog.clone(),
            metrics_addr: args.metrics_addr,
            metrics_linger: args.metrics_linger,
            out,
            failures,
            state_dir,
            request: Arc::new(request),
            timeout: args.timeout,
            max_attempts: args.max_attempts,
            max_wait: args.max_wait,
            max_body: args.max_body,
            fail_fast: fail_fast(args.fail_fast, limit),
            max_failures: args.max_failures,
            fresh: args.fresh,
            retry_failed: args.retry_failed,
            keep_done: args.keep_done,
            force_outputs: args.force_outputs,
            skip_invalid: args.skip_invalid,
            input_name: input_name(&args.input),
            spooled: None,
            api_key_env: args.api_key_env.clone(),
            limit_source: limit_source(args, &policies),
            costing: costing(args, &policies),
            wait_for_quota: args.wait_for_quota,
            shape_unknown: !policies[0].named,
            policies,
            dry_run: args.dry_run,
            batch: batch_spec(args)?,
            verbose: args.verbose,
            json: args.json,
            style: crate::settings::values::Style::detect(args.color, args.quiet, args.log_every),
            credits: CreditSettings::from_cli(args),
            fleet,
            shard: args.shard,
        })
    }
}

/// Where the limit comes from, as the start line says it: the plan, or
/// `--limit` with any further policies.
fn limit_source(args: &RunArgs, policies: &[PolicySpec]) -> String {
    match (args.limit.is_empty(), policies.len() < 2) {
        (true, _) => format!("plan {}", args.plan().name()),
        (false, true) => "--limit".to_string(),
        (false, false) => format!(
            "--limit, with {} too",
            policies[1..]
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// The input's name as the job knows it (see [`Settings::input_name`]).
fn input_name(input: &Path) -> String {
    if places::piped(input) {
        return "stdin".to_string();
    }
    input
        .file_name()
        .map_or_else(|| "input".to_string(), |n| n.to_string_lossy().into_owned())
}

/// The origin of a rehearsal's jobs: the built-in sim's.
pub const SIM_ORIGIN: &str = "sim";

/// Whose credits these are: the API's origin ([`SIM_ORIGIN`] for the
/// built-in one).
fn origin(sim: bool, identity_url: &str, url_src: &str) -> String {
    if sim && identity_url.starts_with("sim:") {
        return SIM_ORIGIN.to_string();
    }
    reqwest::Url::parse(url_src)
        .map(|u| u.origin().ascii_serialization())
        .unwrap_or_else(|_| url_src.split('{').next().unwrap_or_default().to_string())
}

/// A slow plan must not spend minutes proving its URL wrong: never more
/// than one window's worth of calls.
fn fail_fast(asked: u32, limit: Limit) -> u32 {
    match limit.rate() {
        Some(r) if r.count >= 3 => asked.min(u32::try_from(r.count).unwrap_or(u32::MAX)),
        _ => asked,
    }
}

impl CreditSettings {
    fn from_cli(args: &RunArgs) -> CreditSettings {
        CreditSettings {
            alert_at: args.alert_at.0.clone(),
            burn_window: args.burn_window,
            webhook: args.alert_webhook.clone(),
            reserve: args.reserve,
            require_full: args.require_full,
            wait_for_credits: args.wait_for_credits,
            probe_every: args.probe_every,
        }
    }
}

/// Whether a file can be made beside `out`: the outputs are written to a
/// temporary file there and renamed over it, so a folder that refuses new
/// files (read-only, a file in the way) would lose every result after the
/// last call. The nearest folder that exists is tried with a probe file
/// (permission bits alone do not stop root; a read-only mount does).
fn writable_dir(out: &Path) -> Result<(), String> {
    let parent = out.parent().filter(|d| !d.as_os_str().is_empty());
    let dir = parent.unwrap_or(Path::new("."));
    let Some(existing) = dir.ancestors().find(|a| a.exists()) else {
        return Ok(());
    };
    if !existing.is_dir() {
        return Err(format!("{} is a file, not a directory", existing.display()));
    }
    let probe = existing.join(format!(".batchrun-probe.{}", std::process::id()));
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
    {
        Ok(_) => {
            let _ = std::fs::remove_file(&probe);
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(format!(
            "no file can be made in {}: {e}",
            existing.display()
        )),
    }
}

/// Refuses a `--joblog` that would add a line per call to a file that
/// must not have one: the input, an output, or a file of the checkpoint in
/// `state_dir` (by path or a hard link).
fn check_joblog(
    (input, out, failures): (&Path, &Path, &Path),
    state_dir: &Path,
    joblog: &Path,
) -> Result<(), RunError> {
    let piped = input == Path::new("-");
    for (what, p) in [
        ("the input file", input),
        ("--out", out),
        ("--failures", failures),
    ] {
        if same_file(joblog, p) && !(what == "the input file" && piped) {
            return Err(usage(format!(
                "--joblog {} is {what}: a line per call would be added to it",
                joblog.display()
            )));
        }
    }
    if places::of_the_state(state_dir, joblog) {
        return Err(usage(format!(
            "--joblog {} is inside the checkpoint ({}): a line per call would damage it",
            joblog.display(),
            state_dir.display()
        )));
    }
    Ok(())
}

/// Refuses outputs that would destroy the input or each other, or that
/// cannot be written, before anything is read or sent.
fn check_outputs(input: &Path, out: &Path, failures: &Path) -> Result<(), RunError> {
    let (o, f) = (resolved(out), resolved(failures));
    let piped = input == Path::new("-");
    for (what, p, r) in [("--out", out, &o), ("--failures", failures, &f)] {
        if same_file(p, input) && !piped {
            return Err(usage(format!(
                "{what} {} is the input file: it would be overwritten",
                p.display()
            )));
        }
        if r.is_dir() {
            return Err(usage(format!("{what} {} is a directory", p.display())));
        }
        if r.exists() {
            std::fs::OpenOptions::new()
                .append(true)
                .open(r)
                .map_err(|e| usage(format!("{what} {} cannot be written: {e}", p.display())))?;
        }
        writable_dir(r)
            .map_err(|why| usage(format!("{what} {} cannot be written: {why}", p.display())))?;
    }
    if same_file(out, failures) {
        return Err(usage(format!(
            "--out and --failures are the same file ({}): results and failures would overwrite each other",
            out.display()
        )));
    }
    Ok(())
}

/// The fleet settings: `--redis` checked, and the fleet's keys derived from
/// `--fleet-key` or from the origin and the API key (hashed, never stored).
fn fleet_settings(
    args: &RunArgs,
    origin: &str,
    request: &RequestSpec,
) -> Result<Option<FleetSettings>, RunError> {
    let Some(url) = args.redis.as_ref().filter(|u| !u.trim().is_empty()) else {
        return Ok(None);
    };
    crate::fleet::check_url(url).map_err(|e| usage(e.to_string()))?;
    let keys = match (&args.fleet_key, &request.key) {
        (Some(name), _) => FleetKeys::named(name),
        (None, Some(k)) => FleetKeys::for_key(origin, k.expose()),
        (None, None) => FleetKeys::for_key(origin, ""),
    };
    Ok(Some(FleetSettings {
        url: url.clone(),
        headroom: args.headroom,
        keys,
        redis_timeout: args.redis_timeout,
    }))
}

/// How calls are weighed in tokens. Always: a server may state a token
/// policy that nothing told (OpenAI's, Anthropic's headers), and it is kept
/// only if each call is estimated before it goes and counted at what it
/// used.
fn costing(args: &RunArgs, policies: &[PolicySpec]) -> crate::cost::Costing {
    crate::cost::Costing {
        expr: args.cost.clone(),
        usage: args.usage.clone(),
        file: input_name(&args.input),
        most: limits::most_at_once(policies, |_| true),
        most_answered: limits::most_at_once(policies, |u| u != Unit::InputTokens),
        guess_cap: limits::least_quota(policies),
    }
}

#[cfg(test)]
mod tests;
