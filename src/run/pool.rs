//! The worker pool: a fixed number of workers take items from one queue,
//! and for each call pass the gate, wait for the pacer, pass the reserve,
//! send, and read what the response means; `run/react.rs` decides what
//! that means, and the pool carries it out.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, Mutex};
use tokio::time::Instant;

use super::events::Event;
use super::gate::{Gate, Halt, Pass};
use super::keys::At;
use super::react::{react, Action, Call, Outcome, Policy, Tries};
use super::slots::Slot;
pub use super::slots::Slots;
use super::watch::{Systemic, Verdict, Watch};
use crate::classify::CallError;
use crate::credits::{InFlight, Ledger};
use crate::input::Item;
use crate::pace::{Pacer, Permit, Weight};
use crate::report::calls::CallId;
use crate::request::{Body, RequestSpec};
use crate::transport::{Request, Transport};

/// How the pool treats each item.
#[derive(Debug, Clone)]
pub struct PoolConfig {
    /// How the job's Idempotency-Keys are made.
    pub keys: super::keys::KeyScheme,
    /// What a failed call leads to.
    pub policy: Policy,
    /// One line per call (`-v`).
    pub verbose: bool,
    /// What a call costs against token policies (`--cost`, `--usage`).
    pub cost: Option<Arc<crate::cost::Costing>>,
    /// The most of a response body kept per item (`--max-body`).
    pub max_body: usize,
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
    /// A call of this run has succeeded (the key works).
    pub got_through: std::sync::atomic::AtomicBool,
    /// 401s in a row since the last call that got through.
    pub refusals_in_a_row: std::sync::atomic::AtomicU32,
    /// Items set aside for a refusal before any call got through (at most
    /// [`DEFERRABLE`] a run: one more such refusal is the key's).
    pub deferred: std::sync::atomic::AtomicU32,
    /// A retry's long wait that the server asked for was said (once a
    /// run).
    pub long_wait_said: std::sync::atomic::AtomicBool,
    /// A response held the key's text, and the results hold `***` in its
    /// place: said once a run.
    pub scrub_said: std::sync::atomic::AtomicBool,
    /// Fail fast on a wrong job; bound the failures.
    pub watch: Watch,
    /// Calls in flight at once.
    pub slots: Arc<Slots>,
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
    /// Earlier lines of the input with the same content: part of its key
    /// when keys follow content (see `run/keys.rs`).
    pub repeat: u32,
    /// The block of the input its batch is formed from, under `--batch`
    /// (see [`super::batch::Blocks`]).
    pub block: u64,
}

/// How many items a run sets aside for a 403 (or another refusal) before
/// any call got through, to tell an item's refusal from the key's: the
/// next refused then is the key's. Three items refused alike and no call
/// through is a key's refusal; one was not enough where the first two
/// items of a queue are refused (a cron job's key halted as rejected
/// every night, the same two items going first each time).
pub const DEFERRABLE: u32 = 3;

/// How many items are set aside for a refusal of `status` first: a 401
/// is the credentials' (one, as ever; a 403 may be an item's).
fn deferrable(status: u16) -> u32 {
    match status {
        401 => 1,
        _ => DEFERRABLE,
    }
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

    /// Readies one item from the queue and drives it (see [`Pool::drive`]).
    pub(super) async fn process(self: &Arc<Self>, queued: Queued) -> Left {
        let Some(req) = self.render(&queued.item, queued.generation, queued.repeat) else {
            return Left::Over;
        };
        // Before any slot or probe is held: an item whose cost cannot be
        // read fails with nothing to give back.
        let weight = match self.weigh(&queued.item, &req) {
            Ok(w) => w,
            Err(reason) => {
                self.fail_unsent(&queued.item, reason);
                return Left::Over;
            }
        };
        let tries = Tries {
            n: 0,
            maybe_ran: queued.maybe_ran,
        };
        self.drive(Going {
            queued,
            req,
            weight,
            tries,
        })
        .await
    }

    /// Drives one item until it is done, failed, left pending by a stop,
    /// or set aside: for a refusal ([`Action::Defer`]) or for a long wait
    /// the server asked for ([`Left::Later`]).
    pub(super) async fn drive(self: &Arc<Self>, going: Going) -> Left {
        let Going {
            queued,
            req,
            weight,
            mut tries,
        } = going;
        let item = &queued.item;
        loop {
            if let Some(reason) = self.over_stated(item, weight, &tries) {
                self.fail_refused_every_time(item, reason, tries.n);
                return Left::Over;
            }
            let Cleared {
                probing,
                slot,
                permit,
                guard,
            } = match self.clear(weight, 1).await {
                Clearance::Go(c) => c,
                Clearance::Again => continue,
                Clearance::Stop => return Left::Over,
            };
            // A retry counts when it goes (a run stopped during its
            // backoff sent none): an attempt before this one failed.
            if tries.n > 0 {
                self.emit(Event::Retry);
            }
            self.emit(Event::Sent);
            tries.n += 1;
            let id = CallId {
                line: item.line,
                attempt: tries.n,
            };
            let outcome = self.call(&req, permit, guard, id, None).await;
            drop(slot);
            match self.act(outcome, item, &req, &mut tries, probing).await {
                Turn::Next(Next::Again) => continue,
                Turn::Next(Next::Finished) => return Left::Over,
                Turn::Next(Next::Defer) => {
                    let maybe_ran = tries.maybe_ran;
                    return Left::Defer(Queued {
                        maybe_ran,
                        ..queued
                    });
                }
                Turn::Later(at) => {
                    let going = Box::new(Going {
                        queued,
                        req,
                        weight,
                        tries,
                    });
                    return Left::Later { at, going };
                }
            }
        }
    }

    /// The item's request under its Idempotency-Key; an item that cannot
    /// be rendered is failed with the reason, and None.
    fn render(&self, item: &Item, generation: u32, repeat: u32) -> Option<Request> {
        match self.spec.render(item) {
            Ok(r) => {
                let idem = self.cfg.keys.key(At::of(item, repeat), generation, &r);
                Some(r.with_idempotency_key(&idem))
            }
            Err(reason) => {
                self.fail_unsent(item, reason);
                None
            }
        }
    }

    /// The item could not be made into a call (its request, its cost): it
    /// fails with the reason, nothing sent.
    fn fail_unsent(&self, item: &Item, reason: String) {
        self.emit(Event::Failed {
            line: item.line,
            status: None,
            reason,
            attempts: 0,
            unknown: false,
            digest: item.digest(),
        });
    }

    /// Why the item's call is heavier than a token policy the server
    /// stated admits at once (learnt from an answer, maybe this item's own
    /// 429), so that it is refused every time: failed rather than sent
    /// again until `--max-wait`. Never for a call that may have run.
    /// Not for an estimate `--cost` did not give: a server may state
    /// quotas that do not count a call's `max_tokens` (Anthropic's input
    /// tokens), read here as one quota of tokens.
    fn over_stated(&self, item: &Item, weight: Weight, tries: &Tries) -> Option<String> {
        let cost = self.cfg.cost.as_ref().filter(|c| !c.guessed())?;
        let (most, name) = self.pacer.most_stated_tokens()?;
        (weight.tokens.total > most && !tries.maybe_ran).then(|| {
            let what = format!("the server's limit {name}");
            cost.too_heavy(item, weight.tokens.total, most, &what)
        })
    }

    /// Fails the item with `reason` after `attempts` calls, each refused
    /// (nothing ran).
    fn fail_refused_every_time(&self, item: &Item, reason: String, attempts: u32) {
        self.emit(Event::Failed {
            line: item.line,
            status: None,
            reason,
            attempts,
            unknown: false,
            digest: item.digest(),
        });
    }

    /// What the item's call (`req`, rendered) weighs: one call, and its
    /// estimate in tokens.
    pub(super) fn weigh(&self, item: &Item, req: &Request) -> Result<Weight, String> {
        let Some(c) = &self.cfg.cost else {
            return Ok(Weight::default());
        };
        // A `--body` rendered holds the request (read again only for a
        // guess, which reads the request); otherwise the item is it.
        let rendered = match (&self.spec.body, &req.body) {
            (Body::Template(_), Some(b)) if c.guessed() => serde_json::from_slice(b).ok(),
            _ => None,
        };
        let tokens = c.estimate(item, rendered.as_ref())?;
        Ok(Weight { calls: 1, tokens })
    }

    /// Acts on one call's outcome: [`react`] decides, this carries it out.
    async fn act(
        &self,
        outcome: Outcome,
        item: &Item,
        req: &Request,
        tries: &mut Tries,
        probing: bool,
    ) -> Turn {
        let limited_since = *self.limited_since.lock().unwrap_or_else(|p| p.into_inner());
        let got_through = self.got_through.load(std::sync::atomic::Ordering::Relaxed);
        // Items are set aside a few a run, claimed here: one more refusal
        // before any call got through is the key's.
        let may_defer = !probing
            && !got_through
            && match &outcome {
                Outcome::Error(CallError::Refused { status, .. }, _) => {
                    let set_aside = self
                        .deferred
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    set_aside < deferrable(*status)
                }
                _ => false,
            };
        let call = Call {
            item,
            tries: *tries,
            probing,
            limited_for: limited_since.map(|since| Instant::now() - since),
            jitter: fastrand::f64(),
            got_through,
            may_defer,
            refusals_in_a_row: self
                .refusals_in_a_row
                .load(std::sync::atomic::Ordering::Relaxed),
        };
        let reaction = react(outcome, call, &self.cfg.policy);
        *tries = reaction.tries;
        if reaction.release_probe {
            self.gate.release_probe();
        }
        match reaction.action {
            Action::Retry {
                after,
                systemic,
                asked,
                later: true,
            } => match self.retrying(systemic, asked, req) {
                true => Turn::Later(Instant::now() + after),
                false => Turn::Next(Next::Finished),
            },
            action => Turn::Next(self.follow(action, req).await),
        }
    }

    /// Carries out what [`react`] decided for the call `req`.
    pub(super) async fn follow(&self, action: Action, req: &Request) -> Next {
        match action {
            Action::Record { event, systemic } => {
                self.settle(systemic, Some(event), req);
                Next::Finished
            }
            Action::ProbeDone(event) => {
                self.settle(None, Some(event), req);
                self.probe_succeeded();
                Next::Finished
            }
            Action::Stop { record, halt } => {
                if let Some(event) = record {
                    self.settle(None, Some(event), req);
                }
                self.gate.stop(halt);
                Next::Finished
            }
            // A batch waits in its worker even when `later` says the item
            // may be set aside: its items go again together.
            Action::Retry {
                after,
                systemic,
                asked,
                ..
            } => match self.retrying(systemic, asked, req) {
                true => self.again_after(after).await,
                false => Next::Finished,
            },
            Action::Pause { pause, message } => self.pause(pause, message, false).await,
            Action::Hold { pause, message } => self.pause(pause, message, true).await,
            Action::FewerInFlight(after) => {
                self.limited_since
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get_or_insert_with(Instant::now);
                if let Some(n) = self.slots.lower() {
                    self.emit(Event::Note(format!(
                        "batchrun: the server's concurrency ceiling was reached (429 with x-concurrency-limit): at most {n} calls in flight from now on"
                    )));
                }
                self.emit(Event::RateLimited {
                    pause: after,
                    concurrency: true,
                    message: None,
                });
                self.again_after(after).await
            }
            Action::OutOfHandles(after) => {
                self.out_of_handles();
                self.again_after(after).await
            }
            Action::WaitForCredits { probe_failed } => {
                match probe_failed {
                    true => self.gate.probe_failed(),
                    false => self.start_waiting("credits exhausted"),
                }
                Next::Again
            }
            Action::Defer => {
                self.emit(Event::Note(
                    "batchrun: the first answer refused its item: sending the next item to tell the key's refusal from the item's".to_string(),
                ));
                Next::Defer
            }
        }
    }

    /// Tells the watch of a call to be retried, and says the server's long
    /// wait (once a run, so a long silence is explained). False when the
    /// watch halted the run on it.
    fn retrying(&self, systemic: Option<Systemic>, asked: Option<String>, req: &Request) -> bool {
        if !self.settle(systemic, None, req) {
            return false;
        }
        if let Some(asked) = asked.filter(|_| {
            !self
                .long_wait_said
                .swap(true, std::sync::atomic::Ordering::Relaxed)
        }) {
            self.emit(Event::Note(asked));
        }
        true
    }

    /// A window 429: every worker pauses, and the time since the first of
    /// an unbroken run of them is kept (past `--max-wait` the run halts).
    /// `hold`: a wait that teaches the pacer nothing (a quota waited for, a
    /// batch item's own 429).
    async fn pause(&self, pause: Duration, message: Option<String>, hold: bool) -> Next {
        self.limited_since
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert_with(Instant::now);
        let paused = match hold {
            true => self.pacer.hold(pause).await,
            false => self.pacer.pause(pause).await,
        };
        if let Err(e) = paused {
            self.gate.stop(Halt::of_pace_error(&e));
            return Next::Finished;
        }
        self.emit(Event::RateLimited {
            pause,
            concurrency: false,
            message,
        });
        Next::Again
    }

    /// Too many connections for this process's file handles: fewer calls in
    /// flight from now on, said once.
    fn out_of_handles(&self) {
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
    }

    pub(super) async fn again_after(&self, d: Duration) -> Next {
        if self.gate.sleep(d).await {
            Next::Again
        } else {
            Next::Finished
        }
    }

    /// Passes one call's outcome through the watch. False when the run
    /// halted on it (nothing is recorded then: the item stays pending).
    pub(super) fn settle(
        &self,
        systemic: Option<Systemic>,
        event: Option<Event>,
        req: &Request,
    ) -> bool {
        // Only a halt names the URL: no copy of it for every call.
        let url = || match &self.spec.key {
            Some(k) => k.redact(&req.url),
            None => req.url.clone(),
        };
        let verdict = self.watch.outcome(systemic, event, url);
        self.carry_out(verdict)
    }

    /// Records what the watch lets through; false when it halts the run.
    pub(super) fn carry_out(&self, verdict: Verdict) -> bool {
        match verdict {
            Verdict::Record(events) => {
                for e in events {
                    self.emit(e);
                }
                true
            }
            Verdict::Halt { record, why } => {
                for e in record {
                    self.emit(e);
                }
                self.gate.stop(Halt::Systemic(why));
                false
            }
        }
    }

    /// Waits until a call of `weight` carrying `items` items may go: past
    /// the gate (a probe while it is paused), a slot of the pool, the
    /// pacer and the credits' admission, in that order. [`Clearance::Again`]
    /// when the gate closed meanwhile or admission said wait: the caller
    /// checks what it must (a stated limit may have changed) and asks again.
    pub(super) async fn clear(self: &Arc<Self>, weight: Weight, items: u64) -> Clearance<'_> {
        let probing = match self.gate.pass().await {
            Pass::Run => false,
            Pass::Probe => true,
            Pass::Stop => return Clearance::Stop,
        };
        let slot = tokio::select! {
            s = self.slots.acquire() => s,
            _ = self.gate.until_stopped() => None,
        };
        let Some(slot) = slot else {
            if probing {
                self.gate.release_probe();
            }
            return Clearance::Stop;
        };
        let Some(permit) = self.pace(probing, weight).await else {
            return Clearance::Stop;
        };
        if !probing && !self.gate.is_running() {
            return Clearance::Again;
        }
        match self.admit(probing, items).await {
            Some(guard) => Clearance::Go(Cleared {
                probing,
                slot,
                permit,
                guard,
            }),
            None if self.gate.is_stopped() => Clearance::Stop,
            None => Clearance::Again,
        }
    }

    /// Waits for the pacer, for a call that weighs `weight` (more than one
    /// call for a batch under `--batch-weight items`). None when the run
    /// stopped first (or the pacer failed, which stops it).
    pub(super) async fn pace(&self, probing: bool, weight: Weight) -> Option<Permit> {
        let taken = tokio::select! {
            t = self.pacer.take_weighted(weight) => t,
            _ = self.gate.until_stopped() => {
                if probing { self.gate.release_probe(); }
                return None;
            }
        };
        match taken {
            Ok(p) if !self.gate.is_stopped() => Some(p),
            Ok(_) => None,
            Err(e) => {
                self.gate.stop(Halt::of_pace_error(&e));
                None
            }
        }
    }
}

/// What [`Pool::clear`] found.
pub(super) enum Clearance<'a> {
    /// The call may go.
    Go(Cleared<'a>),
    /// Not yet: ask again.
    Again,
    /// The run stopped.
    Stop,
}

/// A call cleared to go: what it holds while it is out.
pub(super) struct Cleared<'a> {
    /// Whether it is the probe of a paused run.
    pub(super) probing: bool,
    /// Its place in the pool, given back once answered.
    pub(super) slot: Slot<'a>,
    /// The pacer's grant.
    pub(super) permit: Permit,
    /// Its share of the credits in flight.
    pub(super) guard: InFlight,
}

/// Where an item stands when its worker lets go of it.
pub(super) enum Left {
    /// Done, failed, or left pending by a stop: nothing more to do here.
    Over,
    /// Set aside after a refusal ([`Action::Defer`]): it goes again after
    /// the worker's next item had its answer.
    Defer(Queued),
    /// Set aside until `at`, when it may go again: the server asked its
    /// retry to wait that long (`later` in [`Action::Retry`]).
    Later {
        /// When it may go again.
        at: Instant,
        /// The item as it stood, to go on from (boxed: most items never
        /// stand aside, and [`Left`] need not be as large for them).
        going: Box<Going>,
    },
}

/// An item between its calls: its request under its Idempotency-Key
/// (rendered once, so a retry set aside goes under the same key), what it
/// weighs, and its calls so far.
pub(super) struct Going {
    /// The item as queued.
    queued: Queued,
    /// Its request.
    req: Request,
    /// What its call weighs.
    weight: Weight,
    /// Its calls so far: a retry set aside keeps counting its attempts.
    tries: Tries,
}

/// What the worker does after a call: [`Next`], or set its item aside
/// until an instant.
enum Turn {
    Next(Next),
    Later(Instant),
}

/// What the worker does next with its item.
pub(super) enum Next {
    Again,
    Finished,
    /// The item is set aside: it goes again after the worker's next item.
    Defer,
}
