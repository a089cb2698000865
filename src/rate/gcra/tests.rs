use super::*;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn rate(count: u64, period_ms: u64) -> Rate {
    Rate {
        count,
        period: ms(period_ms),
    }
}

#[test]
fn the_burst_less_the_allowance_goes_at_once_then_the_rate() {
    let t0 = Instant::now();
    // T = 100 ms, burst 5 (τ = 500 ms), D = 50 ms: 1 + 4 at once (the
    // fifth would need τ of 500 ms with D on top).
    let mut g = Gcra::with_allowance(rate(10, 1000), 5, ms(50));
    let mut n = 0;
    while g.try_take(t0, 1).is_ok() {
        n += 1;
    }
    assert_eq!(n, 5);
    let next = g.try_take(t0, 1).unwrap_err();
    assert_eq!(next, t0 + ms(50), "then one every T");
    assert!(g.try_take(next, 1).is_ok());
    assert_eq!(g.try_take(next, 1), Err(next + ms(100)));
}

#[test]
fn no_burst_spaces_calls_a_twentieth_more_than_the_rate() {
    let t0 = Instant::now();
    let mut g = Gcra::new(rate(10, 1000), 0);
    assert_eq!(g.allowance(), ms(5));
    assert!(g.try_take(t0, 1).is_ok());
    assert_eq!(g.try_take(t0, 1), Err(t0 + ms(105)));
}

#[test]
fn a_refusal_widens_the_allowance_up_to_one_interval() {
    let t0 = Instant::now();
    let mut g = Gcra::new(rate(10, 1000), 0);
    let mut seen = vec![g.allowance()];
    while g.widen() {
        seen.push(g.allowance());
    }
    assert_eq!(seen, [ms(5), ms(10), ms(20), ms(40), ms(80), ms(100)]);
    assert!(g.try_take(t0, 1).is_ok());
    assert_eq!(
        g.try_take(t0, 1),
        Err(t0 + ms(200)),
        "half the rate at worst"
    );
    // With a burst, up to its tolerance: the burst is then kept for idle
    // spells only.
    let mut b = Gcra::new(rate(10, 1000), 5);
    while b.widen() {}
    assert_eq!(b.allowance(), ms(500));
}

#[test]
fn given_back_and_corrected_units_move_the_tat() {
    let t0 = Instant::now();
    let mut g = Gcra::with_allowance(rate(100, 1000), 0, Duration::ZERO);
    let a = g.try_take(t0, 50).unwrap();
    assert_eq!(g.try_take(t0, 1), Err(t0 + ms(500)));
    g.complete(a, Some(10));
    assert_eq!(g.try_take(t0, 1), Err(t0 + ms(100)));
    let b = g.try_take(t0 + ms(100), 1).unwrap();
    assert!(g.cancel(b));
    assert!(g.try_take(t0 + ms(100), 1).is_ok());
    // A call heavier than the bucket goes when it is empty.
    assert_eq!(g.try_take(t0 + ms(105), 500), Err(t0 + ms(110)));
    assert!(g.try_take(t0 + ms(110), 500).is_ok());
}
