//! The calls in flight at once: a semaphore the size of the pool, that can
//! only shrink while the run goes (a server's concurrency ceiling, this
//! process's file handles).

/// The calls in flight at once: the pool's size, lowered when the server
/// says its concurrency ceiling is lower (a 429 with x-concurrency-limit).
pub struct Slots {
    sem: tokio::sync::Semaphore,
    size: std::sync::atomic::AtomicUsize,
    /// Slots to retire as soon as they are returned.
    debt: std::sync::atomic::AtomicUsize,
    /// Running out of file handles was said once already.
    pub(super) noted_handles: std::sync::atomic::AtomicBool,
}

/// One call's slot; returned (or retired) when dropped.
pub(super) struct Slot<'a> {
    permit: Option<tokio::sync::SemaphorePermit<'a>>,
    slots: &'a Slots,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        use std::sync::atomic::Ordering::SeqCst;
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

impl Slots {
    /// `n` calls in flight at most.
    pub fn new(n: usize) -> Slots {
        Slots {
            sem: tokio::sync::Semaphore::new(n),
            size: std::sync::atomic::AtomicUsize::new(n),
            debt: std::sync::atomic::AtomicUsize::new(0),
            noted_handles: std::sync::atomic::AtomicBool::new(false),
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
        self.size.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// One fewer call in flight from now on (never below one). The new
    /// size, if it changed.
    pub(super) fn lower(&self) -> Option<usize> {
        use std::sync::atomic::Ordering::SeqCst;
        let lowered = self
            .size
            .fetch_update(SeqCst, SeqCst, |n| (n > 1).then(|| n - 1))
            .ok()?;
        // A slot in use now is forgotten when it is returned.
        if self.sem.forget_permits(1) == 0 {
            self.debt.fetch_add(1, SeqCst);
        }
        Some(lowered - 1)
    }
}
