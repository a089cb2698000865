//! The worker pool: a fixed number of workers take items from one queue,
//! and for each call pass the gate, wait for the pacer, pass the reserve,
//! send, and act on what the response means.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::{mpsc, Mutex};
use tokio::time::Instant;

use super::events::Event;
use super::gate::{Gate, Halt, Pass};
pub use super::slots::Slots;
use super::watch::{Systemic, Verdict, Watch};
use crate::classify::{self, CallError};
use crate::credits::{self, Admit, InFlight, Ledger};
use crate::input::Item;
use crate::pace::{PaceError, Pacer, Permit};
use crate::rate::backoff::Backoff;
use crate::report::calls::Answer;
use crate::request::{FailureKind, Request, RequestSpec, Response, Transport};

/// The shortest pause a 429 causes, whatever its Retry-After says.
pub const MIN_PAUSE: Duration = Duration::from_secs(1);

/// How the pool treats each item.
#[derive(Debug, Clone)]
pub struct PoolConfig {
    /// How the job's Idempotency-Keys are made.
    pub keys: super::keys::KeyScheme,
    /// Calls per item for transient failures.
    pub max_attempts: u32,
    /// The pause of a rate-limit 429 without a usable Retry-After.
    pub default_pause: Duration,
    /// Backoff for transient failures.
    pub backoff: Backoff,
    /// Wait and probe instead of halting when credits run out.
    pub wait_for_credits: bool,
    /// How long nothing but rate-limit 429s may go on before the run halts.
    pub max_wait: Duration,
    /// One line per call (`-v`).
    pub verbose: bool,
}

/// Everything the workers share.
pub struct Pool {
    /// What to send.
    pub spec: Arc<RequestSpec>,
    /// How to send it.
    pub transport: Arc<dyn Transport>,
    /// When it may go.
    pub pacer: Arc<dyn Pacer>,
    /// Whether it may go at all.
    pub gate: Arc<Gate>,
    /// The balance and the reserve.
    pub ledger: Arc<Ledger>,
    /// Where the workers report.
    pub events: mpsc::UnboundedSender<Event>,
    /// The per-item policy.
    pub cfg: PoolConfig,
    /// Since when every answer has been a rate-limit 429, if so.
    pub limited_since: std::sync::Mutex<Option<Instant>>,
    /// Fail fast on a wrong job; bound the failures.
    pub watch: Watch,
    /// Calls in flight at once.
    pub slots: Slots,
}

/// The queue the feeder fills: items with their retry generation.
pub type Queue = Arc<Mutex<mpsc::Receiver<Queued>>>;

/// An item as the feeder queues it.
#[derive(Debug)]
pub struct Queued {
    /// The item.
    pub item: Item,
    /// Its retry generation: part of its Idempotency-Key.
    pub generation: u32,
    /// A call under this key, in an earlier run, may have run: the item's
    /// outcome stays unknown unless a call of this run gets a verdict.
    pub maybe_ran: bool,
}

/// What a response (or its absence) means for the item.
enum Outcome {
    Done(u16, String),
    /// A failure, and whether its cause is job-wide (a wrong URL).
    Error(CallError, Option<Systemic>),
    /// The reserve refused the rest of the job; the call itself may be done.
    Refused {
        done: Option<(u16, String)>,
        why: String,
    },
    /// This process ran out of file handles: the call never left.
    OutOfHandles,
}

/// One item's calls so far.
#[derive(Default)]
struct Tries {
    /// Calls that count against `--max-attempts`.
    n: u32,
    /// A call for it went out and got no verdict: it may have run.
    maybe_ran: bool,
}

/// Why a call is worth another try.
struct Why {
    reason: String,
    retry_after: Option<Duration>,
    /// The call may have run.
    unknown: bool,
}

/// What the worker does next with its item.
enum Next {
    Again,
    Finished,
}

impl Pool {
    fn emit(&self, ev: Event) {
        // The recording loop outlives every worker; a closed channel means
        // the run is being torn down, and there is nothing left to record.
        let _ = self.events.send(ev);
    }

    /// Records the outcomes the watch still holds: call once the pool is over.
    pub fn release_held(&self) {
        for e in self.watch.release() {
            self.emit(e);
        }
    }

    /// One worker: takes items until the queue closes or the run stops.
    pub async fn worker(self: Arc<Self>, queue: Queue) {
        loop {
            if self.gate.is_stopped() {
                return;
            }
            let item = {
                let mut q = queue.lock().await;
                tokio::select! {
                    it = q.recv() => it,
                    _ = self.gate.until_stopped() => None,
                }
            };
            let Some(queued) = item else {
                return;
            };
            self.process(queued).await;
        }
    }

    /// Drives one item until it is done, failed, or left pending by a stop.
    pub async fn process(self: &Arc<Self>, queued: Queued) {
        let Queued {
            item,
            generation,
            maybe_ran,
        } = queued;
        let req = match self.spec.render(&item) {
            Ok(r) => {
                let idem = self.cfg.keys.key(item.line, generation, &r);
                r.with_idempotency_key(&idem)
            }
            Err(reason) => {
                self.emit(Event::Failed {
                    line: item.line,
                    status: None,
                    reason,
                    attempts: 0,
                    unknown: false,
                    digest: item.digest(),
                });
                return;
            }
        };
        let mut tries = Tries { n: 0, maybe_ran };
        loop {
            let probing = match self.gate.pass().await {
                Pass::Run => false,
                Pass::Probe => true,
                Pass::Stop => return,
            };
            let slot = tokio::select! {
                s = self.slots.acquire() => s,
                _ = self.gate.until_stopped() => None,
            };
            let Some(slot) = slot else {
                if probing {
                    self.gate.release_probe();
                }
                return;
            };
            let Some(permit) = self.pace(probing).await else {
                return;
            };
            if !probing && !self.gate.is_running() {
                continue;
            }
            let Some(guard) = self.admit(probing).await else {
                if self.gate.is_stopped() {
                    return;
                }
                continue;
            };
            self.emit(Event::Sent);
            tries.n += 1;
            let outcome = self.call(&req, permit, guard).await;
            drop(slot);
            match self.react(outcome, &item, &req, &mut tries, probing).await {
                Next::Again => continue,
                Next::Finished => return,
            }
        }
    }

    /// Waits for the pacer. None when the run stopped first (or the pacer
    /// failed, which stops it).
    async fn pace(&self, probing: bool) -> Option<Permit> {
        let taken = tokio::select! {
            t = self.pacer.take() => t,
            _ = self.gate.until_stopped() => {
                if probing { self.gate.release_probe(); }
                return None;
            }
        };
        match taken {
            Ok(p) if !self.gate.is_stopped() => Some(p),
            Ok(_) => None,
            Err(e) => {
                self.gate.stop(unavailable(&e));
                None
            }
        }
    }

    /// Passes the reserve. None when the worker must look again (or stop).
    async fn admit(self: &Arc<Self>, probing: bool) -> Option<InFlight> {
        // Subscribed before asking, so a call that ends in between still
        // wakes this worker if it has to wait its turn.
        let mut turn = self.ledger.subscribe();
        match self.ledger.admit(probing) {
            Admit::Go(g) => Some(g),
            Admit::WaitForBalance => {
                tokio::select! {
                    _ = turn.changed() => {}
                    _ = self.gate.until_stopped() => {}
                }
                None
            }
            Admit::Refused(why) => {
                if self.cfg.wait_for_credits {
                    self.start_waiting(&why);
                } else {
                    self.gate.stop(Halt::Reserve(why));
                }
                None
            }
        }
    }

    /// Sends one call and reads what its response means.
    async fn call(&self, req: &Request, permit: Permit, guard: InFlight) -> Outcome {
        let sent = Instant::now();
        let result = self.transport.send(req).await;
        let latency = match &result {
            Err(e) if matches!(e.kind, FailureKind::Connect | FailureKind::Resources) => None,
            _ => Some(sent.elapsed()),
        };
        self.emit(Event::Answered(
            match &result {
                Ok(r) => Answer::Status(r.status),
                Err(e) => Answer::Failure(e.kind),
            },
            latency,
        ));
        if self.cfg.verbose {
            let url = match &self.spec.key {
                Some(k) => k.redact(&req.url),
                None => req.url.clone(),
            };
            let what = match &result {
                Ok(r) => format!("HTTP {}", r.status),
                Err(e) => e.reason.clone(),
            };
            self.emit(Event::Note(format!(
                "batchrun: {} {url} -> {what} in {} ms",
                req.method,
                sent.elapsed().as_millis()
            )));
        }
        let outcome = match result {
            Ok(resp) => {
                permit.complete(Instant::now());
                self.read(resp).await
            }
            Err(e) if e.kind == FailureKind::Resources => {
                drop(permit);
                Outcome::OutOfHandles
            }
            // No connection, so the server never saw the call: its place in
            // the window is free again, and a wrong host fails fast.
            Err(e) if e.kind == FailureKind::Connect => {
                drop(permit);
                Outcome::Error(classify::transport(&e), Some(Systemic::Connect(e.reason)))
            }
            Err(e) => {
                permit.complete(Instant::now());
                Outcome::Error(classify::transport(&e), None)
            }
        };
        // Only now is this call's charge visible in the balance the
        // reserve reads, so only now does it stop counting as in flight.
        drop(guard);
        outcome
    }

    async fn read(&self, resp: Response) -> Outcome {
        let Response {
            status,
            headers,
            body,
            truncated,
        } = resp;
        // A server may echo the key back (in an error, a debug field), even
        // JSON-escaped or cut by --max-body: it must never reach the
        // checkpoint, the outputs, a failure reason or the pause line.
        let body = match self
            .spec
            .key
            .as_ref()
            .and_then(|k| k.scrub(&body, truncated))
        {
            Some(clean) => clean,
            None => body,
        };
        let body = if truncated {
            truncated_body(&body)
        } else {
            body
        };
        if let Some(note) = self.pacer.observe(&headers).await {
            self.emit(Event::Pace(note));
        }
        let c = classify::classify(
            reqwest::StatusCode::from_u16(status).unwrap_or(reqwest::StatusCode::BAD_GATEWAY),
            &headers,
            &body,
            SystemTime::now(),
        );
        let c = match (c, &self.spec.key) {
            (Err(e), Some(k)) => Err(e.redacted(k)),
            (Err(e), None) => Err(e.kept_short()),
            (c, _) => c,
        };
        if !matches!(c, Err(CallError::RateLimited { .. })) {
            *self.limited_since.lock().unwrap_or_else(|p| p.into_inner()) = None;
        }
        let charged = !matches!(c, Err(CallError::CreditsExhausted { .. }));
        let seen =
            self.ledger
                .observe(credits::snapshot_from_headers(&headers), c.is_ok(), charged);
        if let Some(s) = seen.newer {
            self.emit(Event::Credits(s));
        }
        if let Some(line) = seen.note {
            self.emit(Event::Note(line));
        }
        if let Some(a) = seen.alert {
            self.emit(Event::Alert(a));
        }
        match (c, seen.refusal) {
            (c, Some(why)) => Outcome::Refused {
                done: c.ok().map(|()| (status, body)),
                why,
            },
            (Ok(()), None) => Outcome::Done(status, body),
            (Err(e), None) => {
                let systemic = matches!(status, 404 | 405).then_some(Systemic::Status(status));
                Outcome::Error(e, systemic)
            }
        }
    }

    /// Acts on one call's outcome.
    async fn react(
        &self,
        outcome: Outcome,
        item: &Item,
        req: &Request,
        tries: &mut Tries,
        probing: bool,
    ) -> Next {
        let (err, systemic) = match outcome {
            Outcome::Done(status, body) => {
                let done = self.done_event(item, status, body, tries.n);
                self.settle(None, Some(done), req);
                if probing {
                    self.probe_succeeded();
                }
                return Next::Finished;
            }
            Outcome::Refused { done, why } => {
                if let Some((status, body)) = done {
                    let done = self.done_event(item, status, body, tries.n);
                    self.settle(None, Some(done), req);
                }
                self.gate.stop(Halt::Reserve(why));
                return Next::Finished;
            }
            Outcome::Error(e, systemic) => (e, systemic),
            Outcome::OutOfHandles => {
                if probing {
                    self.gate.release_probe();
                }
                tries.n -= 1;
                return self.out_of_handles().await;
            }
        };
        // Whatever went wrong, a probe that did not find credits gone must
        // not hold the probe: the next waiting worker takes it.
        if probing
            && !matches!(
                err,
                CallError::CreditsExhausted { .. } | CallError::Auth { .. }
            )
        {
            self.gate.release_probe();
        }
        match err {
            CallError::RateLimited {
                retry_after,
                message,
            } => {
                tries.n -= 1;
                self.rate_limited(retry_after, message).await
            }
            CallError::Concurrency { retry_after } => {
                tries.n -= 1;
                self.concurrency_limited(retry_after).await
            }
            CallError::CreditsExhausted { .. } => {
                tries.n -= 1;
                self.exhausted(probing)
            }
            CallError::Auth { status } => {
                self.gate.stop(Halt::Auth(status));
                Next::Finished
            }
            CallError::Permanent { status, reason } => {
                let failed = Event::Failed {
                    line: item.line,
                    status: Some(status),
                    reason: format!("HTTP {status}: {reason}"),
                    attempts: tries.n,
                    unknown: false,
                    digest: item.digest(),
                };
                self.settle(systemic, Some(failed), req);
                Next::Finished
            }
            CallError::Transient {
                reason,
                retry_after,
                unknown,
            } => {
                let why = Why {
                    reason,
                    retry_after,
                    unknown,
                };
                self.transient(item, req, tries, why, systemic).await
            }
        }
    }

    /// A rate-limit 429: every worker pauses; the item goes again after.
    async fn rate_limited(&self, retry_after: Option<Duration>, message: Option<String>) -> Next {
        if self.stalled() {
            return Next::Finished;
        }
        // A zero Retry-After would turn the pause into a hot loop.
        let pause = retry_after.unwrap_or(self.cfg.default_pause).max(MIN_PAUSE);
        if let Err(e) = self.pacer.pause(pause).await {
            self.gate.stop(unavailable(&e));
            return Next::Finished;
        }
        self.emit(Event::RateLimited {
            pause,
            concurrency: false,
            message,
        });
        Next::Again
    }

    /// The server allows fewer calls in flight than the pool has workers:
    /// fewer go from now on; the window is not paused.
    async fn concurrency_limited(&self, retry_after: Option<Duration>) -> Next {
        if let Some(n) = self.slots.lower() {
            self.emit(Event::Note(format!(
                "batchrun: the server's concurrency ceiling was reached (429 with x-concurrency-limit): at most {n} calls in flight from now on"
            )));
        }
        let pause = retry_after.unwrap_or(Duration::from_secs(1)).max(MIN_PAUSE);
        self.emit(Event::RateLimited {
            pause,
            concurrency: true,
            message: None,
        });
        self.again_after(pause).await
    }

    /// Too many connections for this process's file handles: fewer calls in
    /// flight from now on, and the item goes again. Neither the item nor the
    /// job is at fault, so no attempt is spent and nothing is failed.
    async fn out_of_handles(&self) -> Next {
        if let Some(n) = self.slots.lower() {
            if !self
                .slots
                .noted_handles
                .swap(true, std::sync::atomic::Ordering::Relaxed)
            {
                self.emit(Event::Note(format!(
                    "batchrun: out of file handles (EMFILE): lowering the calls in flight \
                     (now {n}); raise `ulimit -n` or lower --concurrency"
                )));
            }
        }
        let wait = Duration::from_millis(fastrand::u64(50..=250));
        self.again_after(wait).await
    }

    /// A transient failure: retried with backoff (under the same key) until
    /// the attempts run out.
    async fn transient(
        &self,
        item: &Item,
        req: &Request,
        tries: &mut Tries,
        why: Why,
        systemic: Option<Systemic>,
    ) -> Next {
        let Why {
            reason,
            retry_after,
            unknown,
        } = why;
        // Once any call for the item may have run, the item's outcome stays
        // unknown: a later 503 does not prove the earlier call did not run.
        tries.maybe_ran |= unknown;
        let (attempts, unknown) = (tries.n, tries.maybe_ran);
        let last = attempts >= self.cfg.max_attempts;
        let failed = last.then(|| Event::Failed {
            line: item.line,
            status: None,
            reason: match unknown {
                true => format!(
                    "outcome unknown: {reason} (gave up after {attempts} attempts; the call may \
                     have run, so --retry-failed sends it again under the same Idempotency-Key)"
                ),
                false => format!("{reason} (gave up after {attempts} attempts)"),
            },
            attempts,
            unknown,
            digest: item.digest(),
        });
        if !self.settle(systemic, failed, req) || last {
            return Next::Finished;
        }
        self.emit(Event::Retry);
        let wait = self
            .cfg
            .backoff
            .wait(attempts, retry_after, fastrand::f64());
        self.again_after(wait).await
    }

    /// A server that answers nothing but rate limits would keep the run
    /// waiting forever: past `max_wait` of it, halt resumably.
    fn stalled(&self) -> bool {
        let now = Instant::now();
        let since = *self
            .limited_since
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert(now);
        let for_ = now - since;
        if for_ >= self.cfg.max_wait {
            self.gate.stop(Halt::Stalled(for_));
            return true;
        }
        false
    }

    fn exhausted(&self, probing: bool) -> Next {
        if !self.cfg.wait_for_credits {
            self.gate.stop(Halt::Exhausted);
            return Next::Finished;
        }
        if probing {
            self.gate.probe_failed();
        } else {
            self.start_waiting("credits exhausted");
        }
        Next::Again
    }

    async fn again_after(&self, d: Duration) -> Next {
        if self.gate.sleep(d).await {
            Next::Again
        } else {
            Next::Finished
        }
    }

    /// Credits are out (or the reserve reached) and the run waits for them.
    /// Alerts once per waiting spell.
    fn start_waiting(&self, why: &str) {
        if self.gate.start_waiting() {
            let last = self.ledger.last();
            self.emit(Event::Alert(credits::Alert::new(
                credits::AlertKind::Waiting,
                "waiting",
                format!(
                    "{why} ({}); waiting for credits, probing every {}",
                    credits::describe_renewal(last.and_then(|s| s.renewal)),
                    humantime::format_duration(self.gate.probe_every())
                ),
                last,
            )));
        }
    }

    /// The probe went through: resume everyone, unless the reserve still
    /// has no room, in which case keep waiting.
    fn probe_succeeded(&self) {
        if !self.ledger.has_room() {
            self.gate.probe_failed();
            return;
        }
        if self.gate.probe_succeeded() {
            self.emit(Event::Alert(credits::Alert::new(
                credits::AlertKind::Resumed,
                "resumed",
                "credits are back: resuming the run",
                self.ledger.last(),
            )));
        }
    }

    fn done_event(&self, item: &Item, status: u16, body: String, attempts: u32) -> Event {
        Event::Done {
            line: item.line,
            status,
            body: body.into_bytes(),
            attempts,
            digest: item.digest(),
        }
    }

    /// Passes one call's outcome through the watch. False when the run
    /// halted on it (nothing is recorded then: the item stays pending).
    fn settle(&self, systemic: Option<Systemic>, event: Option<Event>, req: &Request) -> bool {
        // Only a halt names the URL: no copy of it for every call.
        let url = || match &self.spec.key {
            Some(k) => k.redact(&req.url),
            None => req.url.clone(),
        };
        match self.watch.outcome(systemic, event, url) {
            Verdict::Record(events) => {
                for e in events {
                    self.emit(e);
                }
                true
            }
            Verdict::Halt(why) => {
                self.gate.stop(Halt::Systemic(why));
                false
            }
        }
    }
}

/// What is kept of a body cut at `--max-body`: its beginning, and a mark
/// that says so, as one JSON object in place of the body.
fn truncated_body(kept: &str) -> String {
    serde_json::json!({
        "batchrun_truncated": true,
        "bytes_kept": kept.len(),
        "head": kept,
    })
    .to_string()
}

/// The halt of a pacer that cannot hand out permits: resumable, since the
/// items stay pending and nothing went out without a slot.
fn unavailable(e: &PaceError) -> Halt {
    Halt::PacerUnavailable(format!(
        "{e}; the checkpoint is saved: run the same command to resume"
    ))
}
