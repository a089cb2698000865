//! Which lines are done and which failed, as two bitsets in memory.
//!
//! Two bits per line of the input: 250 KB for a million lines. The feeder
//! skips finished lines from here without touching sled, and the scan does
//! not render them again. The bits are loaded from the checkpoint's chunks
//! when the job is opened and set by the committer only after the chunks
//! saying the same are committed, so they never run ahead of the disk.

use std::sync::atomic::{AtomicU64, Ordering};

use super::{Counts, ItemState};

/// Done and failed lines, shared by the feeder (reads) and the committer
/// (writes). Lines outside the capacity are pending.
#[derive(Debug, Default)]
pub struct LineStates {
    done: Vec<AtomicU64>,
    failed: Vec<AtomicU64>,
}

impl Clone for LineStates {
    fn clone(&self) -> Self {
        let copy = |v: &[AtomicU64]| {
            v.iter()
                .map(|w| AtomicU64::new(w.load(Ordering::Relaxed)))
                .collect()
        };
        LineStates {
            done: copy(&self.done),
            failed: copy(&self.failed),
        }
    }
}

fn word_bit(line: u64) -> (usize, u64) {
    ((line / 64) as usize, 1u64 << (line % 64))
}

impl LineStates {
    /// Makes room for every line up to `last_line`.
    pub fn grow(&mut self, last_line: u64) {
        let words = (last_line / 64 + 1) as usize;
        if words > self.done.len() {
            self.done.resize_with(words, AtomicU64::default);
            self.failed.resize_with(words, AtomicU64::default);
        }
    }

    /// The highest line there is room for.
    pub fn capacity(&self) -> u64 {
        (self.done.len() as u64 * 64).saturating_sub(1)
    }

    /// A line's state: None while it is pending.
    pub fn state(&self, line: u64) -> Option<ItemState> {
        let (w, bit) = word_bit(line);
        let test = |v: &[AtomicU64]| {
            v.get(w)
                .is_some_and(|x| x.load(Ordering::Relaxed) & bit != 0)
        };
        if test(&self.done) {
            Some(ItemState::Done)
        } else if test(&self.failed) {
            Some(ItemState::Failed)
        } else {
            None
        }
    }

    /// True when the line is done or failed: it is not sent again.
    pub fn is_finished(&self, line: u64) -> bool {
        self.state(line).is_some()
    }

    /// True when the line is done.
    pub fn is_done(&self, line: u64) -> bool {
        self.state(line) == Some(ItemState::Done)
    }

    /// Sets a line's state. False when the line is beyond the capacity.
    pub fn set(&self, line: u64, state: Option<ItemState>) -> bool {
        let (w, bit) = word_bit(line);
        let (Some(d), Some(f)) = (self.done.get(w), self.failed.get(w)) else {
            return false;
        };
        let put = |w: &AtomicU64, on: bool| {
            if on {
                w.fetch_or(bit, Ordering::Relaxed);
            } else {
                w.fetch_and(!bit, Ordering::Relaxed);
            }
        };
        put(d, state == Some(ItemState::Done));
        put(f, state == Some(ItemState::Failed));
        true
    }

    /// Done and failed lines, counted from the bits. A checkpoint whose job
    /// record disagrees with this is damaged.
    pub fn counts(&self) -> Counts {
        let ones = |v: &[AtomicU64]| {
            v.iter()
                .map(|w| u64::from(w.load(Ordering::Relaxed).count_ones()))
                .sum()
        };
        Counts {
            done: ones(&self.done),
            failed: ones(&self.failed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_move_between_states_and_counts_follow() {
        let mut s = LineStates::default();
        assert_eq!(s.state(5), None);
        assert!(!s.set(5, Some(ItemState::Done)), "no room yet");
        s.grow(130);
        assert_eq!(s.capacity(), 191);
        assert!(s.set(1, Some(ItemState::Done)));
        assert!(s.set(64, Some(ItemState::Failed)));
        assert!(s.set(130, Some(ItemState::Done)));
        assert_eq!(s.counts(), Counts { done: 2, failed: 1 });
        assert!(s.is_finished(64) && !s.is_done(64));
        assert!(s.set(64, None), "a retried failure is pending again");
        assert_eq!(s.state(64), None);
        assert!(s.set(1, Some(ItemState::Failed)));
        assert_eq!(s.state(1), Some(ItemState::Failed), "one state at a time");
        assert_eq!(s.counts(), Counts { done: 1, failed: 1 });
        let copy = s.clone();
        assert_eq!(copy.counts(), s.counts());
        assert!(!s.is_finished(10_000));
    }
}
