//! The worker pool: a fixed number of workers take items from one queue,
//! and for each call pass the gate, wait for the pacer, pass the reserve,
//! send, and act on what the response means.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::{mpsc, Mutex};
use tokio::time::Instant;

use super::events::Event;
use super::gate::{Gate, Halt, Pass};
use crate::classify::{self, CallError};
use crate::credits::{self, Admit, InFlight, Ledger};
use crate::input::Item;
use crate::pace::{Pacer, Permit};
use crate::rate::backoff::Backoff;
use crate::request::{Request, RequestSpec, Response, Transport, TransportError};

/// The shortest pause a 429 causes, whatever its Retry-After says.
pub const MIN_PAUSE: Duration = Duration::from_secs(1);

/// How the pool treats each item.
#[derive(Debug, Clone)]
pub struct PoolConfig {
    /// The job's Idempotency-Key prefix.
    pub idem_prefix: String,
    /// Calls per item for transient failures.
    pub max_attempts: u32,
    /// The pause of a rate-limit 429 without a usable Retry-After.
    pub default_pause: Duration,
    /// Backoff for transient failures.
    pub backoff: Backoff,
    /// Wait and probe instead of halting when credits run out.
    pub wait_for_credits: bool,
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
    pub gate: Gate,
    /// The balance and the reserve.
    pub ledger: Arc<Ledger>,
    /// Where the workers report.
    pub events: mpsc::UnboundedSender<Event>,
    /// The per-item policy.
    pub cfg: PoolConfig,
}

/// The queue the feeder fills: items with their retry generation.
pub type Queue = Arc<Mutex<mpsc::Receiver<(Item, u32)>>>;

/// What a response (or its absence) means for the item.
enum Outcome {
    Done(u16, String),
    Error(CallError),
    /// The reserve refused the rest of the job; the call itself may be done.
    Refused {
        done: Option<(u16, String)>,
        why: String,
    },
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
            let Some((item, generation)) = item else {
                return;
            };
            self.process(item, generation).await;
        }
    }

    /// Drives one item until it is done, failed, or left pending by a stop.
    pub async fn process(self: &Arc<Self>, item: Item, generation: u32) {
        let idem = idempotency_key(&self.cfg.idem_prefix, item.line, generation);
        let req = match self.spec.render(&item) {
            Ok(r) => r.with_idempotency_key(&idem),
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
            let probing = match self.gate.pass().await {
                Pass::Run => false,
                Pass::Probe => true,
                Pass::Stop => return,
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
            attempts += 1;
            let outcome = self.call(&req, permit, guard).await;
            match self.react(outcome, &item, &mut attempts, probing).await {
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
                self.gate.stop(Halt::Internal(format!(
                    "{e}; the checkpoint is saved: run the same command to resume"
                )));
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
        let result = self.transport.send(req).await;
        permit.complete(Instant::now());
        let outcome = match result {
            Ok(resp) => self.read(resp).await,
            Err(e) => Outcome::Error(transport_error(&e)),
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
        } = resp;
        if let Some(note) = self.pacer.observe(&headers).await {
            self.emit(Event::Pace(note));
        }
        let c = classify::classify(
            reqwest::StatusCode::from_u16(status).unwrap_or(reqwest::StatusCode::BAD_GATEWAY),
            &headers,
            &body,
            SystemTime::now(),
        );
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
            (Err(e), None) => Outcome::Error(e),
        }
    }

    /// Acts on one call's outcome.
    async fn react(
        &self,
        outcome: Outcome,
        item: &Item,
        attempts: &mut u32,
        probing: bool,
    ) -> Next {
        let err = match outcome {
            Outcome::Done(status, body) => {
                self.record_done(item, status, &body, *attempts);
                if probing {
                    self.probe_succeeded();
                }
                return Next::Finished;
            }
            Outcome::Refused { done, why } => {
                if let Some((status, body)) = done {
                    self.record_done(item, status, &body, *attempts);
                }
                self.gate.stop(Halt::Reserve(why));
                return Next::Finished;
            }
            Outcome::Error(e) => e,
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
            CallError::RateLimited { retry_after } => {
                *attempts -= 1;
                // A zero Retry-After would turn the pause into a hot loop.
                let pause = retry_after.unwrap_or(self.cfg.default_pause).max(MIN_PAUSE);
                if let Err(e) = self.pacer.pause(pause).await {
                    self.gate.stop(Halt::Internal(e.to_string()));
                    return Next::Finished;
                }
                self.emit(Event::RateLimited {
                    pause,
                    concurrency: false,
                });
                Next::Again
            }
            CallError::Concurrency { retry_after } => {
                *attempts -= 1;
                let pause = retry_after.unwrap_or(Duration::from_secs(1)).max(MIN_PAUSE);
                self.emit(Event::RateLimited {
                    pause,
                    concurrency: true,
                });
                self.again_after(pause).await
            }
            CallError::CreditsExhausted { .. } => {
                *attempts -= 1;
                self.exhausted(probing)
            }
            CallError::Auth { status } => {
                self.gate.stop(Halt::Auth(status));
                Next::Finished
            }
            CallError::Permanent { status, reason } => {
                self.emit(Event::Failed {
                    line: item.line,
                    status: Some(status),
                    reason: format!("HTTP {status}: {reason}"),
                    attempts: *attempts,
                });
                Next::Finished
            }
            CallError::Transient {
                reason,
                retry_after,
            } => self.transient(item, *attempts, reason, retry_after).await,
        }
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

    async fn transient(
        &self,
        item: &Item,
        attempts: u32,
        reason: String,
        retry_after: Option<Duration>,
    ) -> Next {
        if attempts >= self.cfg.max_attempts {
            self.emit(Event::Failed {
                line: item.line,
                status: None,
                reason: format!("{reason} (gave up after {attempts} attempts)"),
                attempts,
            });
            return Next::Finished;
        }
        self.emit(Event::Retry);
        let wait = self
            .cfg
            .backoff
            .wait(attempts, retry_after, fastrand::f64());
        self.again_after(wait).await
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

    fn record_done(&self, item: &Item, status: u16, body: &str, attempts: u32) {
        self.emit(Event::Done {
            line: item.line,
            status,
            body: body.as_bytes().to_vec(),
            attempts,
        });
    }
}

fn transport_error(e: &TransportError) -> CallError {
    classify::transport(e)
}

/// The Idempotency-Key of an item: stable across resumes (the job's
/// prefix and the line), new after `--retry-failed` re-opens it (the
/// generation).
pub fn idempotency_key(prefix: &str, line: u64, generation: u32) -> String {
    if generation == 0 {
        format!("{prefix}-{line}")
    } else {
        format!("{prefix}-{line}-r{generation}")
    }
}
