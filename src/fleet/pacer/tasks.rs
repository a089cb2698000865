//! The fleet pacer's tasks and permits: the settler that hands
//! completions to Redis as they come, the heartbeat that renews the leases
//! of this process's calls in flight, and a permit's hold on the fleet.

use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::Inner;
use crate::pace::{PaceError, Ticket};
use crate::rate::policy::{TokenWeight, Used};

/// Sends completions as they come, so other processes see a slot free up
/// (and a lease come back) without waiting for this one's next take.
pub(super) async fn settler(inner: Weak<Inner>, wake: Arc<Notify>) {
    loop {
        wake.notified().await;
        let Some(inner) = inner.upgrade() else { return };
        let within = inner.fleet.redis_timeout();
        if !inner.flush_settles(within).await {
            // Redis is away: the next completion or take tries again.
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// Renews the leases of this process's calls in flight.
pub(super) async fn heartbeat(inner: Weak<Inner>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(inner) = inner.upgrade() else { return };
        let ids: Vec<String> = inner.lock().in_flight.iter().cloned().collect();
        if ids.is_empty() {
            continue;
        }
        // A drip rule's calls occupy no window: only their leases.
        let leases_only = u8::from(!inner.rule.windowed());
        let _: Result<i64, PaceError> = inner
            .run("beat", every, |inv| {
                inv.arg(ids.len());
                for id in &ids {
                    inv.arg(id);
                }
                inv.arg(leases_only);
            })
            .await;
    }
}

/// A permit's hold on the fleet's window and ceiling.
pub(super) struct SharedTicket {
    pub(super) inner: Arc<Inner>,
    pub(super) id: String,
    /// The call's estimate: what its response does not say it used stays
    /// at that.
    pub(super) estimate: TokenWeight,
    /// When the fleet granted it: its round trip is measured from then.
    pub(super) granted: Instant,
}

impl Ticket for SharedTicket {
    fn complete(self: Box<Self>, arrived: Instant) {
        self.inner
            .trip(arrived.saturating_duration_since(self.granted));
        self.inner.settled(self.id, Some(arrived), None);
    }

    fn complete_used(self: Box<Self>, arrived: Instant, used: Option<Used>) {
        self.inner
            .trip(arrived.saturating_duration_since(self.granted));
        let used = used.map(|u| u.or(self.estimate));
        self.inner.settled(self.id, Some(arrived), used);
    }

    fn cancel(self: Box<Self>) {
        self.inner.settled(self.id, None, None);
    }
}

/// Hands a take that did not finish back: if Redis granted it just before
/// the caller gave up, the slot is freed rather than held until it expires.
pub(super) struct Abandon<'a> {
    pub(super) inner: &'a Arc<Inner>,
    pub(super) id: Option<String>,
}

impl Drop for Abandon<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            self.inner.settled(id, None, None);
        }
    }
}
