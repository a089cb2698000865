//! Exponential backoff with full jitter (see docs/design.md: "randomising the full
//! range beats adding a small random nudge to a fixed delay").

use std::time::Duration;

/// Backoff schedule for transient failures.
#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    /// The ceiling of the first retry's range.
    pub base: Duration,
    /// No retry waits longer than this.
    pub cap: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            base: Duration::from_millis(500),
            cap: Duration::from_secs(30),
        }
    }
}

impl Backoff {
    /// The ceiling for retry number `attempt` (1 = the first retry):
    /// `min(cap, base × 2^(attempt-1))`.
    pub fn ceiling(&self, attempt: u32) -> Duration {
        let shift = attempt.saturating_sub(1).min(30);
        self.base.saturating_mul(1 << shift).min(self.cap)
    }

    /// Full jitter: a uniform draw from `[0, ceiling]`. `unit` is a uniform
    /// random number in `[0, 1)` supplied by the caller so this stays pure.
    pub fn delay(&self, attempt: u32, unit: f64) -> Duration {
        self.ceiling(attempt).mul_f64(unit.clamp(0.0, 1.0))
    }

    /// The wait before a retry: the server's `Retry-After` when it sent one
    /// (it beats any formula), otherwise full jitter.
    pub fn wait(&self, attempt: u32, retry_after: Option<Duration>, unit: f64) -> Duration {
        retry_after.unwrap_or_else(|| self.delay(attempt, unit))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceiling_doubles_up_to_the_cap() {
        let b = Backoff::default();
        let c: Vec<_> = (1..=8).map(|a| b.ceiling(a).as_millis()).collect();
        assert_eq!(c, [500, 1000, 2000, 4000, 8000, 16000, 30000, 30000]);
        assert_eq!(b.ceiling(1000), b.cap);
    }

    #[test]
    fn full_jitter_spans_the_whole_range() {
        let b = Backoff::default();
        assert_eq!(b.delay(3, 0.0), Duration::ZERO);
        assert_eq!(b.delay(3, 0.5), Duration::from_millis(1000));
        assert!(b.delay(3, 0.999_999) <= b.ceiling(3));
        // Out-of-range input never escapes the range.
        assert_eq!(b.delay(3, 7.0), b.ceiling(3));
        assert_eq!(b.delay(3, -1.0), Duration::ZERO);
    }

    #[test]
    fn retry_after_beats_the_formula() {
        let b = Backoff::default();
        assert_eq!(
            b.wait(5, Some(Duration::from_secs(2)), 0.9),
            Duration::from_secs(2)
        );
        assert_eq!(b.wait(1, None, 0.5), Duration::from_millis(250));
    }
}
