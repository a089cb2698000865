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

/// A server's token bucket as OpenAI and Anthropic keep it: `quota`
/// refilling over a minute, counting `unit` of a call's tokens (all of
/// them, or Anthropic's input or output apart), stating what is left and
/// when it is full again (to the millisecond, `exact`, or in whole seconds
/// rounded up and one more, as the sim's RFC 3339 instant, read against
/// the response's `Date`).
struct TokenBucket {
    quota: u64,
    unit: Unit,
    exact: bool,
    /// Tokens in the bucket as of `at`.
    level: f64,
    at: Instant,
}

impl TokenBucket {
    fn new(quota: u64, unit: Unit, exact: bool, t0: Instant) -> TokenBucket {
        TokenBucket {
            quota,
            unit,
            exact,
            level: 0.0,
            at: t0,
        }
    }

    fn drain(&mut self, now: Instant) {
        let gone = now.saturating_duration_since(self.at).as_secs_f64() * self.quota as f64 / 60.0;
        self.level = (self.level - gone).max(0.0);
        self.at = self.at.max(now);
    }

    /// The part of `w` it counts.
    fn counts(&self, w: TokenWeight) -> f64 {
        w.of(self.unit.counted()) as f64
    }

    /// Whether `w` fits at `now`.
    fn fits(&mut self, now: Instant, w: TokenWeight) -> bool {
        self.drain(now);
        self.level + self.counts(w) <= self.quota as f64
    }

    /// Counts `w` at `now` when `admitted`; then states (remaining, reset).
    fn state(&mut self, now: Instant, w: TokenWeight, admitted: bool) -> Announced {
        self.drain(now);
        if admitted {
            self.level += self.counts(w);
        }
        let reset = Duration::from_secs_f64(self.level * 60.0 / self.quota as f64);
        let reset = match self.exact {
            true => ms(reset.as_nanos().div_ceil(1_000_000) as u64),
            false => Duration::from_secs(reset.as_nanos().div_ceil(1_000_000_000) as u64 + 1),
        };
        let remaining = self.quota.saturating_sub(self.level.ceil() as u64);
        Announced {
            name: format!("{:?}", self.unit),
            unit: self.unit,
            reset_in: Some(reset),
            reset_exact: self.exact,
            reset_dated: !self.exact,
            ..calls_policy(self.quota, None, Some(remaining))
        }
    }
}

/// A server of one or more [`TokenBucket`]s: a call is admitted when it
/// fits in each, and then counted in each.
struct Buckets(Vec<TokenBucket>);

impl Buckets {
    /// Admits `w` at `now`, or refuses; then states every bucket.
    fn admit(&mut self, now: Instant, w: TokenWeight) -> (bool, Vec<Announced>) {
        let fits = self.0.iter_mut().all(|b| b.fits(now, w));
        (
            fits,
            self.0.iter_mut().map(|b| b.state(now, w, fits)).collect(),
        )
    }
}

/// A call out: its arrival at the server, its response back, its slot,
/// its tokens, and the server's verdict once it arrived.
type Out = (
    Instant,
    Instant,
    SetSlot,
    TokenWeight,
    Option<(bool, Vec<Announced>)>,
);

/// Drives a set told `--limit 1000/1s` against `server`'s token buckets,
/// stating themselves as OpenAI (`exact`) or Anthropic does, with calls of
/// `weights` tokens each, `latency` ms each way (the way back taken from
/// the next entry, so that responses come back out of the order the
/// server admitted them in), at most `workers` at once. The server admits
/// calls in the order they reach it; the client reads each answer when it
/// is back. The first call goes alone (before it, the token quotas are
/// unknown). Returns the calls refused, when the last was sent, and
/// whether a refill was heard.
fn against_buckets(
    mut server: Buckets,
    weights: &[TokenWeight],
    latency: &[u64],
    workers: usize,
    t0: Instant,
) -> (usize, Instant, bool) {
    let mut s = PolicySet::new(ExactWindow::new(1000, ms(1000), t0), Vec::new());
    let mut out: Vec<Out> = Vec::new();
    let (mut now, mut refused, mut last, mut heard) = (t0, 0, t0, false);
    let mut next = 0;
    while next < weights.len() || !out.is_empty() {
        let alone = next > 0 && !heard_any(&s) && !out.is_empty();
        let first_back = out.iter().map(|o| o.1).min();
        if next < weights.len() && out.len() < workers && !alone {
            match s.try_take_weighted(now, 1, weights[next]) {
                Ok(slot) => {
                    let there = ms(latency[next % latency.len()]);
                    let back = ms(latency[(next + 1) % latency.len()]);
                    let sent = (now + there, now + there + back, slot, weights[next], None);
                    out.push(sent);
                    last = now;
                    next += 1;
                    continue;
                }
                Err(at) => now = first_back.map_or(at, |b| b.min(at)).max(now),
            }
        } else if let Some(b) = first_back {
            now = now.max(b);
        }
        // The server admits what reached it by `now`, in arrival order.
        out.sort_by_key(|o| o.0);
        for o in out.iter_mut().filter(|o| o.0 <= now && o.4.is_none()) {
            o.4 = Some(server.admit(o.0, o.3));
        }
        // The client reads what is back, in the order it came back.
        out.sort_by_key(|o| o.1);
        while out.first().is_some_and(|o| o.1 <= now) {
            let (_, back, slot, tokens, verdict) = out.remove(0);
            let (fits, said) = verdict.expect("admitted before it is back");
            if fits {
                s.complete_used(slot, back, Some(tokens.into()));
            } else {
                refused += 1;
                s.complete_refused(slot, back);
            }
            s.announce(&said, back);
            while let Some(n) = s.take_note(back) {
                heard |= matches!(n, Note::Heard(Heard::Refills { .. }));
            }
        }
    }
    (refused, last, heard)
}

/// [`against_buckets`] of one bucket of all tokens, of `quota`, stating
/// itself as OpenAI (`exact`) or Anthropic.
fn against_a_token_bucket(
    (quota, exact): (u64, bool),
    weights: &[u64],
    latency: &[u64],
    workers: usize,
    t0: Instant,
) -> (usize, Instant, bool) {
    let server = Buckets(vec![TokenBucket::new(quota, Unit::Tokens, exact, t0)]);
    let weights: Vec<TokenWeight> = weights.iter().map(|&w| TokenWeight::whole(w)).collect();
    against_buckets(server, &weights, latency, workers, t0)
}

fn heard_any(s: &PolicySet) -> bool {
    s.kept().iter().any(|k| k.unit().is_tokens())
}

/// Anthropic's input and output buckets, stated apart: each counts only
/// its part of a call (read as one quota of all tokens, each held prompts
/// and answers together, 3.6-3.7 times the ideal time against 6,000
/// output tokens a minute). 200 calls of 1,000 input and 150 output
/// tokens against 40,000 input and 6,000 output a minute: 40 calls a
/// minute either way, the first 40 at once, then 160 at the refill: 240
/// s, and 4 s of skew allowance (each call is counted in full only once
/// the other bucket admits it).
#[test]
fn anthropics_input_and_output_buckets_are_paced_apart() {
    let t0 = Instant::now();
    let server = || {
        Buckets(vec![
            TokenBucket::new(40_000, Unit::InputTokens, false, t0),
            TokenBucket::new(6_000, Unit::OutputTokens, false, t0),
        ])
    };
    let weights = vec![TokenWeight::split(1000, 150); 200];
    let (refused, last, heard) = against_buckets(server(), &weights, &[20], 4, t0);
    assert_eq!((refused, heard), (0, true));
    let took = last - t0;
    assert!(took >= ms(238_000) && took <= ms(252_000), "{took:?}");
}
/// OpenAI's token bucket, whose quota is stated without a window: kept
/// as a sliding minute it sent the quota, then waited out the minute
/// (2.3 times the ideal time in trial K); its resets keep proportion with
/// its use, so it is found to be a bucket and paced as one: 9,000 tokens
/// against 6,000 refilling over a minute take about 30 s, not 60.
#[test]
fn a_stated_token_bucket_is_found_and_paced_at_its_refill() {
    let t0 = Instant::now();
    let weights = vec![300; 30];
    let (refused, last, heard) = against_a_token_bucket((6000, true), &weights, &[20], 4, t0);
    assert_eq!(refused, 0);
    assert!(heard);
    // 3,000 beyond the quota at 100 a second: 30 s; at most 34 with the
    // skew allowance, and far under the minute a window would wait.
    let took = last - t0;
    assert!(took >= ms(29_000) && took <= ms(34_000), "{took:?}");
    // Answers read out of the order the server admitted the calls in, in
    // whole seconds too: found all the same, and nothing refused.
    for exact in [true, false] {
        let latency = [5, 80, 20, 140, 1];
        let (refused, _, heard) = against_a_token_bucket((6000, exact), &weights, &latency, 8, t0);
        assert_eq!((refused, heard), (0, true), "{exact}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Whatever the calls weigh, the latency and the calls at once, no
    /// call after the first answer is refused by a stated token bucket,
    /// found or not.
    #[test]
    fn a_stated_token_bucket_never_refuses_a_call_after_the_first_answer(
        weights in proptest::collection::vec(1u64..900, 10..80),
        latency in proptest::collection::vec(1u64..150, 1..8),
        workers in 1usize..12,
        quota in 2_000u64..12_000,
        exact in any::<bool>(),
    ) {
        let server = (quota, exact);
        let (refused, _, _) = against_a_token_bucket(server, &weights, &latency, workers, Instant::now());
        prop_assert_eq!(refused, 0);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Against Anthropic's input and output buckets, whatever each call's
    /// prompt and answer weigh, the latency and the calls at once: no call
    /// after the first answer is refused.
    #[test]
    fn input_and_output_buckets_never_refuse_a_call_after_the_first_answer(
        weights in proptest::collection::vec((1u64..3000, 0u64..600), 10..60),
        latency in proptest::collection::vec(1u64..150, 1..8),
        workers in 1usize..12,
        quotas in (4_000u64..40_000, 1_000u64..8_000),
        exact in any::<bool>(),
    ) {
        let t0 = Instant::now();
        let server = Buckets(vec![
            TokenBucket::new(quotas.0, Unit::InputTokens, exact, t0),
            TokenBucket::new(quotas.1, Unit::OutputTokens, exact, t0),
        ]);
        let weights: Vec<TokenWeight> = (weights.iter())
            .map(|&(i, o)| TokenWeight::split(i, o))
            .collect();
        let (refused, _, _) = against_buckets(server, &weights, &latency, workers, t0);
        prop_assert_eq!(refused, 0);
    }
}

/// A found bucket whose quota the server then states lower (a tier
/// changed, or a proxy's lower quota): the bucket shrinks to it. It kept
/// its first size and let 7,900 tokens go at once against a stated 4,000.
#[test]
fn a_found_bucket_stated_smaller_shrinks_to_it() {
    let t0 = Instant::now();
    let mut s = PolicySet::new(ExactWindow::new(1000, ms(1000), t0), Vec::new());
    let said = |quota: u64, used: u64| Announced {
        unit: Unit::Tokens,
        reset_in: Some(ms(used * 60_000 / quota)),
        reset_exact: true,
        ..calls_policy(quota, None, Some(quota - used))
    };
    for used in (500..=4000).step_by(500) {
        s.announce(&[said(8000, used)], t0);
    }
    assert!(s.kept()[0].refills(), "{:?}", s.kept()[0].spec());
    let later = t0 + ms(60_000);
    s.announce(&[said(4000, 1)], later);
    assert!(s
        .try_take_weighted(later, 1, TokenWeight::whole(4500))
        .is_err());
    assert!(s
        .try_take_weighted(later, 1, TokenWeight::whole(3500))
        .is_ok());
}
