//! A server stating its quota: what is left of it, used up, and a bucket
//! stated as a quota per window.

use super::*;
use crate::rate::testing::{drive_stated, Gcra};

/// The default pacer's set told `--limit 90/1s` (a bare rate: its shape
/// learnt, with a start), empty at `t0`.
fn told_90(t0: Instant) -> PolicySet {
    PolicySet::new(
        ExactWindow::new(90, ms(1000), t0).learning_shape(None),
        Vec::new(),
    )
}

/// The default pacer's set against a server stating a bucket as a quota
/// of 30 a second (its burst unstated), with the pool's answer to a 429:
/// the response is read, then every call pauses a second.
struct StatedBucket {
    set: PolicySet,
    /// Whether each call was sent before any response came back (by what
    /// had happened, as `Announcing` tells it).
    early: Vec<bool>,
    first_back: bool,
    refused_at: Option<Instant>,
}

impl Client for StatedBucket {
    type Slot = SetSlot;
    fn try_take(&mut self, now: Instant) -> Result<SetSlot, Instant> {
        let slot = self.set.try_take(now)?;
        self.early.push(!self.first_back);
        Ok(slot)
    }
    fn complete(&mut self, slot: SetSlot, at: Instant, refused: bool) {
        self.first_back = true;
        match refused {
            true => {
                self.set.complete_refused(slot, at);
                self.refused_at = Some(at);
            }
            false => self.set.complete(slot, at),
        }
    }
    fn cancel(&mut self, slot: SetSlot) {
        self.early.pop();
        self.set.cancel(slot);
    }
    fn heard(&mut self, remaining: u64, reset: Duration, at: Instant) {
        let p = Announced {
            reset_in: Some(reset),
            ..calls_policy(30, Some(1000), Some(remaining))
        };
        self.set.announce(&[p], at);
        if self.refused_at.take().is_some() {
            self.set.rate_limited(at);
            self.set.primary_mut().pause_until(at + ms(1000));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Told three times the rate of a bucket the server states as a quota
    /// per window (nginx `limit_req` with a burst, behind headers that say
    /// `limit: 30`): the first answer already says less is left than the
    /// calls sent explain, and the pacer paces evenly from it, leaving
    /// what is left to the calls on their way, so only calls sent before
    /// the first response came back are ever refused. The one-way
    /// latency varies by at most 3 ms, within the even pace's allowance
    /// (a tenth of its 36.7 ms): a path that jitters more is refused by a
    /// bucket at its own rate, whatever the client.
    #[test]
    fn a_stated_bucket_refuses_only_calls_sent_before_the_first_response(
        burst in 0u64..=6,
        workers in 1usize..=10,
        base in 2u64..=80,
        seed in any::<u64>(),
    ) {
        let mut rng = fastrand::Rng::with_seed(seed);
        let fates: Vec<Fate> = (0..150)
            .map(|_| Fate {
                cancel: false,
                latency: ms(base) + Duration::from_micros(rng.u64(0..=6000)),
                transit: Some(0.5),
            })
            .collect();
        let t0 = Instant::now();
        let mut c = StatedBucket {
            set: told_90(t0),
            early: Vec::new(),
            first_back: false,
            refused_at: None,
        };
        let mut nginx = Gcra::new(30.0, burst);
        let calls = drive_stated(&mut c, workers, &fates, t0, &mut |at| {
            let (accepted, said) = nginx.admit_stated(at);
            (accepted, Some(said))
        });
        let late: Vec<Duration> = calls
            .iter()
            .zip(&c.early)
            .filter(|(call, &early)| call.refused && !early)
            .map(|(call, _)| call.sent - t0)
            .collect();
        prop_assert!(late.is_empty(), "refused though sent after the first response: {:?}", late);
        // And not by going slowly: 150 calls at the even pace (27.3 a
        // second) take 5.5 s, or at one round trip per worker longer; a
        // first flight refused pauses a second.
        let paced = Duration::from_secs_f64(150.0 / 27.3);
        let bound = ms(base + 6) * 150 / workers as u32;
        let last = calls.iter().map(|c| c.sent - t0).max().unwrap_or_default();
        prop_assert!(last <= paced.max(bound) + ms(1500), "the last call went at {:?}", last);
    }
}

/// A bucket stating its limit in whole seconds (`RateLimit: r=0;t=1`, as
/// the IETF fields and `X-RateLimit-Reset` do) says after each call that
/// nothing is left for a second. Paced evenly, that is the bucket's next
/// unit rounded up: the hold is the even pace's, not the second's. As a
/// window whose quota this client used up, and for a reset beyond the
/// window, the reset holds as stated.
#[test]
fn a_whole_second_reset_at_the_even_pace_holds_for_the_pace() {
    let t0 = Instant::now();
    let primary = ExactWindow::new(30, ms(1000), t0)
        .learning_shape(None)
        .without_start();
    let mut s = PolicySet::new(primary, Vec::new());
    let used_up = |reset: u64| Announced {
        reset_in: Some(ms(reset)),
        ..calls_policy(30, Some(1000), Some(0))
    };
    let window: Vec<_> = std::iter::from_fn(|| s.try_take(t0).ok()).collect();
    assert_eq!(window.len(), 30);
    for slot in window {
        s.complete(slot, t0 + ms(10));
    }
    s.announce(&[used_up(1000)], t0 + ms(10));
    assert_eq!(
        s.try_take(t0 + ms(1005)),
        Err(t0 + ms(1010)),
        "a window: held"
    );

    // A burst refused: the set paces evenly from the pause's end.
    let t1 = t0 + ms(2000);
    let burst: Vec<_> = std::iter::from_fn(|| s.try_take(t1).ok()).collect();
    for slot in burst {
        s.complete(slot, t1 + ms(10));
    }
    s.rate_limited(t1 + ms(10));
    let t2 = t1 + ms(1010);
    s.primary_mut().pause_until(t2);
    let slot = s.try_take(t2).unwrap();
    s.complete(slot, t2 + ms(10));
    // An RFC 3339 reset in whole seconds: up to a second late.
    s.announce(&[used_up(1900)], t2 + ms(10));
    let even = ms(1000).mul_f64(1.1 / 30.0);
    assert_eq!(
        s.try_take(t2 + ms(10)),
        Err(t2 + even),
        "the even pace's slot"
    );
    let slot = s.try_take(t2 + even).unwrap();
    s.complete(slot, t2 + even + ms(10));
    s.announce(&[used_up(5000)], t2 + even + ms(10));
    assert_eq!(
        s.try_take(t2 + even + ms(20)),
        Err(t2 + even + ms(5010)),
        "a reset beyond the window and its rounding holds as stated"
    );
}

/// A server stating 30 a second says nothing is left after one call: a
/// bucket with no burst (a window of 30 would have room for 29 more).
/// The set paces evenly from that response, leaving the bucket's next unit
/// to the call still in flight, instead of sending the rest of the window
/// at once when the hold ends, into the bucket's refusals.
#[test]
fn nothing_left_of_a_stated_quota_after_one_call_paces_evenly() {
    let t0 = Instant::now();
    let primary = ExactWindow::new(30, ms(1000), t0).learning_shape(None);
    let mut s = PolicySet::new(primary, Vec::new());
    let first = s.try_take(t0).unwrap();
    let _second = s.try_take(t0).unwrap();
    s.complete(first, t0 + ms(10));
    let used_up = Announced {
        reset_in: Some(ms(1000)),
        ..calls_policy(30, Some(1000), Some(0))
    };
    s.announce(&[used_up], t0 + ms(10));
    let next = t0 + ms(10) + even() * 2;
    assert_eq!(s.try_take(t0 + ms(20)), Err(next));
    one_per_slot(&mut s, next);
}

/// The even pace of 30 a second, with its allowance for jitter.
fn even() -> Duration {
    ms(1000).mul_f64(1.1 / 30.0)
}

/// From `at`, five calls go one per even slot, never two at once.
fn one_per_slot(s: &mut PolicySet, mut at: Instant) {
    for _ in 0..5 {
        s.try_take(at).expect("on the even pace");
        assert!(s.try_take(at).is_err(), "one call per slot");
        at += even();
    }
}

/// Three calls sent and the first response says 2 of a stated 30 a second
/// are left: a window of 30 counting only this client's calls would have
/// at least 27, so the server keeps a bucket whose burst is smaller (or
/// shares the key). The set paces evenly from that response, leaving the
/// two left to the two calls in flight: the next call goes one even
/// interval later, one per interval after. Told 27 are left, it stays a
/// window.
#[test]
fn less_left_of_a_stated_quota_than_the_calls_sent_explain_paces_evenly() {
    let start = |left: u64| {
        let t0 = Instant::now();
        let mut s = told_90(t0);
        let first = s.try_take(t0).unwrap();
        s.try_take(t0).unwrap();
        s.try_take(t0 + ms(13)).unwrap();
        s.complete(first, t0 + ms(14));
        s.announce(&[calls_policy(30, Some(1000), Some(left))], t0 + ms(14));
        (s, t0 + ms(14))
    };
    let (window, _) = start(27);
    assert_eq!(window.primary().shape(), Some(Phase::Window));
    let (mut s, t) = start(2);
    assert!(matches!(s.primary().shape(), Some(Phase::Probing { .. })));
    assert_eq!(s.try_take(t + ms(6)), Err(t + even()));
    one_per_slot(&mut s, t + even());
}

/// A daily quota an earlier run used up says nothing is left on the first
/// response: a quota to wait for (or halt on), not a bucket's burst spent,
/// so the pacer does not go on to pace a day's quota evenly.
#[test]
fn nothing_left_of_a_daily_quota_is_no_bucket() {
    let t0 = Instant::now();
    let day = 86_400_000;
    let primary = ExactWindow::new(1000, ms(day), t0).learning_shape(None);
    let mut s = PolicySet::new(primary, Vec::new());
    let first = s.try_take(t0).unwrap();
    s.complete(first, t0 + ms(10));
    let used_up = Announced {
        reset_in: Some(ms(3_600_000)),
        ..calls_policy(1000, Some(day), Some(0))
    };
    s.announce(&[used_up], t0 + ms(10));
    assert_eq!(s.primary().shape(), Some(Phase::Window));
}

/// A stated window of 10,000 a minute, this client alone on it: past the
/// 4,096 sends the learner remembers, what is left is still what its own
/// calls explain, and it stays a window (no bucket taken for it).
#[test]
fn a_large_stated_window_kept_alone_stays_a_window() {
    let t0 = Instant::now();
    let (quota, minute) = (10_000, 60_000);
    let primary = ExactWindow::new(quota, ms(minute), t0).learning_shape(None);
    let mut s = PolicySet::new(primary, Vec::new());
    let (mut at, mut sent) = (t0, 0);
    while sent < 4_200 {
        match s.try_take(at) {
            Ok(slot) => {
                sent += 1;
                s.complete(slot, at);
                let left = calls_policy(quota, Some(minute), Some(quota - sent));
                s.announce(&[left], at);
            }
            Err(next) => at = next,
        }
    }
    assert_eq!(s.primary().shape(), Some(Phase::Window));
}

/// Another client's 12 calls are in a stated 30 a second when this run
/// starts: the first answer says less is left than this client's calls
/// explain, and it paces evenly. Then nothing is left, until a reset 97 ms
/// away: stated to the millisecond (OpenAI's durations), it holds calls
/// until then, since the window is full whatever the even pace; stated in
/// whole seconds, it may be a second late, and the even pace governs.
#[test]
fn an_exact_reset_holds_the_even_pace_and_a_whole_second_does_not() {
    let at_50ms = |exact: bool| {
        let t0 = Instant::now();
        let mut s = told_90(t0);
        let first = s.try_take(t0).unwrap();
        s.complete(first, t0 + ms(10));
        s.announce(&[calls_policy(30, Some(1000), Some(17))], t0 + ms(10));
        assert!(matches!(s.primary().shape(), Some(Phase::Probing { .. })));
        let full = Announced {
            reset_in: Some(ms(97)),
            reset_exact: exact,
            ..calls_policy(30, Some(1000), Some(0))
        };
        s.announce(&[full], t0 + ms(10));
        s.try_take(t0 + ms(50)).map_err(|until| until - t0)
    };
    assert_eq!(at_50ms(true), Err(ms(107)));
    assert!(at_50ms(false).is_ok(), "the even pace's slot governs");
}
