//! Property tests of the shapes the pacers' tests use as judges: whatever
//! the arrivals and weights, what each admits keeps its own limit when
//! measured from outside, by brute force over the admitted log.

use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::fixed_window::FixedWindow;
use super::gcra::Gcra;
use super::weighted_window::WeightedWindow;
use crate::rate::Rate;

/// Arrivals as gaps in milliseconds (many zero, some long) and weights.
fn arrivals() -> impl Strategy<Value = Vec<(u64, u64)>> {
    prop::collection::vec(
        (prop_oneof![Just(0u64), 0u64..50, 0u64..2000], 1u64..40),
        1..300,
    )
}

fn times(t0: Instant, gaps: &[(u64, u64)]) -> Vec<(Instant, u64)> {
    let mut at = t0;
    gaps.iter()
        .map(|&(g, w)| {
            at += Duration::from_millis(g);
            (at, w)
        })
        .collect()
}

proptest! {
    #[test]
    fn a_bucket_never_admits_more_than_its_burst_and_rate_allow(
        gaps in arrivals(), count in 1u64..50, burst in 0u64..10,
    ) {
        let t0 = Instant::now();
        let rate = Rate { count, period: Duration::from_secs(1) };
        let mut b = Gcra::new(rate, burst, t0);
        let admitted: Vec<Instant> = times(t0, &gaps)
            .into_iter()
            .filter(|&(at, _)| b.try_acquire(at, 1).is_ok())
            .map(|(at, _)| at)
            .collect();
        // In any span [a_i, a_j]: at most burst + 1 + rate·span requests.
        for i in 0..admitted.len() {
            for j in i..admitted.len() {
                let span = admitted[j].duration_since(admitted[i]).as_secs_f64();
                let n = (j - i + 1) as f64;
                prop_assert!(n <= (burst + 1) as f64 + count as f64 * span + 1e-9,
                    "{n} in {span}s at {count}/s burst {burst}");
            }
        }
    }

    #[test]
    fn a_fixed_window_never_counts_more_than_its_limit_in_one_window(
        gaps in arrivals(), limit in 1u64..200,
    ) {
        let t0 = Instant::now();
        let w = Duration::from_millis(700);
        let mut f = FixedWindow::new(limit, w, t0);
        let mut per_window = std::collections::HashMap::<u128, u64>::new();
        for (at, units) in times(t0, &gaps) {
            if f.try_acquire(at, units).is_ok() {
                let k = at.duration_since(t0).as_nanos() / w.as_nanos();
                *per_window.entry(k).or_default() += units;
            }
        }
        prop_assert!(per_window.values().all(|&n| n <= limit), "{per_window:?}");
    }

    #[test]
    fn a_token_window_never_holds_more_than_its_budget_in_any_span(
        gaps in arrivals(), limit in 40u64..400,
    ) {
        let t0 = Instant::now();
        let w = Duration::from_millis(500);
        let mut tw = WeightedWindow::new(limit, w);
        let admitted: Vec<(Instant, u64)> = times(t0, &gaps)
            .into_iter()
            .filter(|&(at, units)| tw.try_acquire(at, units).is_ok())
            .collect();
        for (i, &(start, _)) in admitted.iter().enumerate() {
            let inside: u64 = admitted[i..]
                .iter()
                .take_while(|(at, _)| at.duration_since(start) < w)
                .map(|(_, u)| u)
                .sum();
            prop_assert!(inside <= limit, "{inside} > {limit}");
        }
    }
}
