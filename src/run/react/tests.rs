use super::*;

fn policy() -> Policy {
    Policy {
        max_attempts: 3,
        default_pause: Duration::from_secs(30),
        backoff: Backoff::default(),
        wait_for_credits: false,
        max_wait: Duration::from_secs(600),
        wait_for_quota: false,
    }
}

fn item() -> Item {
    Item::new(7, serde_json::json!({ "n": 7 }))
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
        refusals_in_a_row: 0,
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
            refusals_in_a_row: 0,
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

/// The item's first call, after 429s for `limited_for` with nothing
/// through since the first (None: none yet).
fn limited_call(item: &Item, limited_for: Option<Duration>) -> Call<'_> {
    Call {
        item,
        tries: tries(1),
        probing: false,
        limited_for,
        jitter: 0.5,
        got_through: false,
        may_defer: false,
        refusals_in_a_row: 0,
    }
}

#[test]
fn nothing_but_rate_limits_past_max_wait_stalls_the_run() {
    let item = item();
    let after = |limited_for| {
        let call = limited_call(&item, limited_for);
        let e = CallError::RateLimited {
            retry_after: None,
            message: None,
        };
        let concurrency = CallError::Concurrency { retry_after: None };
        let call2 = Call { ..call };
        (
            react(error(e), call, &policy()).action,
            react(error(concurrency), call2, &policy()).action,
        )
    };
    let max = policy().max_wait;
    let (window, ceiling) = after(Some(max - Duration::from_secs(1)));
    // The pause of a 429 with no Retry-After (a window's) ends with
    // --max-wait, not 29 s past it.
    let one = Duration::from_secs(1);
    assert!(
        matches!(window, Action::Hold { pause, .. } if pause == one),
        "{window:?}"
    );
    assert!(matches!(ceiling, Action::FewerInFlight(_)), "{ceiling:?}");
    let expected = || Action::Stop {
        record: None,
        halt: Halt::Stalled(max),
    };
    // A server answering nothing but concurrency 429s kept the run forever.
    assert_eq!(after(Some(max)), (expected(), expected()));
}

/// A 429 after nothing got through since the last one's pause began (an
/// outage, a cooldown with no `Retry-After`) teaches the pacer nothing (a
/// hold), and its pause lasts as long as the 429s have. Taught, each
/// lowered the limit, capped by the one refused: a four-second outage
/// held a run at a call a second to its end; asked every window, a half
/// hour's outage took a flight of calls a second.
#[test]
fn a_429_with_nothing_through_since_the_last_holds_for_as_long_as_they_have_lasted() {
    let item = item();
    let on = |limited_for| {
        let call = limited_call(&item, limited_for);
        let e = CallError::RateLimited {
            retry_after: None,
            message: None,
        };
        react(error(e), call, &policy()).action
    };
    let p = policy();
    assert!(
        matches!(on(None), Action::Pause { pause, .. } if pause == p.default_pause),
        "the first teaches"
    );
    let held = |for_: u64| match on(Some(Duration::from_secs(for_))) {
        Action::Hold { pause, .. } => pause,
        other => panic!("{other:?}"),
    };
    assert_eq!(held(1), p.default_pause, "no shorter than a pause");
    assert_eq!(
        held(120),
        Duration::from_secs(120),
        "as long as they lasted"
    );
    assert_eq!(held(500), Duration::from_secs(100), "until --max-wait");
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
        refusals_in_a_row: 0,
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
                mid_run: false,
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

/// 401s in a row after calls got through are the key's (revoked or
/// expired mid-run): the run stops, its items pending (each was failed,
/// every item left). A lone 401 is its item's.
#[test]
fn a_401_after_a_success_fails_its_item_and_401s_in_a_row_stop_the_run() {
    let item = item();
    let call = |refusals_in_a_row| Call {
        item: &item,
        tries: tries(1),
        probing: false,
        limited_for: None,
        jitter: 0.5,
        got_through: true,
        may_defer: false,
        refusals_in_a_row,
    };
    let lone = react(refused(401), call(1), &policy());
    assert!(
        matches!(lone.action, Action::Record { .. }),
        "{:?}",
        lone.action
    );
    let r = react(refused(401), call(KEY_REVOKED_AFTER), &policy());
    let expected = Action::Stop {
        record: None,
        halt: Halt::Auth {
            status: 401,
            line: 7,
            reason: "\"needs the Geo add-on\"".into(),
            mid_run: true,
        },
    };
    assert_eq!(r.action, expected);
    assert_eq!(r.tries, tries(0), "no attempt spent");
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
            systemic: None,
            asked: None,
            later: false,
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
        asked: None,
        later: false,
    };
    assert_eq!(r.action, expected, "the server's Retry-After wins");
    // Longer than any backoff: waited for, and said.
    let e = CallError::Transient {
        reason: "HTTP 503".into(),
        status: Some(503),
        retry_after: Some(Duration::from_secs(900)),
        unknown: false,
    };
    let r = on(error(e), 1, false, &p);
    let Action::Retry {
        after,
        asked,
        later,
        ..
    } = r.action
    else {
        panic!("{:?}", r.action)
    };
    assert_eq!(after, Duration::from_secs(900));
    assert!(later, "a long wait sets the item aside");
    assert_eq!(
        asked.as_deref(),
        Some("batchrun: line 7: HTTP 503: the server asks to try again in 15m or more (Retry-After); the item waits at most 15m, the others go on")
    );
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
fn only_the_servers_long_wait_sets_an_item_aside() {
    let p = Policy {
        max_attempts: 10,
        ..policy()
    };
    let asking = |secs: Option<u64>| CallError::Transient {
        reason: "HTTP 503".into(),
        status: Some(503),
        retry_after: secs.map(Duration::from_secs),
        unknown: false,
    };
    let later = |r: Reaction| match r.action {
        Action::Retry { later, .. } => later,
        other => panic!("{other:?}"),
    };
    assert!(later(on(error(asking(Some(3))), 1, false, &p)));
    assert!(!later(on(error(asking(Some(2))), 1, false, &p)));
    // The run's own backoff, even at its cap, keeps the item in turn.
    assert!(!later(on(error(asking(None)), 8, false, &p)));
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
        refusals_in_a_row: 0,
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

/// A 429 whose Retry-After is beyond the quota bound is a used-up quota:
/// the run halts and says when it resets, or with --wait-for-quota pauses
/// until then (uncapped); one within the bound is an ordinary pause.
#[test]
fn a_retry_after_beyond_the_quota_bound_is_a_quota() {
    let limited = |secs: u64, wait_for_quota: bool| {
        let p = Policy {
            wait_for_quota,
            ..policy()
        };
        rate_limited(Some(Duration::from_secs(secs)), None, None, &p)
    };
    let day = QUOTA_BOUND.as_secs() + 86_400;
    match limited(day, false) {
        Action::Stop {
            halt: Halt::QuotaExhausted { name, in_, .. },
            ..
        } => {
            assert!(name.is_empty(), "{name}");
            assert_eq!(in_, Duration::from_secs(day));
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        limited(day, true),
        Action::Hold { pause, .. } if pause == Duration::from_secs(day)
    ));
    let within = QUOTA_BOUND.as_secs();
    assert!(matches!(
        limited(within, false),
        Action::Pause { pause, .. } if pause == Duration::from_secs(within)
    ));
}
