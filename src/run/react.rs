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

/// The shortest pause a 429 causes, whatever its Retry-After says.
pub const MIN_PAUSE: Duration = Duration::from_secs(1);

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
    },
    /// A window 429: every worker pauses this long, then the item goes
    /// again; `message` is what the server said about it.
    Pause {
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
        Outcome::Error(err, systemic) => failed(err, systemic, call, policy),
    }
}

/// A call that failed, for whatever reason.
fn failed(err: CallError, systemic: Option<Systemic>, call: Call<'_>, policy: &Policy) -> Reaction {
    let Call {
        item,
        mut tries,
        probing,
        ..
    } = call;
    // A refusal before any call got through is the key's (or the
    // account's), after one it is the item's.
    let key_refused = matches!(err, CallError::Refused { .. }) && !call.got_through;
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
    let action = match err {
        CallError::RateLimited {
            retry_after,
            message,
        } => rate_limited(retry_after, message, call.limited_for, policy),
        CallError::Concurrency { retry_after } => {
            let pause = retry_after.unwrap_or(Duration::from_secs(1)).max(MIN_PAUSE);
            Action::FewerInFlight(pause)
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
        CallError::Refused { status, reason } => Action::Record {
            event: refused_item(item, status, &reason, tries.n),
            systemic,
        },
        CallError::Permanent { status, reason } => Action::Record {
            event: Event::Failed {
                line: item.line,
                status: Some(status),
                reason: format!("HTTP {status}: {reason}"),
                attempts: tries.n,
                unknown: false,
                digest: item.digest(),
            },
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
            transient(item, tries, why, systemic, call.jitter, policy)
        }
    };
    Reaction {
        tries,
        release_probe,
        action,
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

/// A rate-limit 429: every worker pauses; the item goes again after. A
/// server that answers nothing but rate limits would keep the run waiting
/// forever: past `max_wait` of it, halt resumably.
fn rate_limited(
    retry_after: Option<Duration>,
    message: Option<String>,
    limited_for: Option<Duration>,
    policy: &Policy,
) -> Action {
    let for_ = limited_for.unwrap_or(Duration::ZERO);
    if for_ >= policy.max_wait {
        return stop(Halt::Stalled(for_));
    }
    // A zero Retry-After would turn the pause into a hot loop.
    let pause = retry_after.unwrap_or(policy.default_pause).max(MIN_PAUSE);
    Action::Pause { pause, message }
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
        return Action::Retry { after, systemic };
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
mod tests {
    use super::*;

    fn policy() -> Policy {
        Policy {
            max_attempts: 3,
            default_pause: Duration::from_secs(30),
            backoff: Backoff::default(),
            wait_for_credits: false,
            max_wait: Duration::from_secs(600),
        }
    }

    fn item() -> Item {
        Item {
            line: 7,
            value: serde_json::json!({ "n": 7 }),
        }
    }

    /// The reaction to `outcome` on the item's `n`th call.
    fn on(outcome: Outcome, n: u32, probing: bool, policy: &Policy) -> Reaction {
        let item = item();
        let call = Call {
            item: &item,
            tries: Tries {
                n,
                maybe_ran: false,
            },
            probing,
            limited_for: None,
            jitter: 0.5,
            got_through: false,
            may_defer: false,
        };
        react(outcome, call, policy)
    }

    fn error(e: CallError) -> Outcome {
        Outcome::Error(e, None)
    }

    fn transient(reason: &str, unknown: bool) -> CallError {
        CallError::Transient {
            reason: reason.into(),
            status: reason.strip_prefix("HTTP ").and_then(|s| s.parse().ok()),
            retry_after: None,
            unknown,
        }
    }

    fn tries(n: u32) -> Tries {
        Tries {
            n,
            maybe_ran: false,
        }
    }

    #[test]
    fn a_done_call_records_the_item_with_its_attempts() {
        let r = on(Outcome::Done(200, "{}".into()), 2, false, &policy());
        let event = done(&item(), 200, "{}".into(), 2);
        let expected = Action::Record {
            event,
            systemic: None,
        };
        assert_eq!(r.action, expected);
        assert_eq!((r.tries, r.release_probe), (tries(2), false));
    }

    #[test]
    fn a_probe_that_goes_through_is_told_apart() {
        let r = on(Outcome::Done(200, "ok".into()), 1, true, &policy());
        assert_eq!(
            r.action,
            Action::ProbeDone(done(&item(), 200, "ok".into(), 1))
        );
        assert!(!r.release_probe, "the probe's end is decided by the pool");
    }

    #[test]
    fn a_refusal_stops_the_run_and_keeps_a_done_call() {
        let why = "the reserve".to_string();
        let r = on(
            Outcome::Refused {
                done: Some((200, "{}".into())),
                why: why.clone(),
            },
            1,
            false,
            &policy(),
        );
        let expected = Action::Stop {
            record: Some(done(&item(), 200, "{}".into(), 1)),
            halt: Halt::Reserve(why.clone()),
        };
        assert_eq!(r.action, expected);
        let r = on(
            Outcome::Refused {
                done: None,
                why: why.clone(),
            },
            1,
            true,
            &policy(),
        );
        let expected = Action::Stop {
            record: None,
            halt: Halt::Reserve(why),
        };
        assert_eq!(r.action, expected);
        assert!(!r.release_probe);
    }

    #[test]
    fn out_of_handles_spends_no_attempt_and_waits_50_to_250_ms() {
        let r = on(Outcome::OutOfHandles, 2, true, &policy());
        assert_eq!(r.tries, tries(1));
        assert!(r.release_probe);
        let item = item();
        let wait = |jitter| {
            let call = Call {
                item: &item,
                tries: tries(1),
                probing: false,
                limited_for: None,
                jitter,
                got_through: false,
                may_defer: false,
            };
            react(Outcome::OutOfHandles, call, &policy()).action
        };
        assert_eq!(wait(0.0), Action::OutOfHandles(Duration::from_millis(50)));
        assert_eq!(
            wait(0.999_999),
            Action::OutOfHandles(Duration::from_millis(250))
        );
    }

    #[test]
    fn a_rate_limit_pauses_for_its_retry_after_at_least_a_second() {
        let limited = |retry_after| {
            error(CallError::RateLimited {
                retry_after,
                message: Some("slow".into()),
            })
        };
        let pause_of = |r: Reaction| match r.action {
            Action::Pause { pause, message } => {
                assert_eq!(message.as_deref(), Some("slow"));
                assert_eq!(r.tries, tries(1), "no attempt spent");
                pause
            }
            other => panic!("{other:?}"),
        };
        let p = policy();
        let secs = |s| Some(Duration::from_secs(s));
        assert_eq!(
            pause_of(on(limited(secs(3)), 2, false, &p)),
            secs(3).unwrap()
        );
        assert_eq!(pause_of(on(limited(secs(0)), 2, false, &p)), MIN_PAUSE);
        assert_eq!(pause_of(on(limited(None), 2, false, &p)), p.default_pause);
        assert!(on(limited(None), 2, true, &p).release_probe);
    }

    #[test]
    fn nothing_but_rate_limits_past_max_wait_stalls_the_run() {
        let item = item();
        let after = |limited_for| {
            let call = Call {
                item: &item,
                tries: tries(1),
                probing: false,
                limited_for,
                jitter: 0.5,
                got_through: false,
                may_defer: false,
            };
            let e = CallError::RateLimited {
                retry_after: None,
                message: None,
            };
            react(error(e), call, &policy()).action
        };
        let max = policy().max_wait;
        assert!(matches!(
            after(Some(max - Duration::from_secs(1))),
            Action::Pause { .. }
        ));
        let expected = Action::Stop {
            record: None,
            halt: Halt::Stalled(max),
        };
        assert_eq!(after(Some(max)), expected);
    }

    #[test]
    fn a_concurrency_429_means_fewer_in_flight_for_its_retry_after() {
        let c = |retry_after| error(CallError::Concurrency { retry_after });
        let r = on(c(None), 1, false, &policy());
        assert_eq!(r.action, Action::FewerInFlight(Duration::from_secs(1)));
        assert_eq!(r.tries, tries(0));
        let r = on(c(Some(Duration::from_secs(4))), 1, true, &policy());
        assert_eq!(r.action, Action::FewerInFlight(Duration::from_secs(4)));
        assert!(r.release_probe);
        let r = on(c(Some(Duration::ZERO)), 1, false, &policy());
        assert_eq!(r.action, Action::FewerInFlight(MIN_PAUSE));
    }

    #[test]
    fn exhaustion_halts_or_waits_and_keeps_the_probe() {
        let out = || error(CallError::CreditsExhausted { status: 402 });
        let r = on(out(), 1, false, &policy());
        let halt = Action::Stop {
            record: None,
            halt: Halt::Exhausted,
        };
        assert_eq!(r.action, halt);
        let waiting = Policy {
            wait_for_credits: true,
            ..policy()
        };
        let r = on(out(), 2, false, &waiting);
        let expected = Action::WaitForCredits {
            probe_failed: false,
        };
        assert_eq!((r.action, r.tries), (expected, tries(1)));
        let r = on(out(), 1, true, &waiting);
        assert_eq!(r.action, Action::WaitForCredits { probe_failed: true });
        assert!(
            !r.release_probe,
            "the probe found credits gone: it stays held"
        );
    }

    fn refused(status: u16) -> Outcome {
        error(CallError::Refused {
            status,
            reason: "needs the Geo add-on".into(),
        })
    }

    /// As [`on`], after another call of the run got through.
    fn on_after_success(outcome: Outcome, probing: bool, policy: &Policy) -> Reaction {
        let item = item();
        let call = Call {
            item: &item,
            tries: tries(1),
            probing,
            limited_for: None,
            jitter: 0.5,
            got_through: true,
            may_defer: false,
        };
        react(outcome, call, policy)
    }

    #[test]
    fn a_refusal_before_any_success_stops_the_run_and_marks_nothing() {
        for status in [401, 403] {
            let r = on(refused(status), 1, true, &policy());
            let expected = Action::Stop {
                record: None,
                halt: Halt::Auth {
                    status,
                    line: 7,
                    reason: "\"needs the Geo add-on\"".into(),
                },
            };
            assert_eq!(r.action, expected);
            assert!(!r.release_probe);
            assert_eq!(r.tries, tries(0), "no attempt spent");
        }
        let r = on(refused(402), 1, false, &policy());
        let expected = Action::Stop {
            record: None,
            halt: Halt::Exhausted,
        };
        assert_eq!(r.action, expected);
    }

    #[test]
    fn a_refusal_after_a_success_fails_only_its_item_with_the_servers_words() {
        for status in [401, 402, 403] {
            let r = on_after_success(refused(status), true, &policy());
            let Action::Record {
                event:
                    Event::Failed {
                        line,
                        status: s,
                        reason,
                        ..
                    },
                ..
            } = r.action
            else {
                panic!("{:?}", r.action)
            };
            assert_eq!((line, s), (7, Some(status)));
            assert!(reason.contains("\"needs the Geo add-on\""), "{reason}");
            assert!(reason.starts_with(&format!("HTTP {status}")), "{reason}");
            assert!(r.release_probe);
        }
    }

    #[test]
    fn a_permanent_error_fails_the_item_with_its_cause() {
        let e = CallError::Permanent {
            status: 404,
            reason: "no such thing".into(),
        };
        let systemic = Some(Systemic::Status(404));
        let r = on(Outcome::Error(e, systemic.clone()), 1, true, &policy());
        let event = Event::Failed {
            line: 7,
            status: Some(404),
            reason: "HTTP 404: no such thing".into(),
            attempts: 1,
            unknown: false,
            digest: item().digest(),
        };
        assert_eq!(r.action, Action::Record { event, systemic });
        assert!(r.release_probe);
    }

    #[test]
    fn a_transient_error_is_retried_with_backoff_until_the_last_attempt() {
        let p = policy();
        let r = on(error(transient("HTTP 503", false)), 2, true, &p);
        let after = p.backoff.wait(2, None, 0.5);
        assert_eq!(
            r.action,
            Action::Retry {
                after,
                systemic: None
            }
        );
        assert!(r.release_probe);
        let e = CallError::Transient {
            reason: "busy".into(),
            status: Some(503),
            retry_after: Some(Duration::from_secs(2)),
            unknown: false,
        };
        let r = on(error(e), 1, false, &p);
        let expected = Action::Retry {
            after: Duration::from_secs(2),
            systemic: None,
        };
        assert_eq!(r.action, expected, "the server's Retry-After wins");
        let r = on(error(transient("HTTP 503", false)), 3, false, &p);
        let event = Event::Failed {
            line: 7,
            status: Some(503),
            reason: "HTTP 503 (gave up after 3 attempts)".into(),
            attempts: 3,
            unknown: false,
            digest: item().digest(),
        };
        let systemic = None;
        assert_eq!(r.action, Action::Record { event, systemic });
    }

    #[test]
    fn once_a_call_may_have_run_the_item_stays_unknown() {
        let p = policy();
        let r = on(error(transient("timed out", true)), 1, false, &p);
        assert!(r.tries.maybe_ran);
        let item = item();
        let call = Call {
            item: &item,
            tries: Tries {
                n: 3,
                maybe_ran: true,
            },
            probing: false,
            limited_for: None,
            jitter: 0.5,
            got_through: false,
            may_defer: false,
        };
        let r = react(error(transient("HTTP 503", false)), call, &p);
        match r.action {
            Action::Record {
                event: Event::Failed {
                    unknown, reason, ..
                },
                ..
            } => {
                assert!(unknown);
                assert!(reason.starts_with("outcome unknown: HTTP 503"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
    }
}
