//! A batch's answer carried out on its items (`--batch N`): each is
//! recorded from its own element in one commit, those the credits did not
//! cover stop the run, and those refused by a rate limit or worth another
//! call go back. What each element means is [`super::batch`]'s; sending
//! the batch is [`super::batch_pool`]'s.

use std::sync::atomic::Ordering;

use super::batch::{self, Member};
use super::events::Event;
use super::gate::Halt;
use super::pool::{Next, Pool};
use super::react::{rate_limited, Action, Tries};
use super::watch::{Systemic, Verdict};
use crate::input::Item;
use crate::transport::Request;

/// An item of a batch: rendered, keyed, and its calls so far.
pub(super) struct Entry {
    pub(super) item: Item,
    pub(super) req: Request,
    pub(super) key: String,
    pub(super) tries: Tries,
    /// Its estimate of tokens (`--cost`, or a guess): a batch weighs its items' sum.
    pub(super) tokens: crate::rate::policy::TokenWeight,
}

/// What became of a batch call's items.
pub(super) enum Sent {
    /// Every item is recorded (or left for a later run by a stop).
    Over,
    /// These go again, in new batches.
    Back(Vec<Entry>),
    /// The run stopped: the items not recorded stay pending.
    Stop,
}

impl Pool {
    /// Records each item from its own element; the items the credits did
    /// not cover stop the run (or wait for credits) and stay pending; those
    /// worth another call go back, after a backoff.
    pub(super) async fn settle_items(
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
        if !settled.own {
            for &i in &settled.limited {
                if let Some(e) = slots[i].as_mut() {
                    e.tries.n = e.tries.n.saturating_sub(1);
                }
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
    pub(super) fn record_alike(
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
pub(super) fn failure(e: &Entry, status: Option<u16>, reason: String, unknown: bool) -> Event {
    Event::Failed {
        line: e.item.line,
        status,
        reason,
        attempts: e.tries.n,
        unknown,
        digest: e.item.digest(),
    }
}
