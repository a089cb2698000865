//! How long a quota stated used up holds calls, by its reset.

use super::*;

fn used_up(quota: u64, window_ms: Option<u64>, reset_ms: u64, exact: bool) -> Announced {
    Announced {
        reset_in: Some(ms(reset_ms)),
        reset_exact: exact,
        ..calls_policy(quota, window_ms, Some(0))
    }
}

/// Told `5/100ms`, the server says nothing is left, resetting in `1`
/// (whole seconds, `X-RateLimit-Reset`): the reset is the window's end
/// rounded up, so the hold is the window's, not the second's. It held a
/// second per window, 200 calls taking 39 s where 4 do.
#[test]
fn a_whole_second_reset_of_a_shorter_window_holds_for_the_window() {
    let t0 = Instant::now();
    let mut s = set(&[(5, 100)], t0);
    assert_eq!(at_once(&mut s, t0), 5);
    s.announce(&[used_up(5, None, 1000, false)], t0);
    assert_eq!(s.try_take(t0 + ms(50)), Err(t0 + ms(100)));
    assert_eq!(at_once(&mut s, t0 + ms(100)), 5);
}

/// A reset instant in whole seconds against a whole-second `Date` (GitHub,
/// Anthropic) reads up to two seconds long for a one-second window: held
/// for the window (the reset's 2 s held a 10/1s job at half its pace).
/// Stated to the millisecond, or beyond the window and its rounding, a
/// reset holds as stated.
#[test]
fn a_reset_holds_at_most_its_window_unless_exact_or_further() {
    let t0 = Instant::now();
    for (reset, exact, held) in [(2000, false, 1000), (1500, true, 1500), (3500, false, 3500)] {
        let mut s = set(&[(10, 1000)], t0);
        assert_eq!(at_once(&mut s, t0), 10);
        s.announce(&[used_up(10, Some(1000), reset, exact)], t0);
        assert_eq!(s.held_until(t0), Some(t0 + ms(held)), "reset {reset} ms");
    }
}
