//! The calls in flight at once: a semaphore the size of the pool. A pool
//! sized by the limit (`--limit` without `-c`) grows as latency is
//! measured, to what the limit's pace needs in flight (Little's law: rate
//! times latency); any pool shrinks when the server or the OS says so (a
//! server's concurrency ceiling, this process's file handles), and never
//! grows past that again.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::Mutex;
use std::time::Duration;

/// How much more in flight than rate x mean latency a growing pool keeps:
/// latency varies, and a call that takes twice the mean must not leave the
/// limit's pace unused.
const HEADROOM: f64 = 1.25;

/// Weight of the newest latency in the running mean.
const EWMA_WEIGHT: f64 = 0.2;

/// Latencies measured before the pool judges whether concurrency bounds
/// the run (the first calls pay for connecting).
const SAMPLES_TO_JUDGE: u64 = 8;

/// The calls in flight at once: the pool's size, raised toward what the
/// limit needs when the pool grows, lowered when the server says its
/// concurrency ceiling is lower (a 429 with x-concurrency-limit).
pub struct Slots {
    sem: tokio::sync::Semaphore,
    size: AtomicUsize,
    /// The most it may grow to: the workers, or less once lowered.
    ceiling: AtomicUsize,
    /// Whether it grows with the measured latency.
    grows: bool,
    /// The limit's pace, calls per second; None when unlimited.
    per_second: Option<f64>,
    /// Running mean latency of answered calls, and how many were measured.
    latency: Mutex<(f64, u64)>,
    /// Slots to retire as soon as they are returned.
    debt: AtomicUsize,
    /// Growing was said once already.
    noted_grew: AtomicBool,
    /// Concurrency bounding the run was said once already.
    noted_bound: AtomicBool,
    /// Running out of file handles was said once already.
    pub(super) noted_handles: AtomicBool,
}

/// One call's slot; returned (or retired) when dropped.
pub(super) struct Slot<'a> {
    permit: Option<tokio::sync::SemaphorePermit<'a>>,
    slots: &'a Slots,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        let retire = self
            .slots
            .debt
            .fetch_update(SeqCst, SeqCst, |d| d.checked_sub(1))
            .is_ok();
        if let (true, Some(p)) = (retire, self.permit.take()) {
            p.forget();
        }
    }
}

/// What a measured latency changed.
#[derive(Debug, PartialEq)]
pub(super) enum Resized {
    /// The pool grew to this many calls in flight (said the first time only).
    Grew(usize),
    /// The pool cannot keep the limit's pace: `size` calls in flight at
    /// `latency` make `per_min`, where the limit's pace needs `need`.
    Bound {
        size: usize,
        need: usize,
        latency: Duration,
        per_min: f64,
    },
}

impl Slots {
    /// `n` calls in flight at most, always.
    pub fn new(n: usize) -> Slots {
        Slots::sized(n, n, false, None)
    }

    /// `start` calls in flight, growing (when `grows`) up to `max` as the
    /// latency measured shows the limit's pace (`per_second`) needs them.
    pub fn sized(start: usize, max: usize, grows: bool, per_second: Option<f64>) -> Slots {
        let start = start.clamp(1, max.max(1));
        Slots {
            sem: tokio::sync::Semaphore::new(start),
            size: AtomicUsize::new(start),
            ceiling: AtomicUsize::new(max.max(start)),
            grows,
            per_second: per_second.filter(|p| p.is_finite() && *p > 0.0),
            latency: Mutex::new((0.0, 0)),
            debt: AtomicUsize::new(0),
            noted_grew: AtomicBool::new(false),
            noted_bound: AtomicBool::new(false),
            noted_handles: AtomicBool::new(false),
        }
    }

    pub(super) async fn acquire(&self) -> Option<Slot<'_>> {
        let permit = self.sem.acquire().await.ok()?;
        Some(Slot {
            permit: Some(permit),
            slots: self,
        })
    }

    /// The calls in flight allowed now.
    pub fn size(&self) -> usize {
        self.size.load(SeqCst)
    }

    /// The mean latency of the calls answered so far, once measured.
    pub fn mean_latency(&self) -> Option<Duration> {
        let (mean, n) = *self.latency.lock().unwrap_or_else(|p| p.into_inner());
        (n > 0).then(|| Duration::from_secs_f64(mean))
    }

    /// The pace the calls in flight allow, items per minute, once a
    /// latency is measured: what the run goes at when concurrency, not the
    /// limit, bounds it.
    pub fn pace_per_min(&self) -> Option<f64> {
        let mean = self.mean_latency()?.as_secs_f64();
        (mean > 0.0).then(|| self.size() as f64 * 60.0 / mean)
    }

    /// The limit's pace, calls per second: the configured one, or what the
    /// pacer allows now when that is less (`live`: a quota of tokens it
    /// follows, at the calls' mean weight, or a limit the server states).
    fn pace(&self, live: Option<f64>) -> Option<f64> {
        let live = live.filter(|p| p.is_finite() && *p > 0.0);
        match (self.per_second, live) {
            (Some(c), Some(l)) => Some(c.min(l)),
            (c, _) => c,
        }
    }

    /// Calls in flight a pace of `per_second` needs at mean latency `mean`.
    fn need(per_second: f64, mean: f64) -> Option<usize> {
        let need = (per_second * mean * HEADROOM).ceil() + 1.0;
        Some(if need >= usize::MAX as f64 {
            usize::MAX
        } else {
            need as usize
        })
    }

    /// Feeds the latency of one answered call: a growing pool grows toward
    /// what the limit needs; a pool that cannot keep the limit's pace says
    /// so once, judged against `live` too (see [`pace`](Self::pace); asked
    /// only then): a run bound by its tokens is not bound by its
    /// concurrency. The growth follows the configured pace only, so that a
    /// limit the pacer is still learning upward does not hold it back.
    pub(super) fn measured(
        &self,
        latency: Duration,
        live: impl FnOnce() -> Option<f64>,
    ) -> Option<Resized> {
        let (mean, n) = {
            let mut l = self.latency.lock().unwrap_or_else(|p| p.into_inner());
            let x = latency.as_secs_f64();
            l.0 = if l.1 == 0 {
                x
            } else {
                l.0 + EWMA_WEIGHT * (x - l.0)
            };
            l.1 += 1;
            *l
        };
        let need = Self::need(self.per_second?, mean)?;
        if self.grows {
            if let Some(grown) = self.grow_to(need) {
                // Said once: later growth follows the latency quietly.
                return (!self.noted_grew.swap(true, SeqCst)).then_some(Resized::Grew(grown));
            }
        }
        let size = self.size();
        // Bound only when the calls in flight fall short of the limit's pace
        // itself (the headroom is for growing, not for judging).
        if n < SAMPLES_TO_JUDGE || self.noted_bound.load(SeqCst) {
            return None;
        }
        let pace = self.pace(live()).unwrap_or(0.0);
        let short = (size as f64) < pace * mean;
        if short && !self.noted_bound.swap(true, SeqCst) {
            return Some(Resized::Bound {
                size,
                need: Self::need(pace, mean).unwrap_or(need),
                latency: Duration::from_secs_f64(mean),
                per_min: size as f64 * 60.0 / mean,
            });
        }
        None
    }

    /// Raises the size toward `target`, within the ceiling. The new size, if
    /// it changed.
    fn grow_to(&self, target: usize) -> Option<usize> {
        let ceiling = self.ceiling.load(SeqCst);
        let old = self
            .size
            .fetch_update(SeqCst, SeqCst, |n| {
                let to = target.min(ceiling);
                (to > n).then_some(to)
            })
            .ok()?;
        let new = target.min(ceiling);
        // No slot is owed to a lowering here: a lowering sets the ceiling
        // to the size, so a lowered pool never grows again.
        self.sem.add_permits(new - old);
        Some(new)
    }

    /// One fewer call in flight from now on (never below one), and never
    /// more again: the server or the OS said so. The new size, if it changed.
    pub(super) fn lower(&self) -> Option<usize> {
        let lowered = self
            .size
            .fetch_update(SeqCst, SeqCst, |n| (n > 1).then(|| n - 1))
            .ok()?;
        self.ceiling.store(lowered - 1, SeqCst);
        // A slot in use now is forgotten when it is returned.
        if self.sem.forget_permits(1) == 0 {
            self.debt.fetch_add(1, SeqCst);
        }
        Some(lowered - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_growing_pool_grows_to_rate_times_latency_within_its_ceiling() {
        // 600/6s is 100 calls a second: at 200 ms, 20 in flight, 26 with
        // the headroom.
        let s = Slots::sized(4, 100, true, Some(100.0));
        assert_eq!(s.size(), 4);
        assert_eq!(s.measured(200 * MS, || None), Some(Resized::Grew(26)));
        assert_eq!(s.size(), 26);
        assert_eq!(s.sem.available_permits(), 26);
        // Faster calls never shrink it; slower ones grow it, quietly.
        assert_eq!(s.measured(50 * MS, || None), None);
        assert_eq!(s.size(), 26);
        assert_eq!(s.measured(Duration::from_secs(2), || None), None);
        assert!(s.size() > 26, "{}", s.size());
        let s = Slots::sized(4, 20, true, Some(100.0));
        assert_eq!(s.measured(200 * MS, || None), Some(Resized::Grew(20)));
        assert_eq!(s.pace_per_min().map(|p| p.round()), Some(6000.0));
    }

    #[test]
    fn a_pool_that_cannot_keep_the_pace_says_so_once_after_enough_calls() {
        // 10 calls a second at 200 ms: 2 in flight, 4 with the headroom.
        let s = Slots::sized(1, 1, false, Some(10.0));
        for _ in 1..SAMPLES_TO_JUDGE {
            assert_eq!(s.measured(200 * MS, || None), None);
        }
        let Some(Resized::Bound {
            size,
            need,
            per_min,
            ..
        }) = s.measured(200 * MS, || None)
        else {
            panic!("bound")
        };
        assert_eq!((size, need), (1, 4));
        assert!((per_min - 300.0).abs() < 1e-6, "{per_min}");
        assert_eq!(s.measured(200 * MS, || None), None, "said once");
        // Quick enough calls keep the pace (4 a second at 240 ms is 0.96 in
        // flight): nothing to say, headroom or not.
        let s = Slots::sized(1, 1, false, Some(4.0));
        for _ in 0..20 {
            assert_eq!(s.measured(240 * MS, || None), None);
        }
        // 10 calls a second configured, but a quota of tokens the pacer
        // follows allows 4 (`live`): 1 in flight at 200 ms keeps that
        // pace, and the run is not bound by its concurrency.
        let s = Slots::sized(1, 1, false, Some(10.0));
        for _ in 0..20 {
            assert_eq!(s.measured(200 * MS, || Some(4.0)), None);
        }
        // Without a limit there is no pace to keep.
        let s = Slots::new(1);
        let s = Slots {
            per_second: None,
            ..s
        };
        for _ in 0..20 {
            assert_eq!(s.measured(200 * MS, || None), None);
        }
    }

    #[test]
    fn a_lowered_pool_never_grows_past_the_ceiling_it_was_told() {
        let s = Slots::sized(4, 100, true, Some(100.0));
        assert_eq!(s.lower(), Some(3));
        assert_eq!(
            s.measured(200 * MS, || None),
            None,
            "the server's ceiling is 3"
        );
        assert_eq!(s.size(), 3);
        assert_eq!(s.sem.available_permits(), 3);
    }

    #[tokio::test]
    async fn a_lowering_owed_by_a_slot_in_use_retires_it_on_return() {
        let s = Slots::sized(2, 100, true, Some(10.0));
        let a = s.acquire().await.unwrap();
        let b = s.acquire().await.unwrap();
        // Both in use: the lowering is owed until one comes back.
        assert_eq!(s.lower(), Some(1));
        assert_eq!(s.sem.available_permits(), 0);
        drop(a);
        assert_eq!(s.sem.available_permits(), 0, "retired on return");
        drop(b);
        assert_eq!(s.sem.available_permits(), 1);
        // Grows back only to the ceiling it was told: it stays at 1.
        assert_eq!(s.measured(Duration::from_secs(1), || None), None);
        assert_eq!(s.size(), 1);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Take,
        Give,
        Measure(u64),
        Lower,
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        prop_oneof![
            3 => Just(Op::Take),
            3 => Just(Op::Give),
            3 => (1u64..3_000).prop_map(Op::Measure),
            1 => Just(Op::Lower),
        ]
    }

    proptest::proptest! {
        /// Whatever the latencies and the server's lowerings, the pool never
        /// holds more slots than its size (plus what is owed to a lowering),
        /// never grows past its ceiling, and never grows again once lowered.
        #[test]
        fn the_pool_never_exceeds_its_size_nor_grows_after_a_lowering(
            start in 1usize..8,
            max in 1usize..64,
            per_second in 0.5f64..500.0,
            ops in proptest::collection::vec(op(), 1..200),
        ) {
            let s = Slots::sized(start, max, true, Some(per_second));
            let mut held: Vec<Slot<'_>> = Vec::new();
            let mut lowered_to: Option<usize> = None;
            for op in ops {
                match op {
                    Op::Take => {
                        if let Ok(p) = s.sem.try_acquire() {
                            held.push(Slot { permit: Some(p), slots: &s });
                        }
                    }
                    Op::Give => drop(held.pop()),
                    Op::Measure(ms) => drop(s.measured(Duration::from_millis(ms), || None)),
                    Op::Lower => {
                        if let Some(n) = s.lower() {
                            lowered_to = Some(n);
                        }
                    }
                }
                let size = s.size();
                proptest::prop_assert!(size >= 1 && size <= max, "size {size}, ceiling {max}");
                if let Some(l) = lowered_to {
                    proptest::prop_assert!(size <= l, "grew to {size} after a lowering to {l}");
                }
                let permits = s.sem.available_permits() + held.len();
                proptest::prop_assert_eq!(permits, size + s.debt.load(SeqCst));
            }
        }
    }
}
