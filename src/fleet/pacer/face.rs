//! The fleet pacer's face to the pool: the [`Pacer`] the workers call,
//! each method one or two runs of the script (see the parent module).

use std::sync::atomic::Ordering;
use std::time::Duration;

use reqwest::header::HeaderMap;
use tokio::time::Instant;

use super::rule::Verb;
use super::tasks::{Abandon, SharedTicket};
use super::{
    FleetPacer, Took, Why, FLUSH_LOST_WITHIN, FLUSH_WITHIN, LOOK_AGAIN, POLL_FIRST, POLL_MAX,
};
use crate::fleet::script::millis;
use crate::pace::{PaceError, PaceNote, Pacer, Permit, Weight};
use crate::rate::announce::{reset_or_now, Unit};
use crate::rate::learn::Learnt;
use crate::rate::policies::{QUOTA_BOUND, TOKEN_WINDOW};
use crate::rate::policy::Unit as Counted;
use crate::util::BoxFuture;

impl Pacer for FleetPacer {
    fn take(&self) -> BoxFuture<'_, Result<Permit, PaceError>> {
        self.take_weighted(Weight::default())
    }

    fn take_weighted(&self, weight: Weight) -> BoxFuture<'_, Result<Permit, PaceError>> {
        Box::pin(async move {
            let inner = &self.inner;
            let id = inner.next_id();
            let mut abandon = Abandon {
                inner,
                id: Some(id.clone()),
            };
            // While there is room every worker asks at once; once it must
            // wait, it queues behind this process's one waiter at Redis.
            let mut front = None;
            let mut poll = POLL_FIRST;
            loop {
                // Each time round: a loss put back with nothing learnt asks
                // for the start again.
                inner.ask_start().await?;
                match inner.try_take(&id, inner.cap, weight.tokens).await? {
                    Took::Wait(_, Why::Quota(q)) if q > QUOTA_BOUND && !inner.wait_for_quota => {
                        return Err(inner.quota_error(q).await);
                    }
                    Took::Granted => {
                        abandon.id = None;
                        return Ok(Permit::tracked(Box::new(SharedTicket {
                            inner: inner.clone(),
                            id,
                            estimate: weight.tokens,
                            granted: Instant::now(),
                        })));
                    }
                    // Queued for a while: look again before sleeping.
                    Took::Wait(..) if front.is_none() => {
                        front = Some(inner.front.lock().await);
                    }
                    Took::Wait(d, Why::Ceiling) => {
                        tokio::time::sleep(d.min(poll)).await;
                        poll = (poll * 2).min(POLL_MAX);
                    }
                    // Another process may hold the fleet for a used-up
                    // quota meanwhile, to be halted on: look again by then.
                    Took::Wait(d, why) => {
                        if let Why::Quota(q) = why {
                            inner.say_held(q).await;
                        }
                        tokio::time::sleep(d.min(LOOK_AGAIN)).await
                    }
                }
            }
        })
    }

    fn pause(&self, for_: Duration) -> BoxFuture<'_, Result<(), PaceError>> {
        Box::pin(self.inner.paused(for_, true))
    }

    fn hold(&self, for_: Duration) -> BoxFuture<'_, Result<(), PaceError>> {
        Box::pin(self.inner.paused(for_, false))
    }

    fn observe<'a>(&'a self, headers: &'a HeaderMap) -> BoxFuture<'a, Option<PaceNote>> {
        Box::pin(async move {
            let inner = &self.inner;
            if !inner.rule.windowed() {
                let queued = inner.lock().notes.pop_front();
                return inner.drip_in_force(headers).await.or(queued);
            }
            let heard = Instant::now();
            let fixed: Vec<_> = (inner.fixed.iter())
                .filter(|f| f.unit == Counted::Calls)
                .map(|f| (f.window, f.quota))
                .collect();
            let said = Said::of(headers, inner.window, &inner.call_bucket_periods(), &fixed);
            if said.binds(inner.configured) {
                inner.secret.store(false, Ordering::SeqCst);
            }
            if said.used_up {
                inner.hold().await;
            }
            if let Some(r) = said.explains {
                let mut l = inner.lock();
                let until = heard + r;
                l.explained_until = Some(l.explained_until.map_or(until, |e| e.max(until)));
            }
            for p in said.tightest_others() {
                let adopted = inner.adopt(p).await;
                let found = inner.heard_reset(p).await;
                match adopted {
                    Some(note) => inner.lock().push(note),
                    // Seeded from what it says when adopted; kept since.
                    None => inner.spent_elsewhere(p).await,
                }
                if let Some(note) = found {
                    inner.lock().push(note);
                }
            }
            inner.hold_spent(&said).await;
            for (name, reset, exact, bucket) in &said.emptied {
                inner.emptied(name, *reset, *exact, *bucket).await;
            }
            inner.fixed_spent(&said.fixed_left).await;
            inner.align(&said.resets, heard).await;
            let queued = inner.lock().notes.pop_front();
            let Some(l) = said.limit else {
                return queued;
            };
            // Only a change costs a round trip: most responses repeat it
            // (but for a raise waiting for its window: `RAISING`). A limit
            // above the configured one changes nothing unless a lower one
            // is in force, which it raises back to the configured one (as
            // in-process: `ExactWindow::set_limit_in_force`).
            let l_in = match inner.configured {
                0 => l,
                c => l.min(c),
            };
            let sent = inner.reported.load(Ordering::SeqCst);
            if (sent == 0 && l > l_in) || inner.reported.swap(l_in, Ordering::SeqCst) == l_in {
                return queued;
            }
            let told: Result<i64, PaceError> = inner
                .run("inforce", Duration::from_secs(2), |inv| {
                    inv.arg(l_in);
                })
                .await;
            match told {
                Ok(0 | 1) => {}
                Ok(RAISING) => inner.reported.store(u64::MAX, Ordering::SeqCst),
                Ok(_) => return queued,
                // Tell the fleet again with the next response.
                Err(_) => {
                    inner.reported.store(0, Ordering::SeqCst);
                    return queued;
                }
            }
            let below = inner.configured == 0 || l < inner.configured;
            below.then_some(PaceNote::LimitInForce(l)).or(queued)
        })
    }

    fn steady_per_min(&self) -> Option<f64> {
        self.inner.rule.steady_per_min()
    }

    fn paused_until(&self) -> Option<Instant> {
        let now = Instant::now();
        self.inner.lock().paused_until.filter(|&u| u > now)
    }

    fn held_until(&self) -> Option<Instant> {
        let now = Instant::now();
        self.inner.lock().held_until.filter(|&u| u > now)
    }

    fn note(&self) -> Option<PaceNote> {
        self.inner.lock().notes.pop_front()
    }

    fn learnt(&self) -> Option<Learnt> {
        self.inner.lock().learnt_as_of(self.inner.window)
    }

    fn flush(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            // Redis already out of reach: one try, not a long wait.
            let (within, bound) = if self.inner.lock().lost {
                (Duration::ZERO, FLUSH_LOST_WITHIN)
            } else {
                (FLUSH_WITHIN, FLUSH_WITHIN)
            };
            // Bounded as a whole: the settler's batch in flight, which the
            // flush waits for, may be retrying for --redis-timeout.
            let _ = tokio::time::timeout(bound, self.inner.flush_settles(within)).await;
        })
    }
}

/// The script's answer to `inforce` while a higher limit waits for its
/// window: the fleet tells it again with each response until then.
const RAISING: i64 = 2;

/// What a response says, in any dialect (`rate::announce`), of the
/// fleet's primary window (policies of calls stated for that window, or
/// for no window, as `x-rate-limit-limit` always was read) and of the
/// other policies a fleet adopts (`stated.rs`).
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Said {
    /// The lowest quota stated for the primary window.
    pub(super) limit: Option<u64>,
    /// Whether a quota of calls or what is left of one is stated at all
    /// (see [`Said::binds`]).
    pub(super) told: bool,
    /// Whether a told bucket's or fixed window's policy was stated: the
    /// told policies' quotas, not a secret limit, explain a 429 then.
    pub(super) told_elsewhere: bool,
    /// The longest a policy stated with its quota is used up for: a 429
    /// until then is that quota's (other clients on the key), not a secret
    /// limit's, and teaches the fleet nothing.
    pub(super) explains: Option<Duration>,
    /// Whether a policy of the primary window has nothing left: the fleet
    /// holds new calls until its window has room.
    pub(super) used_up: bool,
    /// Policies stated with a quota for another window of calls, or of
    /// tokens.
    pub(super) others: Vec<Stated>,
    /// Policies of any kind with nothing left, and how long until each
    /// resets: the fleet holds new calls until then.
    pub(super) spent: Vec<(String, Duration)>,
    /// Policies of calls a told bucket keeps (one of the same window, as
    /// in-process), with nothing left: how long until each resets, whether
    /// to the millisecond, and the bucket (its index among the told
    /// buckets of calls). Not the primary window's.
    pub(super) emptied: Vec<(String, Duration, bool, usize)>,
    /// Policies stated with a reset: (what they count, their window (a
    /// token quota's per minute when none is stated, [`TOKEN_WINDOW`]),
    /// how long until it resets, whether measured from the response's
    /// `Date`). A configured fixed window counting the same over that
    /// window is aligned to it. Policies of calls stated with no window
    /// are not among them.
    pub(super) resets: Vec<(Counted, Duration, Duration, bool)>,
    /// Policies of calls a told fixed window keeps, saying what is left:
    /// (the window, the quota stated, what is left).
    pub(super) fixed_left: Vec<(Duration, Option<u64>, u64)>,
}

/// A policy a server states that is not the primary window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Stated {
    /// Its name in the headers.
    pub(super) name: String,
    /// What it counts.
    pub(super) unit: Counted,
    pub(super) quota: u64,
    /// Its window; a token quota stated without one is per minute
    /// ([`TOKEN_WINDOW`]), as in-process.
    pub(super) window: Duration,
    /// What the server says was used of it already.
    pub(super) used: u64,
    /// Stated without a window (OpenAI's, Anthropic's token quotas): it
    /// may be a bucket refilling continuously ([`crate::rate::refill`]).
    pub(super) windowless: bool,
    /// When it is full again, as stated.
    pub(super) reset: Option<Duration>,
    /// Whether the reset is stated to the millisecond.
    pub(super) reset_exact: bool,
    /// Whether the reset was read against the response's `Date`.
    pub(super) reset_dated: bool,
}

impl Said {
    /// The policies stated besides the primary window's, those of calls
    /// first and then those of tokens, each the tightest (least per
    /// second) first: beyond the most the fleet adopts, the loosest are
    /// the ones left out.
    pub(super) fn tightest_others(&self) -> Vec<&Stated> {
        let mut v: Vec<&Stated> = self.others.iter().collect();
        let rate = |p: &Stated| p.quota as f64 / p.window.as_secs_f64().max(1e-9);
        v.sort_by(|a, b| {
            let tokens = |p: &Stated| p.unit.is_tokens();
            tokens(a).cmp(&tokens(b)).then(rate(a).total_cmp(&rate(b)))
        });
        v
    }

    /// Whether what was stated binds a fleet configured `configured` per
    /// window (0: none): the limit is then no secret to learn from 429s.
    /// A quota of the primary window above the configured one does not
    /// explain a 429, and leaves learning on (as in-process).
    pub(super) fn binds(&self, configured: u64) -> bool {
        let above = self.limit.is_some_and(|l| configured > 0 && l > configured);
        self.told_elsewhere || (self.told && !above)
    }

    /// What `headers` say, the primary window being `window`, the told
    /// buckets of calls refilling over `buckets` and the told fixed
    /// windows of calls being `fixed` (W, quota).
    pub(super) fn of(
        headers: &HeaderMap,
        window: Duration,
        buckets: &[Duration],
        fixed: &[(Duration, u64)],
    ) -> Said {
        let mut said = Said::default();
        let stated = crate::rate::announce::read(headers, crate::util::unix_now());
        for p in stated {
            // Content bytes, concurrent requests: nothing paced (as
            // in-process), so no window of calls is theirs to align.
            let over = match p.unit {
                Unit::Calls => p.window,
                u if u.is_tokens() => Some(p.window.unwrap_or(TOKEN_WINDOW)),
                _ => None,
            };
            if let (Some(w), Some(r)) = (over, p.reset_in) {
                if !r.is_zero() {
                    said.resets.push((p.unit.counted(), w, r, p.reset_dated));
                }
            }
            let emptied = p
                .reset_in
                .filter(|r| p.remaining == Some(0) && !r.is_zero());
            // As in-process: a told bucket's hold is its own
            // (`Kept::emptied_hold`), any other no longer than its window
            // for a reset in whole seconds.
            let spent = emptied.map(|r| p.hold(r, over.unwrap_or(window)));
            // As in-process (`PolicySet::explain`): until the reset as
            // stated, a second for one of nothing, the window for none.
            if p.remaining == Some(0) && p.quota.is_some() {
                let r = p.reset_in.map_or(over.unwrap_or(window), reset_or_now);
                said.explains = Some(said.explains.map_or(r, |e| e.max(r)));
            }
            // A policy of a told fixed window's window, of no less than its
            // quota, is that window's, as in-process: it aligns it and
            // holds the fleet when used up, but lowers no other window.
            let fixed_keeps = p.unit == Unit::Calls
                && fixed
                    .iter()
                    .any(|&(w, q)| Some(w) == p.window && p.quota.map_or(true, |s| s >= q));
            if fixed_keeps {
                said.told |= p.quota.is_some();
                said.told_elsewhere |= p.quota.is_some();
                if let (Some(w), Some(left)) = (p.window, p.remaining) {
                    said.fixed_left.push((w, p.quota, left));
                }
                if let Some(r) = spent {
                    said.spent.push((p.name, r));
                }
                continue;
            }
            let kept = match (p.unit, p.window) {
                (Unit::Calls, Some(w)) => buckets.iter().position(|&b| b == w),
                _ => None,
            };
            if let Some(i) = kept {
                // A stated policy of calls: no secret to learn.
                said.told |= p.quota.is_some();
                said.told_elsewhere |= p.quota.is_some();
                if let Some(r) = emptied {
                    said.emptied.push((p.name, r, p.reset_exact, i));
                }
                continue;
            }
            if let Some(r) = spent {
                said.spent.push((p.name.clone(), r));
            }
            let used = |q: u64| q.saturating_sub(p.remaining.unwrap_or(q));
            match (p.unit, p.window, p.quota) {
                // A quota of another window with room left does not
                // explain a 429: a limit kept unstated beside it (a
                // second's, beside an hour's) is still learnt from them.
                (Unit::Calls, Some(w), Some(q)) if w != window => said.others.push(Stated {
                    used: used(q),
                    name: p.name,
                    unit: Counted::Calls,
                    quota: q,
                    window: w,
                    windowless: false,
                    reset: None,
                    reset_exact: false,
                    reset_dated: false,
                }),
                (Unit::Calls, Some(w), None) if w != window => {}
                (Unit::Calls, _, q) => {
                    if let Some(q) = q {
                        said.limit = Some(said.limit.map_or(q, |l| l.min(q)));
                    }
                    said.told |= q.is_some() || p.remaining.is_some();
                    said.used_up |= p.remaining == Some(0);
                }
                (u, w, Some(q)) if u.is_tokens() => said.others.push(Stated {
                    used: used(q),
                    name: p.name,
                    unit: u.counted(),
                    quota: q,
                    window: w.unwrap_or(TOKEN_WINDOW),
                    windowless: w.is_none(),
                    reset: p.reset_in,
                    reset_exact: p.reset_exact,
                    reset_dated: p.reset_dated,
                }),
                _ => {}
            }
        }
        said
    }
}

impl super::Inner {
    /// Every process waits `for_`; `learning`: a rate-limit 429 of a secret
    /// limit may teach the fleet a limit, a quota waited for (`hold`) not.
    async fn paused(&self, for_: Duration, learning: bool) -> Result<(), PaceError> {
        // 2: a bare rate, whose first refused burst paces evenly.
        let explained = self
            .lock()
            .explained_until
            .is_some_and(|u| u > Instant::now());
        let learn = match (
            learning && self.secret.load(Ordering::SeqCst) && !explained,
            self.shape_unknown,
        ) {
            (false, _) => 0u8,
            (true, false) => 1,
            (true, true) => 2,
        };
        let settles = self.take_settles();
        let (a, b) = self.rule.params();
        let v: Result<Vec<i64>, PaceError> = self
            .run(
                self.rule.op(Verb::Pause),
                self.fleet.redis_timeout(),
                |inv| {
                    inv.arg(millis(for_));
                    // The window rule may learn a limit; a drip rule's state
                    // is made on first use from its sizing.
                    if self.rule.windowed() {
                        inv.arg(self.cap).arg(learn);
                    } else {
                        inv.arg(&a).arg(&b);
                    }
                    inv.arg(settles.len());
                    for (id, ago) in &settles {
                        inv.arg(id).arg(ago);
                    }
                },
            )
            .await;
        let v = v.inspect_err(|_| self.requeue(settles))?;
        let left = v.first().copied().unwrap_or(0).max(0) as u64;
        let mut l = self.lock();
        l.paused_until = Some(Instant::now() + Duration::from_millis(left));
        // This process's 429 taught the fleet a limit, or began its
        // even pace (the limit in force then unchanged: the cap).
        let began = v.get(2) == Some(&1);
        let learnt = v.get(1).copied().unwrap_or(0).max(0) as u64;
        if learnt > 0 || began {
            // A lowering says nothing of the even pace: the fleet keeps
            // it if it had it (what a take puts back after a loss).
            let even = began || l.even;
            l.heard(self.cap, learnt, false, even);
        }
        if began {
            // Its ramp rises from the pause's end.
            (l.even_since, l.even_grants) = (l.paused_until, 0);
        }
        Ok(())
    }
}
