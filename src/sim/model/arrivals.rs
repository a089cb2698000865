//! The arrival log behind `/admin/arrivals`: when each request that counted
//! in a window arrived, for utilization benchmarks.

use std::collections::VecDeque;
use std::time::Instant;

/// The most arrivals kept; older ones are forgotten first, so a long run
/// costs at most this many `f64`s.
pub(super) const MAX_ARRIVALS: usize = 2_000_000;

pub(super) struct ArrivalLog {
    epoch: Instant,
    cap: usize,
    /// Milliseconds since `epoch`, in arrival order.
    log: VecDeque<f64>,
}

impl ArrivalLog {
    /// An empty log keeping the last `cap` arrivals, timed from `epoch`.
    pub(super) fn new(epoch: Instant, cap: usize) -> Self {
        ArrivalLog {
            epoch,
            cap,
            log: VecDeque::new(),
        }
    }

    /// Logs an arrival at `now`.
    pub(super) fn push(&mut self, now: Instant) {
        if self.cap == 0 {
            return;
        }
        if self.log.len() == self.cap {
            self.log.pop_front();
        }
        let ms = now.saturating_duration_since(self.epoch).as_secs_f64() * 1000.0;
        self.log.push_back(ms);
    }

    /// The logged arrivals, oldest first, in milliseconds since the epoch.
    pub(super) fn snapshot(&self) -> Vec<f64> {
        self.log.iter().copied().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn keeps_the_last_cap_arrivals_in_milliseconds() {
        let t0 = Instant::now();
        let mut log = ArrivalLog::new(t0, 3);
        for ms in [0, 1500, 2250, 4000] {
            log.push(t0 + Duration::from_millis(ms));
        }
        assert_eq!(log.snapshot(), [1500.0, 2250.0, 4000.0]);
    }
}
