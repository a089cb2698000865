//! What each call's outcome means for its item and for the run: done,
//! failed, retried under the same key, paused, or the run stopped.
//!
//! [`react`] decides, from the outcome and a few values, and touches
//! nothing: the pool ([`super::pool`]) makes the calls and carries out the
//! [`Action`] it returns.

use std::time::Duration;

use super::events::Event;
use super::gate::Halt;
use super::watch::Systemic;
use crate::classify::CallError;
use crate::input::Item;
use crate::rate::backoff::Backoff;
use crate::rate::policies::QUOTA_BOUND;
use crate::rate::retry_after;

/// The shortest pause a 429 causes, whatever its Retry-After says.
pub const MIN_PAUSE: Duration = Duration::from_secs(1);

/// The longest a pause of batchrun's own choosing grows to during a spell
/// of 429s, in default pauses.
const MOST_PAUSES: u32 = 16;

/// A transient failure whose `Retry-After` asks for longer than this sets
/// its item aside, and its worker goes on with other items meanwhile (see
/// [`Action::Retry`]). Lower than the backoff's cap: with `-c 1` every
/// second a worker holds a waiting item is a second nothing is sent, and
/// setting one aside costs a list entry. Not lower: a server's "again in
/// a second or two" is soon enough to wait for in turn.
pub(super) const SET_ASIDE_PAST: Duration = Duration::from_secs(2);

/// What a response (or its absence) means for the item.
#[derive(Debug)]
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
    /// A success too long to keep (a batch's answer past its cap): the
    /// call ran and was charged, but its results are lost. Sent again, it
    /// would be answered as long: the item fails, keeping its
    /// Idempotency-Key for `--retry-failed`, so a replay gets it back.
    TooLong {
        status: u16,
        reason: String,
    },
}

/// One item's calls so far.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub(super) struct Tries {
    /// Calls that count against `--max-attempts`.
    pub(super) n: u32,
    /// A call for it went out and got no verdict: it may have run.
    pub(super) maybe_ran: bool,
}

/// How the pool treats a failed call: the part of its settings [`react`] reads.
#[derive(Debug, Clone)]
pub struct Policy {
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
    /// Wait for a used-up quota to reset (a 429's `Retry-After` beyond
    /// [`QUOTA_BOUND`]) instead of halting.
    pub wait_for_quota: bool,
}

/// The call whose outcome is decided on, and what else the decision reads.
#[derive(Clone, Copy)]
pub(super) struct Call<'a> {
    /// Its item.
    pub(super) item: &'a Item,
    /// The item's calls, this one counted.
    pub(super) tries: Tries,
    /// This call was the probe of a run waiting for credits.
    pub(super) probing: bool,
    /// How long every answer has been a rate-limit 429, if they have.
    pub(super) limited_for: Option<Duration>,
    /// A random number in [0, 1): the jitter of any wait.
    pub(super) jitter: f64,
    /// A call of this run has succeeded: the key works, so a refusal is
    /// about its item.
    pub(super) got_through: bool,
    /// No item of the run was set aside yet for a refusal before any call
    /// got through: this one may be, while the next item tells whether the
    /// key works.
    pub(super) may_defer: bool,
    /// 401s in a row since the last call that got through, this one
    /// counted.
    pub(super) refusals_in_a_row: u32,
}

/// After calls got through, this many 401s in a row are the key's (revoked
/// or expired mid-run), not their items': the run stops. A 401 is the
/// credentials' answer; a lone one, an API's way to refuse one item.
pub(super) const KEY_REVOKED_AFTER: u32 = 3;

/// Whether a refusal of `status` is the key's, revoked or expired after
/// calls got through: a 401, [`KEY_REVOKED_AFTER`] in a row.
fn revoked(status: u16, call: &Call<'_>) -> bool {
    status == 401 && call.refusals_in_a_row >= KEY_REVOKED_AFTER
}

/// What the pool does next.
#[derive(Debug, PartialEq)]
pub(super) enum Action {
    /// Pass the item's result through the watch; the item is over.
    Record {
        event: Event,
        systemic: Option<Systemic>,
    },
    /// The probe's item is done: record it, then resume the run if the
    /// reserve has room (or keep waiting).
    ProbeDone(Event),
    /// Record `record` (if any) through the watch, then stop the run.
    Stop { record: Option<Event>, halt: Halt },
    /// A transient failure with attempts left: tell the watch, and unless it
    /// halts the run, send the item again after `after`.
    Retry {
        after: Duration,
        systemic: Option<Systemic>,
        /// The server asked for a wait longer than any backoff takes (its
        /// `Retry-After`): what to say, once a run, so a long silence is
        /// explained.
        asked: Option<String>,
        /// The server asked for longer than [`SET_ASIDE_PAST`]: the worker
        /// sets the item aside until then and sends others meanwhile. Only
        /// the server's wait: a backoff of the run's own eases the load on
        /// a failing server, which a worker going on to new items would
        /// not.
        later: bool,
    },
    /// A window 429: every worker pauses this long, then the item goes
    /// again; `message` is what the server said about it.
    Pause {
        pause: Duration,
        message: Option<String>,
    },
    /// A used-up quota waited for (`--wait-for-quota`), or items of a
    /// batch call the pacer's limit let through refused by a rate limit
    /// of their own: as a pause, but nothing about the rate is learnt
    /// from it.
    Hold {
        pause: Duration,
        message: Option<String>,
    },
    /// A concurrency 429: one call fewer in flight, and this item goes
    /// again after this long.
    FewerInFlight(Duration),
    /// Out of file handles: one call fewer in flight, and this item goes
    /// again after this long.
    OutOfHandles(Duration),
    /// Credits ran out and the run waits for them: the item goes again
    /// once they are back. `probe_failed`: this call was the probe.
    WaitForCredits { probe_failed: bool },
    /// Refused (401, 402 with credits left, 403) before any call got
    /// through: the key's or this item's? Set the item aside and send the
    /// next; it goes again after that one, when a refusal is its own.
    Defer,
}

/// What a call's outcome leads to.
#[derive(Debug, PartialEq)]
pub(super) struct Reaction {
    /// The item's calls from now on.
    pub(super) tries: Tries,
    /// The probe is handed on to the next waiting worker, first.
    pub(super) release_probe: bool,
    /// Then this.
    pub(super) action: Action,
}

/// Decides what one call's outcome means; see the module docs.
pub(super) fn react(outcome: Outcome, call: Call<'_>, policy: &Policy) -> Reaction {
    let Call {
        item,
        mut tries,
        probing,
        ..
    } = call;
    match outcome {
        Outcome::Done(status, body) => {
            let done = done(item, status, body, tries.n);
            let action = match probing {
                true => Action::ProbeDone(done),
                false => Action::Record {
                    event: done,
                    systemic: None,
                },
            };
            keep(tries, action)
        }
        Outcome::Refused { done: d, why } => {
            let record = d.map(|(status, body)| done(item, status, body, tries.n));
            let halt = Halt::Reserve(why);
            keep(tries, Action::Stop { record, halt })
        }
        Outcome::OutOfHandles => {
            // Neither the item nor the job is at fault: no attempt is spent.
            tries.n = tries.n.saturating_sub(1);
            // 50 to 250 ms: the workers that met it do not all come back at once.
            let wait = Duration::from_millis(50 + (call.jitter * 201.0) as u64);
            Reaction {
                tries,
                release_probe: probing,
                action: Action::OutOfHandles(wait),
            }
        }
        Outcome::TooLong { status, reason } => Reaction {
            tries,
            release_probe: probing,
            action: Action::Record {
                event: Event::Failed {
                    line: item.line,
                    status: Some(status),
                    reason,
                    attempts: tries.n,
                    unknown: true,
                    digest: item.digest(),
                },
                systemic: None,
            },
        },
        Outcome::Error(err, systemic) => failed(err, systemic, call, policy),
    }
}

/// A call that failed, for whatever reason.
fn failed(err: CallError, systemic: Option<Systemic>, call: Call<'_>, policy: &Policy) -> Reaction {
    let Call {
        mut tries, probing, ..
    } = call;
    // A refusal before any call got through is the key's (or the
    // account's), after one it is the item's.
    let key_refused = match err {
        CallError::Refused { status, .. } => !call.got_through || revoked(status, &call),
        _ => false,
    };
    // Whatever went wrong, a probe that did not find credits gone must
    // not hold the probe: the next waiting worker takes it.
    let release_probe =
        probing && !key_refused && !matches!(err, CallError::CreditsExhausted { .. });
    // A 429 or running out of credits says nothing about the item: no
    // attempt is spent on it.
    if key_refused
        || matches!(
            err,
            CallError::RateLimited { .. }
                | CallError::Concurrency { .. }
                | CallError::CreditsExhausted { .. }
        )
    {
        tries.n = tries.n.saturating_sub(1);
    }
    let action = action_for(err, systemic, call, &mut tries, policy);
    Reaction {
        tries,
        release_probe,
        action,
    }
}

/// What the pool does after the call for `call.item` failed with `err`
/// (`tries` as counted, marked when the call may have run).
fn action_for(
    err: CallError,
    systemic: Option<Systemic>,
    call: Call<'_>,
    tries: &mut Tries,
    policy: &Policy,
) -> Action {
    let (item, probing) = (call.item, call.probing);
    match err {
        CallError::RateLimited {
            retry_after,
            message,
        } => rate_limited(retry_after, message, call.limited_for, policy),
        CallError::Concurrency { retry_after } => {
            // Nothing but these for `--max-wait` halts as rate limits do:
            // a server that answers only them would keep the run forever.
            let for_ = call.limited_for.unwrap_or(Duration::ZERO);
            match for_ >= policy.max_wait {
                true => stop(Halt::Stalled(for_)),
                false => {
                    let pause = retry_after.unwrap_or(Duration::from_secs(1)).max(MIN_PAUSE);
                    Action::FewerInFlight(pause)
                }
            }
        }
        CallError::CreditsExhausted { .. } => match policy.wait_for_credits {
            true => Action::WaitForCredits {
                probe_failed: probing,
            },
            false => stop(Halt::Exhausted),
        },
        CallError::Refused { .. } if !call.got_through && call.may_defer && !probing => {
            Action::Defer
        }
        CallError::Refused { status, reason } if !call.got_through => {
            refused_first(status, reason, item, probing, policy)
        }
        // 401s in a row are the credentials' (a 403 may be an item's): a
        // key revoked mid-run would fail every item left.
        CallError::Refused { status, reason } if revoked(status, &call) => stop(Halt::Auth {
            status,
            line: item.line,
            reason: quoted(&reason),
            mid_run: true,
        }),
        CallError::Refused { status, reason } => Action::Record {
            event: refused_item(item, status, &reason, tries.n),
            systemic,
        },
        CallError::Permanent { status, reason } => Action::Record {
            event: permanent(item, status, &reason, tries.n),
            systemic,
        },
        CallError::Unreadable { reason } => Action::Record {
            event: unreadable(item, &reason, tries.n),
            systemic,
        },
        CallError::Transient {
            reason,
            status,
            retry_after,
            unknown,
        } => {
            // Once any call for the item may have run, the item's outcome
            // stays unknown: a later 503 does not prove the earlier call did
            // not run.
            tries.maybe_ran |= unknown;
            let why = Why {
                reason,
                status,
                retry_after,
            };
            transient(item, *tries, why, systemic, call.jitter, policy)
        }
    }
}

fn keep(tries: Tries, action: Action) -> Reaction {
    Reaction {
        tries,
        release_probe: false,
        action,
    }
}

fn stop(halt: Halt) -> Action {
    Action::Stop { record: None, halt }
}

/// The item's result: done, with the response.
pub(super) fn done(item: &Item, status: u16, body: String, attempts: u32) -> Event {
    Event::Done {
        line: item.line,
        status,
        body: body.into_bytes(),
        attempts,
        digest: item.digest(),
    }
}

/// A rate-limit 429: every worker pauses (a hold, teaching the pacer
/// nothing, when nothing got through since the last one); the item goes
/// again after. A
/// server that answers nothing but rate limits would keep the run waiting
/// forever: past `max_wait` of it, halt resumably. Also what the 429s of
/// a batch's items lead to (`run/batch_pool.rs`).
pub(super) fn rate_limited(
    retry_after: Option<Duration>,
    message: Option<String>,
    limited_for: Option<Duration>,
    policy: &Policy,
) -> Action {
    // A 429 asking for longer than a pause is worth says a quota (a daily
    // limit) is used up: halt resumably and say when it resets, as a
    // quota the headers state does, unless told to wait for it.
    let quota = retry_after.filter(|r| *r > QUOTA_BOUND);
    if let (Some(in_), false) = (quota, policy.wait_for_quota) {
        let e = crate::pace::PaceError::quota_exhausted(String::new(), in_);
        return stop(Halt::of_pace_error(&e));
    }
    let for_ = limited_for.unwrap_or(Duration::ZERO);
    if for_ >= policy.max_wait && quota.is_none() {
        return stop(Halt::Stalled(for_));
    }
    // A zero Retry-After would turn the pause into a hot loop; any other
    // is capped (a quota waited for excepted). A pause of our own choosing
    // (no Retry-After) ends when --max-wait does, so that the next 429
    // halts then: a window's pause carried `--max-wait 5s` to 30 s. It
    // lasts as long as the 429s have (doubling while nothing gets
    // through), up to 16 pauses' worth: an outage answering 429s or a
    // limiter's 503s was asked a flight of calls every window. The bound
    // keeps a wait for a quota (which counts as limited) from making the
    // next pause as long.
    let grown = for_.min(policy.default_pause.saturating_mul(MOST_PAUSES));
    let pause = match (quota, retry_after) {
        (Some(pause), _) => return Action::Hold { pause, message },
        (None, Some(r)) => retry_after::capped(r).max(MIN_PAUSE),
        (None, None) => (policy.default_pause.max(grown))
            .min(policy.max_wait.saturating_sub(for_))
            .max(MIN_PAUSE),
    };
    match limited_for {
        // Nothing got through since the last 429's pause began: the server
        // refuses whatever comes (an outage, a cooldown, a quota of a longer
        // window), which tells no rate. Each such 429 lowered the limit, and
        // the limit it was refused at capped probing: a four-second outage
        // held a run to a call a second to its end (and its next run,
        // through the checkpoint).
        Some(_) => Action::Hold { pause, message },
        None => Action::Pause { pause, message },
    }
}

/// A refusal before any call of the run got through: a 401 or 403 is the
/// key's (the run stops, nothing marked failed), a 402 the account's.
fn refused_first(
    status: u16,
    reason: String,
    item: &Item,
    probing: bool,
    policy: &Policy,
) -> Action {
    match status {
        402 if policy.wait_for_credits => Action::WaitForCredits {
            probe_failed: probing,
        },
        402 => stop(Halt::Exhausted),
        _ => stop(Halt::Auth {
            status,
            line: item.line,
            reason: quoted(&reason),
            mid_run: false,
        }),
    }
}

/// A refusal while other calls of the run got through: the item's failure,
/// with the server's words.
fn refused_item(item: &Item, status: u16, reason: &str, attempts: u32) -> Event {
    Event::Failed {
        line: item.line,
        status: Some(status),
        reason: format!(
            "HTTP {status}: the API refused this item ({}) while other calls got through",
            quoted(reason)
        ),
        attempts,
        unknown: false,
        digest: item.digest(),
    }
}

/// An item whose call got an answer that cannot be read: it ran or may
/// have, so it is not sent again (the same answer would come back).
fn unreadable(item: &Item, reason: &str, attempts: u32) -> Event {
    Event::Failed {
        line: item.line,
        status: None,
        reason: format!(
            "outcome unknown: {reason}; the server answered, so the call may have run and is \
             not sent again (--retry-failed sends it again under the same Idempotency-Key)"
        ),
        attempts,
        unknown: true,
        digest: item.digest(),
    }
}

/// An item the API failed for good (a 4xx that is the item's).
fn permanent(item: &Item, status: u16, reason: &str, attempts: u32) -> Event {
    Event::Failed {
        line: item.line,
        status: Some(status),
        reason: format!("HTTP {status}: {reason}"),
        attempts,
        unknown: false,
        digest: item.digest(),
    }
}

/// The server's words, quoted as they appear in a reason.
fn quoted(words: &str) -> String {
    format!("{words:?}")
}

/// Why a call is worth another try.
struct Why {
    reason: String,
    status: Option<u16>,
    retry_after: Option<Duration>,
}

/// A transient failure: retried with backoff (under the same key) until
/// the attempts run out.
fn transient(
    item: &Item,
    tries: Tries,
    why: Why,
    systemic: Option<Systemic>,
    jitter: f64,
    policy: &Policy,
) -> Action {
    let Why {
        reason,
        status,
        retry_after,
    } = why;
    let (attempts, unknown) = (tries.n, tries.maybe_ran);
    if attempts < policy.max_attempts {
        let after = policy.backoff.wait(attempts, retry_after, jitter);
        let asked = retry_after.filter(|&r| r > policy.backoff.cap).map(|r| {
            // A pause is capped: a longer ask is said as what it is at least.
            let cap = retry_after::MAX_RETRY_AFTER;
            let (more, waits) = match r >= cap {
                true => (
                    " or more",
                    format!("at most {}", humantime::format_duration(cap)),
                ),
                false => ("", "that long".to_string()),
            };
            format!(
                "batchrun: line {}: {reason}: the server asks to try again in {}{more} \
                 (Retry-After); the item waits {waits}, the others go on",
                item.line,
                humantime::format_duration(r)
            )
        });
        return Action::Retry {
            after,
            systemic,
            asked,
            later: retry_after.is_some_and(|r| r > SET_ASIDE_PAST),
        };
    }
    let reason = match unknown {
        true => format!(
            "outcome unknown: {reason} (gave up after {attempts} attempts; the call may \
             have run, so --retry-failed sends it again under the same Idempotency-Key)"
        ),
        false => format!("{reason} (gave up after {attempts} attempts)"),
    };
    Action::Record {
        event: Event::Failed {
            line: item.line,
            status,
            reason,
            attempts,
            unknown,
            digest: item.digest(),
        },
        systemic,
    }
}

#[cfg(test)]
mod tests;
