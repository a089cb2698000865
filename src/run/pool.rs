//! The worker pool: a fixed number of workers take items from one queue,
//! and for each call pass the gate, wait for the pacer, pass the reserve,
//! send, and read what the response means; `run/react.rs` acts on it.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::{mpsc, Mutex};
use tokio::time::Instant;

use super::events::Event;
use super::gate::{Gate, Halt, Pass};
use super::react::{Next, Outcome, Tries};
pub use super::slots::Slots;
use super::watch::{Systemic, Watch};
use crate::classify::{self, CallError};
use crate::credits::{self, Admit, InFlight, Ledger};
use crate::input::Item;
use crate::pace::{PaceError, Pacer, Permit};
use crate::rate::backoff::Backoff;
use crate::report::calls::Answer;
use crate::request::RequestSpec;
use crate::transport::{FailureKind, Request, Response, Transport};

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

impl Pool {
    pub(super) fn emit(&self, ev: Event) {
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
            self.spec.key.as_ref(),
        );
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
pub(super) fn unavailable(e: &PaceError) -> Halt {
    Halt::PacerUnavailable(format!(
        "{e}; the checkpoint is saved: run the same command to resume"
    ))
}
