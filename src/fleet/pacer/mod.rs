//! The fleet pacer: a pacer's rule kept in Redis so that every process on
//! one API key shares one limit, one concurrency ceiling, one pause and one
//! learnt limit. The rule is the exact window pacer's (the default) or,
//! for `--pacer spike` and `--pacer bucket`, the SpikeArrest mirror's or
//! the token bucket's ([`FleetRule`]); the scenarios of
//! [`crate::rate::scenario`] hold each to its in-process twin.
//!
//! Each decision is one atomic run of the script (`lua/*.lua`) on Redis's own clock
//! (`TIME`), never a client's. A permit is one member of the window sorted
//! set (and one concurrency lease) from its send until W after its response
//! arrived, exactly as in-process: `tests/it/fleet/rule.rs` runs the
//! script and [`ExactWindow`](crate::rate::exact::ExactWindow) through the
//! same scenarios ([`crate::rate::scenario`]) on one fake clock and fails on
//! any answer that differs. The client keeps only what it needs to
//! put its own calls back should Redis lose its data, and a heartbeat that
//! renews the leases of its calls in flight: a process killed with -9 stops
//! renewing, and its leases expire.
//!
//! Permit ids are `<process tag>:<sequence>`, the process tag being
//! `<pid>-<random hex>`.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use redis::aio::ConnectionManager;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::local::{Local, Restore};
use super::script::{millis, tokens_arg, ScriptArgs, SCRIPT};
use super::Fleet;
use crate::pace::{PaceError, PaceNote, Pacer};
use crate::rate::bucket::SizingError;
use crate::rate::learn::Learnt;
use crate::rate::policy::{PolicySpec, Shape, TokenWeight, Unit};
use crate::rate::{Limit, Rate};
use configured::{call_buckets, fixed_kept, told_tokens, FixedKept, ToldTokens};
use rule::{buckets_of, tokens_of, windows_of, ScriptRule, Verb};
use settles::PUT_BACK;
use tasks::{heartbeat, settler};

mod configured;
mod face;
mod fixed;
mod heard;
mod refill;
mod rule;
mod settles;
mod tasks;

pub use rule::{fleet_policies, FleetRule};

/// The window a limit reported for an unlimited plan is read against.
const CAP_WINDOW: Duration = Duration::from_secs(60);
/// Margin on an in-flight call's provisional occupancy, for the time between
/// its permit and its send.
const HOLD_SLACK: Duration = Duration::from_secs(1);
/// While the concurrency ceiling is full, look again after this long at
/// first, doubling up to [`POLL_MAX`]: leases are released by other
/// processes, whom nobody can wait on.
const POLL_FIRST: Duration = Duration::from_millis(2);
const POLL_MAX: Duration = Duration::from_millis(50);
/// The longest a take sleeps before asking again, whatever the wait: a
/// window of the fleet's own full for hours is not slept through while
/// another process finds the quota behind it used up.
const LOOK_AGAIN: Duration = Duration::from_secs(1);
/// How long the end of a run waits to hand back what it owes.
const FLUSH_WITHIN: Duration = Duration::from_secs(3);
/// How long it waits while Redis is not answering: what it owes is lost
/// with the run's end either way (the leases expire), and the run is
/// halting or stopping.
const FLUSH_LOST_WITHIN: Duration = Duration::from_secs(1);

/// What the fleet pacer paces to.
#[derive(Debug, Clone, Copy)]
pub struct FleetPacing {
    /// The configured limit (before `--headroom`).
    pub limit: Limit,
    /// The concurrency ceiling the whole fleet shares.
    pub concurrency: usize,
    /// The per-call timeout: a call in flight occupies the window for at
    /// most this long past its permit, plus W.
    pub timeout: Duration,
    /// `--wait-for-quota`: a quota said to be used up until beyond
    /// [`QUOTA_BOUND`](crate::rate::policies::QUOTA_BOUND) is waited for
    /// rather than halted on.
    pub wait_for_quota: bool,
    /// A bare rate (`--limit 30/1s`, no shape named): kept as a sliding
    /// window until a burst under it is refused, then paced evenly (the
    /// script's `pause`), as a bucket with no burst.
    pub shape_unknown: bool,
    /// What the job's checkpoint says an earlier run learnt: put back by
    /// this process's first take if that take begins the fleet (no
    /// process running on the key), so a resumed fleet does not pay for
    /// it again with 429s; a live fleet's own learning is left alone.
    pub learnt: Option<Learnt>,
    /// The job sent calls within the last hour: a fleet this process finds
    /// missing from Redis on its first take is taken as forgotten, and held
    /// for a window, as a process that heard it would (other processes may
    /// be running, their calls of the window lost with it).
    pub ran_lately: bool,
}

/// How long a concurrency lease lasts without a heartbeat: three per-call
/// timeouts, between 3 and 15 seconds. A killed process's slots come back
/// after at most this long.
pub fn lease_for(timeout: Duration) -> Duration {
    (timeout * 3).clamp(Duration::from_secs(3), Duration::from_secs(15))
}

/// The limit after `--headroom`: at least one call.
pub fn scaled(count: u64, headroom: f64) -> u64 {
    ((count as f64 * headroom + 1e-9).floor() as u64).max(1)
}

/// The fleet pacer. See the module docs.
pub struct FleetPacer {
    inner: Arc<Inner>,
}

struct Inner {
    fleet: Fleet,
    /// The rule kept in Redis, sized for the limit after the headroom.
    rule: ScriptRule,
    script: redis::Script,
    /// The script's keys: the fleet's five, then a further window, bucket
    /// or token window each, configured or adopted from what a server
    /// stated (`stated.rs`).
    keys: RwLock<Vec<String>>,
    /// Whether a token window is among them: settles then carry the
    /// tokens a call used.
    weighed: AtomicBool,
    /// How many keys were configured (those after were adopted).
    configured_keys: usize,
    /// The configured policies of tokens, windows and buckets: a stated
    /// quota one of them keeps already is not adopted, and corrects it
    /// ([`heard`]).
    told_tokens: Vec<ToldTokens>,
    /// The configured buckets of calls (after `--headroom`), with their
    /// keys: a stated policy of calls of the same window is theirs.
    call_buckets: Vec<(Rate, String)>,
    /// The configured fixed windows, of calls and of tokens.
    fixed: Vec<FixedKept>,
    args: ScriptArgs,
    window: Duration,
    /// The configured limit scaled by the headroom; 0 for none.
    cap: u64,
    configured: u64,
    headroom: f64,
    ceiling: u64,
    wait_for_quota: bool,
    tag: String,
    seq: AtomicU64,
    local: Mutex<Local>,
    /// One worker of this process at a time waits at Redis: the others
    /// wait here, so a full window costs one round trip per process, not
    /// one per worker, whenever a slot frees up.
    front: tokio::sync::Mutex<()>,
    /// Held while completions are handed to Redis: a flush waits for the
    /// settler's batch in flight, so what it returns after is in Redis.
    settling: tokio::sync::Mutex<()>,
    wake: Arc<Notify>,
    /// No `x-rate-limit-*` header seen yet: a 429 teaches the limit.
    secret: AtomicBool,
    /// A bare rate: the fleet's first window goes on the even pace (the
    /// script's `start`, asked once by each process: `start_asked`), and
    /// the first 429 that teaches paces it evenly for good.
    shape_unknown: bool,
    /// Every take waits for it: a worker's take before the start ran
    /// would send the first window's burst the start is there to avoid.
    /// True once asked; false again after this process put its calls back
    /// into a fleet Redis forgot, with nothing learnt: the fleet begun
    /// anew starts on the even pace as the first one did.
    start_asked: tokio::sync::Mutex<bool>,
    /// The last `x-rate-limit-limit` this process told the fleet (0: none).
    reported: AtomicU64,
}

/// Why a take must wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Why {
    Paused,
    Window,
    Ceiling,
    /// Held until a quota a response said was used up resets, in this
    /// long (the wait may be longer still).
    Quota(Duration),
}

enum Took {
    Granted,
    Wait(Duration, Why),
}

impl FleetPacer {
    /// A pacer on `fleet` for `cfg` keeping the window rule. Spawns its
    /// settler and heartbeat tasks, which end when the pacer is dropped.
    pub fn new(fleet: Fleet, cfg: FleetPacing) -> FleetPacer {
        FleetPacer::build(fleet, cfg, &[], &[], &[], |_| {
            Ok::<_, std::convert::Infallible>(ScriptRule::Window)
        })
        .unwrap_or_else(|never| match never {})
    }

    /// A pacer on `fleet` for `cfg` keeping `rule`; an error when the rule
    /// cannot be sized for the limit (a `--burst` too large for it).
    pub fn with_rule(
        fleet: Fleet,
        cfg: FleetPacing,
        rule: FleetRule,
    ) -> Result<FleetPacer, SizingError> {
        FleetPacer::build(fleet, cfg, &[], &[], &[], |rate| {
            ScriptRule::new(rule, rate)
        })
    }

    /// A pacer on `fleet` for `cfg` keeping the window rule for its limit
    /// and for each of `further` as well (`--limit` given more than once;
    /// a fixed window aligned to its reset once one is stated),
    /// and a GCRA bucket for each of `buckets` (rate, burst, of calls or
    /// of tokens): a call must fit in every window and every bucket, and
    /// only the first window learns; and a token window for each of
    /// `tokens` (rate, what it counts). A call's estimate of each part
    /// must fit in each that counts it, and its usage corrects them.
    pub fn with_limits(
        fleet: Fleet,
        cfg: FleetPacing,
        further: &[(Rate, Shape)],
        buckets: &[(Rate, u64, Unit)],
        tokens: &[(Rate, Unit, Shape)],
    ) -> FleetPacer {
        FleetPacer::build(fleet, cfg, further, buckets, tokens, |_| {
            Ok::<_, std::convert::Infallible>(ScriptRule::Window)
        })
        .unwrap_or_else(|never| match never {})
    }

    fn build<E>(
        fleet: Fleet,
        cfg: FleetPacing,
        further: &[(Rate, Shape)],
        buckets: &[(Rate, u64, Unit)],
        tokens: &[(Rate, Unit, Shape)],
        size: impl FnOnce(Option<Rate>) -> Result<ScriptRule, E>,
    ) -> Result<FleetPacer, E> {
        let (window, configured) = match cfg.limit {
            Limit::Rate(r) => (r.period, r.count),
            Limit::Unlimited => (CAP_WINDOW, 0),
        };
        let headroom = fleet.headroom();
        let cap = if configured == 0 {
            0
        } else {
            scaled(configured, headroom)
        };
        let rule = size((cap > 0).then_some(Rate {
            count: cap,
            period: window,
        }))?;
        let told_tokens = told_tokens(&fleet, buckets, tokens, headroom);
        let call_buckets = call_buckets(&fleet, buckets, headroom);
        let windows: Vec<(Duration, u64, String, bool)> = further
            .iter()
            .map(|&(r, shape)| {
                let (count, ms) = (scaled(r.count, headroom), millis(r.period));
                match shape {
                    Shape::Fixed => (r.period, count, fleet.keys().fixed(count, ms), true),
                    _ => (r.period, count, fleet.keys().further(count, ms), false),
                }
            })
            .collect();
        let fixed = fixed_kept(&windows, &told_tokens);
        let inner = Arc::new(Inner {
            rule,
            script: redis::Script::new(SCRIPT),
            keys: RwLock::new(
                fleet
                    .keys()
                    .pacer()
                    .into_iter()
                    .chain(windows.iter().map(|w| w.2.clone()))
                    .chain(call_buckets.iter().map(|(_, key)| key.clone()))
                    .chain(told_tokens.iter().map(|t| t.key.clone()))
                    .collect(),
            ),
            configured_keys: 5 + further.len() + buckets.len() + tokens.len(),
            weighed: AtomicBool::new(!told_tokens.is_empty()),
            told_tokens,
            call_buckets,
            fixed,
            args: ScriptArgs {
                window,
                hold: cfg.timeout + window + HOLD_SLACK,
                lease: lease_for(cfg.timeout),
            },
            fleet,
            window,
            cap,
            configured,
            headroom,
            ceiling: cfg.concurrency as u64,
            wait_for_quota: cfg.wait_for_quota,
            tag: format!("{}-{:08x}", std::process::id(), fastrand::u32(..)),
            seq: AtomicU64::new(0),
            local: Mutex::new(Local {
                ran_lately: cfg.ran_lately,
                ..Local::new(cfg.limit, cfg.shape_unknown, cfg.learnt)
            }),
            front: tokio::sync::Mutex::new(()),
            settling: tokio::sync::Mutex::new(()),
            wake: Arc::new(Notify::new()),
            secret: AtomicBool::new(true),
            shape_unknown: cfg.shape_unknown,
            start_asked: tokio::sync::Mutex::new(false),
            reported: AtomicU64::new(0),
        });
        tokio::spawn(settler(Arc::downgrade(&inner), inner.wake.clone()));
        tokio::spawn(heartbeat(Arc::downgrade(&inner), inner.args.lease / 3));
        Ok(FleetPacer { inner })
    }

    /// This process's tag: the prefix of every permit id it adds.
    pub fn tag(&self) -> &str {
        &self.inner.tag
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // The settler waits on this; it finds the pacer gone and ends.
        self.wake.notify_one();
    }
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, Local> {
        // Local bookkeeping stays usable after a panic elsewhere.
        self.local.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One invocation of the script with the common arguments filled in.
    fn invocation(&self, op: &str) -> redis::ScriptInvocation<'_> {
        self.args.invoke(&self.script, &self.keys(), op, None)
    }

    /// The script's keys as they are now.
    fn keys(&self) -> std::sync::RwLockReadGuard<'_, Vec<String>> {
        // A panic elsewhere leaves the list whole: it is only pushed to, a
        // key replaced in place, or one removed (a swap to a bucket passed
        // already).
        self.keys.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs one script op, retried while Redis is away for at most `within`.
    async fn run<T: redis::FromRedisValue>(
        &self,
        op: &str,
        within: Duration,
        build: impl Fn(&mut redis::ScriptInvocation<'_>),
    ) -> Result<T, PaceError> {
        self.fleet
            .retry(
                within,
                |mut c: ConnectionManager| {
                    let mut inv = self.invocation(op);
                    build(&mut inv);
                    async move { inv.invoke_async::<T>(&mut c).await }
                },
                |e| self.lost_contact(e),
            )
            .await
            .map_err(|e| PaceError::Unavailable(e.to_string()))
    }

    fn lost_contact(&self, e: &redis::RedisError) {
        let first = {
            let mut l = self.lock();
            !std::mem::replace(&mut l.lost, true)
        };
        if first {
            let note = PaceNote::StoreLost {
                at: self.fleet.at().to_string(),
                cause: e.to_string(),
                waits: self.fleet.redis_timeout(),
            };
            self.lock().push(note);
        }
    }

    /// Before this process's first take under a bare rate, asks the
    /// script to start the fleet on the even pace, unless it started, or
    /// learnt or was told anything, already.
    async fn ask_start(&self) -> Result<(), PaceError> {
        let bare = self.shape_unknown
            && self.rule.windowed()
            && self.cap > 0
            && self.window <= crate::rate::learn::START_WITHIN;
        if !bare {
            return Ok(());
        }
        // Held while asking: the other workers' takes wait for the start.
        // Asked again if it failed.
        let mut asked = self.start_asked.lock().await;
        if !*asked {
            let _began: i64 = self
                .run("start", self.fleet.redis_timeout(), |inv| {
                    inv.arg(u8::from(self.secret.load(Ordering::SeqCst)));
                })
                .await?;
            *asked = true;
        }
        Ok(())
    }

    async fn try_take(&self, id: &str, cap: u64, tokens: TokenWeight) -> Result<Took, PaceError> {
        let settles = self.take_settles();
        // What the take's restore block carried (see `restore_args`).
        let restored = AtomicU8::new(0);
        let (a, b) = match self.rule {
            ScriptRule::Window => (cap.to_string(), self.headroom.to_string()),
            drip => drip.params(),
        };
        let result: Result<Vec<i64>, PaceError> = self
            .run(
                self.rule.op(Verb::Take),
                self.fleet.redis_timeout(),
                |inv| {
                    inv.arg(id).arg(&a).arg(&b).arg(self.ceiling);
                    // Only the window rule's take weighs its call.
                    if self.rule.windowed() {
                        inv.arg(tokens_arg(tokens));
                    }
                    inv.arg(settles.len());
                    for (sid, ago) in &settles {
                        inv.arg(sid).arg(ago);
                    }
                    // Built afresh for every attempt: a failed attempt may have
                    // been Redis restarting empty.
                    let carried = self.restore_args(inv);
                    restored.store(carried, Ordering::SeqCst);
                    let (heard, witness) = self.loss_check(carried & PUT_BACK != 0);
                    inv.arg(heard).arg(fastrand::u32(1..)).arg(witness);
                },
            )
            .await;
        let v = match result {
            Ok(v) => v,
            Err(e) => {
                self.requeue(settles);
                return Err(e);
            }
        };
        self.restore_answered(restored.load(Ordering::SeqCst)).await;
        // Every answer ends with the fleet's epoch (see `loss_check`).
        if let Some(&epoch) = v.last() {
            let mut l = self.lock();
            // A loss found: the put-back says the epoch heard before it.
            if matches!(v[..], [0, _, 4, ..]) && l.epoch_before_loss.is_none() {
                l.epoch_before_loss = l.epoch;
            }
            l.epoch = Some(epoch);
        }
        self.took(id, &v).await
    }

    /// What the script's answer `v` to the take of call `id` means: the
    /// call granted (and what the fleet's limit stands at), or a wait and
    /// its reason.
    async fn took(&self, id: &str, v: &[i64]) -> Result<Took, PaceError> {
        match v {
            [1, rest @ ..] => {
                let mut l = self.lock();
                l.in_flight.insert(id.to_string());
                if let [limit, _, learnt, settled, rest @ ..] = rest {
                    // The window rule's flag, then the epoch: a drip rule's
                    // answer has only the epoch there.
                    let even = rest.len() >= 2 && rest[0] == 1;
                    l.heard(
                        (*limit).max(0) as u64,
                        (*learnt).max(0) as u64,
                        *settled == 1,
                        even,
                    );
                }
                Ok(Took::Granted)
            }
            // Redis forgot the fleet: the next take puts this process's
            // calls back (the fleet is held meanwhile).
            [0, _, 4, ..] => {
                self.lock().lost = true;
                Ok(Took::Wait(Duration::from_millis(1), Why::Window))
            }
            // Another process adopted a policy a server stated: its key
            // first, then ask again.
            [0, _, 5, ..] => {
                self.fetch_stated().await?;
                Ok(Took::Wait(Duration::ZERO, Why::Window))
            }
            [0, ms, why, rest @ ..] => {
                let wait = Duration::from_millis((*ms).max(1) as u64);
                let why = match (why, rest) {
                    (1, _) => Why::Paused,
                    (2, _) => Why::Window,
                    (6, [quota, ..]) => Why::Quota(Duration::from_millis((*quota).max(0) as u64)),
                    _ => Why::Ceiling,
                };
                if why == Why::Paused {
                    self.lock().paused_until = Some(Instant::now() + wait);
                }
                Ok(Took::Wait(wait, why))
            }
            other => Err(PaceError::Unavailable(format!(
                "the fleet script answered {other:?}"
            ))),
        }
    }

    fn next_id(&self) -> String {
        format!("{}:{}", self.tag, self.seq.fetch_add(1, Ordering::Relaxed))
    }
}

/// The pacer of a process in a fleet (`--redis`) keeping `rule`: the rule's
/// state (a window, a SpikeArrest mirror or a bucket), the concurrency
/// ceiling, the pause and the learnt limit are shared with every process on
/// the key. `policies`: every `--limit` past the primary one (a sliding
/// or fixed window, or a GCRA bucket, of calls or of tokens). Returns the pause of a 429
/// without a usable Retry-After, as [`crate::pace::for_limit`] does; an
/// error when `--burst` cannot be kept under the limit.
pub fn for_fleet(
    fleet: Fleet,
    cfg: FleetPacing,
    rule: FleetRule,
    policies: &[PolicySpec],
) -> Result<(Arc<dyn Pacer>, Duration), SizingError> {
    let pause = match cfg.limit {
        Limit::Rate(r) => r.period.min(Duration::from_secs(60)),
        Limit::Unlimited => Duration::from_secs(30),
    };
    let further = windows_of(policies);
    let buckets = buckets_of(policies);
    let tokens = tokens_of(policies);
    let pacer = if further.is_empty() && buckets.is_empty() && tokens.is_empty() {
        FleetPacer::with_rule(fleet, cfg, rule)?
    } else {
        FleetPacer::with_limits(fleet, cfg, &further, &buckets, &tokens)
    };
    Ok((Arc::new(pacer), pause))
}

#[cfg(test)]
mod tests;
