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
use super::batch;
use super::batch_settle::{failure, Entry, Sent};
use super::events::Event;
use super::gate::Halt;
use super::keys::At;
use super::pool::{Clearance, Cleared, Next, Pool, Queue, Queued};
use super::react::{react, Action, Call, Outcome, Tries};
use crate::classify::CallError;
use crate::pace::Weight;
use crate::rate::policy::TokenWeight;
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
                let tokens = self.weigh(&q.item, &req)?.tokens;
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
        let guessed = cost.is_some_and(|c| c.guessed());
        while !entries.is_empty() {
            // With a reserve, one item learns the balance before a batch
            // spends it (see Ledger::first_alone); one sent alone before
            // goes alone again.
            let size = batching.next_size(&entries, self.ledger.first_alone());
            let weigh = |e: &Entry| if guessed { 0 } else { e.tokens.total };
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
            tokens: (chunk.iter().map(|e| e.tokens))
                .fold(TokenWeight::default(), TokenWeight::saturating_add),
        };
        // A batch of guesses is held to what one may weigh, as its items are.
        let weight = match self.cfg.cost.as_ref() {
            Some(c) if c.guessed() => Weight {
                tokens: c.held(weight.tokens),
                ..weight
            },
            _ => weight,
        };
        loop {
            let Cleared {
                probing,
                slot,
                permit,
                guard,
            } = match self.clear(weight, chunk.len() as u64).await {
                Clearance::Go(c) => c,
                Clearance::Again => continue,
                Clearance::Stop => return Sent::Stop,
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
                Err(unpaired) => {
                    // Answered but not paired: it may have run; resent
                    // under the same key, the server replays what it did.
                    let err = CallError::Transient {
                        reason: format!("HTTP {status}: {unpaired}"),
                        status: Some(status),
                        retry_after: None,
                        unknown: true,
                    };
                    // Every first answer with no array of results: not a
                    // batch endpoint (or not its --batch-results).
                    let systemic = (unpaired.no_array)
                        .then_some(super::watch::Systemic::Unpaired(unpaired.reason));
                    self.whole(Outcome::Error(err, systemic), chunk, req, probing)
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
