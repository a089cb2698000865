use std::collections::VecDeque;
use std::time::Duration;

use proptest::prelude::*;

use super::*;

const MINUTE: Duration = Duration::from_secs(60);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A statement read as soon as it was made.
fn say(quota: u64, remaining: u64, reset: Duration, exact: bool) -> Said {
    Said::new(quota, remaining, reset, exact, Duration::ZERO)
}

/// A reset as a dialect states it: to the millisecond, rounded up; or in
/// whole seconds, rounded up, as the sim's RFC 3339 instants are.
fn stated(r: Duration, exact: bool) -> Duration {
    if exact {
        ms(r.as_nanos().div_ceil(1_000_000) as u64)
    } else {
        Duration::from_secs(r.as_nanos().div_ceil(1_000_000_000) as u64 + 1)
    }
}

/// OpenAI's statement of a bucket of 8,000 tokens a minute with `used`
/// used, observed.
fn observe_used(fit: &mut RefillFit, used: u64) -> Option<Duration> {
    let (left, r) = bucket_says(8000, MINUTE, used);
    fit.observe(say(8000, left, r, true), MINUTE)
}

/// What a bucket of `quota` refilling over `period` states with `used`.
fn bucket_says(quota: u64, period: Duration, used: u64) -> (u64, Duration) {
    let r = period.as_nanos() * u128::from(used) / u128::from(quota);
    (quota - used, Duration::from_nanos(r as u64))
}

#[test]
fn openai_statements_of_a_minute_bucket_are_believed_at_the_eighth() {
    // OpenAI's own headers: 73 of 8,000 tokens used, full again in 547 ms;
    // then more used, and the resets keep proportion.
    let mut fit = RefillFit::new();
    assert_eq!(fit.observe(say(8000, 7927, ms(547), true), MINUTE), None);
    for used in [500, 1000, 1500, 2000, 2500, 3000] {
        assert_eq!(observe_used(&mut fit, used), None, "{used}");
    }
    let period = observe_used(&mut fit, 3500).expect("a minute's bucket");
    assert!(period >= MINUTE && period <= MINUTE + ms(500), "{period:?}");
}

#[test]
fn a_spread_under_a_quarter_of_the_quota_is_not_enough() {
    let mut fit = RefillFit::new();
    for used in (100..=1900).step_by(200) {
        assert_eq!(observe_used(&mut fit, used), None, "{used}");
    }
    // 2,100 of 8,000 used: the spread is now over a quarter.
    assert!(observe_used(&mut fit, 2100).is_some());
}

#[test]
fn a_reset_out_of_proportion_starts_the_run_again() {
    let mut fit = RefillFit::new();
    for used in (500..=3000).step_by(500) {
        observe_used(&mut fit, used);
    }
    // A window's reset: used up half, yet full again only in 50 s.
    assert_eq!(fit.observe(say(8000, 4000, ms(50_000), true), MINUTE), None);
    for used in [4500, 5000] {
        assert_eq!(observe_used(&mut fit, used), None, "{used}");
    }
}

/// A refill is doubted only once a run that held is broken, until a run
/// holds again: a fit with too little heard, as a process of a fleet that
/// learnt the refill from another has, doubts nothing.
#[test]
fn a_refill_is_doubted_once_a_run_that_held_breaks_until_one_holds_again() {
    let mut fit = RefillFit::new();
    assert!(!fit.doubted());
    observe_used(&mut fit, 500);
    assert!(!fit.doubted() && !fit.holding());
    // Out of proportion before any run held: nothing to doubt yet.
    fit.observe(say(8000, 4000, ms(50_000), true), MINUTE);
    assert!(!fit.doubted());
    for used in [4500, 5000] {
        observe_used(&mut fit, used);
    }
    assert!(fit.holding() && !fit.doubted());
    fit.observe(say(8000, 2000, ms(50_000), true), MINUTE);
    assert!(fit.doubted());
    // Another statement out of proportion with that one: still doubted.
    fit.observe(say(8000, 7000, ms(50_000), true), MINUTE);
    assert!(fit.doubted());
    for used in [1000, 1500] {
        observe_used(&mut fit, used);
    }
    assert!(fit.holding() && !fit.doubted());
    // Nothing used and a reset to wait for breaks the run too.
    fit.observe(say(8000, 8000, ms(30_000), true), MINUTE);
    assert!(fit.doubted());
}

/// A sliding window kept full, stating when its newest call ages out,
/// frees what it was fed a window before: its statements while it refuses
/// fall in proportion, as a bucket's do. A call it takes sets its reset to
/// the whole window; a bucket's is the share used, and only that shows it.
#[test]
fn a_full_window_freeing_as_fed_is_no_bucket_until_a_call_taken_resets_short() {
    let mut fit = RefillFit::new();
    for used in (5200..=8000).rev().step_by(400) {
        assert_eq!(observe_used(&mut fit, used), None, "{used}");
    }
    // Taken, with a reset of 57 s: no shorter than the window's seven
    // eighths (52.5 s), as a sliding window's after a call it took.
    assert_eq!(observe_used(&mut fit, 7600), None);
    assert_eq!(observe_used(&mut fit, 6000), None);
    // Taken with 6,800 of 8,000 used: a bucket's 51 s.
    assert!(observe_used(&mut fit, 6800).is_some());
}

/// Calls each weighing more than three eighths of the quota (12,000
/// tokens of 30,000 a minute), two at the start of each minute as a
/// sliding minute of tokens lets them go, still show a bucket: the second
/// of each pair rises to four fifths used, a reset of 48 s.
#[test]
fn a_bucket_of_heavy_calls_is_found() {
    let calls: Vec<(u64, u64)> = (0..40)
        .map(|i| (if i % 2 == 0 { 60_000 } else { 0 }, 12_000))
        .collect();
    let said = statements(Server::Bucket, 30_000, MINUTE, &calls);
    let mut fit = RefillFit::new();
    let found = said
        .iter()
        .any(|&(left, r)| fit.observe(say(30_000, left, r, true), MINUTE).is_some());
    assert!(found, "{fit:?}");
}

#[test]
fn a_reset_with_nothing_used_is_no_bucket() {
    let mut fit = RefillFit::new();
    for used in (500..=3500).step_by(500) {
        observe_used(&mut fit, used);
    }
    assert_eq!(fit.observe(say(8000, 8000, ms(30_000), true), MINUTE), None);
    assert_eq!(observe_used(&mut fit, 4000), None);
}

#[test]
fn a_refill_slower_than_the_window_or_too_short_to_tell_is_not_believed() {
    // Refilling over two minutes where the policy says one.
    let mut fit = RefillFit::new();
    for used in (500..=5000).step_by(500) {
        let r = ms(used * 120_000 / 8000);
        assert_eq!(fit.observe(say(8000, 8000 - used, r, true), MINUTE), None);
    }
    // Over two seconds in whole seconds: a fixed window's rounding.
    let mut fit = RefillFit::new();
    for used in (1000..=8000).step_by(1000) {
        let r = stated(ms(used * 2_000 / 8000), false);
        assert_eq!(fit.observe(say(8000, 8000 - used, r, false), MINUTE), None);
    }
}

/// The three shapes a token quota is kept in, as a server keeps them,
/// each stating what is left and its reset after a call.
#[derive(Debug, Clone, Copy)]
enum Server {
    /// Refilling q over W continuously; reset: until full.
    Bucket,
    /// A fixed window; reset: its end.
    Fixed,
    /// A sliding log; reset: the oldest call ages out (`oldest`) or the
    /// newest does (the window back to its initial state).
    Sliding { oldest: bool },
}

/// The statements a server of `shape` with `quota` per `window` makes for
/// calls of `tokens` each after `gap_ms`, as (remaining, reset); refused
/// calls state too, and are not counted.
fn statements(
    shape: Server,
    quota: u64,
    window: Duration,
    calls: &[(u64, u64)],
) -> Vec<(u64, Duration)> {
    let w = window.as_secs_f64();
    let mut now = 0.0_f64;
    let mut level = 0.0_f64;
    let mut log: VecDeque<(f64, u64)> = VecDeque::new();
    let mut out = Vec::new();
    for &(gap, tokens) in calls {
        let before = now;
        now += gap as f64 / 1000.0;
        let (remaining, reset) = match shape {
            Server::Bucket => {
                level = (level - (now - before) * quota as f64 / w).max(0.0);
                if level + tokens as f64 <= quota as f64 {
                    level += tokens as f64;
                }
                let left = (quota as f64 - level).floor() as u64;
                (left, level * w / quota as f64)
            }
            Server::Fixed => {
                let start = (now / w).floor() * w;
                log.retain(|&(t, _)| t >= start);
                let used: u64 = log.iter().map(|&(_, n)| n).sum();
                if used + tokens <= quota {
                    log.push_back((now, tokens));
                }
                let used: u64 = log.iter().map(|&(_, n)| n).sum();
                (quota - used, start + w - now)
            }
            Server::Sliding { oldest } => {
                log.retain(|&(t, _)| t > now - w);
                let used: u64 = log.iter().map(|&(_, n)| n).sum();
                if used + tokens <= quota {
                    log.push_back((now, tokens));
                }
                let used: u64 = log.iter().map(|&(_, n)| n).sum();
                let at = if oldest { log.front() } else { log.back() };
                (quota - used, at.map_or(0.0, |&(t, _)| t + w - now))
            }
        };
        out.push((remaining, Duration::from_secs_f64(reset.max(0.0))));
    }
    out
}

fn calls() -> impl Strategy<Value = Vec<(u64, u64)>> {
    proptest::collection::vec((0u64..3_000, 1u64..2_500), 1..200)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4000))]

    /// A window, fixed or sliding, stated in any grain, is never taken
    /// for a bucket, whatever the traffic: the bucket it would be paced
    /// as would refill faster than the window frees.
    #[test]
    fn no_window_is_taken_for_a_bucket(
        calls in calls(),
        shape in 0usize..3,
        exact in any::<bool>(),
        window_s in prop::sample::select(vec![6u64, 10, 60]),
        quota in 2_000u64..40_000,
    ) {
        let shape = [Server::Fixed, Server::Sliding { oldest: true }, Server::Sliding { oldest: false }][shape];
        let window = Duration::from_secs(window_s);
        let mut fit = RefillFit::new();
        for (remaining, reset) in statements(shape, quota, window, &calls) {
            let said = fit.observe(say(quota, remaining, stated(reset, exact), exact), window);
            prop_assert_eq!(said, None, "{:?} {:?}", shape, fit);
        }
    }

    /// A bucket is never believed to refill faster than it does, and is
    /// believed much slower (by more than its statements' grains).
    #[test]
    fn a_bucket_is_believed_no_faster_than_it_refills(
        calls in calls(),
        exact in any::<bool>(),
        quota in 2_000u64..40_000,
        read_late_ms in 0u64..3_000,
    ) {
        let mut fit = RefillFit::new();
        let mut most = 0;
        // An instant in whole seconds read up to a round trip late.
        let read_late = if exact { Duration::ZERO } else { ms(read_late_ms) };
        for (remaining, reset) in statements(Server::Bucket, quota, MINUTE, &calls) {
            most = most.max(quota - remaining);
            let read = stated(reset, exact).saturating_sub(read_late);
            let said = Said::new(quota, remaining, read, exact, read_late);
            if let Some(p) = fit.observe(said, MINUTE) {
                prop_assert!(p >= MINUTE - ms(1), "{:?}", p);
                // No slower than the grains at the most used allow.
                let slack = (said.early + said.late).mul_f64(quota as f64 / most as f64);
                prop_assert!(p <= MINUTE + slack, "{:?} {:?}", p, slack);
            }
        }
    }
}

#[test]
fn a_bucket_filled_at_ten_times_its_rate_is_believed_within_two_seconds() {
    // 400 tokens every 100 ms against 20,000 a minute (333 a second).
    for exact in [true, false] {
        let calls = vec![(100, 400); 40];
        let said = statements(Server::Bucket, 20_000, MINUTE, &calls);
        let mut fit = RefillFit::new();
        let first = said.iter().position(|&(left, r)| {
            fit.observe(say(20_000, left, stated(r, exact), exact), MINUTE)
                .is_some()
        });
        let first = first.expect("believed");
        assert!(first < 20, "{exact}: call {first}");
    }
}
