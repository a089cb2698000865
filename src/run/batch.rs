//! Batches (`--batch N`), the pure part: the call that carries several
//! items, its Idempotency-Key, and what its answer means for each item.
//!
//! A batch is its items' requests made one: the first item's method, URL
//! and headers, and as body the array of the items' own bodies (in
//! `--batch-body` when given). Its key is derived from the items' own keys
//! (the keys they would have one by one), in order: the same items in the
//! same order make the same key in any run, so a batch whose outcome is
//! unknown is resent under its key and the server replays what it settled.
//!
//! The answer holds one element per item, in the batch's order: element i
//! is item i's. An answer whose array is missing or of another length
//! pairs nothing: the whole batch is one transient failure, since pairing
//! by position with a wrong count would give items each other's results.

use std::time::Duration;

use serde_json::Value;
use sha2::{Digest, Sha256};

use super::events::Event;
use crate::request::BatchSpec;
use crate::settings::Settings;
use crate::transport::Request;

/// How a run forms its batches: what the checkpoint records of it, and
/// the blocks of the input its batches are formed from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Formation {
    /// As the checkpoint records it: `--batch` and what cuts a batch short.
    pub how: String,
    /// The blocks a batch holds pending items of one of.
    pub blocks: Blocks,
}

/// The blocks of the input a batch is formed from: it holds pending items
/// of one block, so any run forms a batch left unrecorded (a crash, a lost
/// connection) again from the same items, under the same key, whatever
/// else settled meanwhile. Consecutive pending items would not: one item
/// settled out of turn shifts every later batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Blocks {
    /// N lines of the input: lines 1-N, N+1-2N, ...
    Lines(u64),
    /// N of a shard's items, done or not: its first N, the next N, ...
    /// A shard holds about one line in M, and blocks of lines left its
    /// batches about N/M items.
    ShardItems(u64),
}

impl Blocks {
    /// The block of the item on `line`, the `nth` of its shard's (from 1).
    pub fn of(self, line: u64, nth: u64) -> u64 {
        match self {
            Blocks::Lines(n) => line.saturating_sub(1) / n.max(1),
            Blocks::ShardItems(n) => nth.saturating_sub(1) / n.max(1),
        }
    }
}

impl Formation {
    /// `--batch` as `settings` ask it; `None` for one item per call.
    pub fn asked(settings: &Settings) -> Option<Formation> {
        let by_lines = Formation::by_lines(settings)?;
        match settings.shard.is_some_and(|s| s.count > 1) {
            true => Some(Formation {
                how: format!("{} (blocks of this shard's items)", by_lines.how),
                blocks: Blocks::ShardItems(by_lines.size()),
            }),
            false => Some(by_lines),
        }
    }

    /// `--batch` formed from blocks of lines, as every job formed them
    /// until shards formed theirs from their own items.
    pub fn by_lines(settings: &Settings) -> Option<Formation> {
        let b = settings.batch.as_ref()?;
        let mut how = format!("--batch {}", b.size);
        let c = &settings.costing;
        if let Some(e) = &c.expr {
            how.push_str(&format!(" --cost {e}"));
        }
        if let Some((most, _)) = &c.most {
            how.push_str(&format!(" (at most {most} tokens a call)"));
        }
        Some(Formation {
            how,
            blocks: Blocks::Lines(b.size.max(1) as u64),
        })
    }

    /// The items a block holds (or the lines it spans).
    fn size(&self) -> u64 {
        match self.blocks {
            Blocks::Lines(n) | Blocks::ShardItems(n) => n,
        }
    }
}

/// Cuts the next batch off the front of `pending`: at most `size` items,
/// and no more than fit together in `most` tokens (the least a told
/// policy of tokens admits at once), one at the least, since a batch
/// heavier than that would be refused every time it is sent.
///
/// `pending` is put in line order first. A resume takes an interrupted
/// block's pending items in line order, and a batch's key is made of its
/// items' keys in order: a run that cut items sent back in the order they
/// came back could form a batch that a resume never forms again, and then
/// send an item it may have had executed under a second key.
pub(super) fn cut<T>(
    pending: &mut Vec<T>,
    line: impl Fn(&T) -> u64,
    tokens: impl Fn(&T) -> u64,
    size: usize,
    most: Option<u64>,
) -> Vec<T> {
    pending.sort_by_key(&line);
    let mut n = size.min(pending.len());
    if let Some(most) = most {
        let mut sum = 0u64;
        let fit = pending[..n]
            .iter()
            .take_while(|e| {
                sum = sum.saturating_add(tokens(e));
                sum <= most
            })
            .count();
        n = fit.max(1).min(n);
    }
    let rest = pending.split_off(n);
    std::mem::replace(pending, rest)
}

/// The Idempotency-Key of a batch of items with these keys, in order.
pub(super) fn batch_key(keys: &[String]) -> String {
    let mut h = Sha256::new();
    h.update(b"batch");
    for k in keys {
        h.update((k.len() as u64).to_le_bytes());
        h.update(k.as_bytes());
    }
    let hex: String = h.finalize()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("batchrun-{hex}")
}

/// The one call for the items' requests, or why they cannot be one (an
/// item without a JSON body).
pub(super) fn assemble(spec: &BatchSpec, reqs: &[&Request]) -> Result<Request, String> {
    let first = reqs.first().ok_or("an empty batch")?;
    let mut bodies = Vec::with_capacity(reqs.len());
    for r in reqs {
        let body = r.body.as_deref().unwrap_or_default();
        let v: Value = serde_json::from_slice(body).map_err(|_| {
            "--batch: the item's body is not JSON (a batch is the array of the items' JSON bodies: use --json-body or a JSON --body)".to_string()
        })?;
        bodies.push(v);
    }
    let array = Value::Array(bodies).to_string();
    let body = match &spec.body {
        Some(b) => b.render(&array),
        None => array,
    };
    let mut headers = first.headers.clone();
    headers.remove(crate::wire::IDEMPOTENCY_KEY);
    headers.insert(
        reqwest::header::CONTENT_TYPE,
        reqwest::header::HeaderValue::from_static("application/json"),
    );
    Ok(Request {
        method: first.method.clone(),
        url: first.url.clone(),
        headers,
        body: Some(body.into_bytes()),
    })
}

/// What a batch's answer may hold besides its items' results (its
/// envelope: the wrapping object, separators, a `usage`).
pub(super) const ENVELOPE: usize = 64 * 1024;

/// The most of a batch's answer read: `--max-body` is kept per item, so
/// a batch of `size` may bring each item's share, and its envelope.
pub(super) fn answer_cap(max_body: usize, size: usize) -> usize {
    max_body
        .saturating_mul(size.max(1))
        .saturating_add(ENVELOPE)
}

/// One item's element of the answer.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Element {
    /// Its own status (else the call's).
    pub(super) status: u16,
    /// The element as JSON text: the item's result.
    pub(super) body: String,
    /// The element says the credits are exhausted (its `code`), as the
    /// API's own answer to one call would.
    pub(super) exhausted: bool,
}

/// Why a batch's answer pairs no result with an item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Unpaired {
    /// What the answer held instead, for the items' failures.
    pub(super) reason: String,
    /// It held no array of results at all (not JSON, nothing or no array
    /// at `--batch-results`): what an endpoint of one item a call answers,
    /// where a batch endpoint's array of the wrong length (one that leaves
    /// out a failed item's result) is that batch's alone.
    pub(super) no_array: bool,
}

impl std::fmt::Display for Unpaired {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.reason)
    }
}

/// The answer's elements, one per item in order, or why there are none.
pub(super) fn pair(
    spec: &BatchSpec,
    call_status: u16,
    body: &str,
    n: usize,
) -> Result<Vec<Element>, Unpaired> {
    let none = |reason: String| Unpaired {
        reason,
        no_array: true,
    };
    let v: Value = serde_json::from_str(body).map_err(|_| {
        none("the batch's answer is not JSON: no item's result can be told".to_string())
    })?;
    let array = match &v {
        Value::Array(a) => a,
        other => match other.pointer(&spec.results) {
            Some(Value::Array(a)) => a,
            Some(_) => {
                return Err(none(format!(
                    "the batch's answer has no array at {} (--batch-results)",
                    spec.results
                )))
            }
            None => {
                return Err(none(format!(
                    "the batch's answer has nothing at {} (--batch-results)",
                    spec.results
                )))
            }
        },
    };
    if array.len() != n {
        return Err(Unpaired {
            reason: format!(
                "the batch's answer holds {} results for {n} items: none is paired with an item",
                array.len()
            ),
            no_array: false,
        });
    }
    Ok(array
        .iter()
        .map(|e| Element {
            status: element_status(spec, e).unwrap_or(call_status),
            body: e.to_string(),
            exhausted: says_exhausted(e),
        })
        .collect())
}

/// What a batch's answer holds, for the run's standing, before it is
/// paired with its items.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Tally {
    /// The items it settled (its 2xx elements), for the credit meter,
    /// which charges per item: 0 when it cannot be paired.
    pub(super) settled: u64,
    /// Every element is a rate-limit 429 (and there is one): the answer
    /// is nothing but 429s, as a call's 429 is, for `--max-wait`.
    pub(super) all_limited: bool,
}

impl Tally {
    /// A call of one item: settled if it went through.
    pub(super) fn one(ok: bool) -> Tally {
        Tally {
            settled: u64::from(ok),
            all_limited: false,
        }
    }
}

/// What a batch's answer holds (see [`Tally`]).
pub(super) fn tally(spec: &BatchSpec, call_status: u16, body: &str) -> Tally {
    let Ok(v) = serde_json::from_str::<Value>(body) else {
        return Tally::default();
    };
    let array = match &v {
        Value::Array(a) => a,
        other => match other.pointer(&spec.results) {
            Some(Value::Array(a)) => a,
            _ => return Tally::default(),
        },
    };
    let status = |e: &Value| element_status(spec, e).unwrap_or(call_status);
    Tally {
        settled: array
            .iter()
            .filter(|e| (200..300).contains(&status(e)))
            .count() as u64,
        all_limited: !array.is_empty()
            && array.iter().all(|e| status(e) == 429 && !says_exhausted(e)),
    }
}

/// Whether an element says the credits are exhausted (its `code`).
fn says_exhausted(e: &Value) -> bool {
    e.get("code").and_then(Value::as_str) == Some("credits_exhausted")
}

/// An element's own status: at `--batch-status`, else its `status` or
/// `code` field (a number, or digits), when it is an HTTP status.
fn element_status(spec: &BatchSpec, e: &Value) -> Option<u16> {
    let as_status = |v: &Value| -> Option<u16> {
        let n = match v {
            Value::Number(n) => n.as_u64()?,
            Value::String(s) => s.trim().parse().ok()?,
            _ => return None,
        };
        u16::try_from(n).ok().filter(|s| (100..600).contains(s))
    };
    match &spec.status {
        Some(p) => e.pointer(p).and_then(as_status),
        None => ["status", "code"]
            .iter()
            .find_map(|f| e.get(f).and_then(as_status)),
    }
}

/// What one element means for its item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Verdict {
    /// Done: its element is its result.
    Done,
    /// Credits did not cover it: it stays pending, and the run stops (or
    /// waits for credits).
    Unpaid,
    /// Worth another call (a 408, 425 or 5xx of its own): it did not run.
    Again,
    /// A rate-limit 429 of its own: it did not run, and the rate, not the
    /// item, refused it. It goes again after every worker paused, as the
    /// item of a call's 429 does, and never uses up an attempt. Whatever
    /// the element says beside (a concurrency ceiling, say), its 429 is a
    /// rate limit: an element has no headers to tell a ceiling by.
    Limited,
    /// Failed for good with its own status.
    Failed,
}

/// What the answer says of the credits, for [`verdict`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Credits {
    /// The balance is spent: the last balance seen, less what the other
    /// calls in flight may cost, is 0 or less (`Ledger::spent`), as for
    /// one item's call.
    pub(super) out: bool,
    /// A call of the run, or an item of this batch, was done: the key and
    /// the account work, so a 402 that says nothing of the credits is
    /// about its own item (an add-on it needs), as for one item's call.
    pub(super) got_through: bool,
}

/// What an element with `status` means; `exhausted` when the element
/// itself says the credits are exhausted. A 402 is the account's only
/// when the credits say so (or nothing got through yet, as for an
/// unbatched call): otherwise halting on it would halt every run on the
/// same item, while the credits are there.
pub(super) fn verdict(status: u16, exhausted: bool, credits: Credits) -> Verdict {
    let out = exhausted || credits.out;
    match status {
        200..=299 => Verdict::Done,
        402 | 429 if out => Verdict::Unpaid,
        402 if !credits.got_through => Verdict::Unpaid,
        402 => Verdict::Failed,
        429 => Verdict::Limited,
        408 | 425 | 500..=599 => Verdict::Again,
        _ => Verdict::Failed,
    }
}

/// An item of a batch, as its result is recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Member {
    /// Its line.
    pub(super) line: u64,
    /// Its digest.
    pub(super) digest: u64,
    /// Its calls, this one counted.
    pub(super) attempts: u32,
}

/// What a batch's answer settles.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Settlement {
    /// The items' results and failures, in the batch's order.
    pub(super) record: Vec<Event>,
    /// Positions (in the batch) of the items left pending for want of
    /// credits.
    pub(super) unpaid: Vec<usize>,
    /// Positions of the items to send again.
    pub(super) again: Vec<usize>,
    /// Positions of the items refused by a rate limit of their own, to
    /// send again after a pause.
    pub(super) limited: Vec<usize>,
    /// Those refusals are the items' own: other items of the same call
    /// were accepted. Each spends an attempt, as a retry does: an item
    /// refused every time (OpenAI's "request too large") would otherwise
    /// ride in every batch after it, each pausing every worker, and never
    /// let `--max-wait` end the run.
    pub(super) own: bool,
    /// What those items' elements asked: the pause every worker takes.
    pub(super) limit: Option<Limit>,
}

/// What the rate-limited elements of an answer ask of the run.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Limit {
    /// The longest wait an element asked for (its `retry_after` or
    /// `Retry-After`, in seconds or as an HTTP-date), if any did.
    pub(super) retry_after: Option<Duration>,
    /// What the first of them said.
    pub(super) message: String,
}

/// The wait an element asks for, as a `Retry-After` header would.
fn element_retry_after(element: &str) -> Option<Duration> {
    let v: Value = serde_json::from_str(element).ok()?;
    let asked = ["retry_after", "Retry-After", "retry-after"]
        .iter()
        .find_map(|f| v.get(f))?;
    let text = match asked {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        _ => return None,
    };
    crate::rate::retry_after::parse_uncapped(&text, std::time::SystemTime::now())
}

/// Each member's outcome from its own element: `elements[i]` is
/// `members[i]`'s (as [`pair`] guarantees).
/// An item worth another call that has had `max_attempts` fails with its
/// own status; one refused by a rate limit only when the refusal is its
/// own (see [`Settlement::own`]).
pub(super) fn settle(
    members: &[Member],
    elements: Vec<Element>,
    credits: Credits,
    max_attempts: u32,
) -> Settlement {
    let mut s = Settlement {
        own: elements.iter().any(|e| (200..300).contains(&e.status)),
        ..Settlement::default()
    };
    for (i, (m, e)) in members.iter().zip(elements).enumerate() {
        let v = match verdict(e.status, e.exhausted, credits) {
            Verdict::Again if m.attempts >= max_attempts => Verdict::Failed,
            Verdict::Limited if s.own && m.attempts >= max_attempts => Verdict::Failed,
            v => v,
        };
        match v {
            Verdict::Done => s.record.push(Event::Done {
                line: m.line,
                status: e.status,
                body: e.body.into_bytes(),
                attempts: m.attempts,
                digest: m.digest,
            }),
            Verdict::Unpaid => s.unpaid.push(i),
            Verdict::Again => s.again.push(i),
            Verdict::Limited => {
                let asked = element_retry_after(&e.body);
                let limit = s.limit.get_or_insert_with(|| Limit {
                    retry_after: None,
                    message: reason(&e.body),
                });
                limit.retry_after = limit.retry_after.max(asked);
                s.limited.push(i);
            }
            Verdict::Failed => s.record.push(Event::Failed {
                line: m.line,
                status: Some(e.status),
                reason: format!(
                    "HTTP {} (its own, in the batch): {}",
                    e.status,
                    reason(&e.body)
                ),
                attempts: m.attempts,
                unknown: false,
                digest: m.digest,
            }),
        }
    }
    s
}

/// What an element says of its failure: its `error` or `message` field,
/// else the element itself (cut short).
fn reason(element: &str) -> String {
    let v: Option<Value> = serde_json::from_str(element).ok();
    let said = v.as_ref().and_then(|v| {
        ["error", "message"]
            .iter()
            .find_map(|f| v.get(f).and_then(Value::as_str).map(str::to_string))
    });
    said.unwrap_or_else(|| element.chars().take(200).collect())
}

/// Whether a failed call's answer means the batch is too large: a 413, or
/// a 400 or 422 that says so.
pub(super) fn too_large(status: Option<u16>, reason: &str) -> bool {
    let says = reason.to_ascii_lowercase().contains("batch too large")
        || reason.to_ascii_lowercase().contains("too many items");
    status == Some(413) || (matches!(status, Some(400 | 422)) && says)
}

#[cfg(test)]
#[path = "batch_tests.rs"]
mod tests;
