//! One worker's loop: what it sends next, from the queue or from the items
//! it set aside.
//!
//! A worker drives one item at a time ([`Pool::drive`]). An item the
//! server asked to wait long before its retry (a 503 with `Retry-After:
//! 600`) is set aside with the instant it may go again, its
//! Idempotency-Key and attempts kept, and the worker goes on with the
//! queue: with `-c 1`, waiting in turn would send nothing for as long.
//! Such an item goes again, before any new one, once its time has come;
//! once the queue is done the worker waits for its items set aside, or a
//! stop, which leaves them pending as any unsent item (never recorded: the
//! next run sends them under the same key).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::time::Instant;

use super::pool::{Going, Left, Pool, Queue, Queued};

/// The most items one worker sets aside at once. A server that asks every
/// item to wait would otherwise have the worker send the whole queue once
/// into its outage and hold every item in memory; past this, the worker
/// takes no new item until its earliest one has gone again.
const MOST_SET_ASIDE: usize = 256;

/// What a worker goes on with.
enum Take {
    /// A new item from the queue.
    Item(Queued),
    /// An item set aside whose time has come.
    Due(Box<Going>),
    /// The queue is done (it stays done).
    Closed,
    /// The queue is done and nothing is set aside for later.
    Idle,
    /// The run stopped.
    Stop,
}

impl Pool {
    /// One worker: takes items until the queue is done and its items set
    /// aside are over, or the run stops.
    pub async fn worker(self: Arc<Self>, queue: Queue) {
        // Items set aside after a first refusal (`Action::Defer`), at most
        // `DEFERRABLE` a run.
        let mut held: Vec<Queued> = Vec::new();
        let mut later = Later::default();
        let mut open = true;
        loop {
            let left = match self.take(&queue, &mut later, open).await {
                Take::Stop => return,
                Take::Closed => {
                    open = false;
                    continue;
                }
                Take::Item(q) => self.process(q).await,
                Take::Due(going) => self.drive(*going).await,
                Take::Idle => match held.pop() {
                    // With nothing left to tell the key from them, the
                    // items set aside go again, and a refusal while no
                    // call got through halts as the key's (set aside
                    // again, the same refused call went out four times).
                    Some(h) => {
                        (self.deferred).fetch_max(super::pool::DEFERRABLE, Ordering::Relaxed);
                        self.process(h).await
                    }
                    None => return,
                },
            };
            let aside = match left {
                Left::Over => None,
                Left::Defer(q) => Some(q),
                // No answer yet: the item set aside for a refusal waits
                // for one that tells the key's refusal from its item's.
                Left::Later { at, going } => {
                    later.put(at, going);
                    continue;
                }
            };
            // A call got through (the key works): the items set aside go
            // again, each refusal now its own. Sent again before that, each
            // spent the budget of items set aside for nothing.
            if aside.is_none() && self.got_through.load(Ordering::Relaxed) {
                for h in std::mem::take(&mut held) {
                    match self.process(h).await {
                        Left::Over => {}
                        Left::Defer(q) => held.push(q),
                        Left::Later { at, going } => later.put(at, going),
                    }
                }
            }
            held.extend(aside);
        }
    }

    /// What the worker goes on with: an item set aside whose time has
    /// come, else a new item, waiting for whichever comes first.
    async fn take(&self, queue: &Queue, later: &mut Later<Box<Going>>, open: bool) -> Take {
        loop {
            if self.gate.is_stopped() {
                return Take::Stop;
            }
            if let Some(going) = later.take_due(Instant::now()) {
                return Take::Due(going);
            }
            if !open && later.is_empty() {
                return Take::Idle;
            }
            let room = open && later.len() < MOST_SET_ASIDE;
            // Dropped when an item set aside comes due first: a lock not
            // yet had is not held, and a receive cut short loses nothing.
            let from_queue = async {
                if !room {
                    return std::future::pending().await;
                }
                match queue.lock().await.recv().await {
                    Some(q) => Take::Item(q),
                    None => Take::Closed,
                }
            };
            tokio::select! {
                t = from_queue => return t,
                _ = later.until_due() => {}
                _ = self.gate.until_stopped() => return Take::Stop,
            }
        }
    }
}

/// Items set aside, each with the instant it may go again.
struct Later<T> {
    items: Vec<(Instant, T)>,
}

impl<T> Default for Later<T> {
    fn default() -> Self {
        Later { items: Vec::new() }
    }
}

impl<T> Later<T> {
    fn put(&mut self, at: Instant, item: T) {
        self.items.push((at, item));
    }

    fn len(&self) -> usize {
        self.items.len()
    }

    fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The earliest instant, the first set aside among equals.
    fn next_at(&self) -> Option<(usize, Instant)> {
        (self.items.iter().enumerate())
            .min_by_key(|(_, (at, _))| *at)
            .map(|(i, (at, _))| (i, *at))
    }

    /// The item whose time has come first, if any has by `now`.
    fn take_due(&mut self, now: Instant) -> Option<T> {
        let (i, at) = self.next_at()?;
        (at <= now).then(|| self.items.remove(i).1)
    }

    /// Until the earliest item's time comes: never, with none.
    async fn until_due(&self) {
        match self.next_at() {
            Some((_, at)) => tokio::time::sleep_until(at).await,
            None => std::future::pending().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn the_earliest_comes_first_once_its_time_has_come() {
        let now = Instant::now();
        let s = Duration::from_secs;
        let mut l = Later::default();
        l.put(now + s(9), "nine");
        l.put(now + s(3), "three");
        l.put(now + s(3), "three again");
        assert_eq!(l.take_due(now), None, "nothing is due yet");
        l.until_due().await;
        assert_eq!(Instant::now(), now + s(3));
        assert_eq!(l.take_due(Instant::now()), Some("three"));
        assert_eq!(l.take_due(Instant::now()), Some("three again"));
        assert_eq!(l.take_due(Instant::now()), None);
        assert_eq!(l.take_due(now + s(9)), Some("nine"));
        assert!(l.is_empty());
    }
}
