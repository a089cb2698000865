//! Which windows could have answered as the server did, when no bucket
//! could (see `fit.rs`): a fixed window, told from a sliding one.
//!
//! A secret window is learnt from the calls it had accepted in the last W
//! when it refused one. That count is a sliding window's limit, but a fixed
//! window lets up to twice its limit through in a span of W that straddles
//! its reset: the count overshoots (41 for a window of 30), each lowering
//! at the even pace is refused again, and learning costs a 429 a step.
//!
//! So the calls of the start and the ramp are replayed. A sliding window of
//! L accepts at most L in any span of W and refuses only with L in the W
//! before; if no L does both, the server's window is not sliding. A fixed
//! window of L with its resets at some phase does the same per window; the
//! phase is not known, so every phase is tried, and the limit taken is the
//! least that fits at any phase: never above the server's.
//!
//! A call within `slack` of a reset may have reached the server in either
//! window: it counts in neither, and a refused one there tells nothing.

use std::ops::Bound::{self, Excluded, Included};
use std::time::{Duration, Instant};

/// Phases tried, evenly over one window.
const PHASES: u32 = 1000;

/// The least limit of a fixed window of `window` that answers `calls`
/// (send instant, accepted) exactly as the server did at some phase (or,
/// if none does exactly, loosely), when no sliding window does; `None`
/// when a sliding window fits (its count is the server's limit) or no
/// fixed one does either.
pub fn fit_fixed(calls: &[(Instant, bool)], window: Duration, slack: Duration) -> Option<u64> {
    let fits = phases(calls, window, slack)?;
    exact(&fits).or_else(|| fits.iter().map(|f| f.0).min())
}

/// The least limit of a fixed window that answers `calls` exactly at some
/// phase, when no sliding window does (see [`fit_fixed`]).
pub fn fit_fixed_exactly(
    calls: &[(Instant, bool)],
    window: Duration,
    slack: Duration,
) -> Option<u64> {
    exact(&phases(calls, window, slack)?)
}

/// At the server's own phase a refused call's window held the limit
/// before it, and so did the fullest window: its fit is exact. A phase
/// that fits only loosely cuts the windows where the answers are few.
fn exact(fits: &[(u64, u64)]) -> Option<u64> {
    fits.iter().filter(|f| f.0 == f.1).map(|f| f.0).min()
}

/// The least and greatest limits of a fixed window that fit `calls`, at
/// each phase where one does; `None` when a sliding window fits.
fn phases(calls: &[(Instant, bool)], window: Duration, slack: Duration) -> Option<Vec<(u64, u64)>> {
    let a = Answers::of(calls, window, slack)?;
    if a.sliding().is_some() {
        return None;
    }
    let fits = (0..PHASES)
        .map(|p| a.w * f64::from(p) / f64::from(PHASES))
        .filter_map(|phase| fixed_fits(&a.times, &a.accepted, a.w, phase, a.slack))
        .collect();
    Some(fits)
}

/// The least and greatest limits of a sliding window of `window` that
/// answer `calls` (send instant, accepted) as the server did; `None` when
/// none does, or nothing was refused (nothing bounds it from above).
pub fn fit_sliding(
    calls: &[(Instant, bool)],
    window: Duration,
    slack: Duration,
) -> Option<(u64, u64)> {
    Answers::of(calls, window, slack)?.sliding()
}

/// The answers a window is fitted to, in seconds.
struct Answers {
    /// Every call as (seconds from the first send, accepted), in send order.
    times: Vec<(f64, bool)>,
    /// The accepted ones' instants.
    accepted: Vec<f64>,
    /// The window and the slack, in seconds.
    w: f64,
    slack: f64,
}

impl Answers {
    /// `calls` to fit a window of `window` to; `None` when there is nothing
    /// to fit: no call, none refused (nothing bounds a limit from above), or
    /// a window no wider than the slack at each end.
    fn of(calls: &[(Instant, bool)], window: Duration, slack: Duration) -> Option<Answers> {
        let origin = calls.iter().map(|c| c.0).min()?;
        let mut times: Vec<(f64, bool)> = calls
            .iter()
            .map(|&(at, ok)| (at.saturating_duration_since(origin).as_secs_f64(), ok))
            .collect();
        times.sort_by(|a, b| a.0.total_cmp(&b.0));
        let accepted: Vec<f64> = times.iter().filter(|c| c.1).map(|c| c.0).collect();
        let (w, slack) = (window.as_secs_f64(), slack.as_secs_f64());
        if w <= 2.0 * slack || accepted.len() == times.len() {
            return None;
        }
        Some(Answers {
            times,
            accepted,
            w,
            slack,
        })
    }

    /// The sliding window's least and greatest limits, if one fits.
    fn sliding(&self) -> Option<(u64, u64)> {
        sliding_fits(&self.times, &self.accepted, self.w, self.slack)
    }
}

/// How many of the sorted `accepted` send instants lie between `from`
/// and `to`.
fn held(accepted: &[f64], from: Bound<f64>, to: f64) -> u64 {
    let lo = match from {
        Included(f) => accepted.partition_point(|&t| t < f),
        Excluded(f) => accepted.partition_point(|&t| t <= f),
        Bound::Unbounded => 0,
    };
    let hi = accepted.partition_point(|&t| t <= to);
    hi.saturating_sub(lo) as u64
}

/// The least and greatest limits of a sliding window that answers `times`
/// (seconds from the first send, accepted; in send order; `accepted` the
/// accepted ones' instants) as the server did, if any does.
fn sliding_fits(times: &[(f64, bool)], accepted: &[f64], w: f64, slack: f64) -> Option<(u64, u64)> {
    // Accepted sends within W less the slack reached the server within W.
    let least = accepted
        .iter()
        .map(|&t| held(accepted, Excluded(t - (w - slack)), t))
        .max()
        .unwrap_or(0);
    let most = times
        .iter()
        .filter(|c| !c.1)
        .map(|&(t, _)| held(accepted, Excluded(t - w - slack), t + slack))
        .min()
        .unwrap_or(u64::MAX);
    (least <= most).then_some((least, most))
}

/// The least and the greatest limit of a fixed window of `w` resetting at
/// `phase` (and every W after) that answers `times` as the server did.
fn fixed_fits(
    times: &[(f64, bool)],
    accepted: &[f64],
    w: f64,
    phase: f64,
    slack: f64,
) -> Option<(u64, u64)> {
    // Window k holds [k·W − phase, (k+1)·W − phase); a send within the
    // slack of either end is in no window for sure.
    let place = |t: f64| {
        let x = (t + phase) / w;
        let k = x.floor();
        let sure = (x - k) * w >= slack && (k + 1.0 - x) * w >= slack;
        (k, sure)
    };
    let (mut least, mut most) = (0u64, u64::MAX);
    let (mut k_now, mut count) = (f64::NAN, 0u64);
    for &(t, ok) in times {
        let (k, sure) = place(t);
        if k != k_now {
            (k_now, count) = (k, 0);
        }
        if ok && sure {
            count += 1;
            least = least.max(count);
        } else if !ok && sure {
            // Every accepted call that may have reached the server in this
            // window before it: from the slack before the window's reset
            // to the slack after the refused call.
            let from = k * w - phase - slack;
            most = most.min(held(accepted, Included(from), t + slack));
        }
        if least > most {
            return None;
        }
    }
    Some((least, most))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// What a window of `limit` per `w` ms answers to calls sent at
    /// `sends` (ms from t0): fixed, resetting at `phase` ms, or sliding.
    fn answered(limit: usize, w: u64, fixed: Option<u64>, sends: &[u64]) -> Vec<(Instant, bool)> {
        let t0 = Instant::now();
        let mut accepted: Vec<u64> = Vec::new();
        sends
            .iter()
            .map(|&s| {
                let held = match fixed {
                    Some(p) => {
                        let k = (s + p) / w;
                        accepted.iter().filter(|&&a| (a + p) / w == k).count()
                    }
                    None => accepted.iter().filter(|&&a| a + w > s).count(),
                };
                let ok = held < limit;
                if ok {
                    accepted.push(s);
                }
                (t0 + ms(s), ok)
            })
            .collect()
    }

    /// The secret cell's calls: a start at three times the limit, a pause
    /// of a second after its refusal, then a ramp from a quarter of that
    /// pace up to all of it.
    fn start_and_ramp() -> Vec<u64> {
        let mut sends: Vec<u64> = (0..40).map(|i| i * 12).collect();
        let mut at = 1500.0;
        for i in 0..60 {
            sends.push(at as u64);
            at += 48.0 - 36.0 * f64::from(i).min(40.0) / 40.0;
        }
        sends
    }

    #[test]
    fn a_fixed_windows_overshoot_is_told_and_its_limit_is_kept() {
        for phase in [0, 130, 420, 777, 999] {
            let calls = answered(30, 1000, Some(phase), &start_and_ramp());
            assert!(calls.iter().filter(|c| !c.1).count() >= 2, "{phase}");
            let f = fit_fixed(&calls, ms(1000), ms(2)).expect("a fixed window fits");
            assert!((25..=30).contains(&f), "{phase}: {f}");
        }
    }

    #[test]
    fn a_sliding_window_is_left_to_its_count() {
        let calls = answered(30, 1000, None, &start_and_ramp());
        assert!(calls.iter().any(|c| !c.1));
        assert_eq!(fit_fixed(&calls, ms(1000), ms(2)), None);
    }

    #[test]
    fn nothing_refused_is_no_window() {
        let t0 = Instant::now();
        let calls: Vec<_> = (0..50).map(|i| (t0 + ms(i * 10), true)).collect();
        assert_eq!(fit_fixed(&calls, ms(1000), ms(2)), None);
    }

    #[test]
    fn the_least_that_fits_is_never_above_the_servers_window() {
        // Random paces against random fixed windows: the limit, when one
        // fits, is at most the server's.
        let mut rng = fastrand::Rng::with_seed(11);
        for _ in 0..300 {
            let limit = rng.usize(3..60);
            let phase = rng.u64(0..1000);
            let mut sends = Vec::new();
            let mut at = 0u64;
            for _ in 0..rng.usize(10..150) {
                at += rng.u64(0..40);
                sends.push(at);
            }
            let calls = answered(limit, 1000, Some(phase), &sends);
            if let Some(f) = fit_fixed(&calls, ms(1000), ms(2)) {
                assert!(f <= limit as u64, "{f} against {limit} at {phase}");
            }
            // The server's own window always fits (the replay's origin is
            // the first send).
            let t0 = calls[0].0;
            let times: Vec<_> = calls
                .iter()
                .map(|&(at, ok)| ((at - t0).as_secs_f64(), ok))
                .collect();
            let origin = (phase + sends[0]) % 1000;
            let accepted: Vec<f64> = times.iter().filter(|c| c.1).map(|c| c.0).collect();
            let fits = fixed_fits(&times, &accepted, 1.0, origin as f64 / 1000.0, 0.002);
            assert!(fits.is_some_and(|(l, m)| l <= limit as u64 && m >= limit as u64));
        }
    }
}
