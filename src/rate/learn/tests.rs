use super::*;
use crate::rate::exact::{ExactWindow, Learning, SlotId};
use crate::rate::testing::{drive, Call, Client, Fate, Gcra};
use proptest::prelude::*;

const W: Duration = Duration::from_secs(1);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[test]
fn a_429_after_a_burst_holds_the_limit_and_paces_evenly() {
    let t0 = Instant::now();
    let mut l = ShapeLearner::new(W);
    for _ in 0..7 {
        l.sent(30, t0);
    }
    assert_eq!(l.ready_at(30, t0), None, "a window has no even pace");
    assert_eq!(l.refused(30, 6, t0 + ms(20), true), Verdict::Hold);
    let until = t0 + ms(1020);
    l.paused_until(until);
    // The ramp: one call per W/30 plus the skew allowance, at a quarter
    // of the pace at first, no burst.
    l.sent(30, until);
    let next = until + W.mul_f64(1.1 / 30.0 / RAMP_FROM);
    assert_eq!(l.ready_at(30, until), Some(next));
    // A window on, the whole pace.
    let later = until + W;
    l.sent(30, later);
    assert_eq!(l.ready_at(30, later), Some(later + W.mul_f64(1.1 / 30.0)));
    assert_eq!(
        l.advance(later),
        None,
        "the ramp's window and one at the rate"
    );
    assert_eq!(l.burst(), None);
    assert_eq!(l.advance(until + 2 * W), Some(5), "six at once, less one");
    assert_eq!(l.phase(), Phase::Bucket { burst: 5 });
    assert_eq!(l.advance(until + 3 * W), None, "said once");
}

#[test]
fn a_stated_limit_refused_after_a_burst_paces_evenly_with_no_ramp() {
    let t0 = Instant::now();
    let mut l = ShapeLearner::new(W);
    for _ in 0..7 {
        l.sent(30, t0);
    }
    assert_eq!(l.refused(30, 6, t0 + ms(20), false), Verdict::Hold);
    let until = t0 + ms(1020);
    l.paused_until(until);
    l.sent(30, until);
    let next = until + W.mul_f64(1.1 / 30.0);
    assert_eq!(l.ready_at(30, until), Some(next));
    l.sent(30, next);
    assert_eq!(l.advance(until + W), Some(5), "a window at the rate held");
}

#[test]
fn a_429_at_the_even_pace_says_the_rate_is_lower() {
    let t0 = Instant::now();
    let mut l = ShapeLearner::new(W);
    for _ in 0..5 {
        l.sent(30, t0);
    }
    assert_eq!(l.refused(30, 1, t0 + ms(5), true), Verdict::Hold);
    let mut now = t0 + ms(1005);
    l.paused_until(now);
    for _ in 0..10 {
        l.sent(30, now);
        now = l.ready_at(30, now).unwrap();
    }
    assert_eq!(l.refused(30, 10, now, true), Verdict::Lower);
    assert_eq!(l.burst(), Some(0), "paced evenly from now on");
}

#[test]
fn a_429_without_a_burst_before_it_lowers_at_once_after_the_first_window() {
    let t0 = Instant::now();
    let mut l = ShapeLearner::new(W);
    // Fifteen calls a tenth of a second apart: slower than 30 a second.
    for i in 0..15 {
        l.sent(30, t0 + ms(100 * i));
    }
    assert_eq!(l.refused(30, 9, t0 + ms(1450), true), Verdict::Lower);
    assert_eq!(l.phase(), Phase::Window);
}

#[test]
fn the_first_429_in_the_first_window_holds_whatever_went_before() {
    // The start's calls on the even pace alone, refused: a bucket at a
    // third of the rate refuses them as it would a burst, and only the
    // ramp tells its rate from its burst.
    let t0 = Instant::now();
    let mut l = ShapeLearner::new(W);
    for i in 0..9 {
        l.sent(30, t0 + ms(37 * i));
    }
    assert_eq!(l.refused(30, 8, t0 + ms(320), true), Verdict::Hold);
    assert!(matches!(l.phase(), Phase::Probing { ramp: true, .. }));
}

#[test]
fn a_restored_bucket_paces_evenly_and_loses_a_burst_that_was_refused() {
    let t0 = Instant::now();
    let bucket = Learnt {
        limit: 10,
        shape: LearntShape {
            burst: Some(2),
            ..LearntShape::default()
        },
    };
    let mut l = ShapeLearner::restored(W, Some(bucket));
    // Three at once (the burst of 2 and one), then one per interval.
    for _ in 0..3 {
        assert_eq!(l.ready_at(10, t0), None);
        l.sent(10, t0);
    }
    assert!(l.ready_at(10, t0).is_some());
    assert_eq!(l.refused(10, 2, t0 + ms(5), true), Verdict::Hold);
    assert_eq!(l.burst(), Some(0));
}

/// A fixed window: `limit` accepted per window of `window` counted from `t0`.
struct Fixed {
    limit: u64,
    window: Duration,
    t0: Instant,
    current: (u128, u64),
}

impl Fixed {
    fn admit(&mut self, at: Instant) -> bool {
        let index = at.saturating_duration_since(self.t0).as_nanos() / self.window.as_nanos();
        if index != self.current.0 {
            self.current = (index, 0);
        }
        if self.current.1 >= self.limit {
            return false;
        }
        self.current.1 += 1;
        true
    }
}

/// A sliding window: `limit` accepted in any `window`.
struct Sliding {
    limit: usize,
    window: Duration,
    accepted: std::collections::VecDeque<Instant>,
}

impl Sliding {
    fn admit(&mut self, at: Instant) -> bool {
        while self
            .accepted
            .front()
            .is_some_and(|&a| at.saturating_duration_since(a) >= self.window)
        {
            self.accepted.pop_front();
        }
        if self.accepted.len() >= self.limit {
            return false;
        }
        self.accepted.push_back(at);
        true
    }
}

/// A secret limit of 10 calls per W, a third of the told 30, of `shape`:
/// 0 a sliding window, 1 a fixed one counted from `t0`, 2 a bucket with a
/// burst of 3, 3 one with none. Says whether a call arriving then is
/// accepted.
fn at_a_third(shape: u8, t0: Instant) -> impl FnMut(Instant) -> bool {
    let mut sliding = Sliding {
        limit: 10,
        window: W,
        accepted: Default::default(),
    };
    let mut fixed = Fixed {
        limit: 10,
        window: W,
        t0,
        current: (0, 0),
    };
    let mut bucket = Gcra::new(10.0, if shape == 2 { 3 } else { 0 });
    move |at| match shape {
        0 => sliding.admit(at),
        1 => fixed.admit(at),
        _ => bucket.admit(at),
    }
}

/// The default pacer's window with a pool's answer to a 429: it learns,
/// then everyone pauses a window (no Retry-After).
struct Paced(ExactWindow);

impl Client for Paced {
    type Slot = SlotId;
    fn try_take(&mut self, now: Instant) -> Result<SlotId, Instant> {
        self.0.try_take(now)
    }
    fn complete(&mut self, slot: SlotId, at: Instant, refused: bool) {
        if refused {
            self.0.complete_refused(slot, at);
            self.0.rate_limited(at);
            self.0.pause_until(at + W);
        } else {
            self.0.complete(slot, at);
        }
    }
    fn cancel(&mut self, slot: SlotId) {
        self.0.cancel(slot);
    }
    fn limit(&self) -> u64 {
        self.0.limit()
    }
}

/// What a job of `items` saw: when its last item was accepted (from the
/// start), the 429s before then, and the highest limit it paced to.
#[derive(Debug)]
struct Outcome {
    took: Duration,
    refused: usize,
    highest: u64,
    learnt: Option<u64>,
    burst: Option<u64>,
    /// What the learner said, in order.
    said: Vec<Learning>,
}

/// A link whose one-way delay is `base / 2` plus up to `jitter / 2`.
fn link(n: usize, base: Duration, jitter: Duration, seed: u64) -> Vec<Fate> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let jitter = u64::try_from(jitter.as_micros()).unwrap_or(0);
    (0..n)
        .map(|_| Fate {
            cancel: false,
            latency: base + Duration::from_micros(rng.u64(0..=jitter)),
            transit: Some(0.5),
        })
        .collect()
}

/// Runs `items` (and room for the 429s' resends) told `told` per W.
fn job(
    told: u64,
    workers: usize,
    fates: &[Fate],
    items: usize,
    server: &mut dyn FnMut(Instant) -> bool,
) -> Outcome {
    let t0 = Instant::now();
    let mut c = Paced(ExactWindow::new(told, W, t0).learning_shape(None));
    let calls: Vec<Call> = drive(&mut c, workers, fates, t0, server);
    let mut accepted: Vec<Instant> = calls
        .iter()
        .filter(|c| !c.refused)
        .filter_map(|c| c.arrival)
        .collect();
    accepted.sort();
    let last = *accepted.get(items - 1).expect("too few calls accepted");
    let refused = calls
        .iter()
        .filter(|c| c.refused && c.arrival.is_some_and(|a| a <= last))
        .count();
    let end = calls.iter().filter_map(|c| c.arrival).max().unwrap_or(t0);
    let said = std::iter::from_fn(|| c.0.take_event(end)).collect();
    Outcome {
        said,
        took: last - t0,
        refused,
        highest: calls.iter().map(|c| c.limit).max().unwrap_or(0),
        learnt: c.0.learnt(),
        burst: c.0.learnt_burst(),
    }
}

/// The bar: 1.3 times the ideal plus 1.5 s.
fn within_bar(o: &Outcome, ideal: Duration) -> bool {
    o.took <= ideal.mul_f64(1.3) + ms(1500)
}

const ITEMS: usize = 210;

/// Told only the rate of nginx with a burst of 5, the start's even pace is
/// never refused and nothing needs learning; told twice the rate, the
/// bucket is learnt with its rate and a burst of no more than 5.
#[test]
fn against_nginx_with_a_burst_of_5_its_rate_holds_and_more_learns_the_bucket() {
    let fates = link(ITEMS + 40, ms(10), ms(2), 1);
    let ideal = Duration::from_secs_f64((ITEMS - 6) as f64 / 30.0);
    let mut nginx = Gcra::new(30.0, 5);
    let o = job(30, 5, &fates, ITEMS, &mut |at| nginx.admit(at));
    assert_eq!(o.refused, 0, "{o:?}");
    assert!(
        o.took <= ideal.mul_f64(1.1) + ms(10),
        "{o:?} against {ideal:?}"
    );
    let mut nginx = Gcra::new(30.0, 5);
    let o = job(60, 5, &fates, ITEMS, &mut |at| nginx.admit(at));
    assert!(within_bar(&o, ideal), "{o:?} against {ideal:?}");
    assert!(o.refused <= 3, "{o:?}");
    // Its even pace (a tenth under the limit) at the rate, or just under.
    assert!(o.learnt.is_some_and(|l| (29..=33).contains(&l)), "{o:?}");
    assert!(o.burst.is_some_and(|b| b <= 5), "{o:?}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// Told only the rate of an nginx-like bucket, with no burst or with
    /// one of 1-8, by a server stating nothing: near the ideal time. With
    /// no burst, few 429s: the start sends one call ahead of the even pace
    /// before the shape is known, whatever the pool's size, and a bucket
    /// refuses it (and a call on the pace) at most, then the even pace
    /// holds. With a burst, none at all: the call ahead fits in it, the
    /// even pace is under the rate, and the window after the start hands
    /// the places that pace left unused out one by one at the rate.
    #[test]
    fn told_only_the_rate_of_a_bucket_it_keeps_the_rate(
        burst in prop_oneof![Just(0u64), 1u64..=8],
        workers in 1usize..=10,
        base in 1u64..=40,
        jitter in 0u64..=4,
        seed in any::<u64>(),
    ) {
        let fates = link(ITEMS + 60, ms(base), ms(jitter), seed);
        let mut nginx = Gcra::new(30.0, burst);
        let o = job(30, workers, &fates, ITEMS, &mut |at| nginx.admit(at));
        let ideal = Duration::from_secs_f64((ITEMS as u64 - 1 - burst) as f64 / 30.0);
        prop_assert!(within_bar(&o, ideal), "{:?} against {:?}", o, ideal);
        prop_assert!(o.refused <= if burst == 0 { 3 } else { 0 }, "{:?}", o);
        // The rate is kept (a round trip slower than the pace never bursts).
        prop_assert!(o.learnt.map_or(true, |l| l == 30), "{:?}", o);
        prop_assert!(o.highest <= 30 && o.learnt.map_or(true, |l| l <= 30));
    }

    /// A secret limit of any shape at a third of the told one: a sliding
    /// window, a fixed one, a bucket with a burst of 3 and with none.
    /// (A grid of 14 400 runs, every worker count and round trip here,
    /// found no case over these bars.)
    #[test]
    fn a_secret_limit_of_any_shape_at_a_third_is_learnt(
        shape in 0u8..4,
        workers in 1usize..=5,
        base in 1u64..=40,
        jitter in 0u64..=4,
        seed in any::<u64>(),
    ) {
        let fates = link(ITEMS + 60, ms(base), ms(jitter), seed);
        let mut server = at_a_third(shape, Instant::now());
        let o = job(30, workers, &fates, ITEMS, &mut server);
        let ideal = match shape {
            0 | 1 => W * 20,
            2 => Duration::from_secs_f64((ITEMS - 4) as f64 / 10.0),
            _ => Duration::from_secs_f64((ITEMS - 1) as f64 / 10.0),
        };
        prop_assert!(within_bar(&o, ideal), "shape {} {:?} against {:?}", shape, o, ideal);
        // The 3: the start's refusal, the ramp's, and at most one
        // more. With round trips longer than the told pace's interval
        // (33 ms at 30 a second) and more than one worker, a call is
        // already on its way when a refusal comes back, and a fixed window
        // refuses it too: one more (docs/pacing.md).
        let in_flight = base + jitter >= 33 && workers > 1;
        prop_assert!(o.refused <= if in_flight { 4 } else { 3 }, "shape {} {:?}", shape, o);
        prop_assert!(o.highest <= 30 && o.learnt.map_or(true, |l| l <= 30));
    }
}

#[test]
fn the_bucket_is_said_as_an_event() {
    let t0 = Instant::now();
    let mut w = ExactWindow::new(30, W, t0).learning_shape(None);
    let slots: Vec<_> = std::iter::from_fn(|| w.try_take(t0).ok()).collect();
    // Two at once (the start's first round is one call ahead of the even
    // pace), the last refused: one accepted, a burst of none.
    assert_eq!(slots.len(), 2, "the start's burst, no more");
    for s in slots {
        w.complete(s, t0 + ms(10));
    }
    assert_eq!(w.rate_limited(t0 + ms(10)), None, "held, not lowered");
    w.pause_until(t0 + ms(1010));
    let mut now = t0 + ms(1010);
    // The ramp's window, then one at the rate.
    while now < t0 + ms(3100) {
        match w.try_take(now) {
            Ok(s) => w.complete(s, now + ms(5)),
            Err(at) => now = at,
        }
    }
    assert_eq!(
        w.take_event(now),
        Some(Learning::Bucket {
            limit: 30,
            burst: 0
        })
    );
    assert_eq!((w.learnt(), w.learnt_burst()), (Some(30), Some(0)));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(8))]

    /// A server keeping the told limit as a sliding window never refuses
    /// the learning pacer, so the learner never leaves the window, and the
    /// start (its first window sent with few calls ahead of the even pace)
    /// costs less than that window: every call after it goes as without
    /// the learner, at most a window later.
    #[test]
    fn a_told_sliding_window_is_never_refused_and_the_start_costs_under_a_window(
        workers in 5usize..=40,
        jitter in 0u64..=100,
        seed in any::<u64>(),
    ) {
        let w6 = Duration::from_secs(6);
        let fates = link(3000, Duration::ZERO, ms(jitter), seed);
        let t0 = Instant::now();
        let run = |w: ExactWindow| {
            let mut c = Paced(w);
            let mut server = Sliding { limit: 600, window: w6, accepted: Default::default() };
            let calls = drive(&mut c, workers, &fates, t0, &mut |at| server.admit(at));
            let arrivals: Vec<_> = calls.iter().map(|c| (c.arrival, c.refused)).collect();
            (arrivals, c.0.shape())
        };
        let (learning, shape) = run(ExactWindow::new(600, w6, t0).learning_shape(None));
        let (before, _) = run(ExactWindow::new(600, w6, t0));
        prop_assert!(learning.iter().all(|&(_, refused)| !refused));
        prop_assert_eq!(shape, Some(Phase::Window));
        prop_assert_eq!(learning.len(), before.len());
        let last = |a: &[(Option<Instant>, bool)]| a.iter().filter_map(|&(t, _)| t).max().unwrap();
        let (l, b) = (last(&learning), last(&before));
        prop_assert!(l <= b + w6.mul_f64(1.0 + SKEW), "{:?} later", l - b);
    }
}

#[test]
fn a_bucket_learnt_earlier_is_paced_evenly_from_the_start() {
    let t0 = Instant::now();
    let learnt = Learnt {
        limit: 30,
        shape: LearntShape {
            burst: Some(5),
            ..LearntShape::default()
        },
    };
    let mut w = ExactWindow::new(30, W, t0).learning_shape(Some(learnt));
    // The burst and one, then one per W/30 plus the skew allowance.
    for _ in 0..6 {
        let s = w.try_take(t0).unwrap();
        w.complete(s, t0);
    }
    let next = w.try_take(t0).unwrap_err();
    assert!(next > t0 && next <= t0 + W.mul_f64(1.1 / 30.0), "{next:?}");
    assert_eq!((w.learnt(), w.learnt_burst()), (Some(30), Some(5)));
    // An older checkpoint's limit alone is a window, as before.
    let mut old = ExactWindow::new(30, W, t0).learning_shape(Some(Learnt::from(4)));
    assert_eq!(fill(&mut old, t0), 4);
    assert_eq!(old.learnt_burst(), None);
}

/// A run stopped after a bucket was fitted, with a fixed window that
/// fitted as well kept aside: the next run starts from both, so the
/// bucket's first refusal switches to the window there too, where a
/// bucket restored alone would drop its burst and lower the rate.
#[test]
fn a_fixed_window_kept_aside_is_restored_with_the_bucket() {
    let t0 = Instant::now();
    let refused_once = |fixed_too: Option<u64>| {
        let learnt = Learnt {
            limit: 38,
            shape: LearntShape {
                burst: Some(17),
                fixed_too,
                fixed: false,
                most: None,
            },
        };
        let mut w = ExactWindow::new(90, W, t0).learning_shape(Some(learnt));
        assert_eq!(w.learnt_shape().fixed_too, fixed_too);
        let mut at = t0;
        for _ in 0..5 {
            let s = w.try_take(at).unwrap();
            w.complete(s, at + ms(10));
            at += ms(10);
        }
        let s = w.try_take(at).unwrap();
        w.complete_refused(s, at + ms(10));
        let lowered = w.rate_limited(at + ms(10));
        (
            lowered,
            std::iter::from_fn(|| w.take_event(at + ms(10))).last(),
        )
    };
    assert_eq!(
        refused_once(Some(30)),
        (Some(30), Some(Learning::FixedWindow(30)))
    );
    let (lowered, _) = refused_once(None);
    assert_ne!(lowered, Some(30), "a bucket alone knows no window");
}

/// A fixed window learnt by an earlier run: the next starts from it,
/// its first span at once (no start's rounds), and never probes above it
/// (a probe above a fixed window's count is refused in every window it
/// tries), where a plain learnt limit probes a call more each full window.
#[test]
fn a_fixed_window_learnt_earlier_is_kept_and_not_probed_above() {
    let t0 = Instant::now();
    let after_windows = |fixed: bool| {
        let learnt = Learnt {
            limit: 8,
            shape: LearntShape {
                fixed,
                ..LearntShape::default()
            },
        };
        let mut w = ExactWindow::new(30, W, t0).learning_shape(Some(learnt));
        assert_eq!(w.learnt_shape().fixed, fixed);
        let first = fill(&mut w, t0);
        let mut at = t0;
        for _ in 0..4 {
            at += W * 2;
            fill(&mut w, at);
        }
        (first, w.limit())
    };
    assert_eq!(after_windows(true), (8, 8));
    let (_, probed) = after_windows(false);
    assert!(probed > 8, "a plain learnt limit probes upward: {probed}");
}

/// Takes places at `now` until refused, answering each at once.
fn fill(w: &mut ExactWindow, now: Instant) -> u64 {
    let mut n = 0;
    while let Ok(s) = w.try_take(now) {
        w.complete(s, now);
        n += 1;
    }
    n
}

/// A bucket that states its limit says `remaining: 0` after nearly every
/// call (its burst is spent at once); paced evenly, that holds a call
/// until the even pace's next slot, not until a window's room: the rate
/// is kept (it once fell to a call a window).
#[test]
fn nothing_left_at_the_even_pace_waits_for_the_pace_not_the_window() {
    let t0 = Instant::now();
    let mut w = ExactWindow::new(30, W, t0).learning_shape(None);
    let first: Vec<_> = std::iter::from_fn(|| w.try_take(t0).ok()).collect();
    for s in first {
        w.complete(s, t0 + ms(10));
    }
    // The server states its limit: a 429 changes the shape, not the rate.
    w.rate_limited_stated(t0 + ms(10));
    assert_eq!(w.limit(), 30, "held, not lowered");
    let from = t0 + ms(1010);
    w.pause_until(from);
    let (mut now, mut sent) = (from, 0);
    while now < from + 2 * W {
        match w.try_take(now) {
            Ok(s) => {
                sent += 1;
                w.complete(s, now + ms(5));
                w.remaining_zero(now + ms(5));
            }
            Err(at) => now = at.max(now + ms(5)),
        }
    }
    // 30 a second less the even pace's tenth: 54 in two seconds.
    assert!((50..=56).contains(&sent), "{sent} calls in 2 s");
}

mod grid;
mod secret;
