//! Every shape through the whole model: a bucket, a fixed window, several
//! policies at once, a token policy and a daily quota, with the per-policy
//! stats they leave.

use super::testkit::*;
use super::*;
use crate::rate::policy::Unit;

fn one(m: &mut Model, at: Instant) -> Out {
    call(m, "k", at)
}

/// Admits (and completes) a request of `estimate` tokens charged
/// `charged`: its refusal, if refused.
fn with_tokens(m: &mut Model, estimate: u64, charged: u64, at: Instant) -> Option<Rejection> {
    let tokens = Tokens::whole(estimate, charged);
    match m.admit_tokens("k", "echo", None, tokens, at) {
        Admission::Admitted { ticket, .. } => {
            let _ = m.complete(ticket, Bytes::new(), at);
            None
        }
        Admission::Rejected { why, .. } => Some(why),
        Admission::Replay { .. } => panic!("no idempotency key was sent"),
    }
}

#[test]
fn a_bucket_with_burst_five_refuses_the_seventh_of_seven_without_a_cooldown() {
    let (mut m, t0) = model(Config {
        concurrency: 100,
        ..cfg("30/1s,burst=5")
    });
    let passed: Vec<bool> = (0..7).map(|_| executed(&one(&mut m, t0))).collect();
    assert_eq!(passed, [true, true, true, true, true, true, false]);
    // A call fits again 33.3 ms later: no cooldown, and the reset says so.
    let view = m.policies("k", t0);
    assert_eq!((view[0].limit, view[0].remaining), (30, 0));
    assert_eq!(view[0].reset, Duration::from_nanos(33_333_334));
    assert!(executed(&one(&mut m, t0 + ms(34))));
    let s = m.stats(t0 + ms(34));
    assert_eq!(s.policies[0].policy, "30ps,burst=5");
    assert_eq!(s.policies[0].max_excess, Some(5));
    assert_eq!((s.rejected_rate, s.rejected_cooldown), (1, 0));
}

#[test]
fn a_fixed_window_resets_at_its_boundary_and_the_stats_show_both_counts() {
    let (mut m, t0) = model(Config {
        concurrency: 100,
        ..cfg("3/1s,fixed")
    });
    for _ in 0..3 {
        assert!(executed(&one(&mut m, t0 + ms(900))));
    }
    let a = one(&mut m, t0 + ms(950));
    assert_eq!(rejection(&a), Some(&Rejection::Rate { retry_after: 1 }));
    assert_eq!(m.policies("k", t0 + ms(950))[0].reset, ms(50));
    // No cooldown: the boundary at 1 s lets three more through at once.
    for _ in 0..3 {
        assert!(executed(&one(&mut m, t0 + ms(1000))));
    }
    assert!(rejection(&one(&mut m, t0 + ms(1000))).is_some());
    let s = m.stats(t0 + ms(1000));
    assert_eq!(s.policies[0].max_in_fixed_window, Some(3));
    assert_eq!(s.policies[0].max_in_window, 6, "six within 100 ms");
}

#[test]
fn several_shapes_at_once_each_must_admit_and_the_lowest_wins() {
    let (mut m, t0) = model(Config {
        concurrency: 100,
        cooldown: Duration::ZERO,
        ..cfgs(&["10/1s,burst=9", "4/1m,fixed", "6/10s"])
    });
    for _ in 0..4 {
        assert!(executed(&one(&mut m, t0)));
    }
    // The bucket has room for six more, the fixed window for none: it waits
    // for the minute's boundary.
    let a = one(&mut m, t0);
    assert_eq!(rejection(&a), Some(&Rejection::Rate { retry_after: 60 }));
    let view = m.policies("k", t0);
    let left: Vec<u64> = view.iter().map(|p| p.remaining).collect();
    assert_eq!(left, [6, 0, 2]);
    assert_eq!(view[1].reset, secs(60));
    let s = m.stats(t0);
    let peaks: Vec<u64> = s.policies.iter().map(|p| p.max_in_window).collect();
    assert_eq!(peaks, [4, 4, 4]);
}

#[test]
fn a_token_policy_refuses_an_estimate_that_does_not_fit_and_counts_the_charge() {
    let (mut m, t0) = model(Config {
        concurrency: 100,
        ..cfgs(&["100/1s", "1000/1m,tokens"])
    });
    assert!(m.keeps_tokens());
    assert_eq!(with_tokens(&mut m, 800, 500, t0), None);
    // 500 charged: 500 left, an estimate of 600 does not fit, one of 400
    // does.
    let a = with_tokens(&mut m, 600, 100, t0 + ms(10));
    assert!(matches!(a, Some(Rejection::Rate { .. })));
    let view = m.policies("k", t0 + ms(10));
    assert_eq!((view[1].unit, view[1].remaining), (Unit::Tokens, 500));
    assert_eq!(with_tokens(&mut m, 400, 400, t0 + ms(20)), None);
    let s = m.stats(t0 + ms(20));
    assert_eq!(s.tokens_charged, 900);
    assert_eq!(s.policies[1].max_in_window, 900);
    // A request bigger than the whole budget is told to come back after a
    // window, not never.
    let a = with_tokens(&mut m, 5000, 1, t0 + ms(30));
    assert_eq!(a, Some(Rejection::Rate { retry_after: 60 }));
}

#[test]
fn a_daily_quota_used_up_says_so_with_a_reset_a_day_away() {
    let (mut m, t0) = model(Config {
        concurrency: 100,
        ..cfg("2/1d,fixed")
    });
    let later = t0 + secs(30);
    assert!(executed(&one(&mut m, later)));
    assert!(executed(&one(&mut m, later)));
    let a = one(&mut m, later);
    assert_eq!(
        rejection(&a),
        Some(&Rejection::Rate {
            retry_after: 86_400 - 30
        })
    );
    let view = m.policies("k", later);
    assert_eq!(view[0].remaining, 0);
    assert_eq!(view[0].reset, secs(86_400 - 30));
}

#[test]
fn spike_arrest_still_keeps_its_bucket_beside_another_policy() {
    let (mut m, t0) = model(Config {
        kind: ModelKind::SpikeArrest,
        concurrency: 100,
        ..cfgs(&["30ps", "5/1m,fixed"])
    });
    let passed = (0..10).filter(|_| executed(&one(&mut m, t0))).count();
    assert_eq!(passed, 3, "30ps holds 3");
    for i in 1..=2 {
        assert!(executed(&one(&mut m, t0 + ms(34) * i)));
    }
    assert!(
        rejection(&one(&mut m, t0 + secs(1))).is_some(),
        "5 a minute"
    );
}
