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
/// Stated to the millisecond, or beyond what the window's end reads as,
/// a reset holds as stated: a delta of 2 s for a 1 s window is a longer
/// window than the one it is read against, which its hold keeps.
#[test]
fn a_reset_holds_at_most_its_window_unless_exact_or_further() {
    let t0 = Instant::now();
    let cases = [
        (2000, false, true, 1000),
        (2000, false, false, 2000),
        (1500, true, false, 1500),
        (3000, false, true, 3000),
    ];
    for (reset, exact, dated, held) in cases {
        let mut s = set(&[(10, 1000)], t0);
        assert_eq!(at_once(&mut s, t0), 10);
        let p = Announced {
            reset_dated: dated,
            ..used_up(10, Some(1000), reset, exact)
        };
        s.announce(&[p], t0);
        let at = s.held_until(t0);
        assert_eq!(at, Some(t0 + ms(held)), "reset {reset} ms, dated {dated}");
    }
}
