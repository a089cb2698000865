//! What each call's outcome means for its item and for the run: done,
//! failed, retried under the same key, paused, or the run stopped. The
//! pool ([`super::pool`]) makes the calls; this is where it acts on them.

use std::time::Duration;

use tokio::time::Instant;

use super::events::Event;
use super::gate::Halt;
use super::pool::{unavailable, Pool, MIN_PAUSE};
use super::watch::{Systemic, Verdict};
use crate::classify::CallError;
use crate::credits;
use crate::input::Item;
use crate::transport::Request;

/// What a response (or its absence) means for the item.
pub(super) enum Outcome {
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
pub(super) struct Tries {
    /// Calls that count against `--max-attempts`.
    pub(super) n: u32,
    /// A call for it went out and got no verdict: it may have run.
    pub(super) maybe_ran: bool,
}

/// Why a call is worth another try.
pub(super) struct Why {
    pub(super) reason: String,
    pub(super) retry_after: Option<Duration>,
    /// The call may have run.
    pub(super) unknown: bool,
}

/// What the worker does next with its item.
pub(super) enum Next {
    Again,
    Finished,
}

impl Pool {
    /// Acts on one call's outcome.
    pub(super) async fn react(
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
    pub(super) fn start_waiting(&self, why: &str) {
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

    pub(super) fn done_event(
        &self,
        item: &Item,
        status: u16,
        body: String,
        attempts: u32,
    ) -> Event {
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
