//! Property tests of every shape, one at a time and several at once: for
//! random latencies, arrival points and response orders, the server (a
//! reference model of each shape) never counts more than a policy allows.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::*;
use crate::rate::policies::{PolicySet, SetSlot};
use crate::rate::testing::{
    drive, fates, judge_fixed, judge_gcra, judge_sliding, weighed, Fate, Weights,
};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn spec(s: &str) -> PolicySpec {
    s.parse().unwrap()
}

/// Drives greedy workers through one kept policy; returns what the server
/// saw, with weights.
fn run_kept(
    k: Kept,
    plan: Vec<u64>,
    workers: usize,
    f: &[Fate],
    t0: Instant,
) -> Vec<(Instant, u64)> {
    let mut c = Weights::new(
        k,
        plan,
        |k: &mut Kept, now, w| k.try_take(now, w, TokenWeight::whole(w)),
        |k: &mut Kept, id, at| k.complete(id, at, None),
        |k: &mut Kept, id| k.cancel(id),
    );
    let calls = drive(&mut c, workers, f, t0, &mut |_| true);
    weighed(&calls, &c.sent)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn a_token_window_is_never_exceeded(
        f in fates(300, ms(400)),
        plan in proptest::collection::vec(1u64..=40, 1..8),
        workers in 1usize..12,
    ) {
        let t0 = Instant::now();
        let k = Kept::new(spec("100/1s,tokens")).unwrap();
        let a = run_kept(k, plan, workers, &f, t0);
        prop_assert_eq!(judge_sliding(&a, 100, ms(1000)), Ok(()));
    }

    #[test]
    fn a_fixed_window_not_yet_aligned_keeps_every_alignment(
        f in fates(300, ms(400)),
        workers in 1usize..12,
        phase in 0u64..1000,
    ) {
        let t0 = Instant::now();
        let k = Kept::new(spec("20/1s,fixed")).unwrap();
        let a = run_kept(k, vec![1], workers, &f, t0);
        prop_assert_eq!(judge_fixed(&a, 20, ms(1000), t0 + ms(phase)), Ok(()));
    }

    #[test]
    fn an_aligned_fixed_window_is_never_exceeded_within_its_uncertainty(
        f in fates(300, ms(400)),
        workers in 1usize..12,
        phase in 0u64..10_000,
        error in 0u64..=300,
        plan in proptest::collection::vec(1u64..=3, 1..4),
    ) {
        let t0 = Instant::now() + ms(20_000);
        let true_origin = t0 + ms(phase);
        // Told a boundary up to 200 ms late or 100 ms early.
        let told = true_origin + ms(error) - ms(100);
        let mut k = Kept::new(spec("50/10s,fixed")).unwrap();
        let aligned = k.align(Align { origin: told, early: ms(200), late: ms(100) });
        prop_assert!(aligned);
        let a = run_kept(k, plan, workers, &f, t0);
        prop_assert_eq!(judge_fixed(&a, 50, ms(10_000), true_origin), Ok(()));
    }

    #[test]
    fn a_bucket_is_never_refused_while_latency_varies_within_the_allowance(
        f in fates(300, ms(50)),
        workers in 1usize..12,
        burst in 0u64..10,
        plan in proptest::collection::vec(1u64..=2, 1..4),
    ) {
        let t0 = Instant::now();
        let r = crate::rate::Rate { count: 30, period: ms(1000) };
        let d = ms(50);
        // Weights up to 2 need room for 2: a heavier call than the bucket
        // goes alone, which the reference model does not keep (burst 0 is
        // the next test's, one unit a call).
        let burst = burst.max(1);
        let k = Kept {
            spec: spec("30/1s,bucket"),
            rate: r,
            refill: Refill::Unwatched,
            rule: Rule::Bucket(crate::rate::gcra::Gcra::with_allowance(r, burst, d)),
        };
        let a = run_kept(k, plan, workers, &f, t0);
        prop_assert_eq!(judge_gcra(&a, r, burst), Ok(()));
    }

    #[test]
    fn a_bucket_as_told_is_never_refused_while_latency_varies_within_its_own_allowance(
        (count, burst, f) in (5u64..=60, 0u64..=8).prop_flat_map(|(count, burst)| {
            let r = crate::rate::Rate { count, period: ms(1000) };
            let d = crate::rate::gcra::Gcra::new(r, burst).allowance();
            (Just(count), Just(burst), fates(300, d))
        }),
        workers in 1usize..12,
    ) {
        // The allowance `--limit N/1s,burst=B` really keeps (a twentieth
        // of T with no burst: 1.7 ms at 30 a second), not a test's own.
        let t0 = Instant::now();
        let r = crate::rate::Rate { count, period: ms(1000) };
        let k = Kept::new(spec(&format!("{count}/1s,burst={burst}"))).unwrap();
        let a = run_kept(k, vec![1], workers, &f, t0);
        prop_assert_eq!(judge_gcra(&a, r, burst), Ok(()));
    }

    #[test]
    fn several_policies_at_once_are_each_kept(
        // Latency varying within the bucket's allowance (50 ms): the
        // windows' own tests take any latency.
        f in fates(400, ms(50)),
        workers in 1usize..16,
        plan in proptest::collection::vec(0u64..=60, 1..8),
    ) {
        let t0 = Instant::now();
        let set = PolicySet::new(crate::rate::exact::ExactWindow::new(20, ms(1000), t0), Vec::new())
            .with_kept(
                ["50/3s,fixed", "25/1s,burst=8", "300/1s,tokens", "2000/10s,tokens,fixed"]
                    .iter()
                    .map(|s| Kept::new(spec(s)).unwrap())
                    .collect(),
            );
        type State = (PolicySet, HashMap<u64, SetSlot>, u64);
        let mut c = Weights::new(
            (set, HashMap::new(), 0u64),
            plan,
            |s: &mut State, now, w| {
                let slot = s.0.try_take_weighted(now, 1, TokenWeight::whole(w))?;
                s.2 += 1;
                s.1.insert(s.2, slot);
                Ok(s.2)
            },
            |s: &mut State, id, at| {
                let slot = s.1.remove(&id).unwrap();
                s.0.complete(slot, at);
            },
            |s: &mut State, id| {
                let slot = s.1.remove(&id).unwrap();
                s.0.cancel(slot);
            },
        );
        let calls = drive(&mut c, workers, &f, t0, &mut |_| true);
        let ones = vec![1; c.sent.len()];
        let by_call = weighed(&calls, &ones);
        let by_token = weighed(&calls, &c.sent);
        prop_assert_eq!(judge_sliding(&by_call, 20, ms(1000)), Ok(()));
        for phase in [0, 700, 1500, 2999] {
            prop_assert_eq!(judge_fixed(&by_call, 50, ms(3000), t0 + ms(phase)), Ok(()));
            prop_assert_eq!(judge_fixed(&by_token, 2000, ms(10_000), t0 + ms(phase * 3)), Ok(()));
        }
        prop_assert_eq!(judge_gcra(&by_call, crate::rate::Rate { count: 25, period: ms(1000) }, 8), Ok(()));
        prop_assert_eq!(judge_sliding(&by_token, 300, ms(1000)), Ok(()));
    }
}

#[test]
fn a_bucket_told_its_burst_sends_the_burst_then_the_rate() {
    // nginx `rate=30r/s burst=5 nodelay`, 210 calls answered at once: the
    // ideal is (210 − 6) / 30 = 6.8 s.
    let t0 = Instant::now();
    let mut k = Kept::new(spec("30/1s,burst=5")).unwrap();
    let (mut now, mut sent) = (t0, Vec::new());
    while sent.len() < 210 {
        match k.try_take(now, 1, TokenWeight::whole(0)) {
            Ok(id) => {
                k.complete(id, now, None);
                sent.push((now, 1));
            }
            Err(at) => now = at,
        }
    }
    let took = now - t0;
    assert!(took <= ms(6900), "{took:?}");
    let r = crate::rate::Rate {
        count: 30,
        period: ms(1000),
    };
    assert_eq!(judge_gcra(&sent, r, 5), Ok(()));
}

#[test]
fn a_daily_quota_aligned_to_its_reset_refills_at_the_boundary() {
    let t0 = Instant::now();
    let mut k = Kept::new(spec("100/1d,fixed")).unwrap();
    let go = |k: &mut Kept, now| {
        let mut n = 0;
        while let Ok(id) = k.try_take(now, 1, TokenWeight::whole(0)) {
            k.complete(id, now, None);
            n += 1;
        }
        n
    };
    assert_eq!(go(&mut k, t0), 100);
    // The server says the day resets in an hour.
    let reset = t0 + Duration::from_secs(3600);
    assert!(k.align(Align {
        origin: reset,
        early: ms(100),
        late: Duration::from_secs(1)
    }));
    assert_eq!(go(&mut k, reset), 0, "not before the uncertainty is past");
    assert_eq!(go(&mut k, reset + ms(1001)), 100);
}
