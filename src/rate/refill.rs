//! Whether a stated quota refills continuously: a token bucket, as OpenAI
//! and Anthropic keep their token limits. Their reset is the time until the
//! bucket is full again, so it keeps proportion with what is used: a quota
//! of q refilling over W, with u used, resets in `u·W/q`. OpenAI's 547 ms
//! for 73 of 8,000 tokens used is a minute's refill of 73 tokens.
//!
//! A window's reset keeps no such proportion: a fixed window's falls with
//! the clock while its use only grows, so two of its statements whose use
//! differs by a quarter of the quota fit one proportion only when its
//! period is under four times the grain the resets are stated in (their
//! rounding); a sliding window's is the age of a call, not a share of the
//! quota, and fits one only by chance. So a run of eight statements that
//! all fit one proportion, spanning a quarter of the quota of use, at a
//! period of at least twelve grains and near the policy's window (half of
//! it to all of it), is a bucket, refilling over the slowest period they
//! all fit. A bucket refilling much faster than its stated window (a test
//! server's, scaled) is not found: it stays a window, paced slower than it
//! could be.
//!
//! One window fits the proportion for as long as it stays full: a sliding
//! window that states when its newest call ages out (when it is back to
//! its initial state). Kept full, it frees what it was fed a window
//! before, about the quota over the window, as a bucket would; each call
//! it takes sets its reset to the whole window, and each it refuses finds
//! both reset and use fallen with the time since (the property test found
//! eight such statements fitting 62 s in a window of 60). It parts from a
//! bucket where it takes a call: its reset is then the whole window, a
//! bucket's the share of it that is used. So the run must also hold a
//! statement whose use rose from the one before (a call taken) with a
//! reset, read at its latest, within seven eighths of the window.
//!
//! Pure: it reads what the statements say, and keeps no clock.

use std::time::Duration;

/// Statements in a run before it is believed.
pub const MIN_STATEMENTS: u32 = 8;

/// The spread of use a run must cover, as a share of the quota (1/4).
/// With an eighth and three statements, 63 of 20,000 random runs of
/// traffic against a sliding window fitted by chance; with a quarter and
/// eight, none of 100,000 (a count made once with the property test's
/// model, which runs 4,000 cases each time).
const SPREAD: u64 = 4;

/// The least period believed, in grains (the sum of how early and how late
/// a reset may be stated): three times the four a fixed window can fake.
/// Nor is a period under half the policy's window believed: a sliding
/// window's resets, the ages of calls, fit a short one by chance (the
/// property test found 2.4 s in a window of 6 s).
const MIN_GRAINS: f64 = 12.0;

/// The most of the window the reset of a statement whose use rose may
/// say (at its latest) and show a bucket's share of it, not a sliding
/// window's whole window after the call it took (7/8).
const ROSE_WITHIN: (u32, u32) = (7, 8);

/// Statements seen against the hypothesis of a continuous refill.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RefillFit {
    /// Seconds of refill per unit used that every statement of the run
    /// fits: at least `lo`, at most `hi`.
    lo: f64,
    hi: f64,
    /// The least and the most used in the run.
    used: Option<(u64, u64)>,
    statements: u32,
    /// A run of two or more was broken, and no run of two holds since.
    doubted: bool,
    /// What the latest statement said was used, in this run or not.
    last: Option<u64>,
    /// The run holds a statement whose use rose from the one before with a
    /// reset within [`ROSE_WITHIN`] of the window.
    rose_short: bool,
}

/// One statement of a quota: what is left and when it is full again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Said {
    /// The quota stated.
    pub quota: u64,
    /// What is left of it.
    pub remaining: u64,
    /// When it resets, as read.
    pub reset: Duration,
    /// How much earlier than the truth the reset may read.
    pub early: Duration,
    /// How much later.
    pub late: Duration,
}

impl Said {
    /// A statement whose reset is stated to the millisecond (`exact`:
    /// OpenAI's durations, within a tenth of a second of rounding) or in
    /// whole seconds (an RFC 3339 instant: a second early by truncation,
    /// three late by rounding up, a second added and a `Date` truncated).
    /// An instant read against this clock, not the response's `Date`, is
    /// read on arrival, up to a round trip after the server stated it, by
    /// a clock that may run ahead of the server's: it may read early by
    /// `read_late` more (the round trip and a second of skew).
    pub fn new(
        quota: u64,
        remaining: u64,
        reset: Duration,
        exact: bool,
        read_late: Duration,
    ) -> Said {
        let (early, late) = if exact {
            (Duration::from_millis(100), Duration::from_millis(100))
        } else {
            (
                Duration::from_secs(1).saturating_add(read_late),
                Duration::from_secs(3),
            )
        };
        Said {
            quota,
            remaining,
            reset,
            early,
            late,
        }
    }
}

impl RefillFit {
    /// No statement yet.
    pub fn new() -> RefillFit {
        RefillFit::default()
    }

    /// A statement. Returns the period the quota refills over once the run
    /// of statements shows a continuous refill over about `window` (the
    /// policy's: half of it to a twentieth more); the period is the
    /// slowest the run fits, so it may be a little over the window.
    pub fn observe(&mut self, said: Said, window: Duration) -> Option<Duration> {
        let Said {
            quota,
            remaining,
            reset,
            early,
            late,
        } = said;
        let used = quota.saturating_sub(remaining);
        let rose = self.last.is_some_and(|last| used > last);
        let within = window.saturating_mul(ROSE_WITHIN.0) / ROSE_WITHIN.1;
        let rose_short = rose && reset.saturating_add(early) <= within;
        self.last = Some(used);
        if used == 0 {
            // Nothing used and a reset to wait for: no bucket of this quota.
            if reset > late {
                *self = RefillFit {
                    doubted: self.broken(),
                    last: self.last,
                    ..RefillFit::new()
                };
            }
            return None;
        }
        let u = used as f64;
        let lo = reset.saturating_sub(late).as_secs_f64() / u;
        let hi = reset.saturating_add(early).as_secs_f64() / u;
        let fits = self.used.is_some() && lo.max(self.lo) <= hi.min(self.hi);
        if fits {
            self.lo = self.lo.max(lo);
            self.hi = self.hi.min(hi);
            let (least, most) = self.used.unwrap_or((used, used));
            self.used = Some((least.min(used), most.max(used)));
            self.statements += 1;
            self.doubted = false;
            self.rose_short |= rose_short;
        } else {
            *self = RefillFit {
                lo,
                hi,
                used: Some((used, used)),
                statements: 1,
                doubted: self.broken(),
                last: self.last,
                rose_short,
            };
        }
        self.period(quota, early + late, window)
    }

    /// Whether the run holds the latest statement and more: the refill is
    /// still seen.
    pub fn holding(&self) -> bool {
        self.statements >= 2
    }

    /// Whether the latest statements broke a run that held (two or more),
    /// and none holds since: evidence against the refill. A fit with too
    /// few statements to hold, and none broken, doubts nothing (a process
    /// of a fleet that found the refill before it heard enough).
    pub fn doubted(&self) -> bool {
        self.doubted
    }

    /// Whether a statement that breaks the run leaves the refill doubted.
    fn broken(&self) -> bool {
        self.holding() || self.doubted
    }

    /// The period the run shows, when it is enough.
    fn period(&self, quota: u64, grains: Duration, window: Duration) -> Option<Duration> {
        let (least, most) = self.used?;
        let q = quota as f64;
        let shortest = self.lo * q;
        let spread = most - least >= quota.div_ceil(SPREAD);
        let enough = self.statements >= MIN_STATEMENTS && spread && self.rose_short;
        let period = self.hi * q;
        let window = window.as_secs_f64();
        let least = (MIN_GRAINS * grains.as_secs_f64()).max(window / 2.0);
        let plausible = shortest >= least && shortest <= window * 1.05;
        (enough && plausible)
            .then(|| Duration::try_from_secs_f64(period).ok())
            .flatten()
    }
}

#[cfg(test)]
mod tests;
