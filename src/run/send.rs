//! Sending one call and reading its answer: the transport, the latency
//! the pool sizes itself by, whether the server spoke at all (the silence
//! breaker), and what the response means for the item or the batch.

use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use super::events::Event;
use super::gate::Halt;
use super::pool::Pool;
use super::react::Outcome;
use super::slots::Resized;
use super::watch::{Heard, Systemic};
use crate::classify::{self, CallError};
use crate::credits::{self, InFlight};
use crate::pace::Permit;
use crate::report::calls::{Answer, CallId};
use crate::request::BatchSpec;
use crate::transport::{FailureKind, Request, Response};

impl Pool {
    /// Tells the watch whether the server answered this call; a silent
    /// server halts the run.
    fn heard(&self, result: &Result<Response, crate::transport::TransportError>) {
        let answered = match result {
            Ok(_) => true,
            Err(e) if e.kind == FailureKind::Timeout => false,
            Err(_) => return,
        };
        match self.watch.heard(answered) {
            Heard::Nothing => {}
            Heard::Released(verdict) => {
                self.carry_out(verdict);
            }
            Heard::Silent(why) => self.gate.stop(Halt::Silent(why)),
        }
    }

    /// Sends one call and reads what its response means; `batch` when it
    /// carries a batch of items (`id` then names its first item).
    pub(super) async fn call(
        &self,
        req: &Request,
        permit: Permit,
        guard: InFlight,
        id: CallId,
        batch: Option<&BatchSpec>,
    ) -> Outcome {
        let sent = Instant::now();
        let result = self.transport.send(req).await;
        let latency = match &result {
            Err(e) if !e.kind.may_have_run() => None,
            _ => Some(sent.elapsed()),
        };
        self.heard(&result);
        if result
            .as_ref()
            .is_ok_and(|r| crate::wire::replayed(&r.headers))
        {
            self.emit(Event::Replayed);
        }
        self.emit(Event::Answered(
            match &result {
                Ok(r) if r.status == 429 && crate::wire::exhausted_by_headers(&r.headers) => {
                    Answer::CreditsExhausted(r.status)
                }
                Ok(r) => Answer::Status(r.status),
                Err(e) => Answer::Failure(e.kind),
            },
            latency,
            id,
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
        if let (Ok(r), Some(l)) = (&result, latency) {
            if (200..300).contains(&r.status) {
                self.sized(l);
            }
        }
        let outcome = match result {
            Ok(resp) => {
                match classify::is_rate_limited(resp.status, &resp.headers, &resp.body) {
                    true => permit.complete_refused(Instant::now()),
                    false => {
                        let used = self.cfg.cost.as_ref().and_then(|c| c.used(&resp.body));
                        permit.complete_used(Instant::now(), used);
                    }
                }
                self.read(resp, batch).await
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

    /// Feeds one answered call's latency to the slots (only a success's:
    /// a refusal comes back faster than the work), and says what changed.
    fn sized(&self, latency: Duration) {
        let ms = |d: Duration| d.as_millis().max(1);
        let live = || self.pacer.steady_per_min().map(|m| m / 60.0);
        match self.slots.measured(latency, live) {
            Some(Resized::Grew(n)) => self.emit(Event::Note(format!(
                "batchrun: calls take ~{} ms: up to {n} calls in flight to keep the limit's pace",
                ms(latency)
            ))),
            Some(Resized::Bound {
                size,
                need,
                latency,
                per_min,
            }) => self.emit(Event::Note(format!(
                "batchrun: note: calls take ~{} ms, so {size} call(s) in flight make ~{per_min:.0}/min; \
                 the limit's pace needs ~{need}: concurrency, not the limit, bounds this run \
                 (-c sets it, within what the API allows)",
                ms(latency)
            ))),
            None => {}
        }
    }

    /// A body was changed to keep the key out of the files: said once, so
    /// that `***` in a result is not taken for what the server answered (a
    /// short key matches ordinary text too).
    fn said_scrubbed(&self) {
        if !self
            .scrub_said
            .swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            self.emit(Event::Note(
                "batchrun: a response held the API key's text: the results and failures hold *** \
                 in its place, so that the key never reaches a file (a short key may match \
                 ordinary text)"
                    .to_string(),
            ));
        }
    }

    /// What an answer says of the run as a whole: whether every answer is
    /// still a rate limit (`limited`: a batch's whose every item's is),
    /// whether the key works (`got_through`), and how many 401s came in a
    /// row.
    fn standing(&self, c: &Result<(), CallError>, limited: bool, got_through: bool) {
        use std::sync::atomic::Ordering::Relaxed;
        if !limited
            && !matches!(
                c,
                Err(CallError::RateLimited { .. } | CallError::Concurrency { .. })
            )
        {
            *self.limited_since.lock().unwrap_or_else(|p| p.into_inner()) = None;
        }
        if got_through {
            self.got_through.store(true, Relaxed);
            self.refusals_in_a_row.store(0, Relaxed);
        }
        if matches!(c, Err(CallError::Refused { status: 401, .. })) {
            self.refusals_in_a_row.fetch_add(1, Relaxed);
        }
    }

    async fn read(&self, resp: Response, batch: Option<&BatchSpec>) -> Outcome {
        let Response {
            status,
            headers,
            body,
            truncated,
            cut,
        } = resp;
        let truncated = truncated || cut.is_some();
        // A server may echo the key back (in an error, a debug field), even
        // JSON-escaped or cut by --max-body: it must never reach the
        // checkpoint, the outputs, a failure reason or the pause line.
        let body = match self
            .spec
            .key
            .as_ref()
            .and_then(|k| k.scrub(&body, truncated))
        {
            Some(clean) => {
                self.said_scrubbed();
                clean
            }
            None => body,
        };
        // A batch's success cut short pairs nothing, though its items ran.
        let cut_batch = batch.filter(|_| truncated && (200..300).contains(&status));
        // What a cut body said is read from its words as they came (a
        // 429's pause line quotes the server, not the record's marking).
        let (body, head) = match truncated {
            true => (truncated_body(&body, cut.as_deref()), Some(body)),
            false => (body, None),
        };
        if let Some(note) = self.pacer.observe(&headers).await {
            self.emit(Event::Pace(note));
        }
        let c = classify::classify(
            reqwest::StatusCode::from_u16(status).unwrap_or(reqwest::StatusCode::BAD_GATEWAY),
            &headers,
            head.as_deref().unwrap_or(&body),
            SystemTime::now(),
            self.spec.key.as_ref(),
        );
        // Read before this answer moves the balance: a bare 402 does not.
        let c = classify::against_balance(c, &headers, self.ledger.spent());
        let charged = !matches!(c, Err(CallError::CreditsExhausted { .. }));
        // A batch is charged per item: the items it settled count.
        let tally = match (batch, c.is_ok()) {
            (Some(b), true) => super::batch::tally(b, status, &body),
            (Some(_), false) => super::batch::Tally::default(),
            (None, ok) => super::batch::Tally::one(ok),
        };
        let done = tally.settled;
        // A batch got through when an item of it was done: a 200 whose
        // every element is a refusal says nothing of the key's standing.
        let got_through = c.is_ok() && (batch.is_none() || done > 0);
        self.standing(&c, tally.all_limited, got_through);
        let snapshot = credits::snapshot_from_headers(&headers);
        let seen = self.ledger.observe_items(snapshot, done, charged);
        if let Some(s) = seen.newer {
            self.emit(Event::Credits(s));
        }
        if let Some(line) = seen.note {
            self.emit(Event::Note(line));
        }
        if let Some(a) = seen.alert {
            self.emit(Event::Alert(a));
        }
        if let (Some(b), Ok(())) = (cut_batch, &c) {
            return self.too_long(status, b.size, cut.as_deref());
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

impl Pool {
    /// A batch's success whose answer was longer than the most read for
    /// it: no item's result can be told, but they ran.
    fn too_long(&self, status: u16, size: usize, cut: Option<&str>) -> Outcome {
        if let Some(why) = cut {
            return Outcome::TooLong {
                status,
                reason: format!(
                    "HTTP {status}, but the connection dropped while the batch's answer was \
                     read ({why}): the items ran, their results were not kept; run with \
                     --retry-failed, which sends them again under the same Idempotency-Key"
                ),
            };
        }
        let max = self.cfg.max_body;
        let cap = super::batch::answer_cap(max, size);
        Outcome::TooLong {
            status,
            reason: format!(
                "HTTP {status}, but the batch's answer is longer than {cap} bytes, the most read \
                 for a batch of {size} item(s) at --max-body {max} (per item): the items ran, \
                 their results were not kept; raise --max-body and run with --retry-failed, \
                 which sends them again under the same Idempotency-Key"
            ),
        }
    }

    /// The answer's elements, as [`super::batch::pair`] makes them, each
    /// kept to `--max-body` as one item's body would be.
    pub(super) fn pair(
        &self,
        spec: &BatchSpec,
        status: u16,
        body: &str,
        n: usize,
    ) -> Result<Vec<super::batch::Element>, super::batch::Unpaired> {
        let elements = super::batch::pair(spec, status, body, n)?;
        Ok(elements
            .into_iter()
            .map(|e| super::batch::Element {
                body: self.kept(e.body),
                ..e
            })
            .collect())
    }

    /// An item's result as kept: at most `--max-body` of it, cut and
    /// marked as a longer body of one item's call is. A batch's answer is
    /// read whole (up to its own cap), so each item's share is cut here.
    fn kept(&self, body: String) -> String {
        let max = self.cfg.max_body;
        if body.len() <= max {
            return body;
        }
        let mut at = max;
        while !body.is_char_boundary(at) {
            at -= 1;
        }
        let head = &body[..at];
        // The cut may leave the start of the key at the end.
        let clean = self.spec.key.as_ref().and_then(|k| k.scrub(head, true));
        truncated_body(clean.as_deref().unwrap_or(head), None)
    }
}

/// What is kept of a body cut at `--max-body`, or by the connection after
/// the server answered (`cut`, why): its beginning, and a mark that says
/// so, as one JSON object in place of the body.
fn truncated_body(kept: &str, cut: Option<&str>) -> String {
    let mut v = serde_json::json!({
        "batchrun_truncated": true,
        "bytes_kept": kept.len(),
        "head": kept,
    });
    // Cut by the connection after the server answered, not at the cap.
    if let Some(why) = cut {
        v["cut"] = why.into();
    }
    v.to_string()
}
