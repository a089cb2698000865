//! The credit meter's side of a call: the reserve admits it, or the run
//! waits for credits (alerting once a spell) and resumes when a probe
//! gets through.

use std::sync::Arc;

use super::events::Event;
use super::gate::Halt;
use super::pool::Pool;
use crate::credits::{self, Admit, InFlight};

impl Pool {
    /// Passes the reserve for a call of `items` items. None when the
    /// worker must look again (or stop).
    pub(super) async fn admit(self: &Arc<Self>, probing: bool, items: u64) -> Option<InFlight> {
        // Subscribed before asking, so a call that ends in between still
        // wakes this worker if it has to wait its turn.
        let mut turn = self.ledger.subscribe();
        match self.ledger.admit_items(probing, items) {
            Admit::Go(g) => Some(g),
            Admit::WaitForBalance => {
                tokio::select! {
                    _ = turn.changed() => {}
                    _ = self.gate.until_stopped() => {}
                }
                None
            }
            Admit::Refused(why) => {
                if self.cfg.policy.wait_for_credits {
                    self.start_waiting(&why);
                } else {
                    self.gate.stop(Halt::Reserve(why));
                }
                None
            }
        }
    }

    /// Credits are out (or the reserve reached) and the run waits for them.
    /// Alerts once per waiting spell.
    pub(super) fn start_waiting(&self, why: &str) {
        if self.gate.start_waiting() {
            let last = self.ledger.last();
            self.emit(Event::Alert(credits::Alert::new(
                credits::AlertKind::Waiting,
                "waiting",
                format!(
                    "{why} ({}); waiting for credits, probing every {}",
                    credits::describe_renewal(last.and_then(|s| s.renewal)),
                    humantime::format_duration(self.gate.probe_every())
                ),
                last,
            )));
        }
    }

    /// The probe went through: resume everyone, unless the reserve still
    /// has no room, in which case keep waiting.
    pub(super) fn probe_succeeded(&self) {
        if !self.ledger.has_room() {
            self.gate.probe_failed();
            return;
        }
        if self.gate.probe_succeeded() {
            self.emit(Event::Alert(credits::Alert::new(
                credits::AlertKind::Resumed,
                "resumed",
                "credits are back: resuming the run",
                self.ledger.last(),
            )));
        }
    }
}
