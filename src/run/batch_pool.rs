//! The pool's batch path (`--batch N`): a worker takes N pending items and
//! sends them as one call, through the same gate, slots, pacer and reserve
//! as one item's call; [`super::batch`] says what the answer means for
//! each item, and each is recorded on its own (all of one call's in one
//! commit).
//!
//! A batch holds the pending items of one block of the input (N lines, or
//! N of a shard's items: [`super::batch::Blocks`]), and the items of a
//! block that come back transient go again together: whatever else settled
//! meanwhile, any run forms a batch left unrecorded by a crash again from
//! the same items, with the same key, and the server replays what it
//! settled.

use std::io::Write as _;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::alone::Alone;
use super::batch::{self, Member};
use super::events::Event;
use super::gate::{Halt, Pass};
use super::keys::At;
use super::pool::{Next, Pool, Queue, Queued};
use super::react::{rate_limited, react, Action, Call, Outcome, Tries};
use super::watch::{Systemic, Verdict};
use crate::classify::CallError;
use crate::input::Item;
use crate::pace::Weight;
use crate::report::calls::CallId;
use crate::request::{BatchSpec, BatchWeight};
use crate::transport::Request;

/// The run's batching: what `--batch` asked, and the size in force.
#[derive(Debug)]
pub struct Batching {
    spec: BatchSpec,
    size: AtomicUsize,
    /// The item taken from the queue that belongs to the next block: read
    /// and written only under the queue's lock.
    next: std::sync::Mutex<Option<Queued>>,
    /// Items sent alone to learn the balance, now or in an earlier run.
    alone: Alone,
}

impl Batching {
    /// Batching as `spec` asks, starting at its size.
    pub fn new(spec: BatchSpec, alone: Alone) -> Arc<Batching> {
        Arc::new(Batching {
            size: AtomicUsize::new(spec.size.max(1)),
            spec,
            next: std::sync::Mutex::new(None),
            alone,
        })
    }

    /// How many of `entries` the next call carries: one for an item that
    /// went alone before (whose call may have run under that key), or to
    /// learn the balance at the reserve (`learn`: never an item whose
    /// batch may have run, and recorded before its call, else a batch).
    fn next_size(&self, entries: &[Entry], learn: bool) -> usize {
        let mut lines: Vec<(u64, bool)> = entries
            .iter()
            .map(|e| (e.item.line, e.tries.maybe_ran))
            .collect();
        lines.sort_unstable();
        let size = self.size();
        // A batch stops short of an item that went alone before, which
        // goes by itself (cut takes the entries in line order).
        match lines
            .iter()
            .take(size)
            .position(|&(l, _)| self.alone.was(l))
        {
            Some(0) => return 1,
            Some(before) => return before,
            None => {}
        }
        match lines.first() {
            Some(&(line, false)) if learn && self.alone.record(line).is_ok() => 1,
            _ => size,
        }
    }

    /// Items per call now.
    pub fn size(&self) -> usize {
        self.size.load(Ordering::Relaxed)
    }

    /// A batch of `len` was too large: at most half of it from now on.
    /// The new size, when it is smaller than before.
    /// The first halving of the run is the one said: it alone sees the
    /// size it was started with (one atomic step, so two workers refused
    /// at once cannot both claim it, nor say the second halving first).
    fn halve(&self, len: usize) -> Option<(usize, bool)> {
        let to = (len / 2).max(1);
        let was = self.size.fetch_min(to, Ordering::Relaxed);
        (was > to).then_some((to, was == self.spec.size.max(1)))
    }
}

/// An item of a batch: rendered, keyed, and its calls so far.
struct Entry {
    item: Item,
    req: Request,
    key: String,
    tries: Tries,
    /// Its `--cost` estimate: a batch weighs its items' sum.
    tokens: u64,
}

/// What became of a batch call's items.
enum Sent {
    /// Every item is recorded (or left for a later run by a stop).
    Over,
    /// These go again, in new batches.
    Back(Vec<Entry>),
    /// The run stopped: the items not recorded stay pending.
    Stop,
}

/// The next step of a batch call.
enum Step {
    /// Send these again under the same key.
    Again(Vec<Entry>),
    Done(Sent),
}

impl Pool {
    /// One worker of a batch run: takes a batch at a time until the queue
    /// closes or the run stops.
    pub async fn batch_worker(self: Arc<Self>, queue: Queue, batching: Arc<Batching>) {
        loop {
            if self.gate.is_stopped() {
                return;
            }
            let taken = self.take_batch(&queue, &batching).await;
            if taken.is_empty() || !self.run_batch(taken, &batching).await {
                return;
            }
        }
    }

    /// The pending items of the next block (see [`super::batch::Blocks`]);
    /// the queue yields them in line order. Nothing
    /// when the run stops meanwhile: the items taken were never sent, and
    /// an item of the next block put aside stays pending too.
    async fn take_batch(&self, queue: &Queue, batching: &Batching) -> Vec<Queued> {
        let mut q = queue.lock().await;
        // Only ever touched under the queue's lock: no one else looks.
        let put_aside = || batching.next.lock().unwrap_or_else(|p| p.into_inner());
        let mut taken: Vec<Queued> = put_aside().take().into_iter().collect();
        loop {
            let it = tokio::select! {
                it = q.recv() => it,
                _ = self.gate.until_stopped() => return Vec::new(),
            };
            let Some(it) = it else { break };
            match taken.first() {
                Some(first) if it.block != first.block => {
                    *put_aside() = Some(it);
                    break;
                }
                _ => taken.push(it),
            }
        }
        taken
    }

    /// Drives the items taken until each is recorded or the run stops
    /// (false then).
    async fn run_batch(self: &Arc<Self>, taken: Vec<Queued>, batching: &Batching) -> bool {
        let mut entries = Vec::with_capacity(taken.len());
        for q in taken {
            let made = self.spec.render(&q.item).and_then(|req| {
                let tokens = self.weigh(&q.item)?.tokens;
                Ok((req, tokens))
            });
            match made {
                Ok((req, tokens)) => entries.push(Entry {
                    key: self
                        .cfg
                        .keys
                        .key(At::of(&q.item, q.repeat), q.generation, &req),
                    item: q.item,
                    req,
                    tries: Tries {
                        n: 0,
                        maybe_ran: q.maybe_ran,
                    },
                    tokens,
                }),
                Err(reason) => self.emit(Event::Failed {
                    line: q.item.line,
                    status: None,
                    reason,
                    attempts: 0,
                    unknown: false,
                    digest: q.item.digest(),
                }),
            }
        }
        let cost = self.cfg.cost.as_ref();
        let most = cost.and_then(|c| c.most.as_ref()).map(|m| m.0);
        // Batches are cut by `--cost` only: a guess (no `--cost`) must not
        // form them otherwise than the run killed before it did (under
        // other Idempotency-Keys), nor split them by a guess.
        let guessed = cost.is_some_and(|c| c.expr.is_none());
        while !entries.is_empty() {
            // With a reserve, one item learns the balance before a batch
            // spends it (see Ledger::first_alone); one sent alone before
            // goes alone again.
            let size = batching.next_size(&entries, self.ledger.first_alone());
            let weigh = |e: &Entry| if guessed { 0 } else { e.tokens };
            let chunk = batch::cut(&mut entries, |e| e.item.line, weigh, size, most);
            match self.send_batch(chunk, batching).await {
                Sent::Over => {}
                Sent::Back(mut back) => {
                    back.append(&mut entries);
                    entries = back;
                }
                Sent::Stop => return false,
            }
        }
        true
    }

    /// Sends one batch until its answer settles it (or the run stops).
    async fn send_batch(self: &Arc<Self>, mut chunk: Vec<Entry>, batching: &Batching) -> Sent {
        let reqs: Vec<&Request> = chunk.iter().map(|e| &e.req).collect();
        let req = match batch::assemble(&batching.spec, &reqs) {
            Ok(r) => r,
            Err(reason) => {
                let failed = failure(&chunk[0], None, reason, false);
                self.record_alike(&chunk, failed, None, &chunk[0].req);
                return Sent::Over;
            }
        };
        let keys: Vec<String> = chunk.iter().map(|e| e.key.clone()).collect();
        let req = req.with_idempotency_key(&batch::batch_key(&keys));
        let weight = Weight {
            calls: match batching.spec.weight {
                BatchWeight::Calls => Weight::default().calls,
                BatchWeight::Items => chunk.len() as u64,
            },
            tokens: chunk.iter().map(|e| e.tokens).fold(0, u64::saturating_add),
        };
        // A batch of guesses is held to what one may weigh, as its items are.
        let weight = match self.cfg.cost.as_ref() {
            Some(c) if c.expr.is_none() => Weight {
                tokens: weight
                    .tokens
                    .min(c.guess_cap.unwrap_or(crate::cost::MAX_ESTIMATE)),
                ..weight
            },
            _ => weight,
        };
        loop {
            let probing = match self.gate.pass().await {
                Pass::Run => false,
                Pass::Probe => true,
                Pass::Stop => return Sent::Stop,
            };
            let slot = tokio::select! {
                s = self.slots.acquire() => s,
                _ = self.gate.until_stopped() => None,
            };
            let Some(slot) = slot else {
                if probing {
                    self.gate.release_probe();
                }
                return Sent::Stop;
            };
            let Some(permit) = self.pace(probing, weight).await else {
                return Sent::Stop;
            };
            if !probing && !self.gate.is_running() {
                continue;
            }
            let Some(guard) = self.admit(probing, chunk.len() as u64).await else {
                if self.gate.is_stopped() {
                    return Sent::Stop;
                }
                continue;
            };
            if chunk.iter().any(|e| e.tries.n > 0) {
                self.emit(Event::Retry);
            }
            self.emit(Event::Sent);
            for e in &mut chunk {
                e.tries.n += 1;
            }
            // The job log has one line per call: a batch's names its first item.
            let id = CallId {
                line: chunk[0].item.line,
                attempt: chunk[0].tries.n,
            };
            let outcome = self
                .call(&req, permit, guard, id, Some(&batching.spec))
                .await;
            drop(slot);
            match self.answer(outcome, chunk, &req, batching, probing).await {
                Step::Again(back) => chunk = back,
                Step::Done(sent) => return sent,
            }
        }
    }

    /// What a batch call's outcome means for its items.
    async fn answer(
        self: &Arc<Self>,
        outcome: Outcome,
        chunk: Vec<Entry>,
        req: &Request,
        batching: &Batching,
        probing: bool,
    ) -> Step {
        let n = chunk.len();
        match outcome {
            Outcome::Done(status, body) => match self.pair(&batching.spec, status, &body, n) {
                Ok(elements) => Step::Done(self.settle_items(chunk, elements, req, probing).await),
                Err(reason) => {
                    // Answered but not paired: it may have run; resent
                    // under the same key, the server replays what it did.
                    let err = CallError::Transient {
                        reason: format!("HTTP {status}: {reason}"),
                        status: Some(status),
                        retry_after: None,
                        unknown: true,
                    };
                    self.whole(Outcome::Error(err, None), chunk, req, probing)
                        .await
                }
            },
            Outcome::Refused { done, why } => {
                if let Some((status, body)) = done {
                    if let Ok(elements) = self.pair(&batching.spec, status, &body, n) {
                        let _ = self.settle_items(chunk, elements, req, false).await;
                    }
                }
                self.gate.stop(Halt::Reserve(why));
                Step::Done(Sent::Stop)
            }
            Outcome::Error(ref e, _) if too_large(e) && n > 1 => {
                if let Some((to, first)) = batching.halve(n) {
                    if first {
                        self.emit(Event::Note(format!(
                            "batchrun: the API says a batch of {n} items is too large: batches of at most {to} items for the rest of this run"
                        )));
                    }
                }
                Step::Done(Sent::Back(chunk))
            }
            other => self.whole(other, chunk, req, probing).await,
        }
    }

    /// An outcome of the whole call (no per-item answer): decided as one
    /// item's call would be, and what it records goes for every item.
    async fn whole(
        &self,
        outcome: Outcome,
        mut chunk: Vec<Entry>,
        req: &Request,
        probing: bool,
    ) -> Step {
        let tries = Tries {
            n: chunk.iter().map(|e| e.tries.n).max().unwrap_or(1),
            maybe_ran: chunk.iter().any(|e| e.tries.maybe_ran),
        };
        let limited_since = *self.limited_since.lock().unwrap_or_else(|p| p.into_inner());
        let call = Call {
            item: &chunk[0].item,
            tries,
            probing,
            limited_for: limited_since.map(|since| tokio::time::Instant::now() - since),
            jitter: fastrand::f64(),
            got_through: self.got_through.load(Ordering::Relaxed),
            may_defer: false,
            refusals_in_a_row: self.refusals_in_a_row.load(Ordering::Relaxed),
        };
        let reaction = react(outcome, call, &self.cfg.policy);
        let spent = tries.n - reaction.tries.n;
        for e in &mut chunk {
            e.tries.n = e.tries.n.saturating_sub(spent);
            e.tries.maybe_ran |= reaction.tries.maybe_ran;
        }
        if reaction.release_probe {
            self.gate.release_probe();
        }
        match reaction.action {
            Action::Record { event, systemic } => {
                self.record_alike(&chunk, event, systemic, req);
                Step::Done(Sent::Over)
            }
            Action::ProbeDone(event) => {
                self.record_alike(&chunk, event, None, req);
                self.probe_succeeded();
                Step::Done(Sent::Over)
            }
            Action::Stop { record, halt } => {
                if let Some(event) = record {
                    self.record_alike(&chunk, event, None, req);
                }
                self.gate.stop(halt);
                Step::Done(Sent::Stop)
            }
            action => match self.follow(action, req).await {
                // A batch never sets its items aside (`may_defer` is off).
                Next::Again | Next::Defer => Step::Again(chunk),
                Next::Finished => Step::Done(Sent::Stop),
            },
        }
    }
}

impl Pool {
    /// Records each item from its own element; the items the credits did
    /// not cover stop the run (or wait for credits) and stay pending; those
    /// worth another call go back, after a backoff.
    async fn settle_items(
        &self,
        chunk: Vec<Entry>,
        elements: Vec<batch::Element>,
        req: &Request,
        probing: bool,
    ) -> Sent {
        let members: Vec<Member> = chunk
            .iter()
            .map(|e| Member {
                line: e.item.line,
                digest: e.item.digest(),
                attempts: e.tries.n,
            })
            .collect();
        let credits = batch::Credits {
            out: self.ledger.spent(),
            got_through: self.got_through.load(Ordering::Relaxed),
        };
        let max = self.cfg.policy.max_attempts;
        let settled = batch::settle(&members, elements, credits, max);
        let recorded = !settled.record.is_empty();
        if !self.record_events(settled.record, None, req) {
            return Sent::Stop;
        }
        let mut slots: Vec<Option<Entry>> = chunk.into_iter().map(Some).collect();
        let mut back: Vec<Entry> = Vec::new();
        if !settled.unpaid.is_empty() {
            if !self.cfg.policy.wait_for_credits {
                self.gate.stop(Halt::Exhausted);
                return Sent::Stop;
            }
            match probing {
                true => self.gate.probe_failed(),
                false => self.start_waiting("credits exhausted (items of a batch came back 402)"),
            }
            back.extend(settled.unpaid.iter().filter_map(|&i| slots[i].take()));
        } else if probing && recorded {
            self.probe_succeeded();
        } else if probing {
            self.gate.release_probe();
        }
        // A rate limit says nothing of its items: no attempt is spent,
        // unless the refusals are the items' own (others were accepted).
        for &i in settled.limited.iter().filter(|_| !settled.own) {
            if let Some(e) = slots[i].as_mut() {
                e.tries.n = e.tries.n.saturating_sub(1);
            }
        }
        back.extend(settled.limited.iter().filter_map(|&i| slots[i].take()));
        back.extend(settled.again.iter().filter_map(|&i| slots[i].take()));
        if back.is_empty() {
            return Sent::Over;
        }
        if let Some(limit) = settled.limit {
            let n = settled.limited.len();
            if matches!(self.items_limited(limit, n, req).await, Next::Finished) {
                return Sent::Stop;
            }
        }
        if !settled.again.is_empty() {
            let attempts = back.iter().map(|e| e.tries.n).max().unwrap_or(1);
            let after = self
                .cfg
                .policy
                .backoff
                .wait(attempts, None, fastrand::f64());
            if matches!(self.again_after(after).await, Next::Finished) {
                return Sent::Stop;
            }
        }
        Sent::Back(back)
    }

    /// `n` items of a batch came back with a rate-limit 429 of their own:
    /// as for a call's 429, every worker pauses (as long as an element
    /// asked, else the default pause), each counts as rate limited, and
    /// past `--max-wait` of nothing but 429s the run halts resumably.
    async fn items_limited(&self, limit: batch::Limit, n: usize, req: &Request) -> Next {
        let since = *self.limited_since.lock().unwrap_or_else(|p| p.into_inner());
        let limited_for = since.map(|s| tokio::time::Instant::now() - s);
        let message = Some(limit.message);
        let action = match rate_limited(limit.retry_after, message, limited_for, &self.cfg.policy) {
            // The call's own status was a success, so its permit was
            // completed as accepted: the pacer's limit let it through. A
            // limit learnt from it would be learnt from a call counted
            // accepted, and lowered for a refusal that may be a limit of
            // the backend behind the batch, not of the calls: every worker
            // waits all the same, but nothing is learnt (a hold).
            Action::Pause { pause, message } => Action::Hold { pause, message },
            other => other,
        };
        let pause = match &action {
            Action::Hold { pause, .. } => Some(*pause),
            _ => None,
        };
        let next = self.follow(action, req).await;
        // The pause counted the first item; the others count too, each a
        // 429 (said once: the same pause).
        if let (Some(pause), Next::Again) = (pause, &next) {
            for _ in 1..n {
                self.emit(Event::RateLimited {
                    pause,
                    concurrency: false,
                    message: None,
                });
            }
        }
        next
    }

    /// Records `event` (a failure of the whole call) for every item of the
    /// batch, each with its own line.
    fn record_alike(
        &self,
        chunk: &[Entry],
        event: Event,
        systemic: Option<Systemic>,
        req: &Request,
    ) {
        let Event::Failed {
            status,
            reason,
            unknown,
            ..
        } = event
        else {
            return;
        };
        let events: Vec<Event> = chunk
            .iter()
            .map(|e| failure(e, status, reason.clone(), unknown))
            .collect();
        self.record_events(events, systemic, req);
    }

    /// Passes a batch's results through the watch and records what it lets
    /// through in one commit. False when it halted the run.
    fn record_events(&self, events: Vec<Event>, systemic: Option<Systemic>, req: &Request) -> bool {
        let mut out = Vec::with_capacity(events.len());
        let mut halted = None;
        for ev in events {
            let url = || self.redacted(req);
            match self.watch.outcome(systemic.clone(), Some(ev), url) {
                Verdict::Record(evs) => out.extend(evs),
                Verdict::Halt { record, why } => {
                    out.extend(record);
                    halted = Some(why);
                    break;
                }
            }
        }
        if !out.is_empty() {
            self.emit(Event::Settled(out));
        }
        match halted {
            Some(why) => {
                self.gate.stop(Halt::Systemic(why));
                false
            }
            None => true,
        }
    }

    /// The call's URL with the key hidden, for a halt's message.
    fn redacted(&self, req: &Request) -> String {
        match &self.spec.key {
            Some(k) => k.redact(&req.url),
            None => req.url.clone(),
        }
    }
}

/// One item's failure, with its own line, digest and attempts.
fn failure(e: &Entry, status: Option<u16>, reason: String, unknown: bool) -> Event {
    Event::Failed {
        line: e.item.line,
        status,
        reason,
        attempts: e.tries.n,
        unknown,
        digest: e.item.digest(),
    }
}

/// Whether a failed call says its batch is too large.
fn too_large(e: &CallError) -> bool {
    match e {
        CallError::Permanent { status, reason } | CallError::Refused { status, reason } => {
            batch::too_large(Some(*status), reason)
        }
        CallError::Transient { status, reason, .. } => batch::too_large(*status, reason),
        _ => false,
    }
}

/// `--dry-run` of a batch job: the first batch's request, as it would go
/// (the key hidden).
pub(super) fn show_first_batch(
    settings: &crate::settings::Settings,
    spec: &BatchSpec,
) -> Result<(), crate::exit::RunError> {
    use crate::exit::RunError;
    let request = &settings.request;
    let mut reqs = Vec::new();
    let mut lines = Vec::new();
    for item in crate::input::Reader::open(&settings.input, settings.format)?.take(spec.size) {
        let item = item?;
        reqs.push(request.render(&item).map_err(RunError::Usage)?);
        lines.push(item.line);
    }
    let refs: Vec<&Request> = reqs.iter().collect();
    let Ok(req) = batch::assemble(spec, &refs) else {
        return Err(RunError::Usage(
            "--batch: the items' bodies are not JSON (use --json-body or a JSON --body)".into(),
        ));
    };
    let hide = |s: &str| match &request.key {
        Some(k) => k.redact(s),
        None => s.to_string(),
    };
    let (first, last) = (
        lines.first().copied().unwrap_or(0),
        lines.last().copied().unwrap_or(0),
    );
    let mut text = format!(
        "# the first batch: {} item(s), lines {first}-{last}\n{} {}\n",
        lines.len(),
        req.method,
        hide(&req.url)
    );
    for (name, value) in &req.headers {
        let v = match *name == request.key_header {
            true => "***".to_string(),
            false => hide(&String::from_utf8_lossy(value.as_bytes())),
        };
        text.push_str(&format!("{name}: {v}\n"));
    }
    if let Some(body) = &req.body {
        text.push_str(&format!("\n{}\n", hide(&String::from_utf8_lossy(body))));
    }
    let mut out: Box<dyn std::io::Write> = match settings.json {
        true => Box::new(std::io::stderr().lock()),
        false => Box::new(std::io::stdout().lock()),
    };
    let _ = writeln!(out, "{text}");
    Ok(())
}
