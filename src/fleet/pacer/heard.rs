//! What responses say, acted on for the whole fleet: `remaining: 0`
//! holds it, a drip rule follows a lower limit, and a policy a server
//! states that the fleet was not told (a window of calls other than the
//! primary one, a window of tokens) is adopted as `lua/stated.lua` says,
//! as in-process a [`PolicySet`](crate::rate::policies::PolicySet) adds
//! it: paced to by every process from then on.

use std::sync::atomic::Ordering;
use std::time::Duration;

use reqwest::header::HeaderMap;
use tokio::time::Instant;

use super::face::Stated;
use super::rule::Verb;
use super::{scaled, Inner, Local};
use crate::fleet::script::millis;
use crate::pace::{PaceError, PaceNote};
use crate::rate::kept::bucket_emptied_hold;
use crate::rate::policies::{Heard, LONG_HOLD, MAX_WINDOWS};
use crate::rate::policy::Unit;

/// The script's answer to `adopt` and `elsewhere` for a window the fleet
/// keeps as a bucket since (`refill.rs`).
const REFILLED: i64 = -2;

/// The script's answer to an adoption when the fleet adopted the most it
/// keeps (`adopt`'s −1).
const LIST_FULL: i64 = -1;

/// The longest spacing between two corrections of a token window for what
/// was spent elsewhere; a window shorter than ten of them is spaced by a
/// tenth of it.
const ELSEWHERE_EVERY: Duration = Duration::from_secs(1);

impl Inner {
    /// A response said `x-rate-limit-remaining: 0`: the fleet holds new
    /// calls until its earliest occupancy ends. Workers that see it at once
    /// tell Redis once: the hold is known here until it ends.
    pub(super) async fn hold(&self) {
        let now = Instant::now();
        {
            let mut l = self.lock();
            if l.held_until.is_some_and(|h| h > now) {
                return;
            }
            // Claimed before the round trip, so concurrent responses skip.
            l.held_until = Some(now + Duration::from_millis(50));
        }
        let held: Result<i64, PaceError> = self.run("full", Duration::from_secs(2), |_| {}).await;
        if let Ok(ms) = held {
            self.lock().held_until = Some(now + Duration::from_millis(ms.max(0) as u64));
        }
    }

    /// A drip rule follows a lower limit a response reports, as its
    /// in-process pacer does (and, like it, reads nothing else of the
    /// headers). Only a change costs a round trip.
    pub(super) async fn drip_in_force(&self, headers: &HeaderMap) -> Option<PaceNote> {
        let l = crate::wire::limit_in_force(headers)?;
        if self.reported.swap(l, Ordering::SeqCst) == l {
            return None;
        }
        let count = scaled(l, self.headroom);
        let extra = self.rule.shrunk(count, self.window)?;
        let (a, b) = self.rule.params();
        let told: Result<i64, PaceError> = self
            .run(self.rule.op(Verb::InForce), Duration::from_secs(2), |inv| {
                inv.arg(count).arg(&a).arg(&b);
                for e in &extra {
                    inv.arg(e);
                }
            })
            .await;
        match told {
            Ok(1) => Some(PaceNote::LimitInForce(l)),
            Ok(_) => None,
            Err(_) => {
                // Tell the fleet again with the next response.
                self.reported.store(0, Ordering::SeqCst);
                None
            }
        }
    }

    /// The key this process keeps for `p`, after `--headroom`.
    pub(super) fn stated_key(&self, p: &Stated) -> String {
        let quota = scaled(p.quota, self.headroom);
        let ms = millis(p.window);
        match p.unit {
            Unit::Calls => self.fleet.keys().further(quota, ms),
            u => self.fleet.keys().tokens(u, quota, ms),
        }
    }

    /// The configured policy of tokens that keeps `p` already, if one
    /// does: it counts the same part of a call over the same window, with
    /// no more than `--headroom`'s share of the stated quota, and a bucket
    /// no larger a burst. A bucket told with its burst, say, which a
    /// window of the stated quota would pace slower: in-process, the
    /// stated quota is read against the configured policy too (whose
    /// window may differ there; the fleet adopts a window then, which errs
    /// on the slow side).
    pub(super) fn told_keeps(&self, p: &Stated) -> Option<&super::ToldTokens> {
        let share = scaled(p.quota, self.headroom);
        self.told_tokens.iter().find(|t| {
            t.unit == p.unit
                && t.window == p.window
                && t.quota <= share
                && t.burst.map_or(true, |b| b <= share)
        })
    }

    /// Adopts `p` for the fleet unless this process keeps its key already
    /// (at most [`MAX_WINDOWS`] adopted, as in-process). Returns what the
    /// operator hears when this process took the key on; `None` when it
    /// had it, the fleet's list is full, or Redis did not answer (the next
    /// response tries again).
    pub(super) async fn adopt(&self, p: &Stated) -> Option<PaceNote> {
        if self.told_keeps(p).is_some() {
            return None;
        }
        let key = self.stated_key(p);
        // Kept as a bucket since (`refill.rs`).
        if self.lock().refilled.contains_key(&key) {
            return None;
        }
        let mut keys = {
            let keys = self.keys();
            if keys.contains(&key) {
                return None;
            }
            if keys.len() >= self.configured_keys + MAX_WINDOWS {
                drop(keys);
                return self.ignored(p);
            }
            keys.clone()
        };
        keys.push(key.clone());
        // Listed and seeded before this process's takes pass it, so that
        // none of them is granted outside it.
        let listed = self.run_adopt(&keys, p.used).await.ok()?;
        if listed == REFILLED {
            // Another process found it to refill before this one adopted
            // it: its bucket is what this process corrects from now on
            // (listed, so passed from the next take).
            self.learn_refilled(&key).await;
        }
        if listed == LIST_FULL {
            return self.ignored(p);
        }
        if listed < 0 {
            return None;
        }
        self.take_on(key).then(|| {
            PaceNote::Heard(Heard::Added {
                name: p.name.clone(),
                quota: p.quota,
                window: p.window,
                tokens: p.unit.is_tokens(),
            })
        })
    }

    /// Policy `p` left out, the fleet keeping the most it adopts: said
    /// once (the note is queued; `None` is returned for the caller's).
    fn ignored(&self, p: &Stated) -> Option<PaceNote> {
        let mut l = self.lock();
        if l.left_out.insert(p.name.clone()) {
            l.push(PaceNote::Heard(Heard::Ignored {
                name: p.name.clone(),
                quota: p.quota,
                window: Some(p.window),
                tokens: p.unit.is_tokens(),
            }));
        }
        None
    }

    /// A token window (or a configured bucket) the fleet keeps, of which a
    /// response says `p.used` was spent: what the fleet counts less than
    /// that was spent elsewhere
    /// (another client on the key, calls that cost more than estimated)
    /// and counts as spent now (the script's `elsewhere`), as in-process.
    /// Each window is corrected at most once per tenth of it
    /// ([`Self::may_correct`]).
    pub(super) async fn spent_elsewhere(&self, p: &Stated) {
        if !p.unit.is_tokens() || p.used == 0 {
            return;
        }
        let (key, kept, told) = match self.told_keeps(p) {
            Some(t) => (t.key.clone(), t.quota, true),
            None => (
                self.kept_as(self.stated_key(p)),
                scaled(p.quota, self.headroom),
                false,
            ),
        };
        // The key keeps `--headroom`'s share of the quota (or less): what
        // the server says was spent is read against that share, as
        // in-process against the lower of the stated and the kept quota.
        // Spending elsewhere within the rest of the quota is what the
        // headroom is for.
        let spent = p.used.saturating_sub(p.quota - kept.min(p.quota));
        if spent == 0 {
            return;
        }
        if let Some(REFILLED) = self.correct(&key, p.window, spent, told).await {
            let _ = self.fetch_stated().await;
        }
    }

    /// Corrects `key`, a window (or bucket) of `window` the fleet keeps,
    /// for `spent` the server says was spent of it (the script's
    /// `elsewhere`; `told`: a policy this process was told), at most once
    /// per tenth of the window ([`Self::may_correct`]). The script's
    /// answer; None when not run (a key this process does not pass, not
    /// due yet, Redis not answering: a response after the spacing tries
    /// again).
    pub(super) async fn correct(
        &self,
        key: &str,
        window: Duration,
        spent: u64,
        told: bool,
    ) -> Option<i64> {
        // The index is of this list: the process's own may shrink (a swap
        // to a bucket it passes already) before the op runs.
        let keys = self.keys().clone();
        let index = keys.iter().position(|k| k == key)?;
        if !self.may_correct(key, window) {
            return None;
        }
        self.run_on(&keys, "elsewhere", |inv| {
            inv.arg(index + 1).arg(spent).arg(u8::from(told));
        })
        .await
        .ok()
    }

    /// Whether `key`, a window of `window` the fleet keeps, may be
    /// corrected for what was spent elsewhere now: at most once per tenth
    /// of it, or per [`ELSEWHERE_EVERY`] if that is shorter (a round trip
    /// for every response would double the fleet's Redis traffic, and a
    /// correction a tenth of a window late errs by a tenth of what the
    /// window spends). Yes means the next one waits.
    fn may_correct(&self, key: &str, window: Duration) -> bool {
        let now = Instant::now();
        let mut l = self.lock();
        if l.elsewhere_at.get(key).is_some_and(|&at| now < at) {
            return false;
        }
        l.elsewhere_at
            .insert(key.to_string(), now + ELSEWHERE_EVERY.min(window / 10));
        true
    }

    /// Runs the script's `adopt` for the last of `keys`, with `used`.
    async fn run_adopt(&self, keys: &[String], used: u64) -> Result<i64, PaceError> {
        self.run_on(keys, "adopt", |inv| {
            inv.arg(keys.len()).arg(used);
        })
        .await
    }

    /// Runs script op `op` on `keys` (not this process's list: one more
    /// key, or another order), retried while Redis is away for at most 2 s.
    pub(super) async fn run_on(
        &self,
        keys: &[String],
        op: &str,
        build: impl Fn(&mut redis::ScriptInvocation<'_>),
    ) -> Result<i64, PaceError> {
        self.fleet
            .retry(
                Duration::from_secs(2),
                |mut c| {
                    let mut inv = self.args.invoke(&self.script, keys, op, None);
                    build(&mut inv);
                    async move { inv.invoke_async::<i64>(&mut c).await }
                },
                |e| self.lost_contact(e),
            )
            .await
            .map_err(|e| PaceError::Unavailable(e.to_string()))
    }

    /// Lists again every key this process adopted or took on, after Redis
    /// forgot the fleet (the list went with it): a process that joins
    /// later is then told of them at its first take, as before the loss.
    /// Each is seeded again from the calls this process put back.
    pub(super) async fn relist(&self) {
        let keys = self.keys().clone();
        for i in self.configured_keys..keys.len() {
            let mut order = keys.clone();
            let key = order.remove(i);
            order.push(key);
            // Not listed now: the next loss, or the next response, tries again.
            let _ = self.run_adopt(&order, 0).await;
        }
    }

    /// Passes `key` from now on; whether it was new to this process (at
    /// most [`MAX_WINDOWS`] beyond those configured, as the script lists).
    fn take_on(&self, key: String) -> bool {
        let mut keys = self.keys.write().unwrap_or_else(|e| e.into_inner());
        if keys.contains(&key) || keys.len() >= self.configured_keys + MAX_WINDOWS {
            return false;
        }
        if !key.contains(":window:") {
            self.weighed.store(true, Ordering::SeqCst);
        }
        keys.push(key);
        drop(keys);
        self.resettle();
        true
    }

    /// Hands Redis again the completions of this process's calls still
    /// occupying the window. One in flight when another process adopted a
    /// policy is in that policy's key with the provisional end of a call
    /// in flight (far off); if it came back before this process passed the
    /// key, its settle left that end there. Settling again is harmless to
    /// everything else (each rule moves a call only while it is in flight,
    /// and the window to the same end).
    pub(super) fn resettle(&self) {
        let gap = self.occupied_after();
        {
            let mut l = self.lock();
            let again: Vec<_> = l
                .recent
                .iter()
                .map(|(id, end, used)| (id.clone(), end.checked_sub(gap), *used))
                .filter(|(_, arrived, _)| arrived.is_some())
                .collect();
            l.settles.extend(again);
        }
        self.wake.notify_one();
    }

    /// Takes on every key the fleet adopted (the limit hash's `stated`),
    /// and passes the bucket in place of each window the fleet found to
    /// refill continuously (its `refilled:KEY`): a take was told this
    /// process lacks one or passes the other. Only names of this fleet's
    /// windows and buckets are taken.
    pub(super) async fn fetch_stated(&self) -> Result<(), PaceError> {
        // Adopted keys only: a window configured under the same name as
        // an adopted one stays this process's (its told policy), beside
        // the bucket.
        let mut fields = vec!["stated".to_string()];
        let mut adopted = {
            let keys = self.keys();
            keys[self.configured_keys.min(keys.len())..].to_vec()
        };
        // And each window this process knows became a bucket: the bucket
        // in force may be a retimed one.
        adopted.extend(self.lock().refilled.keys().cloned());
        adopted.sort();
        adopted.dedup();
        fields.extend(adopted.iter().map(|k| format!("refilled:{k}")));
        let within = self.fleet.redis_timeout();
        let got = (self.limit_fields(&fields, within, |e| self.lost_contact(e)))
            .await
            .map_err(|e| PaceError::Unavailable(e.to_string()))?;
        let keys = self.fleet.keys();
        for (field, to) in fields.iter().zip(&got).skip(1) {
            let (Some(window), Some(to)) = (field.strip_prefix("refilled:"), to) else {
                continue;
            };
            if keys.is_stated(to) {
                self.swap_key(window, to.clone());
            }
        }
        let names = got.into_iter().next().flatten().unwrap_or_default();
        for name in names.split_whitespace().filter(|n| keys.is_stated(n)) {
            self.take_on(name.to_string());
        }
        Ok(())
    }

    /// Holds the fleet for each policy `said` says has nothing left, but a
    /// bucket of tokens keeping it, which refills continuously (OpenAI's
    /// and Anthropic's reset is when it is full): its level, corrected from
    /// what was said, paces it, not a hold until the reset (as in-process,
    /// `Kept::refills`). A told one, or one found to refill while its
    /// statements still show the refill; asked of Redis when another
    /// process may have found it since this one last heard (once per such
    /// statement, a round trip).
    pub(super) async fn hold_spent(&self, said: &super::face::Said) {
        for (name, reset) in &said.spent {
            let mut refilling = false;
            for p in said.others.iter().filter(|p| p.name == *name) {
                let told = self.told_keeps(p).is_some_and(|t| t.burst.is_some());
                refilling |= told || self.refills_asked(p).await;
            }
            if !refilling {
                self.hold_for(name, *reset).await;
            }
        }
    }

    /// The periods of the told buckets of calls, in their order.
    pub(super) fn call_bucket_periods(&self) -> Vec<Duration> {
        self.call_buckets.iter().map(|(r, _)| r.period).collect()
    }

    /// A response said the policy told bucket of calls `bucket` keeps has
    /// nothing left until `reset` (to the millisecond: `exact`): the
    /// bucket holds its calls as in-process (`Kept::emptied_hold`: one
    /// interval for a reset in whole seconds no later than it and the
    /// second of rounding) and is empty then (the script's `empty`; the
    /// rest of the fleet's policies are not held). A hold of more than a
    /// minute holds the fleet as any used-up quota's does, and is said.
    pub(super) async fn emptied(&self, name: &str, reset: Duration, exact: bool, bucket: usize) {
        let Some((rate, key)) = self.call_buckets.get(bucket) else {
            return;
        };
        let keys = self.keys().clone();
        let Some(index) = keys.iter().position(|k| k == key) else {
            return;
        };
        let hold = bucket_emptied_hold(*rate, reset, exact);
        let _ = self
            .run_on(&keys, "empty", |inv| {
                inv.arg(index + 1).arg(millis(hold));
            })
            .await;
        if hold > LONG_HOLD {
            self.hold_for(name, hold).await;
        }
    }

    /// A response said policy `name` has nothing left until `reset` from
    /// now: the fleet holds new calls until then. A hold of more than a
    /// minute is said once.
    pub(super) async fn hold_for(&self, name: &str, reset: Duration) {
        let until = Instant::now() + reset;
        if self.lock().held_until.is_some_and(|h| h >= until) {
            return;
        }
        let held: Result<i64, PaceError> = self
            .run("hold", Duration::from_secs(2), |inv| {
                inv.arg(millis(reset)).arg(name);
            })
            .await;
        let Ok(ms) = held else { return };
        let mut l = self.lock();
        l.held_until = Some(Instant::now() + Duration::from_millis(ms.max(0) as u64));
        if reset > LONG_HOLD {
            say_exhausted(&mut l, name.to_string(), reset);
        }
    }

    /// A take told to wait `left` for a used-up quota another process
    /// found (this one waits, with `--wait-for-quota`): said once, as if
    /// heard here, or a run joining a held fleet would say nothing for
    /// hours.
    pub(super) async fn say_held(&self, left: Duration) {
        if left <= LONG_HOLD || !self.lock().said.is_empty() {
            return;
        }
        let name = self.held_by().await;
        say_exhausted(&mut self.lock(), name, left);
    }

    /// The error a take fails with while the fleet is held for `left` by a
    /// used-up quota beyond the bound: the run halts resumably and says
    /// when it resets.
    pub(super) async fn quota_error(&self, left: Duration) -> PaceError {
        PaceError::quota_exhausted(self.held_by().await, left)
    }

    /// The name of the quota the fleet is held for, as the process that
    /// found it used up keeps it (`a quota` when Redis does not say).
    async fn held_by(&self) -> String {
        (self
            .limit_field("held_by", Duration::from_secs(2), |_| {})
            .await)
            .ok()
            .flatten()
            .unwrap_or_else(|| "a quota".into())
    }

    /// One field of the fleet's limit hash, retried for at most `within`
    /// (`on_retry` hears each failed try).
    pub(super) async fn limit_field(
        &self,
        field: &str,
        within: Duration,
        on_retry: impl FnMut(&redis::RedisError),
    ) -> Result<Option<String>, crate::fleet::FleetError> {
        let fields = [field.to_string()];
        let got = self.limit_fields(&fields, within, on_retry).await?;
        Ok(got.into_iter().next().flatten())
    }

    /// Fields of the fleet's limit hash, in one read, as
    /// [`limit_field`](Self::limit_field).
    async fn limit_fields(
        &self,
        fields: &[String],
        within: Duration,
        on_retry: impl FnMut(&redis::RedisError),
    ) -> Result<Vec<Option<String>>, crate::fleet::FleetError> {
        let limit = self.fleet.keys().limit();
        let get = |mut c: redis::aio::ConnectionManager| {
            let mut cmd = redis::cmd("HMGET");
            cmd.arg(&limit).arg(fields);
            async move { cmd.query_async(&mut c).await }
        };
        self.fleet.retry(within, get, on_retry).await
    }
}

/// Says once that quota `name` is used up, held for `for_`.
fn say_exhausted(l: &mut Local, name: String, for_: Duration) {
    if l.said.insert(name.clone()) {
        l.push(PaceNote::Heard(Heard::Exhausted { name, for_ }));
    }
}
