//! The learner's side of a fit: when it takes one (every answer of the
//! start and the ramp in), and what it then paces to: the bucket that fits
//! (`fit.rs`), else the sliding window that does, else the fixed one
//! (`windows.rs`), each paced as a window.

use std::time::{Duration, Instant};

use super::{windows, Phase, ShapeLearner, SKEW};

/// The spread between a send and its arrival that a fit allows for, at
/// least (and a tenth of the interval at the told rate).
const FIT_SLACK: Duration = Duration::from_millis(2);

/// A bucket, or a window, fitted to the answers of the start and the
/// ramp (see [`ShapeLearner::take_fit`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fitted {
    /// A bucket's limit per window whose even pace is the least rate that
    /// fits; a window's least limit.
    pub limit: u64,
    /// What fitted.
    pub kind: FittedKind,
    /// The limit per window of the greatest rate (or count) that fits.
    pub most: u64,
}

/// The shape a [`Fitted`] limit has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FittedKind {
    /// A bucket with this burst (the least that fits, less one).
    Bucket(u64),
    /// A fixed window, paced as a sliding one of its limit (which no fixed
    /// window of that limit refuses, whatever its phase).
    FixedWindow,
    /// A sliding window: the least count its answers allow (which takes
    /// the place of the lowering's), with no probing above the most they
    /// allow.
    SlidingWindow,
}

impl ShapeLearner {
    /// The bucket (or window) that fits every answer of the start and the
    /// ramp, once they are all in (or a window after the ramp's refusal,
    /// without the rest): `None` until then (or with no fit pending), then
    /// once `Some(fit)`, or `Some(None)` when nothing fits.
    pub fn take_fit(&mut self, now: Instant) -> Option<Option<Fitted>> {
        let (limit, at) = self.pending_fit?;
        if !self.evidence.answered_all() && now.saturating_duration_since(at) < self.window {
            return None;
        }
        self.pending_fit = None;
        let fitted = self.fitted(limit);
        self.evidence.clear();
        if let Some(f) = fitted {
            self.most = Some(f.most);
        }
        Some(fitted)
    }

    /// Whether a fit waits for the answers of calls still in flight.
    pub fn fit_pending(&self) -> bool {
        self.pending_fit.is_some()
    }

    /// [`take_fit`](Self::take_fit)'s bucket or window, told `limit` per
    /// window: a bucket when one fits, else a sliding window when one
    /// does, else a fixed one.
    fn fitted(&mut self, limit: u64) -> Option<Fitted> {
        let w = self.window.as_secs_f64().max(1e-9);
        let told = limit as f64 / w;
        let slack = FIT_SLACK.max(self.window.mul_f64(SKEW / limit.max(1) as f64));
        // A bucket whose rate's share of a window is below its burst is
        // no bucket: the counts are a window's.
        let bucket = self
            .evidence
            .fit(told / 100.0, told, slack)
            .filter(|f| f.per_second * w >= ((f.burst + 1) as f64).max(1.0));
        // The fit already keeps `slack` from every spacing the server
        // accepted, so its rate is paced as it is: the limit per window
        // whose even pace (less SKEW) is that rate. The burst errs low, as
        // one told from one refusal: the rates tried may miss the server's
        // by a step, and a burst one too large costs a 429 after every
        // idle spell.
        let per_window = |r: f64| ((r * w * (1.0 + SKEW)).floor() as u64).clamp(1, limit);
        // A fixed window may fit a bucket's answers too, by resets placed
        // where they are few: a bucket that fits comes first.
        let Some(f) = bucket else {
            return self.fitted_window(limit, slack);
        };
        let burst = f.burst.saturating_sub(1);
        self.held = per_window(f.per_second);
        // Both may fit: a fixed window's answers, by a bucket a little
        // faster with a burst (the window's count went at once in the
        // start), as a bucket's, by a window's resets placed where they are
        // few (a window far below the bucket's rate). The bucket is paced
        // to first (pacing a bucket as a window sends its whole count at
        // once, into its refusals), and the window kept for the bucket's
        // first refusal.
        // (A bucket with no burst is no fixed window's likeness: its
        // answers are not replayed for one.)
        self.fixed_too = (burst > 0)
            .then(|| windows::fit_fixed_exactly(&self.evidence.answers(), self.window, slack))
            .flatten()
            .map(|l| l.clamp(1, limit))
            .filter(|&l| l < self.held && 2 * l >= self.held);
        // While the window may be the server's, the bucket is paced with
        // no burst: its burst, sent at once into a window the start and the
        // ramp had filled, was refused with a call more in its wake (4
        // 429s), where an even pace a little over the window's rate is
        // refused once. A bucket it truly is loses only its burst's head
        // start, and the fit's rate still allows probing.
        let paced = match self.fixed_too {
            Some(_) => 0,
            None => burst,
        };
        self.burst_aside = burst - paced;
        self.phase = Phase::Bucket { burst: paced };
        self.searching = false;
        Some(Fitted {
            limit: self.held,
            kind: FittedKind::Bucket(paced),
            // f.most ≥ f.per_second: the greatest rate that fits. With no
            // burst, no probing above the fit, as the fleet does: a probe
            // a step above the rate it learnt is refused by the first
            // arrival a little early, and a pace a tenth under its rate
            // is within the bar for a secret limit.
            most: if burst == 0 {
                self.held
            } else {
                per_window(f.most)
            },
        })
    }

    /// No bucket fits the answers: the sliding window that does, else the
    /// fixed one, paced as a window.
    fn fitted_window(&mut self, limit: u64, slack: Duration) -> Option<Fitted> {
        let answers = self.evidence.answers();
        let fitted = match windows::fit_sliding(&answers, self.window, slack) {
            // Probing no higher than the answers allow: the ramp's refusal
            // with nothing else in flight counts the server's window
            // exactly, and a probe above that count is refused.
            Some((least, most)) => Fitted {
                limit: least.clamp(1, limit),
                kind: FittedKind::SlidingWindow,
                most: most.clamp(1, limit),
            },
            None => {
                // No probing above it either: the least is the count of
                // the server's fullest window, and a probe above a fixed
                // window's limit is refused in every window it tries.
                let least = windows::fit_fixed(&answers, self.window, slack)?.clamp(1, limit);
                self.fixed = true;
                Fitted {
                    limit: least,
                    kind: FittedKind::FixedWindow,
                    most: least,
                }
            }
        };
        self.phase = Phase::Window;
        self.searching = false;
        Some(fitted)
    }
}
