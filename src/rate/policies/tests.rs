use super::*;
use crate::rate::learn::Phase;
use crate::rate::testing::{check_windows, drive, fates, Call, Client, Fate};
use proptest::prelude::*;

mod bounded;
mod resets;
mod stated;
mod unstated;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn set(limits: &[(u64, u64)], now: Instant) -> PolicySet {
    let mut ws = limits.iter().map(|&(l, w)| ExactWindow::new(l, ms(w), now));
    let primary = ws.next().unwrap();
    PolicySet::new(primary, ws.collect())
}

fn calls_policy(quota: u64, window_ms: Option<u64>, remaining: Option<u64>) -> Announced {
    Announced {
        name: "p".into(),
        unit: Unit::Calls,
        quota: Some(quota),
        window: window_ms.map(ms),
        remaining,
        reset_in: None,
        reset_exact: false,
        reset_dated: false,
    }
}

/// Takes and answers at once, until a take is refused: how many went.
fn at_once(s: &mut PolicySet, now: Instant) -> u64 {
    let mut n = 0;
    while let Ok(slot) = s.try_take(now) {
        s.complete(slot, now);
        n += 1;
    }
    n
}

#[test]
fn the_lowest_applicable_limit_wins() {
    let t0 = Instant::now();
    let mut s = set(&[(10, 1000), (25, 10_000)], t0);
    assert_eq!(at_once(&mut s, t0), 10, "the per-second limit first");
    let t1 = t0 + ms(1000);
    assert_eq!(at_once(&mut s, t1), 10);
    let t2 = t0 + ms(2000);
    assert_eq!(at_once(&mut s, t2), 5, "then the ten-second one");
    // Refused until the first ten calls end, 10 s after they came back.
    assert_eq!(s.try_take(t2), Err(t0 + ms(10_000)));
    assert_eq!(at_once(&mut s, t0 + ms(10_000)), 10);
}

/// A quota stated for the first time nearly used up (by other clients)
/// counts its answered calls one entry each, up to a bound: a monthly
/// quota of a billion took 16 GB and was killed by the kernel.
#[test]
fn a_window_added_nearly_used_up_counts_a_bounded_number_of_calls() {
    let t0 = Instant::now();
    let mut s = set(&[(10, 1000)], t0);
    let month = 30 * 86_400_000;
    let q = 3 * MAX_PREFILL;
    s.announce(&[calls_policy(q, Some(month), Some(5))], t0);
    assert_eq!(s.windows().len(), 2);
    assert_eq!(s.windows()[1].occupancy(t0), MAX_PREFILL);
}

#[test]
fn a_refusal_gives_back_the_places_other_windows_granted() {
    let t0 = Instant::now();
    let mut s = set(&[(5, 1000), (1, 1000)], t0);
    let held = s.try_take(t0).unwrap();
    assert!(s.try_take(t0).is_err());
    assert_eq!(s.windows()[0].in_flight(), 1, "only the held call");
    assert!(s.cancel(held));
    assert!(!s.cancel(held));
    assert_eq!(s.windows()[0].occupancy(t0), 0);
}

#[test]
fn an_announced_policy_lowers_its_window_or_is_added() {
    let t0 = Instant::now();
    let mut s = set(&[(60, 1000)], t0);
    s.announce(&[calls_policy(20, Some(1000), None)], t0);
    assert_eq!(s.windows()[0].limit(), 20);
    assert!(matches!(
        s.take_note(t0),
        Some(Note::Heard(Heard::Lowered {
            quota: 20,
            configured: 60,
            ..
        }))
    ));
    // Said once.
    s.announce(&[calls_policy(20, Some(1000), None)], t0);
    assert_eq!(s.take_note(t0), None);
    // A window it did not know: added, counting the call in flight.
    let flying = s.try_take(t0).unwrap();
    s.announce(&[calls_policy(3, Some(5000), None)], t0);
    assert_eq!(s.windows().len(), 2);
    assert_eq!(s.windows()[1].occupancy(t0), 1);
    s.complete(flying, t0);
    assert_eq!(at_once(&mut s, t0), 2, "3 per 5 s, one already used");
    assert!(matches!(
        s.take_note(t0),
        Some(Note::Heard(Heard::Added { quota: 3, .. }))
    ));
}

#[test]
fn an_added_policy_counts_what_the_server_says_is_used() {
    let t0 = Instant::now();
    let mut s = set(&[(60, 1000)], t0);
    s.announce(&[calls_policy(100, Some(3_600_000), Some(97))], t0);
    assert_eq!(s.windows()[1].occupancy(t0), 3);
}

#[test]
fn a_windowless_report_lowers_the_primary_and_a_higher_one_is_said_once() {
    let t0 = Instant::now();
    let mut s = set(&[(10, 1000), (100, 60_000)], t0);
    s.announce(&[calls_policy(200, None, None)], t0);
    assert_eq!(s.windows()[0].limit(), 10);
    assert!(matches!(
        s.take_note(t0),
        Some(Note::Heard(Heard::Above { quota: 200, .. }))
    ));
    s.announce(&[calls_policy(200, None, None)], t0);
    assert_eq!(s.take_note(t0), None);
    s.announce(&[calls_policy(4, None, None)], t0);
    assert_eq!(s.windows()[0].limit(), 4);
    // Several windows: read against the nearest configured limit.
    let mut s = set(&[(5000, 3_600_000), (10, 1000)], t0);
    s.announce(&[calls_policy(8, None, None)], t0);
    assert_eq!((s.windows()[0].limit(), s.windows()[1].limit()), (5000, 8));
    s.announce(&[calls_policy(4000, None, None)], t0);
    assert_eq!((s.windows()[0].limit(), s.windows()[1].limit()), (4000, 8));
}

#[test]
fn used_up_holds_until_the_reset_in_any_dialect() {
    let t0 = Instant::now();
    let mut s = set(&[(10, 1000), (1000, 86_400_000)], t0);
    let p = Announced {
        reset_in: Some(Duration::from_secs(90)),
        ..calls_policy(1000, Some(86_400_000), Some(0))
    };
    s.announce(&[p], t0);
    assert_eq!(
        s.try_take(t0 + ms(1)).unwrap_err(),
        t0 + Duration::from_secs(90)
    );
    let notes: Vec<_> = std::iter::from_fn(|| s.take_note(t0)).collect();
    assert!(
        notes
            .iter()
            .any(|n| matches!(n, Note::Heard(Heard::Exhausted { .. }))),
        "{notes:?}"
    );
    // The progress display hears of the hold until it ends.
    assert_eq!(s.held_until(t0), Some(t0 + Duration::from_secs(90)));
    assert!(s.try_take(t0 + Duration::from_secs(90)).is_ok());
    assert_eq!(s.held_until(t0 + Duration::from_secs(90)), None);
    // Without a reset: until one of this client's calls ends.
    let mut s = set(&[(10, 1000)], t0);
    let slot = s.try_take(t0).unwrap();
    s.complete(slot, t0 + ms(100));
    s.announce(&[calls_policy(10, None, Some(0))], t0 + ms(100));
    assert_eq!(s.try_take(t0 + ms(101)).unwrap_err(), t0 + ms(1100));
}

/// `remaining: 0` with a reset of nothing (IETF `t=0`, or a reset
/// instant the server's clock put in the past) is a quota back within the
/// second; told nothing of when, a long hold is said and, beyond the quota
/// bound, is a used-up quota. Both held silently for the whole window (an
/// hour here) before.
#[test]
fn nothing_left_with_a_reset_of_nothing_or_none_never_holds_silently() {
    let t0 = Instant::now();
    let hour = 3_600_000;
    let mut s = set(&[(5000, hour)], t0);
    let slot = s.try_take(t0).unwrap();
    s.complete(slot, t0 + ms(10));
    let now = Announced {
        reset_in: Some(Duration::ZERO),
        ..calls_policy(5000, Some(hour), Some(0))
    };
    s.announce(&[now], t0 + ms(10));
    assert_eq!(s.try_take(t0 + ms(11)).unwrap_err(), t0 + ms(1010));
    assert!(s.try_take(t0 + ms(1010)).is_ok());
    assert!(s.exhausted(t0 + ms(1010)).is_none());

    let mut s = set(&[(5000, hour)], t0);
    let slot = s.try_take(t0).unwrap();
    s.complete(slot, t0 + ms(10));
    s.announce(&[calls_policy(5000, Some(hour), Some(0))], t0 + ms(10));
    assert!(
        s.exhausted(t0 + ms(11)).is_some(),
        "an hour's hold is a used-up quota"
    );
    let notes: Vec<_> = std::iter::from_fn(|| s.take_note(t0 + ms(11))).collect();
    assert!(
        notes
            .iter()
            .any(|n| matches!(n, Note::Heard(Heard::Exhausted { .. }))),
        "{notes:?}"
    );
}

#[test]
fn an_announced_token_policy_is_paced_and_said_once() {
    let t0 = Instant::now();
    let mut s = set(&[(10, 1000)], t0);
    let tokens = Announced {
        unit: Unit::Tokens,
        ..calls_policy(50, Some(1000), Some(50))
    };
    s.announce(std::slice::from_ref(&tokens), t0);
    s.announce(&[tokens], t0);
    assert!(matches!(
        s.take_note(t0),
        Some(Note::Heard(Heard::Added {
            quota: 50,
            tokens: true,
            ..
        }))
    ));
    assert_eq!(s.take_note(t0), None);
    assert_eq!((s.windows().len(), s.kept().len()), (1, 1));
    // Calls of 20 tokens each: two fit in 50.
    let mut n = 0;
    while let Ok(slot) = s.try_take_weighted(t0, 1, TokenWeight::whole(20)) {
        s.complete(slot, t0);
        n += 1;
    }
    assert_eq!(n, 2);
    // A call that used less than estimated leaves the rest for others.
    let t1 = t0 + ms(1000);
    let slot = s.try_take_weighted(t1, 1, TokenWeight::whole(40)).unwrap();
    s.complete_used(slot, t1, Some(Used::whole(5)));
    assert!(s.try_take_weighted(t1, 1, TokenWeight::whole(45)).is_ok());
}

/// The set as the driver sees it.
struct Set(PolicySet);

impl Client for Set {
    type Slot = SetSlot;
    fn try_take(&mut self, now: Instant) -> Result<SetSlot, Instant> {
        self.0.try_take(now)
    }
    fn complete(&mut self, slot: SetSlot, at: Instant, _refused: bool) {
        self.0.complete(slot, at);
    }
    fn cancel(&mut self, slot: SetSlot) {
        self.0.cancel(slot);
    }
}

/// Two or three windows of 1 to 12 calls per 10 ms to 2 s, with round
/// trips up to three times the shortest window.
fn scenario() -> impl Strategy<Value = (Vec<(u64, u64)>, Vec<Fate>)> {
    (
        proptest::collection::vec((1u64..=12, 10u64..=2000), 2..=3),
        0u32..=300,
    )
        .prop_flat_map(|(limits, pct)| {
            let shortest = limits.iter().map(|l| l.1).min().unwrap_or(10);
            (Just(limits), fates(150, ms(shortest) * pct / 100))
        })
}

fn with_limit(calls: &[Call], limit: u64) -> Vec<Call> {
    calls.iter().map(|c| Call { limit, ..c.clone() }).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn no_policy_is_ever_exceeded_whatever_the_latency_and_order(
        (limits, fates) in scenario(),
        workers in 1usize..=8,
    ) {
        let t0 = Instant::now();
        let mut c = Set(set(&limits, t0));
        let calls = drive(&mut c, workers, &fates, t0, &mut |_| true);
        for &(l, w) in &limits {
            if let Err(e) = check_windows(&with_limit(&calls, l), ms(w)) {
                prop_assert!(false, "{}/{}ms: {}", l, w, e);
            }
        }
    }

    #[test]
    fn policies_announced_on_the_first_response_are_never_exceeded_after_it(
        (limits, fates) in scenario(),
        workers in 1usize..=8,
    ) {
        // Configured far above what the server keeps; the server announces
        // its policies (and how much of each is used) on every response.
        let t0 = Instant::now();
        let mut c = Announcing {
            set: set(&[(1000, limits[0].1)], t0),
            limits: limits.clone(),
            early: Vec::new(),
            first_back: None,
        };
        let calls = drive(&mut c, workers, &fates, t0, &mut |_| true);
        prop_assert_eq!(calls.len(), c.early.len());
        // Calls sent before the first response could not be paced to the
        // policies: no window whose last-sent call is one of them is
        // checked. Every other window, early calls in it included, keeps
        // every policy.
        let early = c.early.iter().filter(|&&e| e).count();
        prop_assert!(early <= workers, "{} sent before the first response", early);
        for &(l, w) in &limits {
            let judged: Vec<Call> = calls
                .iter()
                .zip(&c.early)
                .map(|(call, &early)| Call {
                    limit: if early { u64::MAX } else { l },
                    ..call.clone()
                })
                .collect();
            if let Err(e) = check_windows(&judged, ms(w)) {
                prop_assert!(false, "{}/{}ms: {}", l, w, e);
            }
        }
    }
}

/// A client whose every response announces the server's policies.
struct Announcing {
    set: PolicySet,
    limits: Vec<(u64, u64)>,
    /// Whether each call was sent before any response came back, in the
    /// driver's order: by what had happened, not by the clock, since a
    /// call may go at the very instant a response comes back, before it.
    early: Vec<bool>,
    first_back: Option<Instant>,
}

impl Client for Announcing {
    type Slot = SetSlot;
    fn try_take(&mut self, now: Instant) -> Result<SetSlot, Instant> {
        let slot = self.set.try_take(now)?;
        self.early.push(self.first_back.is_none());
        Ok(slot)
    }
    fn complete(&mut self, slot: SetSlot, at: Instant, _refused: bool) {
        self.set.complete(slot, at);
        self.first_back.get_or_insert(at);
        let policies: Vec<Announced> = self
            .limits
            .iter()
            .map(|&(l, w)| calls_policy(l, Some(w), None))
            .collect();
        self.set.announce(&policies, at);
    }
    fn cancel(&mut self, slot: SetSlot) {
        // The driver cancels right after the take, before any other.
        self.early.pop();
        self.set.cancel(slot);
    }
}

#[test]
fn a_token_remaining_below_what_was_counted_counts_the_rest_as_spent() {
    let t0 = Instant::now();
    let mut s = set(&[(100, 1000)], t0).with_kept(vec![crate::rate::kept::Kept::new(
        "1000/1m,tokens".parse().unwrap(),
    )
    .unwrap()]);
    let slot = s.try_take_weighted(t0, 1, TokenWeight::whole(100)).unwrap();
    s.complete(slot, t0);
    // The server says 300 are left of 1000: 600 more were spent elsewhere.
    let tokens = Announced {
        unit: Unit::Tokens,
        ..calls_policy(1000, None, Some(300))
    };
    s.announce(std::slice::from_ref(&tokens), t0);
    assert!(s.try_take_weighted(t0, 1, TokenWeight::whole(301)).is_err());
    let slot = s.try_take_weighted(t0, 1, TokenWeight::whole(300)).unwrap();
    s.complete(slot, t0);
    // Said again with what this client spent since: nothing more counts.
    s.announce(
        &[Announced {
            remaining: Some(0),
            ..tokens
        }],
        t0,
    );
    assert_eq!(s.kept()[0].clone().used(t0), Some(1000));
}

#[test]
fn a_call_weighing_several_takes_as_many_places_in_every_window() {
    // --batch-weight items: a batch of 4 counts 4 calls in a 10/1s window.
    let t0 = Instant::now();
    let mut set = PolicySet::new(ExactWindow::new(10, Duration::from_secs(1), t0), vec![]);
    let a = set
        .try_take_weighted(t0, 4, TokenWeight::whole(0))
        .expect("4 of 10");
    let b = set
        .try_take_weighted(t0, 4, TokenWeight::whole(0))
        .expect("8 of 10");
    assert!(
        set.try_take_weighted(t0, 4, TokenWeight::whole(0)).is_err(),
        "12 would overrun"
    );
    assert_eq!(
        set.primary().occupancy(t0),
        8,
        "a refused take leaves nothing"
    );
    set.try_take_weighted(t0, 2, TokenWeight::whole(0))
        .expect("10 of 10");
    // A batch larger than the window can ever hold takes the whole window.
    let later = t0 + Duration::from_secs(5);
    set.complete(a, t0);
    set.complete(b, t0);
    let big = set.try_take_weighted(later, 50, TokenWeight::whole(0));
    assert!(big.is_err(), "the first window still holds the 2 in flight");
    assert!(set.cancel(SetSlot(2)));
    let big = set
        .try_take_weighted(later, 50, TokenWeight::whole(0))
        .expect("capped at the limit");
    assert_eq!(set.primary().occupancy(later), 10);
    assert!(set.cancel(big));
    assert_eq!(set.primary().occupancy(later), 0);
}

/// A told bucket with no burst is paced a twentieth of T apart beyond its
/// rate; refused all the same (a path that jitters more than that), the
/// in-process pacer doubles that allowance, so one 429 buys a margin for
/// the rest of the run.
#[test]
fn a_told_bucket_refused_widens_its_allowance() {
    let t0 = Instant::now();
    let bucket = || crate::rate::kept::Kept::new("10/1s,burst=0".parse().unwrap()).unwrap();
    let mut s = set(&[(100, 1000)], t0).with_kept(vec![bucket()]);
    // The server states its window of 100, so a 429 teaches the primary
    // window nothing: what changes is the bucket's.
    s.announce(&[calls_policy(100, Some(1000), None)], t0);
    let gap = |s: &mut PolicySet, at: Instant| {
        let slot = s.try_take(at).unwrap();
        s.complete(slot, at);
        s.try_take(at).unwrap_err() - at
    };
    assert_eq!(gap(&mut s, t0), ms(105));
    s.rate_limited(t0 + ms(200));
    let t1 = t0 + ms(2000);
    assert_eq!(gap(&mut s, t1), ms(105), "the shared rule leaves it alone");
    s.widen_buckets();
    let t2 = t1 + ms(2000);
    assert_eq!(gap(&mut s, t2), ms(110), "twice the allowance");
    s.widen_buckets();
    assert_eq!(gap(&mut s, t2 + ms(2000)), ms(120));
}

/// The progress line's pace and ETA under a token policy: 600 tokens a
/// second at 100 a call is 6 calls a second, not the 1,000 the policy of
/// calls allows. Read from what the answers used, else the estimates; a
/// refused call weighs nothing, and before any answer the calls' own
/// policies are all there is to go by.
#[test]
fn the_pace_under_a_token_policy_is_its_rate_at_the_calls_mean_weight() {
    let t0 = Instant::now();
    let mut s = set(&[(1000, 1000)], t0).with_kept(vec![crate::rate::kept::Kept::new(
        "600/1s,tokens".parse().unwrap(),
    )
    .unwrap()]);
    assert_eq!(s.per_second(), 1000.0);
    let slot = s.try_take_weighted(t0, 1, TokenWeight::whole(60)).unwrap();
    s.complete_used(slot, t0 + ms(5), Some(Used::whole(150)));
    let slot = s.try_take_weighted(t0, 1, TokenWeight::whole(50)).unwrap();
    s.complete_used(slot, t0 + ms(5), None);
    let slot = s.try_take_weighted(t0, 1, TokenWeight::whole(400)).unwrap();
    s.complete_refused(slot, t0 + ms(5));
    // (150 + 50) / 2 = 100 tokens a call.
    assert!((s.per_second() - 6.0).abs() < 1e-9, "{}", s.per_second());
}

/// Told a bucket of 10 a second with a burst of 5, a response stating it
/// empty with a reset in whole seconds (IETF `t=1`, rounded up from the
/// next unit's 100 ms) holds calls for that one unit, not the second; a
/// reset stated to the millisecond (OpenAI's) is held as said, and one
/// beyond a unit and the rounding is another client's draining it.
#[test]
fn an_emptied_bucket_stated_in_whole_seconds_waits_its_next_unit_not_the_second() {
    let t0 = Instant::now();
    let hold_after = |reset: Duration, exact: bool| {
        let mut s = set(&[(16, 1000)], t0).with_kept(vec![crate::rate::kept::Kept::new(
            "10/1s,burst=5".parse().unwrap(),
        )
        .unwrap()]);
        let said = Announced {
            reset_in: Some(reset),
            reset_exact: exact,
            ..calls_policy(10, Some(1000), Some(0))
        };
        s.announce(&[said], t0);
        match s.try_take(t0 + ms(1)) {
            Ok(_) => Duration::ZERO,
            Err(at) => at - t0,
        }
    };
    assert_eq!(hold_after(Duration::from_secs(1), false), ms(100));
    assert_eq!(hold_after(Duration::from_secs(1), true), ms(1000));
    assert_eq!(hold_after(Duration::from_secs(2), false), ms(2000));
}

/// After the one unit's hold, the bucket kept here is as empty as the
/// server's: one call, then one per 100 ms, not its burst of 6 (which
/// another client emptying the server's bucket would see refused); and a
/// told bucket of tokens emptied waits for the call's tokens to drip back
/// in, not for its reset, which OpenAI and Anthropic state as when the
/// bucket is full again (a minute after it emptied: every `remaining: 0`
/// held a told bucket that long).
#[test]
fn after_an_emptied_buckets_hold_calls_go_one_unit_apart() {
    let t0 = Instant::now();
    let kept = |spec: &str| {
        set(&[(100, 1000)], t0).with_kept(vec![
            crate::rate::kept::Kept::new(spec.parse().unwrap()).unwrap()
        ])
    };
    let mut s = kept("10/1s,burst=5");
    let said = Announced {
        reset_in: Some(Duration::from_secs(1)),
        ..calls_policy(10, Some(1000), Some(0))
    };
    s.announce(&[said], t0);
    let mut sent = Vec::new();
    let mut now = t0;
    while sent.len() < 4 {
        match s.try_take(now) {
            Ok(slot) => {
                s.complete(slot, now);
                sent.push(now - t0);
            }
            Err(at) => now = at,
        }
    }
    assert_eq!(sent, [ms(100), ms(200), ms(300), ms(400)]);
    let mut tokens = kept("60000/1m,burst=60000,tokens");
    let said = Announced {
        unit: Unit::Tokens,
        reset_in: Some(Duration::from_secs(1)),
        ..calls_policy(60000, Some(60_000), Some(0))
    };
    tokens.announce(&[said], t0);
    let at = tokens
        .try_take_weighted(t0, 1, TokenWeight::whole(10))
        .unwrap_err();
    // 10 tokens at 1 ms each, and the skew allowance (200 ms).
    assert!(at - t0 >= ms(10) && at - t0 <= ms(210), "{:?}", at - t0);
}

/// A told bucket of tokens (`--limit 1000/1m,burst=1000,tokens`, as
/// OpenAI's refill) follows what the server says is left, as a window of
/// tokens does: a server charging more than the answers said they used
/// (OpenAI charges `max_tokens` when it admits a call) was sent into a 429
/// after every one-second pause, 13 of them for 100 calls.
#[test]
fn a_told_token_bucket_counts_what_the_server_says_was_spent() {
    let t0 = Instant::now();
    let mut s = set(&[(100, 1000)], t0).with_kept(vec![crate::rate::kept::Kept::new(
        "1000/1m,burst=1000,tokens".parse().unwrap(),
    )
    .unwrap()]);
    let slot = s.try_take_weighted(t0, 1, TokenWeight::whole(100)).unwrap();
    s.complete_used(slot, t0, Some(Used::whole(100)));
    assert!(s
        .try_take_weighted(t0, 1, TokenWeight::whole(800))
        .is_ok_and(|slot| s.cancel(slot)));
    let said = Announced {
        unit: Unit::Tokens,
        ..calls_policy(1000, None, Some(300))
    };
    s.announce(&[said], t0);
    assert!(
        s.try_take_weighted(t0, 1, TokenWeight::whole(400)).is_err(),
        "300 are left"
    );
    assert!(s.try_take_weighted(t0, 1, TokenWeight::whole(250)).is_ok());
}
