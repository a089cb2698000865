//! The run: a fixed pool of workers behind one pacer, a checkpoint that
//! records every item, and a clean stop for credits, Ctrl-C or a rejected key.
//!
//! [`run`] reads like the pipeline: settle the options, scan the input,
//! open the job, start the pool, wait for it, write the outputs. Workers send
//! [`Event`]s to one loop that records them; the reporter and the alerter are
//! consumers of what that loop sees.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use sha2::{Digest, Sha256};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::checkpoint::{ItemRecord, ItemState, JobItems, JobMeta, Store};
use crate::classify::{self, CallError};
use crate::cli::RunArgs;
use crate::credits::Alerter;
use crate::credits::{self, Alert, AlertKind, CreditMeter, CreditSnapshot, MeterConfig};
use crate::input::{self, Format, InputError, Item};
use crate::pacer::{BucketPacer, Pacer, Unpaced};
use crate::rate::backoff::Backoff;
use crate::rate::bucket::TokenBucket;
use crate::rate::Limit;
use crate::report::{self, Reporter, RunState, Summary, View};
use crate::template::{Escape, Template};

/// The shortest pause a 429 causes, whatever its Retry-After says.
pub const MIN_PAUSE: Duration = Duration::from_secs(1);

/// How long in-flight calls get to finish after Ctrl-C before they are abandoned.
pub const INTERRUPT_GRACE: Duration = Duration::from_secs(5);

/// Errors that stop a run before or outside the pool, by exit code.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Bad options (exit 2).
    #[error("{0}")]
    Usage(String),
    /// Bad input (exit 2): names the file, line and reason.
    #[error(transparent)]
    Input(#[from] InputError),
    /// Anything else (exit 1): state mismatch, unusable state dir, ...
    #[error(transparent)]
    Fatal(#[from] anyhow::Error),
}

impl RunError {
    /// The process exit code for this error.
    pub fn exit_code(&self) -> i32 {
        match self {
            RunError::Usage(_) | RunError::Input(_) => 2,
            RunError::Fatal(_) => 1,
        }
    }
}

/// The API key. Its `Debug` never shows it, and it only ever leaves the
/// process as a sensitive header value.
#[derive(Clone)]
struct Secret(String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// What to send for each item.
struct RequestSpec {
    method: reqwest::Method,
    url: Template,
    headers: Vec<(HeaderName, Template)>,
    body: Body,
    key_header: HeaderName,
    key: Option<Secret>,
}

enum Body {
    None,
    Item,
    Template(Template),
}

struct Rendered {
    url: String,
    headers: HeaderMap,
    body: Option<(Vec<u8>, bool)>,
}

impl RequestSpec {
    fn render(&self, item: &Item) -> Result<Rendered, String> {
        let url = self
            .url
            .render(item, Escape::Url)
            .map_err(|e| format!("--url: {e}"))?;
        match reqwest::Url::parse(&url) {
            Ok(u) if matches!(u.scheme(), "http" | "https") => {}
            Ok(u) => {
                return Err(format!(
                    "--url: {url:?} is not http or https (scheme {:?})",
                    u.scheme()
                ))
            }
            Err(e) => return Err(format!("--url: {url:?} is not a valid URL: {e}")),
        }
        let mut headers = HeaderMap::new();
        for (name, t) in &self.headers {
            let v = t
                .render(item, Escape::Header)
                .map_err(|e| format!("--header {name}: {e}"))?;
            let v = HeaderValue::from_str(&v)
                .map_err(|_| format!("--header {name}: value is not a valid header value"))?;
            headers.append(name.clone(), v);
        }
        let body = match &self.body {
            Body::None => None,
            Body::Item => Some((
                serde_json::to_vec(&item.value).map_err(|e| e.to_string())?,
                true,
            )),
            Body::Template(t) => {
                let b = t
                    .render(item, Escape::Json)
                    .map_err(|e| format!("--body: {e}"))?;
                let is_json = serde_json::from_str::<serde_json::Value>(&b).is_ok();
                Some((b.into_bytes(), is_json))
            }
        };
        Ok(Rendered { url, headers, body })
    }
}

/// The settled options of a run.
struct Settings {
    /// Whose credits these are: the API's origin ("sim" for the built-in one).
    origin: String,
    limit: Limit,
    concurrency: usize,
    burst: Option<u64>,
    identity: String,
    format: Format,
    input: PathBuf,
    out: PathBuf,
    failures: PathBuf,
}

fn default_output(input: &Path, suffix: &str) -> PathBuf {
    let stem = input
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "batchrun".into());
    input.with_file_name(format!("{stem}.{suffix}.jsonl"))
}

/// The sim's default endpoint: it echoes the item back.
const SIM_DEFAULT_PATH: &str = "/v1/echo";

fn settle(args: &RunArgs, sim_base: Option<&str>) -> Result<(Settings, RequestSpec), RunError> {
    let usage = RunError::Usage;
    let limit = args.limit.unwrap_or_else(|| args.plan.limit());
    let concurrency = args.concurrency.unwrap_or_else(|| args.plan.concurrency());
    if let (Some(b), Limit::Rate(r)) = (args.burst, limit) {
        TokenBucket::for_limit(r, Some(b), false, std::time::Instant::now())
            .map_err(|e| usage(e.to_string()))?;
    }
    let (url_src, identity_url, default_json_body) =
        match (sim_base, &args.url) {
            (Some(base), None) => (
                format!("{base}{SIM_DEFAULT_PATH}"),
                format!("sim:{SIM_DEFAULT_PATH}"),
                true,
            ),
            (Some(base), Some(u)) if u.starts_with('/') => {
                (format!("{base}{u}"), format!("sim:{u}"), false)
            }
            (Some(_), Some(u)) => (u.clone(), u.clone(), false),
            (None, Some(u)) => (u.clone(), u.clone(), false),
            (None, None) => return Err(usage(
                "no --url given (nor BATCHRUN_URL); use --sim to rehearse against the built-in sim"
                    .into(),
            )),
        };
    let url = Template::parse(&url_src).map_err(|e| usage(format!("--url: {e}")))?;
    let body = if args.json_body || (default_json_body && args.body.is_none()) {
        Body::Item
    } else if let Some(b) = &args.body {
        Body::Template(Template::parse(b).map_err(|e| usage(format!("--body: {e}")))?)
    } else {
        Body::None
    };
    let method = match &args.method {
        Some(m) => reqwest::Method::from_bytes(m.to_ascii_uppercase().as_bytes())
            .map_err(|_| usage(format!("--method {m:?} is not an HTTP method")))?,
        None if matches!(body, Body::None) => reqwest::Method::GET,
        None => reqwest::Method::POST,
    };
    let mut headers = Vec::new();
    for (n, v) in &args.headers {
        let name = HeaderName::from_bytes(n.as_bytes())
            .map_err(|_| usage(format!("--header: {n:?} is not a header name")))?;
        let t = Template::parse(v).map_err(|e| usage(format!("--header {n}: {e}")))?;
        headers.push((name, t));
    }
    let key_header = HeaderName::from_bytes(args.api_key_header.as_bytes()).map_err(|_| {
        usage(format!(
            "--api-key-header {:?} is not a header name",
            args.api_key_header
        ))
    })?;
    let key = match std::env::var(&args.api_key_env) {
        Ok(k) if !k.is_empty() => Some(Secret(k)),
        _ if sim_base.is_some() => Some(Secret("sim-demo-key".into())),
        _ => {
            return Err(usage(format!(
                "no API key: set the environment variable {} (or name another with --api-key-env)",
                args.api_key_env
            )))
        }
    };
    if let Some(Secret(k)) = &key {
        HeaderValue::from_str(k).map_err(|_| {
            usage(format!(
                "the API key in {} contains characters a header cannot carry",
                args.api_key_env
            ))
        })?;
    }
    let format = input::detect_format(&args.input, args.format)?;
    let spec = RequestSpec {
        method,
        url,
        headers,
        body,
        key_header,
        key,
    };
    // The job's identity: what is sent, never the key itself.
    let mut identity = format!("{} {identity_url}", spec.method);
    for (n, v) in &args.headers {
        identity.push_str(&format!("\n{n}: {v}"));
    }
    match (&spec.body, &args.body) {
        (Body::Item, _) => identity.push_str("\nbody: <item as JSON>"),
        (Body::Template(_), Some(b)) => identity.push_str(&format!("\nbody: {b}")),
        _ => {}
    }
    identity.push_str(&format!("\nkey header: {}", spec.key_header));
    let origin = if sim_base.is_some() && identity_url.starts_with("sim:") {
        "sim".to_string()
    } else {
        reqwest::Url::parse(&url_src)
            .map(|u| u.origin().ascii_serialization())
            .unwrap_or_else(|_| url_src.split('{').next().unwrap_or_default().to_string())
    };
    Ok((
        Settings {
            origin,
            limit,
            concurrency,
            burst: args.burst,
            identity,
            format,
            input: args.input.clone(),
            out: args
                .out
                .clone()
                .unwrap_or_else(|| default_output(&args.input, "results")),
            failures: args
                .failures
                .clone()
                .unwrap_or_else(|| default_output(&args.input, "failures")),
        },
        spec,
    ))
}

fn sha_hex(parts: &[&[u8]]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p);
        h.update([0u8]);
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

fn unix_now() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

/// Why the pool stopped early.
#[derive(Debug, Clone, PartialEq)]
enum Halt {
    Exhausted,
    Reserve(String),
    Auth(u16),
    Interrupted,
    Internal(String),
}

impl Halt {
    fn state(&self) -> RunState {
        match self {
            Halt::Exhausted | Halt::Reserve(_) => RunState::Halted,
            Halt::Auth(_) | Halt::Internal(_) => RunState::Failed,
            Halt::Interrupted => RunState::Interrupted,
        }
    }
}

/// The pool's gate: may workers send?
#[derive(Debug, Clone, PartialEq)]
enum Gate {
    Running,
    /// Waiting for credits; the next probe is due at this instant.
    Waiting(Instant),
    Stopped,
}

/// What the gate lets a worker do.
enum Pass {
    Run,
    Probe,
    Stop,
}

/// What workers tell the recording loop.
#[derive(Debug)]
enum Event {
    Sent,
    Done {
        line: u64,
        status: u16,
        body: serde_json::Value,
        attempts: u32,
    },
    Failed {
        line: u64,
        status: Option<u16>,
        reason: String,
        attempts: u32,
    },
    RateLimited {
        pause: Duration,
        concurrency: bool,
    },
    Retry,
    Credits(CreditSnapshot),
    LimitInForce(u64),
    Alert(Alert),
}

/// State shared by the workers.
struct Ctx {
    spec: RequestSpec,
    client: reqwest::Client,
    pacer: Box<dyn Pacer>,
    idem_prefix: String,
    max_attempts: u32,
    default_pause: Duration,
    backoff: Backoff,
    gate: watch::Sender<Gate>,
    halt: Mutex<Option<Halt>>,
    events: mpsc::UnboundedSender<Event>,
    wait_for_credits: bool,
    probe_every: Duration,
    prober: AtomicBool,
    waiting_alerted: AtomicBool,
    reserve: Option<Reserve>,
    /// The latest credit headers, for alerts raised by workers.
    last_seen: Mutex<Option<CreditSnapshot>>,
}

/// The reserve guard: a call may start only if the last known balance,
/// less the projected cost of every call in flight and this one, stays at
/// or above the reserve.
struct Reserve {
    floor: i64,
    allow_partial: bool,
    pending_at_start: u64,
    state: Mutex<ReserveState>,
    changed: watch::Sender<u64>,
}

#[derive(Default)]
struct ReserveState {
    last: Option<CreditSnapshot>,
    in_flight: u64,
    unmetered_responses: u32,
    disabled: bool,
    cost: CostEstimate,
    projected_checked: bool,
    done_in_run: u64,
}

/// Credits per successful call, from the movement of `x-api-credits-used`.
/// Other traffic on the account can only make it higher, which errs on the
/// side of keeping the reserve.
#[derive(Default, Clone, Copy)]
struct CostEstimate {
    base_used: Option<i64>,
    base_renewal: Option<u64>,
    max_used: i64,
    successes: u64,
    per_item: Option<f64>,
    prior: Option<f64>,
}

impl CostEstimate {
    /// Feeds every metered response, in any order. The first one sets the
    /// base; each later success adds one charge; the highest `used` seen
    /// since the base, over those successes, is the cost per item.
    fn observe(&mut self, snap: &CreditSnapshot, success: bool) {
        let new_cycle = self.base_renewal != snap.renewal && self.base_used.is_some();
        match self.base_used {
            Some(b) if !new_cycle => {
                // A response older than the base says nothing new.
                if snap.used < b {
                    return;
                }
                self.max_used = self.max_used.max(snap.used);
                if success {
                    self.successes += 1;
                }
                if self.successes > 0 {
                    self.per_item =
                        Some(self.max_used.saturating_sub(b) as f64 / self.successes as f64);
                }
            }
            _ => {
                self.base_used = Some(snap.used);
                self.base_renewal = snap.renewal;
                self.max_used = snap.used;
                self.successes = 0;
            }
        }
    }

    /// Whether any cost is known (measured in this run or carried over).
    fn known(&self) -> bool {
        self.per_item.is_some() || self.prior.is_some()
    }

    fn current(&self) -> f64 {
        self.per_item.or(self.prior).unwrap_or(1.0).max(0.0)
    }
}

enum Admit {
    Go(InFlight),
    WaitForBalance,
    Refused(String),
}

/// Counts a call as in flight for the reserve until dropped.
struct InFlight(Option<Arc<Ctx>>);

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some(ctx) = self.0.take() {
            if let Some(r) = &ctx.reserve {
                let mut s = r.state.lock().unwrap_or_else(|p| p.into_inner());
                s.in_flight = s.in_flight.saturating_sub(1);
                drop(s);
                // Whatever became of the call (even a panic), a worker
                // waiting for its turn must get to look again.
                r.changed.send_modify(|n| *n += 1);
            }
        }
    }
}

impl Ctx {
    fn emit(&self, ev: Event) {
        // The recording loop outlives every worker; a closed channel means
        // the run is being torn down, and there is nothing left to record.
        let _ = self.events.send(ev);
    }

    fn is_stopped(&self) -> bool {
        *self.gate.borrow() == Gate::Stopped
    }

    fn stop(&self, why: Halt) {
        {
            let mut h = self.halt.lock().unwrap_or_else(|p| p.into_inner());
            if h.is_none() {
                *h = Some(why);
            }
        }
        self.gate.send_replace(Gate::Stopped);
    }

    async fn until_stopped(&self) {
        let mut rx = self.gate.subscribe();
        let _ = rx.wait_for(|g| *g == Gate::Stopped).await;
    }

    /// Waits at the gate. While the pool waits for credits, the first worker
    /// to find the probe due becomes the one prober; everyone else waits
    /// for the gate to change.
    async fn pass_gate(&self) -> Pass {
        let mut rx = self.gate.subscribe();
        loop {
            let g = rx.borrow_and_update().clone();
            match g {
                Gate::Running => return Pass::Run,
                Gate::Stopped => return Pass::Stop,
                Gate::Waiting(next) => {
                    if Instant::now() >= next {
                        if self
                            .prober
                            .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
                            .is_ok()
                        {
                            return Pass::Probe;
                        }
                        if rx.changed().await.is_err() {
                            return Pass::Stop;
                        }
                    } else {
                        tokio::select! {
                            _ = tokio::time::sleep_until(next) => {}
                            r = rx.changed() => if r.is_err() { return Pass::Stop },
                        }
                    }
                }
            }
        }
    }

    /// Credits are out (or the reserve is reached) and the run waits for
    /// them: the pool stops sending until a probe finds them back. Alerts
    /// once per waiting spell.
    fn start_waiting(&self, why: &str) {
        let next = self.next_probe();
        let entered = self.gate.send_if_modified(|g| {
            if *g == Gate::Running {
                *g = Gate::Waiting(next);
                true
            } else {
                false
            }
        });
        if entered && !self.waiting_alerted.swap(true, Ordering::SeqCst) {
            self.emit(Event::Alert(Alert::new(
                AlertKind::Waiting,
                "waiting",
                format!(
                    "{why} ({}); waiting for credits, probing every {}",
                    credits::describe_renewal(self.last_snapshot().and_then(|s| s.renewal)),
                    humantime::format_duration(self.probe_every)
                ),
                self.last_snapshot(),
            )));
        }
    }

    fn next_probe(&self) -> Instant {
        let now = Instant::now();
        now.checked_add(self.probe_every)
            .unwrap_or(now + Duration::from_secs(365 * 86_400))
    }

    /// The probe found no credits: next probe one interval from now.
    fn probe_failed(&self) {
        let next = self.next_probe();
        self.gate.send_modify(|g| {
            if matches!(g, Gate::Waiting(_)) {
                *g = Gate::Waiting(next);
            }
        });
        self.prober.store(false, Ordering::SeqCst);
    }

    /// The probe could not tell (a rate limit, a transient error): hand the
    /// probe back, still due, to whoever passes the gate next.
    fn release_probe(&self) {
        self.prober.store(false, Ordering::SeqCst);
        // Wake the waiters so one of them can take the probe.
        self.gate.send_modify(|_| {});
    }

    /// The probe went through: resume everyone, unless the reserve still
    /// has no room, in which case keep waiting.
    fn probe_succeeded(&self) {
        if !self.reserve_has_room() {
            self.probe_failed();
            return;
        }
        let resumed = self.gate.send_if_modified(|g| {
            if matches!(g, Gate::Waiting(_)) {
                *g = Gate::Running;
                true
            } else {
                false
            }
        });
        self.prober.store(false, Ordering::SeqCst);
        if resumed {
            self.waiting_alerted.store(false, Ordering::SeqCst);
            self.emit(Event::Alert(Alert::new(
                AlertKind::Resumed,
                "resumed",
                "credits are back: resuming the run",
                self.last_snapshot(),
            )));
        }
    }

    fn last_snapshot(&self) -> Option<CreditSnapshot> {
        *self.last_seen.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn reserve_has_room(&self) -> bool {
        let Some(r) = &self.reserve else { return true };
        let s = r.state.lock().unwrap_or_else(|p| p.into_inner());
        match s.last {
            Some(last) if !s.disabled => {
                last.remaining
                    .saturating_sub(s.cost.current().ceil() as i64)
                    >= r.floor
            }
            _ => true,
        }
    }

    fn admit(self: &Arc<Self>, probing: bool) -> Admit {
        let Some(r) = &self.reserve else {
            return Admit::Go(InFlight(None));
        };
        let mut s = r.state.lock().unwrap_or_else(|p| p.into_inner());
        if s.disabled || probing {
            s.in_flight += 1;
            return Admit::Go(InFlight(Some(self.clone())));
        }
        // The balance is learnt from the first response and the cost of a
        // call from the next: until both are known, one call at a time, so
        // that a call costing many credits cannot overshoot the reserve.
        let last = match s.last {
            Some(last) if s.cost.known() => last,
            _ if s.in_flight == 0 => {
                s.in_flight += 1;
                return Admit::Go(InFlight(Some(self.clone())));
            }
            _ => return Admit::WaitForBalance,
        };
        let cost = s.cost.current();
        let need = (cost * (s.in_flight + 1) as f64).ceil() as i64;
        if last.remaining.saturating_sub(need) < r.floor {
            // With calls still in flight the reserve is not reached yet: one
            // of them may fail and cost nothing. Wait for them to settle.
            if s.in_flight > 0 {
                return Admit::WaitForBalance;
            }
            return Admit::Refused(format!(
                "reserve reached: {} credits left, a call costs ~{cost:.0}, the reserve is {}",
                last.remaining, r.floor
            ));
        }
        s.in_flight += 1;
        Admit::Go(InFlight(Some(self.clone())))
    }

    /// Feeds a response's credit headers to the reserve guard. Returns a
    /// refusal message when the start-of-run projection crosses the reserve.
    fn reserve_observe(&self, snap: Option<CreditSnapshot>, success: bool) -> Option<String> {
        let r = self.reserve.as_ref()?;
        let mut s = r.state.lock().unwrap_or_else(|p| p.into_inner());
        let mut refusal = None;
        match snap {
            Some(snap) => {
                s.cost.observe(&snap, success);
                if !older_than(&snap, s.last) {
                    s.last = Some(snap);
                }
                if success {
                    s.done_in_run += 1;
                }
                // Once the cost of a call is known, project the rest.
                if !s.projected_checked && s.cost.known() {
                    s.projected_checked = true;
                    let left = r.pending_at_start.saturating_sub(s.done_in_run);
                    let (line, crosses) =
                        project(s.cost.current(), left, snap.remaining, r.floor, "balance");
                    self.emit(Event::Alert(Alert {
                        kind: AlertKind::Reserve,
                        id: "projection-note".into(),
                        message: line,
                        remaining: Some(snap.remaining),
                        max: Some(snap.max),
                        renewal: snap.renewal,
                    }));
                    if !r.allow_partial {
                        refusal = crosses.map(|why| {
                            format!("{why}; use --allow-partial to run until the reserve")
                        });
                    }
                }
            }
            None => {
                s.unmetered_responses += 1;
                if s.last.is_none() && s.unmetered_responses >= 3 && !s.disabled {
                    s.disabled = true;
                    self.emit(Event::Alert(Alert {
                        kind: AlertKind::Reserve,
                        id: "reserve-unmetered".into(),
                        message: "--reserve is ignored: the API sends no credit headers (x-api-max-credits)".into(),
                        remaining: None,
                        max: None,
                        renewal: None,
                    }));
                }
            }
        }
        drop(s);
        r.changed.send_modify(|n| *n += 1);
        refusal
    }

    async fn send(
        &self,
        idem_key: &str,
        req: &Rendered,
    ) -> Result<(u16, HeaderMap, String), reqwest::Error> {
        let mut b = self
            .client
            .request(self.spec.method.clone(), &req.url)
            .headers(req.headers.clone())
            .header("idempotency-key", idem_key);
        if let Some(Secret(k)) = &self.spec.key {
            if let Ok(mut v) = HeaderValue::from_str(k) {
                v.set_sensitive(true);
                b = b.header(self.spec.key_header.clone(), v);
            }
        }
        if let Some((bytes, is_json)) = &req.body {
            if *is_json && !req.headers.contains_key(reqwest::header::CONTENT_TYPE) {
                b = b.header(reqwest::header::CONTENT_TYPE, "application/json");
            }
            b = b.body(bytes.clone());
        }
        let resp = b.send().await?;
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let body = resp.text().await?;
        Ok((status, headers, body))
    }

    /// Drives one item until it is done, failed, or left pending by a stop.
    async fn process(self: &Arc<Self>, item: Item, generation: u32) {
        let idem_key = idempotency_key(&self.idem_prefix, item.line, generation);
        let req = match self.spec.render(&item) {
            Ok(r) => r,
            Err(reason) => {
                self.emit(Event::Failed {
                    line: item.line,
                    status: None,
                    reason,
                    attempts: 0,
                });
                return;
            }
        };
        let mut attempts: u32 = 0;
        loop {
            let probing = match self.pass_gate().await {
                Pass::Run => false,
                Pass::Probe => true,
                Pass::Stop => return,
            };
            tokio::select! {
                _ = self.pacer.take() => {}
                _ = self.until_stopped() => {
                    if probing { self.release_probe(); }
                    return;
                }
            }
            if self.is_stopped() {
                return;
            }
            if !probing && *self.gate.borrow() != Gate::Running {
                continue;
            }
            // Subscribed before asking, so a call that ends in between still
            // wakes this worker if it has to wait its turn.
            let mut turn = self.reserve.as_ref().map(|r| r.changed.subscribe());
            let guard = match self.admit(probing) {
                Admit::Go(g) => g,
                Admit::WaitForBalance => {
                    if let Some(rx) = turn.as_mut() {
                        tokio::select! {
                            _ = rx.changed() => {}
                            _ = self.until_stopped() => return,
                        }
                    }
                    continue;
                }
                Admit::Refused(why) => {
                    if self.wait_for_credits {
                        self.start_waiting(&why);
                        continue;
                    }
                    self.stop(Halt::Reserve(why));
                    return;
                }
            };
            self.emit(Event::Sent);
            attempts += 1;
            let result = self.send(&idem_key, &req).await;
            let outcome = match result {
                Ok((status, headers, body)) => {
                    let snap = credits::snapshot_from_headers(&headers);
                    if let Some(s) = snap {
                        let mut seen = self.last_seen.lock().unwrap_or_else(|p| p.into_inner());
                        if !older_than(&s, *seen) {
                            *seen = Some(s);
                            drop(seen);
                            self.emit(Event::Credits(s));
                        }
                    }
                    if let Some(l) = self.pacer.observe(&headers) {
                        self.emit(Event::LimitInForce(l));
                    }
                    let c = classify::classify(
                        reqwest::StatusCode::from_u16(status)
                            .unwrap_or(reqwest::StatusCode::BAD_GATEWAY),
                        &headers,
                        &body,
                        SystemTime::now(),
                    );
                    let success = c.is_ok();
                    if !matches!(c, Err(CallError::CreditsExhausted { .. })) {
                        if let Some(refusal) = self.reserve_observe(snap, success) {
                            if success {
                                self.record_done(&item, status, &body, attempts);
                            }
                            self.stop(Halt::Reserve(refusal));
                            return;
                        }
                    }
                    c.map(|()| (status, body))
                }
                Err(e) => Err(classify::transport(&e)),
            };
            // Only now is this call's charge visible in the balance the
            // reserve guard reads, so only now does it stop counting as in flight.
            drop(guard);
            match outcome {
                Ok((status, body)) => {
                    self.record_done(&item, status, &body, attempts);
                    if probing {
                        self.probe_succeeded();
                    }
                    return;
                }
                Err(CallError::RateLimited { retry_after }) => {
                    if probing {
                        self.release_probe();
                    }
                    attempts -= 1;
                    // A zero Retry-After would turn the pause into a hot loop.
                    let pause = retry_after.unwrap_or(self.default_pause).max(MIN_PAUSE);
                    self.pacer.pause(pause);
                    self.emit(Event::RateLimited {
                        pause,
                        concurrency: false,
                    });
                }
                Err(CallError::Concurrency { retry_after }) => {
                    if probing {
                        self.release_probe();
                    }
                    attempts -= 1;
                    let pause = retry_after.unwrap_or(Duration::from_secs(1)).max(MIN_PAUSE);
                    self.emit(Event::RateLimited {
                        pause,
                        concurrency: true,
                    });
                    if !self.sleep_or_stop(pause).await {
                        return;
                    }
                }
                Err(CallError::CreditsExhausted { .. }) => {
                    attempts -= 1;
                    if self.wait_for_credits {
                        if probing {
                            self.probe_failed();
                        } else {
                            self.start_waiting("credits exhausted");
                        }
                        continue;
                    }
                    self.stop(Halt::Exhausted);
                    return;
                }
                Err(CallError::Auth { status }) => {
                    self.stop(Halt::Auth(status));
                    return;
                }
                Err(CallError::Permanent { status, reason }) => {
                    // This item is bad, which says nothing about credits: the
                    // next waiting worker probes with its own item.
                    if probing {
                        self.release_probe();
                    }
                    self.emit(Event::Failed {
                        line: item.line,
                        status: Some(status),
                        reason: format!("HTTP {status}: {reason}"),
                        attempts,
                    });
                    return;
                }
                Err(CallError::Transient {
                    reason,
                    retry_after,
                }) => {
                    if probing {
                        self.release_probe();
                    }
                    if attempts >= self.max_attempts {
                        self.emit(Event::Failed {
                            line: item.line,
                            status: None,
                            reason: format!("{reason} (gave up after {attempts} attempts)"),
                            attempts,
                        });
                        return;
                    }
                    self.emit(Event::Retry);
                    let wait = self.backoff.wait(attempts, retry_after, fastrand::f64());
                    if !self.sleep_or_stop(wait).await {
                        return;
                    }
                }
            }
        }
    }

    fn record_done(&self, item: &Item, status: u16, body: &str, attempts: u32) {
        let body = serde_json::from_str(body)
            .unwrap_or_else(|_| serde_json::Value::String(body.to_string()));
        self.emit(Event::Done {
            line: item.line,
            status,
            body,
            attempts,
        });
    }

    /// Sleeps unless the run stops first. False if it stopped.
    async fn sleep_or_stop(&self, d: Duration) -> bool {
        tokio::select! {
            _ = tokio::time::sleep(d) => !self.is_stopped(),
            _ = self.until_stopped() => false,
        }
    }
}

async fn worker(ctx: Arc<Ctx>, queue: Arc<tokio::sync::Mutex<mpsc::Receiver<(Item, u32)>>>) {
    loop {
        if ctx.is_stopped() {
            return;
        }
        let item = {
            let mut q = queue.lock().await;
            tokio::select! {
                it = q.recv() => it,
                _ = ctx.until_stopped() => None,
            }
        };
        let Some((item, generation)) = item else {
            return;
        };
        ctx.process(item, generation).await;
    }
}

/// Counters shared between the recording loop and the progress ticker.
#[derive(Default)]
struct Stats {
    done: AtomicU64,
    failed: AtomicU64,
    done_this_run: AtomicU64,
    requests: AtomicU64,
    rate_limited: AtomicU64,
    retries: AtomicU64,
    credits: Mutex<Option<CreditSnapshot>>,
}

fn open_job(
    store: &Store,
    settings: &Settings,
    scan: &input::Scan,
    fresh: bool,
) -> Result<JobMeta, RunError> {
    let abs = std::fs::canonicalize(&settings.input)
        .with_context(|| format!("{}", settings.input.display()))?;
    let abs = abs.to_string_lossy().into_owned();
    let id = sha_hex(&[abs.as_bytes(), settings.identity.as_bytes()])[..16].to_string();
    if fresh {
        store
            .discard_job(&id)
            .context("discarding the checkpoint")?;
    }
    if let Some(meta) = store.job(&id).context("reading the checkpoint")? {
        if meta.fingerprint != scan.fingerprint {
            let done = store
                .items(&id)
                .and_then(|i| i.counts())
                .map(|c| c.done)
                .unwrap_or(0);
            return Err(RunError::Fatal(anyhow::anyhow!(
                "{} changed since its checkpoint was made ({done} of {} items done then); \
                 refusing to mix results of two different files. Use --fresh to start over \
                 (the old results are discarded), or restore the original file to resume.",
                settings.input.display(),
                meta.total
            )));
        }
        return Ok(meta);
    }
    let nonce = sha_hex(&[
        &unix_now().as_nanos().to_le_bytes(),
        &fastrand::u64(..).to_le_bytes(),
        &std::process::id().to_le_bytes(),
    ]);
    let meta = JobMeta {
        id,
        input: abs,
        fingerprint: scan.fingerprint.clone(),
        total: scan.total,
        template: settings.identity.clone(),
        nonce,
        created_unix: unix_now().as_secs(),
        ..JobMeta::default()
    };
    store.save_job(&meta).context("writing the checkpoint")?;
    store.flush().context("flushing the checkpoint")?;
    Ok(meta)
}

/// Writes `--out` and `--failures` from the checkpoint, in input order,
/// through temporary files renamed into place.
fn write_outputs(settings: &Settings, items: &JobItems) -> anyhow::Result<()> {
    use std::io::Write;
    let tmp = |p: &Path| p.with_extension("jsonl.tmp");
    let create = |p: &Path| -> anyhow::Result<std::io::BufWriter<std::fs::File>> {
        if let Some(dir) = p.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        Ok(std::io::BufWriter::new(
            std::fs::File::create(tmp(p)).with_context(|| format!("writing {}", p.display()))?,
        ))
    };
    let mut out = create(&settings.out)?;
    let mut fail = create(&settings.failures)?;
    for item in input::Reader::open(&settings.input, settings.format)? {
        let item = item?;
        let Some(rec) = items.get(item.line)? else {
            continue;
        };
        let line = match rec.state {
            ItemState::Done => serde_json::json!({
                "line": item.line, "input": item.value, "status": rec.status, "body": rec.body,
            }),
            ItemState::Failed => serde_json::json!({
                "line": item.line, "input": item.value, "status": rec.status,
                "reason": rec.reason, "attempts": rec.attempts,
            }),
        };
        let w = if rec.state == ItemState::Done {
            &mut out
        } else {
            &mut fail
        };
        serde_json::to_writer(&mut *w, &line)?;
        w.write_all(b"\n")?;
    }
    for (w, p) in [(out, &settings.out), (fail, &settings.failures)] {
        let f = w.into_inner().map_err(|e| e.into_error())?;
        f.sync_all()?;
        std::fs::rename(tmp(p), p).with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}

/// Runs a job to its end: done, halted, interrupted or failed. `shutdown`
/// resolves on Ctrl-C.
pub async fn run(
    args: RunArgs,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<Summary, RunError> {
    let started = Instant::now();

    // 1. Options, and the sim when rehearsing.
    let _sim = if args.sim {
        let limit = args.limit.unwrap_or_else(|| args.plan.limit());
        let concurrency = args.concurrency.unwrap_or_else(|| args.plan.concurrency());
        let (addr, handle) = start_sim(limit, concurrency)
            .await
            .context("starting the built-in sim")?;
        Some((format!("http://{addr}"), AbortOnDrop(handle)))
    } else {
        None
    };
    let (settings, spec) = settle(&args, _sim.as_ref().map(|(u, _)| u.as_str()))?;

    // 2. The whole input is checked before any request is sent.
    let scan = tokio::task::block_in_place(|| {
        input::scan(&settings.input, settings.format, &mut |item| {
            spec.render(item).map(|_| ())
        })
    })?;

    // 3. The job and its checkpoint.
    let store = Store::open(&args.state_dir).map_err(|e| RunError::Fatal(anyhow::Error::new(e)))?;
    let mut meta = open_job(&store, &settings, &scan, args.fresh)?;
    // Until this run ends, a reader of the checkpoint sees it unfinished.
    meta.last_state = None;
    meta.halt_reason = None;
    let items = store.items(&meta.id).context("opening the checkpoint")?;
    if args.retry_failed {
        items.clear_failed().context("clearing failed items")?;
    }
    let counts = items.counts().context("reading the checkpoint")?;
    let pending = scan.total.saturating_sub(counts.done + counts.failed);

    let reporter = Arc::new(Reporter::new(scan.total));
    let alerter = Arc::new(Alerter::new(
        meta.id.clone(),
        args.alert_webhook.clone(),
        reporter.printer(),
    ));
    let restored = store
        .meter_state(&settings.origin)
        .context("reading the checkpoint")?
        .unwrap_or_else(|| meta.meter.clone());
    let last_known = restored.last;
    let meter = CreditMeter::new(
        MeterConfig {
            thresholds: args.alert_at.0.clone(),
            burn_window: args.burn_window,
        },
        Some(restored),
    );

    // 4. The pacer. A job resumed within one window of its last call starts
    //    with an empty bucket: the previous run may have spent the burst.
    let (pacer, default_pause): (Box<dyn Pacer>, Duration) = match settings.limit {
        Limit::Rate(r) => {
            let since_last =
                unix_now().saturating_sub(Duration::from_millis(meta.last_active_unix_ms));
            // The margin covers the pacing stamp a kill -9 may not have saved
            // (saved every second, flushed within half a second more).
            let start_empty =
                meta.last_active_unix_ms > 0 && since_last < r.period + Duration::from_secs(3);
            let bucket =
                TokenBucket::for_limit(r, settings.burst, start_empty, Instant::now().into_std())
                    .map_err(|e| RunError::Usage(e.to_string()))?;
            (
                Box::new(BucketPacer::new(bucket, r.period)),
                r.period.min(Duration::from_secs(60)),
            )
        }
        Limit::Unlimited => (Box::<Unpaced>::default(), Duration::from_secs(30)),
    };

    let client = reqwest::Client::builder()
        .timeout(args.timeout)
        .pool_max_idle_per_host(settings.concurrency)
        .user_agent(concat!("batchrun/", env!("CARGO_PKG_VERSION")))
        // The key travels in a custom header that reqwest would carry across
        // a redirect to another host: follow redirects only within the origin.
        .redirect(reqwest::redirect::Policy::custom(|attempt| {
            let same_origin = attempt
                .previous()
                .first()
                .is_some_and(|first| first.origin() == attempt.url().origin());
            if same_origin && attempt.previous().len() < 10 {
                attempt.follow()
            } else {
                attempt.stop()
            }
        }))
        .build()
        .context("building the HTTP client")?;

    let (ev_tx, mut ev_rx) = mpsc::unbounded_channel();
    let (gate, _) = watch::channel(Gate::Running);
    let reserve = args.reserve.map(|floor| Reserve {
        floor,
        allow_partial: args.allow_partial,
        pending_at_start: pending,
        state: Mutex::new(ReserveState {
            cost: CostEstimate {
                prior: meta.cost_per_item,
                ..CostEstimate::default()
            },
            ..ReserveState::default()
        }),
        changed: watch::channel(0).0,
    });
    let ctx = Arc::new(Ctx {
        spec,
        client,
        pacer,
        idem_prefix: format!(
            "batchrun-{}",
            &sha_hex(&[meta.id.as_bytes(), meta.nonce.as_bytes()])[..20]
        ),
        max_attempts: args.max_attempts,
        default_pause,
        backoff: Backoff::default(),
        gate,
        halt: Mutex::new(None),
        events: ev_tx,
        wait_for_credits: args.wait_for_credits,
        probe_every: args.probe_every,
        prober: AtomicBool::new(false),
        waiting_alerted: AtomicBool::new(false),
        reserve,
        last_seen: Mutex::new(meta.meter.last),
    });
    let stats = Arc::new(Stats::default());
    stats.done.store(counts.done, Ordering::Relaxed);
    stats.failed.store(counts.failed, Ordering::Relaxed);
    *stats.credits.lock().unwrap_or_else(|p| p.into_inner()) = meta.meter.last;

    // 5. The feeder streams pending items into a small queue: memory does
    //    not grow with the input.
    let (item_tx, item_rx) = mpsc::channel::<(Item, u32)>(settings.concurrency * 2);
    let feeder = {
        let items = items.clone();
        let path = settings.input.clone();
        let format = settings.format;
        tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
            for item in input::Reader::open(&path, format)? {
                let item = item?;
                if items.get(item.line)?.is_some() {
                    continue;
                }
                let generation = items.generation(item.line)?;
                if item_tx.blocking_send((item, generation)).is_err() {
                    break;
                }
            }
            Ok(())
        })
    };
    if let Some(halt) = reserve_precheck(&args, last_known, meta.cost_per_item, pending, &reporter)
    {
        // Nothing is sent: the workers start and find the pool stopped.
        ctx.stop(halt);
    }
    let queue = Arc::new(tokio::sync::Mutex::new(item_rx));
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..settings.concurrency {
        workers.spawn(worker(ctx.clone(), queue.clone()));
    }

    // 6. Progress ticker.
    let ticker = {
        let (ctx, stats, reporter) = (ctx.clone(), stats.clone(), reporter.clone());
        tokio::spawn(async move {
            let mut every = tokio::time::interval(reporter.tick_every());
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            every.tick().await;
            loop {
                every.tick().await;
                let now = Instant::now();
                let waiting = match *ctx.gate.borrow() {
                    Gate::Waiting(next) => Some(next.saturating_duration_since(now)),
                    _ => None,
                };
                reporter.update(&View {
                    done: stats.done.load(Ordering::Relaxed),
                    failed: stats.failed.load(Ordering::Relaxed),
                    done_this_run: stats.done_this_run.load(Ordering::Relaxed),
                    elapsed: now - started,
                    rate_limited: stats.rate_limited.load(Ordering::Relaxed),
                    credits: stats
                        .credits
                        .lock()
                        .ok()
                        .and_then(|c| c.map(|s| s.remaining)),
                    paused_for: ctx.pacer.paused_until().map(|u| u - now),
                    waiting_probe_in: waiting,
                });
            }
        })
    };

    // 7. The one loop that records what workers report.
    let recorder = {
        let (stats, items, reporter, alerter) = (
            stats.clone(),
            items.clone(),
            reporter.clone(),
            alerter.clone(),
        );
        let mut meta_local = meta.clone();
        let (store, origin) = (store.clone(), settings.origin.clone());
        tokio::spawn(async move {
            let mut saved_at = Instant::now();
            let mut stamped = false;
            let mut meter_local = meter;
            let mut err: Option<anyhow::Error> = None;
            while let Some(ev) = ev_rx.recv().await {
                // Set when the fired-alert set changed: it goes to disk at once.
                let mut fired = false;
                let res: anyhow::Result<()> = (|| {
                    match ev {
                        Event::Sent => {
                            stats.requests.fetch_add(1, Ordering::Relaxed);
                            meta_local.last_active_unix_ms = unix_now().as_millis() as u64;
                            if !stamped {
                                // The first call of the run goes to disk at
                                // once: a kill -9 a moment later must still
                                // let the next run know it is resuming quickly.
                                stamped = true;
                                fired = true;
                            }
                        }
                        Event::Done { line, status, body, attempts } => {
                            items.record(line, &ItemRecord {
                                state: ItemState::Done,
                                status: Some(status),
                                body: Some(body),
                                reason: None,
                                attempts,
                            })?;
                            stats.done.fetch_add(1, Ordering::Relaxed);
                            stats.done_this_run.fetch_add(1, Ordering::Relaxed);
                            // A call went through: any exhaustion is over, and
                            // the next one is a new outage with its own alert.
                            if meter_local.unmark_fired(credits::ID_EXHAUSTED) {
                                fired = true;
                            }
                        }
                        Event::Failed { line, status, reason, attempts } => {
                            items.record(line, &ItemRecord {
                                state: ItemState::Failed,
                                status,
                                body: None,
                                reason: Some(reason),
                                attempts,
                            })?;
                            stats.failed.fetch_add(1, Ordering::Relaxed);
                        }
                        Event::RateLimited { pause, concurrency } => {
                            stats.rate_limited.fetch_add(1, Ordering::Relaxed);
                            if !concurrency {
                                reporter.println(&format!(
                                    "batchrun: rate limited (429): pausing every worker for {:.1}s",
                                    pause.as_secs_f64()
                                ));
                            }
                        }
                        Event::Retry => {
                            stats.retries.fetch_add(1, Ordering::Relaxed);
                        }
                        Event::Credits(s) => {
                            *stats.credits.lock().unwrap_or_else(|p| p.into_inner()) = Some(s);
                            for a in meter_local.observe(s, SystemTime::now()) {
                                alerter.send(&a);
                                fired = true;
                            }
                        }
                        Event::LimitInForce(l) => reporter.println(&format!(
                            "batchrun: the server reports a limit of {l} per window for this key, below the configured one: slowing down to it"
                        )),
                        Event::Alert(a) => {
                            if a.id == "projection-note" {
                                reporter.println(&a.message);
                            } else if a.id == "waiting" || a.id == "resumed" {
                                alerter.send(&a);
                            } else if meter_local.mark_fired(&a.id) {
                                alerter.send(&a);
                                fired = true;
                            }
                        }
                    }
                    Ok(())
                })();
                if let (Err(e), None) = (res, &err) {
                    err = Some(e);
                }
                // Keep the job's pacing time and the alerts fired current on
                // disk, so a kill -9 neither bursts into the window on resume
                // nor repeats an alert.
                if fired || saved_at.elapsed() >= Duration::from_secs(1) {
                    saved_at = Instant::now();
                    meta_local.meter = meter_local.state();
                    let saved = store
                        .save_job(&meta_local)
                        .and_then(|()| store.save_meter_state(&origin, &meta_local.meter))
                        .and_then(|()| if fired { store.flush() } else { Ok(()) });
                    if let (Err(e), None) = (saved, &err) {
                        err = Some(e.into());
                    }
                }
            }
            meta_local.meter = meter_local.state();
            (meta_local, meter_local, err)
        })
    };

    // 8. Wait for the pool, or Ctrl-C.
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            r = workers.join_next() => match r {
                None => break,
                Some(Err(e)) if e.is_panic() => ctx.stop(Halt::Internal(
                    "a worker crashed (a bug in batchrun); the checkpoint is saved: run the same command to resume".into(),
                )),
                Some(_) => {}
            },
            _ = &mut shutdown => {
                reporter.println("batchrun: interrupted: finishing the calls in flight, then saving the checkpoint...");
                ctx.stop(Halt::Interrupted);
                let grace = tokio::time::sleep(INTERRUPT_GRACE);
                tokio::pin!(grace);
                loop {
                    tokio::select! {
                        r = workers.join_next() => if r.is_none() { break },
                        _ = &mut grace => {
                            // Abandoned calls stay pending; their Idempotency-Key
                            // makes the resend safe.
                            workers.abort_all();
                            while workers.join_next().await.is_some() {}
                            break;
                        }
                    }
                }
                break;
            }
        }
    }
    // The pool is over: no worker will take another item.
    if !ctx.is_stopped() {
        ctx.gate.send_replace(Gate::Stopped);
    }
    let halt = ctx.halt.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let cost_estimate = ctx
        .reserve
        .as_ref()
        .and_then(|r| r.state.lock().ok().map(|s| s.cost.per_item))
        .flatten();
    drop(ctx);
    ticker.abort();
    // Closing the queue lets a feeder blocked on a full queue finish.
    drop(queue);
    let feeder_result = feeder.await;
    let (mut meta_final, meter_final, record_err) =
        recorder.await.context("the recording loop failed")?;

    // 9. Decide the end state, alert, persist, write outputs.
    let counts = items.counts().context("reading the checkpoint")?;
    let last = meter_final.last();
    // The exhaustion and reserve halts are billing alerts, once per cycle.
    let billing = match &halt {
        Some(Halt::Exhausted) => Some(Alert::exhausted(last)),
        Some(Halt::Reserve(why)) => {
            let mut a = Alert::reserve(args.reserve.unwrap_or(0), last);
            a.message = format!("{why}. {}", a.message);
            Some(a)
        }
        _ => None,
    };
    if let Some(a) = &billing {
        let mut m = meter_final;
        if m.mark_fired(&a.id) {
            alerter.send(a);
        } else {
            reporter.println(&format!("batchrun: {}", a.message));
        }
        meta_final.meter = m.state();
    }
    let left = scan.total.saturating_sub(counts.done + counts.failed);
    let (state, halt_reason) = match &halt {
        // Every worker ended without a halt yet items are pending: never
        // report that as done.
        None if left > 0 && matches!(feeder_result, Ok(Ok(()))) => (
            RunState::Failed,
            Some(format!(
                "the pool stopped with {left} item(s) pending (a bug in batchrun); run the same command to resume"
            )),
        ),
        None => (RunState::Done, None),
        Some(h) => {
            let reason = match h {
                Halt::Exhausted | Halt::Reserve(_) => {
                    billing.map(|a| a.message).unwrap_or_default()
                }
                Halt::Auth(status) => format!(
                    "the API rejected the key (HTTP {status}): check {} holds a valid key for this API; nothing was marked failed",
                    args.api_key_env
                ),
                Halt::Interrupted => "interrupted by Ctrl-C".to_string(),
                Halt::Internal(why) => why.clone(),
            };
            (h.state(), Some(reason))
        }
    };
    if let Some(c) = cost_estimate {
        meta_final.cost_per_item = Some(c);
    }
    meta_final.requests += stats.requests.load(Ordering::Relaxed);
    meta_final.rate_limited += stats.rate_limited.load(Ordering::Relaxed);
    meta_final.retries += stats.retries.load(Ordering::Relaxed);
    meta_final.halt_reason = halt_reason.clone();
    let exit_code = state.exit_code(counts.failed);
    meta_final.last_state = Some(
        serde_json::to_value(state)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default(),
    );
    meta = meta_final;
    store.save_job(&meta).context("saving the checkpoint")?;
    store
        .save_meter_state(&settings.origin, &meta.meter)
        .context("saving the checkpoint")?;
    store.flush().context("flushing the checkpoint")?;
    write_outputs(&settings, &items)?;
    reporter.finish();
    alerter.flush(Duration::from_secs(5)).await;
    if let Some(e) = record_err {
        return Err(RunError::Fatal(
            e.context("recording results in the checkpoint"),
        ));
    }
    match feeder_result {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(RunError::Fatal(e.context("reading the input"))),
        Err(e) => return Err(RunError::Fatal(anyhow::anyhow!("reading the input: {e}"))),
    }

    let elapsed = started.elapsed().as_secs_f64();
    let done_this_run = stats.done_this_run.load(Ordering::Relaxed);
    let summary = Summary {
        state,
        total: scan.total,
        done: counts.done,
        failed: counts.failed,
        pending: scan.total.saturating_sub(counts.done + counts.failed),
        requests: stats.requests.load(Ordering::Relaxed),
        rate_limited: stats.rate_limited.load(Ordering::Relaxed),
        retries: stats.retries.load(Ordering::Relaxed),
        credits_remaining: last.map(|s| s.remaining),
        elapsed_s: (elapsed * 1000.0).round() / 1000.0,
        achieved_per_min: if elapsed > 0.0 {
            ((done_this_run as f64 * 60.0 / elapsed) * 10.0).round() / 10.0
        } else {
            0.0
        },
        exit_code,
        halt_reason,
        renewal: last.and_then(|s| s.renewal),
        alerts: alerter.fired(),
        out: settings.out.display().to_string(),
        failures: settings.failures.display().to_string(),
    };
    report::err_line(&report::human_summary(&summary));
    Ok(summary)
}

/// The reserve check a run can make before sending anything, from the last
/// balance and cost per item the checkpoint knows (in this billing cycle).
/// A stale balance can only be too high or too low by a top-up or other
/// traffic: `--recheck-credits` (or `--wait-for-credits`) learns it afresh
/// with one call instead.
fn reserve_precheck(
    args: &RunArgs,
    last: Option<CreditSnapshot>,
    cost: Option<f64>,
    pending: u64,
    reporter: &Reporter,
) -> Option<Halt> {
    let floor = args.reserve?;
    if args.recheck_credits || args.wait_for_credits || pending == 0 {
        return None;
    }
    let last = last?;
    if last.renewal.is_some_and(|r| r <= unix_now().as_secs()) {
        return None; // That cycle is over: the balance has been renewed.
    }
    let cost = cost.unwrap_or(1.0).max(0.0);
    let (line, crosses) = project(cost, pending, last.remaining, floor, "last known balance");
    reporter.println(&line);
    if last.remaining.saturating_sub(cost.ceil() as i64) < floor {
        return Some(Halt::Reserve(format!(
            "reserve reached: the last known balance is {} and a call costs ~{cost:.0}, the reserve is {floor}; nothing was sent (after a top-up, run with --recheck-credits)",
            last.remaining
        )));
    }
    match crosses {
        Some(why) if !args.allow_partial => Some(Halt::Reserve(format!(
            "{why}; nothing was sent (use --allow-partial to run until the reserve)"
        ))),
        _ => None,
    }
}

/// The projected cost of `left` items at `cost` each, as the line to print,
/// and why it is refused when it would take `balance` below the reserve.
/// `what` names the balance ("balance", or "last known balance" when it
/// comes from the checkpoint).
fn project(cost: f64, left: u64, balance: i64, floor: i64, what: &str) -> (String, Option<String>) {
    let projected = (cost * left as f64).ceil() as i64;
    let line = format!(
        "batchrun: projected cost of the {left} remaining item(s): ~{projected} credits at ~{cost:.1}/item; {what} {balance}, reserve {floor}"
    );
    let crosses = (balance.saturating_sub(projected) < floor).then(|| {
        format!(
            "the remaining {left} item(s) would cost ~{projected} credits and take the {what} of {balance} below the reserve of {floor}"
        )
    });
    (line, crosses)
}

/// Whether `snap` is older news than `prev`: responses arrive out of order
/// with many workers, and within one billing cycle the one that saw less
/// spending was answered earlier. It must not roll the balance back.
fn older_than(snap: &CreditSnapshot, prev: Option<CreditSnapshot>) -> bool {
    prev.is_some_and(|p| p.renewal == snap.renewal && snap.used < p.used)
}

/// The Idempotency-Key of an item: stable across resumes (the job's nonce
/// and the line), new after `--retry-failed` re-opens it (the generation).
fn idempotency_key(prefix: &str, line: u64, generation: u32) -> String {
    if generation == 0 {
        format!("{prefix}-{line}")
    } else {
        format!("{prefix}-{line}-r{generation}")
    }
}

/// Starts the built-in sim in this process, mirroring the run's plan.
async fn start_sim(
    limit: Limit,
    concurrency: usize,
) -> anyhow::Result<(std::net::SocketAddr, tokio::task::JoinHandle<()>)> {
    let args = crate::sim::SimArgs {
        listen: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
        limit: Some(limit),
        concurrency: Some(concurrency),
        ..crate::sim::SimArgs::default()
    };
    crate::sim::spawn(args).await
}

/// Aborts a background task when dropped (the in-process sim).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cost_estimate_follows_credits_used() {
        let snap = |used, renewal| CreditSnapshot {
            remaining: 1000 - used,
            used,
            max: 1000,
            renewal: Some(renewal),
        };
        let mut c = CostEstimate::default();
        assert!(!c.known());
        assert_eq!(c.current(), 1.0, "unknown: one credit per item");
        c.observe(&snap(20, 7), true);
        assert!(!c.known(), "one response is only the base");
        c.observe(&snap(40, 7), true);
        assert_eq!(c.current(), 20.0);
        // Responses arriving out of order still count their charge.
        c.observe(&snap(80, 7), true);
        c.observe(&snap(60, 7), true);
        assert_eq!(c.current(), 20.0);
        // Older than the base: ignored.
        c.observe(&snap(0, 7), true);
        assert_eq!(c.current(), 20.0);
        // A new cycle (renewal moved, used back to 0): measure from there.
        c.observe(&snap(0, 8), false);
        c.observe(&snap(3, 8), true);
        assert_eq!(c.current(), 3.0);
    }

    #[test]
    fn an_out_of_order_response_is_older_news_only_within_a_cycle() {
        let snap = |used, renewal| CreditSnapshot {
            remaining: 100 - used,
            used,
            max: 100,
            renewal: Some(renewal),
        };
        assert!(!older_than(&snap(5, 1), None));
        assert!(older_than(&snap(5, 1), Some(snap(6, 1))));
        assert!(
            !older_than(&snap(6, 1), Some(snap(6, 1))),
            "a top-up keeps used"
        );
        assert!(!older_than(&snap(0, 2), Some(snap(6, 1))), "a new cycle");
    }

    #[test]
    fn the_projection_refuses_only_when_it_crosses_the_reserve() {
        let (line, crosses) = project(2.0, 10, 100, 80, "balance");
        assert!(line.contains("~20 credits"), "{line}");
        assert_eq!(crosses, None, "100 - 20 = 80 keeps the reserve");
        let (_, crosses) = project(2.0, 11, 100, 80, "last known balance");
        assert!(crosses.unwrap().contains("last known balance of 100"));
    }

    #[test]
    fn default_outputs_sit_beside_the_input() {
        assert_eq!(
            default_output(Path::new("/data/items.jsonl"), "results"),
            PathBuf::from("/data/items.results.jsonl")
        );
        assert_eq!(
            default_output(Path::new("items.csv"), "failures"),
            PathBuf::from("items.failures.jsonl")
        );
    }

    #[test]
    fn idempotency_keys_are_stable_until_a_retry_reopens_the_item() {
        assert_eq!(idempotency_key("batchrun-ab", 7, 0), "batchrun-ab-7");
        assert_eq!(
            idempotency_key("batchrun-ab", 7, 0),
            idempotency_key("batchrun-ab", 7, 0)
        );
        assert_eq!(idempotency_key("batchrun-ab", 7, 2), "batchrun-ab-7-r2");
    }

    #[test]
    fn the_key_never_shows_in_debug() {
        assert_eq!(format!("{:?}", Secret("sk_live_123".into())), "Secret(***)");
    }
}
