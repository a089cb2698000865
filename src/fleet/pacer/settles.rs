//! What one fleet process hands Redis besides its takes: the completions
//! of its calls (settles, sent by the settler task or a flush), and after
//! Redis forgot the fleet, what it puts back (its restore block) and how a
//! take checks for that loss.

use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

use super::rule::Verb;
use super::{millis, Inner, Restore};
use crate::fleet::local::Source;
use crate::fleet::script::{parse_tokens_arg, tokens_arg};
use crate::pace::PaceError;
use crate::rate::policy::TokenWeight;

/// A take's restore block carried only a job checkpoint's learning.
pub(super) const RECALLED: u8 = 1;
/// A take's restore block put this process's calls back after a loss.
pub(super) const PUT_BACK: u8 = 2;
/// Beside [`PUT_BACK`]: the block carried nothing learnt (no limit, no
/// even pace), so the fleet it began has not started either.
pub(super) const UNLEARNT: u8 = 4;

impl Inner {
    /// Pending completions as (id, ms since the response arrived; -1 for a
    /// call never sent; `ago/used` when the response said the tokens it
    /// used and a policy of tokens counts them, `used` as
    /// [`tokens_arg`] writes it).
    pub(super) fn take_settles(&self) -> Vec<(String, String)> {
        let now = Instant::now();
        let weighed = self.weighed.load(Ordering::SeqCst);
        std::mem::take(&mut self.lock().settles)
            .into_iter()
            .map(|(id, at, used)| {
                let ago = at.map_or(-1, |a| millis(now.saturating_duration_since(a)) as i64);
                match used.filter(|_| weighed && ago >= 0) {
                    Some(u) => (id, format!("{ago}/{}", tokens_arg(u))),
                    None => (id, ago.to_string()),
                }
            })
            .collect()
    }

    /// Puts completions back after Redis could not take them. The ages are
    /// lost; treating them as just arrived only makes them occupy longer.
    pub(super) fn requeue(&self, settles: Vec<(String, String)>) {
        let now = Instant::now();
        let mut l = self.lock();
        l.settles.extend(settles.into_iter().map(|(id, ago)| {
            let sent = !ago.starts_with('-');
            let used = ago.split_once('/').and_then(|(_, u)| parse_tokens_arg(u));
            (id, sent.then_some(now), used)
        }));
    }

    /// What this process puts back when Redis lost its data: its pause,
    /// what it last heard of the fleet's learning, its calls in flight and
    /// those still occupying the window. Until its first take is answered,
    /// what its job's checkpoint says was learnt instead, marked as such
    /// (a loss before then has no learning of its own to put back).
    pub(super) fn restore_block(&self) -> Option<Restore> {
        let now = Instant::now();
        let mut l = self.lock();
        let recall = l.recall.filter(|_| self.rule.windowed());
        if !l.lost {
            let r = recall?;
            return Some(Restore {
                learnt: r.limit(),
                even: r.even,
                from: Source::Checkpoint(r.most),
                ..Restore::default()
            });
        }
        while l.recent.front().is_some_and(|r| r.1 <= now) {
            l.recent.pop_front();
        }
        let paused = l
            .paused_until
            .map_or(0, |u| millis(u.saturating_duration_since(now)));
        let hold = millis(self.args.hold);
        let mut entries: Vec<(String, u64, bool)> = l
            .in_flight
            .iter()
            .map(|id| (id.clone(), hold, true))
            .collect();
        // A drip rule keeps no window and learns nothing: only the calls in
        // flight go back.
        let (mut learnt, mut even) = (0, false);
        if self.rule.windowed() {
            entries.extend(l.recent.iter().map(|(id, end, _)| {
                (
                    id.clone(),
                    millis(end.saturating_duration_since(now)) + 1,
                    false,
                )
            }));
            (learnt, even) = (l.learnt, l.even);
        }
        // With the epoch it last heard: a fleet begun since by another
        // process's checkpoint takes this learning instead (see the
        // script's `recall`). Lost before the first take was answered:
        // nothing heard of the fleet, the checkpoint's learning goes, as a
        // checkpoint's.
        let heard = l.epoch_before_loss.or(l.epoch);
        let mut from = heard.map_or(Source::Heard, Source::HeardIn);
        if let Some(r) = recall {
            (learnt, even, from) = (r.limit(), r.even, Source::Checkpoint(r.most));
        }
        Some(Restore {
            paused,
            learnt,
            even,
            from,
            lost: true,
            entries,
        })
    }

    /// Writes the take's restore block into `inv` (see `restore_block`)
    /// and says what it carried: nothing, only a checkpoint's learning
    /// ([`RECALLED`]), or this process's calls after a loss ([`PUT_BACK`]).
    /// What it last heard of the fleet's learning goes back in the same
    /// take as its calls: no take is granted at the full cap between the
    /// two.
    pub(super) fn restore_args(&self, inv: &mut redis::ScriptInvocation<'_>) -> u8 {
        let block = self.restore_block();
        let carried = match &block {
            None => 0,
            Some(b) if b.lost && b.learnt == 0 && !b.even => PUT_BACK | UNLEARNT,
            Some(b) if b.lost => PUT_BACK,
            Some(_) => RECALLED,
        };
        let Restore {
            paused,
            learnt,
            even,
            from,
            entries,
            ..
        } = block.unwrap_or_default();
        // Where the learning comes from prefixes the flag: a checkpoint's
        // is put back only if this take begins the fleet (see the script's
        // `recall`).
        inv.arg(paused).arg(learnt).arg(from.flag(even));
        inv.arg(entries.len());
        for (rid, left, flying) in entries {
            inv.arg(rid).arg(left).arg(u8::from(flying));
        }
        carried
    }

    /// A take whose restore block carried `carried` was answered: the
    /// checkpoint's learning was put back, or a live fleet's own stands
    /// (it is passed once); calls put back end the loss.
    pub(super) async fn restore_answered(&self, carried: u8) {
        if carried == 0 {
            return;
        }
        let put_back = carried & PUT_BACK != 0;
        {
            let mut l = self.lock();
            l.recall = None;
            if put_back {
                l.lost = false;
                l.epoch_before_loss = None;
                // The alignments went with the fleet's data: the next
                // reset stated aligns each window again.
                l.aligned.clear();
            }
        }
        if carried & UNLEARNT != 0 {
            // The next take asks for the start again; the script begins it
            // only if no other process put back a learning meanwhile.
            *self.start_asked.lock().await = false;
        }
        if put_back {
            self.relist().await;
        }
    }

    /// The loss check's arguments for a take: the epoch last heard and one
    /// of this process's calls in flight, which Redis must still hold; none
    /// while the take puts this process's calls back.
    pub(super) fn loss_check(&self, putting_back: bool) -> (String, String) {
        let l = self.lock();
        if putting_back {
            return (String::new(), String::new());
        }
        // `r`: none heard yet, but the job ran lately (see `Local::ran_lately`).
        let heard = match l.epoch {
            Some(e) => e.to_string(),
            None if l.ran_lately => "r".to_string(),
            None => String::new(),
        };
        let witness = l.in_flight.iter().next().cloned().unwrap_or_default();
        (heard, witness)
    }

    /// Sends pending completions; true when there were none left to send.
    pub(super) async fn flush_settles(&self, within: Duration) -> bool {
        let _one_at_a_time = self.settling.lock().await;
        let settles = self.take_settles();
        if settles.is_empty() {
            return true;
        }
        let sent: Result<i64, PaceError> = self
            .run(self.rule.op(Verb::Settle), within, |inv| {
                inv.arg(settles.len());
                for (id, ago) in &settles {
                    inv.arg(id).arg(ago);
                }
            })
            .await;
        if sent.is_err() {
            self.requeue(settles);
            return false;
        }
        true
    }

    /// How long a call occupies the window after its response: W, and a
    /// millisecond for the script's whole-ms clock.
    pub(super) fn occupied_after(&self) -> Duration {
        self.window + Duration::from_millis(1)
    }

    /// A permit was completed (`arrived`) or dropped unused (`None`).
    pub(super) fn settled(&self, id: String, arrived: Option<Instant>, used: Option<TokenWeight>) {
        {
            let mut l = self.lock();
            l.in_flight.remove(&id);
            if let Some(a) = arrived {
                let end = a + self.occupied_after();
                let now = Instant::now();
                while l.recent.front().is_some_and(|r| r.1 <= now) {
                    l.recent.pop_front();
                }
                l.recent.push_back((id.clone(), end, used));
            }
            l.settles.push((id, arrived, used));
        }
        self.wake.notify_one();
    }
}
