//! A batch call settled item by item: each item is its own side effect,
//! charged on its own, replayed on its own under the batch's
//! Idempotency-Key and its position in the batch.

use std::time::Instant;

use axum::body::Bytes;

use super::admission::{CreditView, Ticket};
use super::idempotency::{Found, IdemStore};
use super::Model;

/// What became of one item of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settled {
    /// It executed now and was charged: its element.
    Executed(Bytes),
    /// It executed under this batch key before: the stored element,
    /// uncharged.
    Replayed(Bytes),
    /// The balance did not cover it: nothing ran, nothing was charged.
    Unpaid,
}

impl Model {
    /// Settles the items of an admitted batch call in order: `items` holds
    /// each item's position in the batch and the element it answers when it
    /// executes. A batch is admitted as one call; its own reservation is
    /// given back here, since the items pay for themselves (`cost` each).
    /// Returns what became of each, and the credit headers after them all.
    pub fn settle_batch(
        &mut self,
        t: Ticket,
        idem: Option<&str>,
        items: Vec<(usize, Bytes)>,
        cost: u64,
        now: Instant,
    ) -> (Vec<Settled>, CreditView) {
        self.release(&t);
        self.refund(&t);
        self.account.roll(now);
        let mut out = Vec::with_capacity(items.len());
        for (pos, element) in items {
            let scoped = idem.map(|i| IdemStore::scoped(&t.key, &format!("{i}#{pos}")));
            if let Some(k) = &scoped {
                if let Some(Found::Done(stored)) = self.idem.lookup(k, now) {
                    self.stats.idempotent_replays += 1;
                    out.push(Settled::Replayed(stored));
                    continue;
                }
            }
            if self.account.balance() < cost {
                out.push(Settled::Unpaid);
                continue;
            }
            self.account.reserve(cost);
            self.stats.side_effects += 1;
            if let Some(k) = scoped {
                self.idem.store(k, element.clone(), now);
            }
            out.push(Settled::Executed(element));
        }
        (out, self.credits(now))
    }
}

#[cfg(test)]
mod tests {
    use super::super::testkit::*;
    use super::super::*;
    use super::Settled;

    fn admitted(m: &mut Model, now: std::time::Instant) -> Ticket {
        match m.admit("k", "echo", None, now) {
            Admission::Admitted { ticket, .. } => ticket,
            other => panic!("{other:?}"),
        }
    }

    fn items(n: usize) -> Vec<(usize, Bytes)> {
        (0..n).map(|i| (i, Bytes::from(format!("{i}")))).collect()
    }

    #[test]
    fn items_past_the_balance_are_unpaid_and_a_resend_replays_the_rest() {
        let (mut m, t0) = model(Config {
            credits: 3,
            ..cfg("none")
        });
        let t = admitted(&mut m, t0);
        let (out, cv) = m.settle_batch(t, Some("b"), items(5), 1, t0);
        assert_eq!(
            out[..3]
                .iter()
                .filter(|s| matches!(s, Settled::Executed(_)))
                .count(),
            3
        );
        assert_eq!(&out[3..], &[Settled::Unpaid, Settled::Unpaid]);
        assert_eq!((cv.remaining, cv.used), (0, 3));
        let _ = m.topup(10, t0);
        let t = admitted(&mut m, t0);
        let (out, cv) = m.settle_batch(t, Some("b"), items(5), 1, t0);
        assert_eq!(out[0], Settled::Replayed(Bytes::from("0")));
        assert_eq!(out[4], Settled::Executed(Bytes::from("4")));
        assert_eq!(cv.used, 5, "replays are not charged");
        let s = m.stats(t0);
        assert_eq!(
            (s.side_effects, s.idempotent_replays, s.in_flight),
            (5, 3, 0)
        );
    }
}
