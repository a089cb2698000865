//! A limit the server keeps unstated beside one it states: a 429 teaches
//! it unless a stated quota explains the 429.

use super::*;

/// The set told `--limit 90/1s` (its primary window learning from 429s),
/// after one call answered at `t0 + 10 ms` whose response stated a quota
/// of 100 per 5 s with 99 left.
fn told_90_stated_5s(t0: Instant) -> PolicySet {
    let mut s = set(&[(90, 1000)], t0);
    let first = s.try_take(t0).unwrap();
    s.complete(first, t0 + ms(10));
    s.announce(&[per_5s(99, None)], t0 + ms(10));
    assert_eq!(s.windows().len(), 2, "the 5 s quota is kept beside");
    s
}

fn per_5s(left: u64, reset: Option<u64>) -> Announced {
    Announced {
        reset_in: reset.map(ms),
        ..calls_policy(100, Some(5000), Some(left))
    }
}

/// Ten more calls at once, answered 10 ms later, the last of them refused
/// with a 429 whose response says `left` of the 5 s quota, resetting in
/// `reset` ms. Returns what the 429 taught.
fn burst_refused(s: &mut PolicySet, t: Instant, left: u64, reset: Option<u64>) -> Option<u64> {
    let burst: Vec<_> = (0..10).map(|_| s.try_take(t).unwrap()).collect();
    for slot in burst {
        s.complete(slot, t + ms(10));
    }
    s.announce(&[per_5s(left, reset)], t + ms(10));
    s.rate_limited(t + ms(10))
}

/// The server states only its 5 s quota and keeps 10 a second unstated
/// (the helper's run: 32 429s in 100 calls before): the 429 after ten
/// calls, with 89 of the stated quota left, is the unstated limit's, and
/// the told window learns it as it would with nothing stated.
#[test]
fn a_quota_stated_for_another_window_leaves_a_secret_limit_to_learn() {
    let t0 = Instant::now();
    let mut s = told_90_stated_5s(t0);
    let learnt = burst_refused(&mut s, t0 + ms(20), 89, None);
    assert_eq!(learnt, Some(10), "ten accepted in the second");
    assert_eq!(s.primary().limit(), 10);
}

/// The same 429 with the stated quota used up (another client on the key
/// spent it) is that quota's: it holds until the reset and teaches the told
/// window no lower rate.
#[test]
fn a_429_while_a_stated_quota_is_used_up_teaches_nothing() {
    let t0 = Instant::now();
    let mut s = told_90_stated_5s(t0);
    let learnt = burst_refused(&mut s, t0 + ms(20), 0, Some(3000));
    assert_eq!(learnt, None);
    assert_eq!(s.primary().limit(), 90);
    assert_eq!(s.held_until(t0 + ms(40)), Some(t0 + ms(3030)));
}

/// Told `5/100ms`, a server stating a quota of 6 with no window, nothing
/// left and a reset of a second: the hold is the told window's, and a call
/// sent after it may meet the quota's 429, which is the stated quota's
/// until the reset as stated, not a secret limit's. It taught a limit of
/// 1 where the server keeps more.
#[test]
fn a_429_before_a_stated_reset_is_the_quotas_though_the_hold_ended() {
    let t0 = Instant::now();
    let mut s = set(&[(5, 100)], t0);
    assert_eq!(at_once(&mut s, t0), 5);
    let used_up = Announced {
        reset_in: Some(ms(1000)),
        ..calls_policy(6, None, Some(0))
    };
    s.announce(&[used_up], t0);
    let slot = s.try_take(t0 + ms(150)).expect("the window's hold is over");
    s.complete_refused(slot, t0 + ms(160));
    assert_eq!(s.rate_limited(t0 + ms(160)), None);
    assert_eq!(s.primary().limit(), 5);
}

/// One call answered at `t0 + 10 ms` whose response says a quota of 1000
/// tokens is used up for 30 s, then what calls the set still lets go at
/// `t0 + 20 ms` refused with a 429: returns what the 429 taught.
fn refused_with_tokens_used_up(s: &mut PolicySet, t0: Instant) -> Option<u64> {
    let first = s.try_take(t0).unwrap();
    s.complete(first, t0 + ms(10));
    let tokens = Announced {
        name: "tokens".into(),
        unit: Unit::Tokens,
        reset_in: Some(ms(30_000)),
        ..calls_policy(1000, None, Some(0))
    };
    s.announce(&[tokens], t0 + ms(10));
    let burst: Vec<_> = (0..10)
        .filter_map(|_| s.try_take(t0 + ms(20)).ok())
        .collect();
    for slot in burst {
        s.complete(slot, t0 + ms(30));
    }
    s.rate_limited(t0 + ms(30))
}

/// A quota of tokens stated used up (OpenAI's `remaining-tokens: 0`)
/// explains a 429 as one of calls does, as it does for a fleet.
#[test]
fn a_used_up_token_quota_explains_a_429() {
    let t0 = Instant::now();
    let mut s = set(&[(90, 1000)], t0);
    assert_eq!(refused_with_tokens_used_up(&mut s, t0), None);
    assert_eq!(s.primary().limit(), 90);
}

/// A told bucket of tokens (`--limit 1000/1m,burst=1000,tokens`) stated
/// used up explains a 429 too: its level follows the server's, so it
/// holds nothing itself, but the 429 is its quota's, not a secret limit of
/// calls. A fleet's script read it so; in one process it lowered the
/// window of calls to the calls it held.
#[test]
fn a_told_token_bucket_stated_used_up_explains_a_429() {
    let t0 = Instant::now();
    let told = "1000/1m,burst=1000,tokens".parse().unwrap();
    let mut s = set(&[(90, 1000)], t0).with_kept(vec![crate::rate::kept::Kept::new(told).unwrap()]);
    assert_eq!(refused_with_tokens_used_up(&mut s, t0), None);
    assert_eq!(s.primary().limit(), 90);
}
