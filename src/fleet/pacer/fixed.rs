//! The fixed windows a fleet was told (`--limit N/W,fixed`, of calls or of
//! tokens: `--limit Q/W,fixed,tokens` and the like): the
//! script keeps each as a sliding one until a response states when the
//! server's window resets, and then, for the whole fleet, aligned to that
//! reset (the `align` op in `lua/stated.lua`), as in-process (`rate::fixed`): an
//! answered call occupies until the first boundary after its answer, so a
//! new server window's quota is used at once rather than a window after
//! the calls of the last one.

use std::time::Duration;

use tokio::time::Instant;

use super::{FixedKept, Inner};
use crate::fleet::script::millis;
use crate::rate::fixed::margins;
use crate::rate::policy::Unit;

/// How long the read of Redis's clock may take: a slower one says too
/// little of when Redis read it, and the alignment waits for the next
/// statement.
const CLOCK_WITHIN: Duration = Duration::from_millis(500);

impl Inner {
    /// A call's round trip, grant to answer: the longest bounds how early
    /// a server may have measured a reset that an answer states.
    pub(super) fn trip(&self, d: Duration) {
        let mut l = self.lock();
        l.longest_trip = l.longest_trip.max(d);
    }

    /// A response read at `heard` stated, for each `(unit, window, reset,
    /// dated)`, a policy counting `unit` over that window resetting that
    /// long after (measured from the response's `Date`: `dated`): each
    /// configured fixed window counting the same over that window not
    /// aligned yet is aligned to it, when
    /// the reset is certain to a tenth of the window (the margins of
    /// `rate::fixed::margins`, as in-process, and the read of Redis's
    /// clock). Once the script aligned it, or found it aligned, this
    /// process asks no more: the script aligns once.
    pub(super) async fn align(&self, resets: &[(Unit, Duration, Duration, bool)], heard: Instant) {
        for &(unit, window, reset, dated) in resets {
            let Some(FixedKept { key, .. }) =
                (self.fixed.iter()).find(|f| f.unit == unit && f.window == window)
            else {
                continue;
            };
            let trip = {
                let l = self.lock();
                match l.aligned.contains(key) {
                    true => continue,
                    false => l.longest_trip,
                }
            };
            let (early, late) = margins(reset, dated, trip);
            if (early + late) * 10 > window {
                continue;
            }
            // The reset on the script's clock: as late as Redis's reading
            // allows, and as much earlier as its round trip. One past
            // already says nothing of the next.
            let Some((clock, before, after)) = self.redis_clock().await else {
                continue;
            };
            let Some(to_reset) = (heard + reset).checked_duration_since(before) else {
                continue;
            };
            let origin = clock + millis(to_reset) + 1;
            let early = early + (after - before) + Duration::from_millis(1);
            let keys = self.keys().clone();
            let Some(index) = keys.iter().position(|k| k == key) else {
                continue;
            };
            let answer = self
                .run_on(&keys, "align", |inv| {
                    inv.arg(index + 1)
                        .arg(origin)
                        .arg(millis(early))
                        .arg(millis(late));
                })
                .await;
            if matches!(answer, Ok(0 | 1)) {
                self.lock().aligned.insert(key.clone());
            }
        }
    }

    /// Responses stated, for each `(window, quota, left)`, what is left of
    /// the policy of calls a told fixed window of that window keeps: what
    /// they say was spent beyond the calls the fleet counts in it was
    /// spent elsewhere (another client on the key) and counts as answered
    /// now (the script's `elsewhere`), as in-process
    /// (`PolicySet::spent_elsewhere`), read against the lower of the
    /// stated quota and the window's share of it. At most once per tenth
    /// of the window, as for a window of tokens.
    pub(super) async fn fixed_spent(&self, left: &[(Duration, Option<u64>, u64)]) {
        for &(window, quota, left) in left {
            let Some(f) = (self.fixed.iter()).find(|f| f.unit == Unit::Calls && f.window == window)
            else {
                continue;
            };
            let spent = quota.unwrap_or(f.quota).min(f.quota).saturating_sub(left);
            if spent > 0 {
                self.correct(&f.key, window, spent, true).await;
            }
        }
    }

    /// Redis's clock (unix ms), with the instants just before it was asked
    /// and just after it answered; `None` when it did not answer soon.
    async fn redis_clock(&self) -> Option<(u64, Instant, Instant)> {
        let mut c = self.fleet.conn();
        let before = Instant::now();
        let time = redis::cmd("TIME");
        let asked = time.query_async::<(u64, u64)>(&mut c);
        let (s, us) = tokio::time::timeout(CLOCK_WITHIN, asked).await.ok()?.ok()?;
        let after = Instant::now();
        Some((s.checked_mul(1000)? + us / 1000, before, after))
    }
}
