//! A quota of tokens a server states without a window (OpenAI's and
//! Anthropic's), which the fleet adopts as a window of a minute, may be a
//! bucket refilling continuously. Each process reads the statements it
//! receives for that ([`crate::rate::refill`], as in-process
//! `Kept::watch_refill`); the first to find the refill has the script keep
//! the quota as a bucket from then on (`refill` in `lua/stated.lua`), and
//! every other process passes the bucket in the window's place from its
//! next take, told to fetch it. As later statements narrow the refill
//! (the period first found is the slowest the first ones fit), a process
//! whose statements show one more than a hundredth faster has the script
//! retime the bucket (a new key at the narrower period, in the old one's
//! place). In-process retimes either way; the fleet only to a shorter
//! period, so processes reading their own statements never undo each
//! other's (each process's narrowing is monotone, and each is a bound the
//! server's refill keeps).

use std::collections::HashMap;
use std::time::Duration;

use super::face::Stated;
use super::{scaled, Inner};
use crate::fleet::FleetKeys;
use crate::pace::{PaceError, PaceNote};
use crate::rate::policies::Heard;
use crate::rate::refill::Said as Statement;
use crate::rate::Rate;

/// How late a reset stated as an instant, with no `Date` to read it
/// against, may be read: in-process, the round trip and a second of
/// skew; the fleet keeps no round trip, so the second alone (such a
/// reset, in whole seconds, is too coarse to show a refill over a minute
/// either way).
const READ_LATE: Duration = Duration::from_secs(1);

impl Inner {
    /// Reads what `p` says of its reset for a continuous refill, when it
    /// is stated without a window and adopted by this process. Once found,
    /// the fleet keeps it as a bucket: what the operator hears when this
    /// process found it.
    pub(super) async fn heard_reset(&self, p: &Stated) -> Option<PaceNote> {
        let reset = p.reset?;
        let key = self.refill_key(p)?;
        let read_late = if p.reset_dated {
            Duration::ZERO
        } else {
            READ_LATE
        };
        let said = Statement::new(
            p.quota,
            p.quota.saturating_sub(p.used),
            reset,
            p.reset_exact,
            read_late,
        );
        let (period, from) = {
            let mut l = self.lock();
            let fit = l.fits.entry(key.clone()).or_default();
            let found = fit.observe(said, p.window)?;
            (found, chain(&l.refilled, key.clone()))
        };
        if !self.keys().contains(&from) {
            return None;
        }
        let count = scaled(p.quota, self.headroom);
        let rate = Rate { count, period };
        let bucket = self.fleet.keys().bucket(rate, count - 1, p.unit);
        // Found already: retimed only once the statements show a refill a
        // hundredth faster, as in-process (narrower statements only ever
        // shorten the period, so processes reading their own never undo
        // each other's).
        let first = from == key;
        if !first && !faster(&from, &bucket) {
            return None;
        }
        // Read against the share of the quota kept, as `spent_elsewhere`.
        let used = p.used.saturating_sub(p.quota - count.min(p.quota));
        match self.run_refill(&from, &bucket, used).await {
            Ok(1) => {
                self.swap_key(&from, bucket);
                first.then(|| {
                    PaceNote::Heard(Heard::Refills {
                        name: p.name.clone(),
                        quota: p.quota,
                        period,
                    })
                })
            }
            // Another process found it first: its bucket, then.
            Ok(0) => {
                let _ = self.fetch_stated().await;
                None
            }
            // Not done: the next statement tries again.
            _ => None,
        }
    }

    /// Whether `p` is kept as a bucket found to refill continuously, and
    /// this process's statements since do not doubt it: a `remaining` of 0
    /// is its level then, not a hold until its reset (as in-process,
    /// `Kept::refills`). A process that learnt of the refill from the
    /// fleet before it heard enough to fit one doubts nothing.
    pub(super) fn refills(&self, p: &Stated) -> bool {
        let key = self.stated_key(p);
        let l = self.lock();
        l.refilled.contains_key(&key) && !l.fits.get(&key).is_some_and(|f| f.doubted())
    }

    /// The key the fleet keeps `key` under: the bucket it became, when it
    /// did (and the bucket that one was retimed to, and so on).
    pub(super) fn kept_as(&self, key: String) -> String {
        chain(&self.lock().refilled, key)
    }

    /// Passes `bucket` in place of `old` (a window found to refill, or a
    /// bucket retimed) from now on. The calls this process settled since
    /// then went to the old key, not the new one, which holds them at
    /// their estimates: they are settled again
    /// ([`resettle`](Self::resettle)).
    pub(super) fn swap_key(&self, old: &str, bucket: String) {
        let swapped = {
            let mut keys = self.keys.write().unwrap_or_else(|e| e.into_inner());
            let at = keys.iter().position(|k| k == old);
            if let Some(i) = at {
                if keys.contains(&bucket) {
                    keys.remove(i);
                } else {
                    keys[i] = bucket.clone();
                }
            }
            at.is_some()
        };
        self.lock().refilled.insert(old.to_string(), bucket);
        if swapped {
            self.resettle();
        }
    }

    /// Whether the fleet keeps `p` as a bucket found to refill, its
    /// statements still showing the refill ([`refills`](Self::refills)),
    /// asked of Redis when this process does not know yet: a `remaining:
    /// 0` read just after another process's refill holds nothing then.
    pub(super) async fn refills_asked(&self, p: &Stated) -> bool {
        let Some(key) = self.refill_key(p) else {
            return false;
        };
        let known = self.lock().refilled.contains_key(&key);
        (known || self.learn_refilled(&key).await) && self.refills(p)
    }

    /// Asks Redis which bucket window `key` became (`refilled:KEY`), if it
    /// did, and keeps that bucket in its place; whether it did.
    pub(super) async fn learn_refilled(&self, key: &str) -> bool {
        let field = format!("refilled:{key}");
        let to = self.limit_field(&field, Duration::from_secs(2), |_| {});
        let Ok(Some(to)) = to.await else {
            return false;
        };
        self.swap_key(key, to);
        true
    }

    /// The key of the window this process keeps for `p` when `p` may be a
    /// bucket refilling continuously: a quota of tokens stated without a
    /// window, which no told policy keeps.
    fn refill_key(&self, p: &Stated) -> Option<String> {
        let may = p.windowless && p.unit.is_tokens() && self.told_keeps(p).is_none();
        may.then(|| self.stated_key(p))
    }

    /// Runs the script's `refill` of window `from` into bucket `to`, `used`
    /// of the quota used.
    async fn run_refill(&self, from: &str, to: &str, used: u64) -> Result<i64, PaceError> {
        let mut keys = self.keys().clone();
        let Some(at) = keys.iter().position(|k| k == from) else {
            return Ok(-1);
        };
        keys.push(to.to_string());
        let (from, to) = (at + 1, keys.len());
        self.run_on(&keys, "refill", |inv| {
            inv.arg(from).arg(to).arg(used);
        })
        .await
    }
}

/// Where `key` is kept now, following `refilled` (a window to the bucket
/// it became, a bucket to the one it was retimed to); a few steps at most.
fn chain(refilled: &HashMap<String, String>, mut key: String) -> String {
    for _ in 0..16 {
        match refilled.get(&key) {
            Some(next) if *next != key => key = next.clone(),
            _ => break,
        }
    }
    key
}

/// Whether bucket `to` refills more than a hundredth faster than `from`
/// (their intervals, as their keys name them).
fn faster(from: &str, to: &str) -> bool {
    match (FleetKeys::interval_of(from), FleetKeys::interval_of(to)) {
        (Some(a), Some(b)) => b < a && a - b > a / 100,
        _ => false,
    }
}
