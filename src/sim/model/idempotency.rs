//! The idempotency store: a request with an `Idempotency-Key` executes once
//! per API key, and repeats within the TTL get the stored response.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use axum::body::Bytes;

enum Idem {
    InProgress,
    Done { body: Bytes, at: Instant },
}

/// What the store knows about a scoped idempotency key.
pub(super) enum Found {
    /// It executed: replay this body.
    Done(Bytes),
    /// It is still executing.
    InProgress,
}

pub(super) struct IdemStore {
    ttl: Duration,
    /// Keyed by [`IdemStore::scoped`].
    map: HashMap<String, Idem>,
    /// Completed keys in completion order, for expiry.
    order: VecDeque<(Instant, String)>,
}

impl IdemStore {
    pub(super) fn new(ttl: Duration) -> Self {
        IdemStore {
            ttl,
            map: HashMap::new(),
            order: VecDeque::new(),
        }
    }

    /// The store's key for `idem` under API key `key`: `key \0 idem`. Header
    /// values cannot hold NUL, so the join is unambiguous.
    pub(super) fn scoped(key: &str, idem: &str) -> String {
        format!("{key}\0{idem}")
    }

    fn prune(&mut self, now: Instant) {
        while let Some((at, _)) = self.order.front() {
            if now.saturating_duration_since(*at) < self.ttl {
                break;
            }
            if let Some((at, k)) = self.order.pop_front() {
                if matches!(self.map.get(&k), Some(Idem::Done { at: a, .. }) if *a == at) {
                    self.map.remove(&k);
                }
            }
        }
    }

    /// What is known about `k` at `now`, forgetting expired responses first.
    pub(super) fn lookup(&mut self, k: &str, now: Instant) -> Option<Found> {
        self.prune(now);
        match self.map.get(k)? {
            Idem::Done { body, .. } => Some(Found::Done(body.clone())),
            Idem::InProgress => Some(Found::InProgress),
        }
    }

    /// Marks `k` as executing.
    pub(super) fn claim(&mut self, k: &str) {
        self.map.insert(k.to_owned(), Idem::InProgress);
    }

    /// Frees `k` for a retry if it is still marked as executing.
    pub(super) fn release(&mut self, k: &str) {
        if matches!(self.map.get(k), Some(Idem::InProgress)) {
            self.map.remove(k);
        }
    }

    /// Stores the response of `k`, which executed at `now`.
    pub(super) fn store(&mut self, k: String, body: Bytes, now: Instant) {
        self.map.insert(k.clone(), Idem::Done { body, at: now });
        self.order.push_back((now, k));
    }
}

#[cfg(test)]
mod tests {
    use super::super::testkit::*;
    use super::super::*;

    #[test]
    fn an_idempotency_key_executes_once_and_replays_for_24h() {
        let (mut m, t0) = model(cfg("none"));
        assert!(executed(&call_idem(&mut m, "k", Some("a"), t0)));
        let a = call_idem(&mut m, "k", Some("a"), t0 + secs(3600));
        assert!(
            matches!(&a, Out::Replayed { body, .. } if body.as_ref() == b"{}"),
            "{a:?}"
        );
        // Nothing charged for the replay.
        assert_eq!(credits(&a).used, 1);
        // The same idempotency key under another API key is another request.
        assert!(executed(&call_idem(&mut m, "k2", Some("a"), t0)));
        // Still there just under 24 h later, gone after.
        let a = call_idem(&mut m, "k", Some("a"), t0 + secs(86_399));
        assert!(!executed(&a));
        assert!(executed(&call_idem(
            &mut m,
            "k",
            Some("a"),
            t0 + secs(86_400)
        )));
        let s = m.stats(t0 + secs(86_400));
        assert_eq!((s.side_effects, s.idempotent_replays), (3, 2));
        assert_eq!(s.credits_used, 3);
    }

    #[test]
    fn a_concurrent_repeat_conflicts_and_a_failed_attempt_frees_the_key() {
        let (mut m, t0) = model(cfg("10/1m"));
        let Admission::Admitted { ticket, .. } = m.admit("k", "echo", Some("a"), t0) else {
            panic!()
        };
        let a = m.admit("k", "echo", Some("a"), t0);
        assert_eq!(refused(&a), Some(&Rejection::Conflict));
        // An injected 503: refunded and retryable.
        let cv = m.fail(ticket, t0);
        assert_eq!((cv.remaining, cv.used), (100_000, 0));
        assert!(executed(&call_idem(&mut m, "k", Some("a"), t0)));
        // The conflict didn't count in the window; the failure did.
        assert_eq!(m.in_window("k", t0), 2);
        let s = m.stats(t0);
        assert_eq!(
            (s.rejected_conflict, s.injected_failures, s.side_effects),
            (1, 1, 1)
        );
    }
}
