//! When may the next call go? The async face of the pure rate logic in
//! [`crate::rate`].
//!
//! The pool sees only the [`Pacer`] interface, so the token bucket, the
//! exact sliding window, the SpikeArrest mirror and the fleet's pacer
//! (`fleet::pacer`, shared by many processes through Redis) are
//! interchangeable behind it.

use std::sync::Arc;
use std::time::Duration;

use reqwest::header::HeaderMap;
use tokio::time::Instant;

use crate::rate::bucket::{SizingError, TokenBucket};
use crate::rate::exact::Learning;
use crate::rate::learn::Learnt;
use crate::rate::policies::Heard;
use crate::rate::policy::{PolicySpec, TokenWeight, Used};
use crate::rate::retry_after::MAX_QUOTA_RESET;
use crate::rate::spike_pace::SpikePace;
use crate::rate::Limit;
use crate::util::BoxFuture;

mod bucket;
mod spike;
mod unpaced;
mod window;

pub use bucket::BucketPacer;
pub use spike::SpikePacer;
pub use unpaced::Unpaced;
pub use window::{Policies, WindowPacer};

/// Which pacer paces a limited run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum PacerKind {
    /// The exact sliding window: at most L calls in any window W, counting
    /// each call from its send until W after its response.
    #[default]
    Window,
    /// A token bucket sized so that burst + rate × W ≤ L.
    Bucket,
    /// A mirror of an Apigee SpikeArrest gateway: one call per interval,
    /// a burst of a tenth of messagesPerPeriod.
    Spike,
}

/// Why a pacer could not hand out a permit.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PaceError {
    /// The pacer's shared state cannot be reached. No call may go out
    /// without a permit (that would risk the limit), so the run must stop
    /// resumably instead.
    #[error("the pacer is unavailable: {0}")]
    Unavailable(String),
    /// The server says a quota is used up and resets too far away to wait
    /// for (`--wait-for-quota` waits): the run stops resumably.
    #[error("the server says its limit {name:?} is used up until {resets_at} (in {}): halted rather than wait (--wait-for-quota waits for it)", humantime::format_duration(*in_))]
    QuotaExhausted {
        /// The policy's name in the headers.
        name: String,
        /// When it resets (RFC 3339, UTC).
        resets_at: String,
        /// How long until then, in whole seconds.
        in_: Duration,
    },
}

impl PaceError {
    /// [`PaceError::QuotaExhausted`] for quota `name`, resetting `in_` from
    /// now (kept to whole seconds, and said as an RFC 3339 instant). At
    /// most a year and a day ahead, as every reset read is: a garbled one
    /// of billions of years would overflow the clock, or the year's four
    /// digits.
    pub fn quota_exhausted(name: String, in_: Duration) -> PaceError {
        let in_ = Duration::from_secs(in_.min(MAX_QUOTA_RESET).as_secs());
        let at = std::time::SystemTime::now() + in_;
        PaceError::QuotaExhausted {
            name,
            resets_at: humantime::format_rfc3339_seconds(at).to_string(),
            in_,
        }
    }
}

/// Something a pacer learnt that the operator should hear. A pacer never
/// writes to the terminal itself: it hands the run a note, and the run's
/// recorder says it.
#[derive(Debug, Clone, PartialEq)]
pub enum PaceNote {
    /// The shared store (the fleet's Redis) stopped answering: no call goes
    /// out until it answers again, for up to `waits`.
    StoreLost {
        /// Where the store is (no credentials).
        at: String,
        /// Why it is taken as lost.
        cause: String,
        /// How long calls are held before the run halts.
        waits: Duration,
    },
    /// The server reports a limit in force below the configured one.
    LimitInForce(u64),
    /// A rate-limit 429 from a server that never reports its limit: the
    /// pacer now paces to this many calls per window, and probes upward
    /// slowly.
    Learnt(u64),
    /// A full window passed without a 429 since the limit was learnt: it
    /// holds, and is worth keeping for a resumed run.
    LearntSettled(u64),
    /// A burst was refused but an even pace at `limit` per window held: the
    /// server keeps a bucket with `burst` (worth keeping, like a settled
    /// limit).
    LearntBucket {
        /// Calls per window at the even pace.
        limit: u64,
        /// Calls at once beyond it.
        burst: u64,
    },
    /// The server's answers fit a fixed window of this many calls (and no
    /// sliding one): paced as a sliding window of it, worth keeping.
    LearntFixedWindow(u64),
    /// What the server's rate-limit headers announce, when it changes or
    /// disagrees with what the pacer was told (each said once).
    Heard(Heard),
    /// A burst under a bare rate was refused, so the fleet paces every
    /// process evenly to `limit` calls per window (a bucket's rate, as
    /// nginx `limit_req` keeps it), with no burst: it learns none. Said
    /// once, with how to name the shape of the rate it was `told`.
    FleetPacedEvenly {
        /// The limit paced to.
        limit: u64,
        /// The rate told, as `--limit` takes it (`30/1s`).
        told: String,
    },
}

impl From<Learning> for PaceNote {
    fn from(l: Learning) -> PaceNote {
        match l {
            Learning::Lowered(n) => PaceNote::Learnt(n),
            Learning::Settled(n) => PaceNote::LearntSettled(n),
            Learning::Bucket { limit, burst } => PaceNote::LearntBucket { limit, burst },
            Learning::FixedWindow(n) => PaceNote::LearntFixedWindow(n),
        }
    }
}

/// Decides when each call may start. One pacer is shared by every worker of
/// a run (and, for the fleet's pacer, by every process on the key).
pub trait Pacer: Send + Sync {
    /// Waits until one call may start and claims its place. The permit is
    /// what lets a window pacer count a call from its send until its
    /// response: complete it with the response's arrival, or drop it if the
    /// call was never sent. Fails only when the pacer's state is out of
    /// reach, in which case no call may go out.
    fn take(&self) -> BoxFuture<'_, Result<Permit, PaceError>>;

    /// [`take`](Self::take) for a call that weighs `weight`: a batch of
    /// items counted as several calls, or a call whose item costs tokens
    /// against a token policy. Pacers that count only calls take one place.
    fn take_weighted(&self, weight: Weight) -> BoxFuture<'_, Result<Permit, PaceError>> {
        let _ = weight;
        self.take()
    }

    /// A rate-limit 429 arrived: every worker waits `for_` before its next
    /// call, and nobody bursts when the pause ends. Async because the fleet's
    /// pacer tells every process through its store. The refused call's
    /// permit is completed first, and [`observe`](Self::observe) has seen
    /// its headers: a pacer that learns the limit from 429s relies on both.
    fn pause(&self, for_: Duration) -> BoxFuture<'_, Result<(), PaceError>>;

    /// A used-up quota is waited for (`--wait-for-quota`, a 429 asking for
    /// longer than a pause is worth): every worker waits `for_`, as for
    /// [`pause`](Self::pause), but nothing is learnt from it. The quota's
    /// reset refused the call, not the rate; learnt from, a day's wait
    /// would end at a lowered limit. Pacers that never learn pause.
    fn hold(&self, for_: Duration) -> BoxFuture<'_, Result<(), PaceError>> {
        self.pause(for_)
    }

    /// Sees every response's headers, so the pacer can follow the limits the
    /// server says are in force (every dialect for the window pacer and
    /// for [`Unpaced`], which hands over to one at the first stated quota;
    /// `x-rate-limit-limit` for the others). Returns a note when that
    /// changed what the pacer does; more may follow through
    /// [`note`](Self::note).
    fn observe<'a>(&'a self, headers: &'a HeaderMap) -> BoxFuture<'a, Option<PaceNote>>;

    /// A note the pacer has for the run outside any response (its store was
    /// lost, say): the recorder asks every tick.
    fn note(&self) -> Option<PaceNote> {
        None
    }

    /// When the current pause ends, if one is in force: for the progress
    /// display only, so it may be approximate for the fleet's pacer.
    fn paused_until(&self) -> Option<Instant>;

    /// When the hold for a quota a response said used up ends, if one is
    /// in force: for the progress display only.
    fn held_until(&self) -> Option<Instant> {
        None
    }

    /// The limit per window learnt from 429s of a server that does not
    /// report its limit, if any, with what it was learnt to be beyond its
    /// count (a bucket's burst, the fixed window its refusal switches to,
    /// a fixed window, the most it is probed to): what a resumed run
    /// starts from, neither learning it again nor probing above it. One
    /// read, so the count and its shape are of the same moment.
    fn learnt(&self) -> Option<crate::rate::learn::Learnt> {
        None
    }

    /// How full each policy it keeps is now (the window pacer only; empty
    /// where the pacer keeps no policies of its own, and the run's
    /// observers count the configured limit themselves).
    fn occupancy(&self) -> Vec<crate::rate::Occupancy> {
        Vec::new()
    }

    /// The most tokens one call may weigh under the token policies the
    /// server stated (the least of their quotas), with the policy's name:
    /// such a server refuses a heavier call every time.
    fn most_stated_tokens(&self) -> Option<(u64, String)> {
        None
    }

    /// Calls per minute the pacer allows now (the limit in force, or the one
    /// learnt), when it knows better than the configured limit: the
    /// progress display's ETA follows it.
    fn steady_per_min(&self) -> Option<f64> {
        None
    }

    /// Hands back what the pacer still owes its shared store (completed
    /// permits not yet recorded there) before the run ends. Bounded in time.
    fn flush(&self) -> BoxFuture<'_, ()> {
        ready(())
    }
}

/// What one call weighs against the limits: the calls it counts as (one,
/// or a batch's items where the API counts each) and its estimated cost in
/// tokens (zero when no token policy applies).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Weight {
    /// Calls it counts as against call policies; at least one.
    pub calls: u64,
    /// Estimated cost units against token policies.
    pub tokens: TokenWeight,
}

impl Default for Weight {
    fn default() -> Weight {
        Weight {
            calls: 1,
            tokens: TokenWeight::default(),
        }
    }
}

/// The bookkeeping a pacer attaches to one permit.
pub trait Ticket: Send {
    /// The call's response arrived (or it gave up waiting) at `arrived`.
    fn complete(self: Box<Self>, arrived: Instant);
    /// [`complete`](Self::complete), with the tokens the call really used
    /// when the response said so. Pacers that count no tokens ignore it.
    fn complete_used(self: Box<Self>, arrived: Instant, used: Option<Used>) {
        let _ = used;
        self.complete(arrived);
    }
    /// The server refused the call with a rate-limit 429 at `arrived`:
    /// [`complete`](Self::complete) for a pacer that learns nothing from
    /// which calls were refused.
    fn complete_refused(self: Box<Self>, arrived: Instant) {
        self.complete(arrived);
    }
    /// The call was never sent: its place is free again.
    fn cancel(self: Box<Self>);
}

/// Leave to send one call. Dropping it unused gives the place back.
#[must_use = "a permit is completed when the call's response arrives"]
pub struct Permit {
    ticket: Option<Box<dyn Ticket>>,
}

impl std::fmt::Debug for Permit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Permit")
            .field("tracked", &self.ticket.is_some())
            .finish()
    }
}

impl Permit {
    /// A permit for a pacer that keeps no per-call state (the bucket).
    pub fn untracked() -> Permit {
        Permit { ticket: None }
    }

    /// A permit carrying a pacer's per-call state.
    pub fn tracked(ticket: Box<dyn Ticket>) -> Permit {
        Permit {
            ticket: Some(ticket),
        }
    }

    /// The call ended at `arrived`: its response came (or the call gave up).
    pub fn complete(mut self, arrived: Instant) {
        if let Some(t) = self.ticket.take() {
            t.complete(arrived);
        }
    }

    /// [`complete`](Self::complete), settling the call at the tokens it
    /// really `used` (from the response; `None`: the estimate stands), so
    /// that a token policy counts what was spent.
    pub fn complete_used(mut self, arrived: Instant, used: Option<Used>) {
        if let Some(t) = self.ticket.take() {
            t.complete_used(arrived, used);
        }
    }

    /// The server refused the call with a rate-limit 429 at `arrived`
    /// (the pause comes apart, with [`Pacer::pause`]): a pacer learning a
    /// secret limit's shape keeps which calls were refused.
    pub fn complete_refused(mut self, arrived: Instant) {
        if let Some(t) = self.ticket.take() {
            t.complete_refused(arrived);
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if let Some(t) = self.ticket.take() {
            t.cancel();
        }
    }
}

/// The pacer of `kind` for `limit`, and the pause a rate-limit 429 without
/// a usable Retry-After causes. With no limit, every kind is [`Unpaced`]
/// (which keeps the quotas a server states with a window pacer).
///
/// A job resumed within one window of its last call (`last_active`, unix
/// time; zero for never) may have calls of the previous run still in the
/// server's window: the bucket and the spike mirror start empty, and the
/// exact window counts as full until that window has passed. `learnt` is
/// the limit a previous run learnt from 429s (window pacer only). `burst`
/// sizes the bucket only.
pub fn for_limit(
    kind: PacerKind,
    limit: Limit,
    burst: Option<u64>,
    learnt: Option<u64>,
    last_active: Duration,
    now_unix: Duration,
) -> Result<(Arc<dyn Pacer>, Duration), SizingError> {
    let p = Policies {
        specs: &[],
        wait_for_quota: false,
        learn_shape: true,
        start: false,
        last_used: &[],
        recent_sends: &[],
    };
    let learnt = learnt.map(Learnt::from);
    for_limits(kind, limit, p, burst, learnt, last_active, now_unix)
}

/// The calls `recent` (unix second, calls sent in it) holds within `window`
/// of `now_unix`, the second the window's start falls in counted whole.
fn sent_within(recent: &[(u64, u32)], now_unix: Duration, window: Duration) -> u64 {
    let from = now_unix.saturating_sub(window).as_secs();
    (recent.iter())
        .filter(|(t, _)| *t >= from)
        .map(|(_, n)| u64::from(*n))
        .sum()
}

/// [`for_limit`] with the `policies` every call must keep (`--limit`,
/// possibly several, with their shapes; the window pacer only, which
/// settings make sure of), the primary one first; empty means a sliding
/// window at `limit`. `limit` is the primary one's rate: its window learns,
/// and its pause is the pause of a 429.
pub fn for_limits(
    kind: PacerKind,
    limit: Limit,
    policies: Policies<'_>,
    burst: Option<u64>,
    learnt: Option<Learnt>,
    last_active: Duration,
    now_unix: Duration,
) -> Result<(Arc<dyn Pacer>, Duration), SizingError> {
    let Limit::Rate(r) = limit else {
        let unpaced = Unpaced::following(policies.wait_for_quota, policies.learn_shape);
        return Ok((Arc::new(unpaced), Duration::from_secs(30)));
    };
    let busy_for = |period: Duration| still_counted(period, last_active, now_unix);
    let recent = !busy_for(r.period).is_zero();
    let now = now_std();
    let pacer: Arc<dyn Pacer> = match kind {
        PacerKind::Bucket => {
            let bucket = TokenBucket::for_limit(r, burst, recent, now)?;
            Arc::new(BucketPacer::new(bucket, r.period))
        }
        PacerKind::Window => {
            let one = [PolicySpec::sliding(limit)];
            let wait_for_quota = policies.wait_for_quota;
            let policies = Policies {
                specs: match policies.specs.is_empty() {
                    true => &one[..],
                    false => policies.specs,
                },
                ..policies
            };
            let mut set = window::policy_set(policies, r, learnt, now);
            // As answered a margin after the last run's last call (the
            // stamp a kill -9 may not have saved).
            let ago = now_unix.saturating_sub(last_active);
            if !last_active.is_zero() {
                if let Some(at) = crate::rate::exact::later(now, STAMP_MARGIN).checked_sub(ago) {
                    let sent_within = |w: Duration| sent_within(policies.recent_sends, now_unix, w);
                    set.resume_use(policies.last_used, &sent_within, at);
                }
            }
            let policies = policies.specs;
            // Held for the shortest window only: a burst overruns that one,
            // while holding a whole hour for an hourly quota would stall a
            // resume for nothing (docs/pacing.md).
            let shortest = shortest_window(limit, policies).unwrap_or(r.period);
            if !busy_for(shortest).is_zero() {
                set.primary_mut()
                    .hold_until(crate::rate::exact::later(now, busy_for(shortest)));
            }
            Arc::new(WindowPacer::of(set).waiting_for_quota(wait_for_quota))
        }
        PacerKind::Spike => {
            let p = if recent {
                SpikePace::new_empty(r, now)
            } else {
                SpikePace::new(r, now)
            };
            Arc::new(SpikePacer::new(p))
        }
    };
    Ok((pacer, r.period.min(Duration::from_secs(60))))
}

/// The shortest window of `limit` and `specs` (`None` without a rate): the
/// one a new run's start is held for while the last run's calls may still
/// count in it ([`still_counted`]).
pub fn shortest_window(limit: Limit, specs: &[PolicySpec]) -> Option<Duration> {
    specs
        .iter()
        .filter_map(PolicySpec::rate)
        .chain(limit.rate())
        .map(|r| r.period)
        .min()
}

/// How much longer a server's window of `period` may still count the
/// calls of a run whose last call went at `last_active` (unix time; zero
/// for never): the window pacer holds a new run's first calls that long.
/// The margin covers the pacing stamp a kill -9 may not have saved (saved
/// every second, flushed within half a second more).
pub fn still_counted(period: Duration, last_active: Duration, now_unix: Duration) -> Duration {
    if last_active.is_zero() {
        return Duration::ZERO;
    }
    period
        .saturating_add(STAMP_MARGIN)
        .saturating_sub(now_unix.saturating_sub(last_active))
}

/// How late the last call's stamp may be saved: every second, flushed
/// within half a second more, so a kill -9 may lose that much.
const STAMP_MARGIN: Duration = Duration::from_secs(3);

/// The time on tokio's clock as a std instant, for the pure rate logic
/// (which tokio's paused test clock then drives as well).
pub(crate) fn now_std() -> std::time::Instant {
    Instant::now().into_std()
}

/// A pure pacing state shared by every worker, with a wake-up for waiters:
/// the thin async layer the window and SpikeArrest pacers have in common.
pub(crate) struct Guarded<T> {
    state: std::sync::Mutex<T>,
    /// Wakes waiters when a place may have come free sooner than they were
    /// told (a call ended, gave its place back, or the limit grew).
    changed: tokio::sync::Notify,
}

impl<T> Guarded<T> {
    pub(crate) fn new(state: T) -> Arc<Guarded<T>> {
        Arc::new(Guarded {
            state: std::sync::Mutex::new(state),
            changed: tokio::sync::Notify::new(),
        })
    }

    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, T> {
        // A panic while holding this lock leaves at worst a stale state,
        // which only errs on the slow side.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Wakes every waiter to look again.
    pub(crate) fn notify(&self) {
        self.changed.notify_waiters();
    }

    /// Waits until `try_take` grants a place: it answers the place, or the
    /// earliest instant time alone could make one.
    pub(crate) async fn take<R>(
        &self,
        mut try_take: impl FnMut(&mut T, std::time::Instant) -> Result<R, std::time::Instant>,
    ) -> R {
        loop {
            // Registered before looking, so a place freed in between still
            // wakes this waiter.
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let taken = try_take(&mut self.lock(), now_std());
            match taken {
                Ok(r) => return r,
                Err(at) => {
                    tokio::select! {
                        _ = tokio::time::sleep_until(Instant::from_std(at)) => {}
                        _ = &mut changed => {}
                    }
                }
            }
        }
    }
}

/// Ready-made future for pacers whose answer needs no waiting.
fn ready<'a, T: Send + 'a>(v: T) -> BoxFuture<'a, T> {
    Box::pin(std::future::ready(v))
}

#[cfg(test)]
pub(crate) mod testing {
    //! Helpers the pacer tests share.
    use super::*;

    /// A response's headers carrying `x-rate-limit-limit: l`.
    pub fn limit_header(l: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(crate::wire::RATE_LIMIT_LIMIT, l.parse().unwrap());
        h
    }

    /// The most release times (sorted) inside any span shorter than `w`.
    pub fn max_in_window(stamps: &[Instant], w: Duration) -> usize {
        (0..stamps.len())
            .map(|i| {
                stamps[i..]
                    .iter()
                    .take_while(|b| **b - stamps[i] < w)
                    .count()
            })
            .max()
            .unwrap_or(0)
    }

    /// Takes a permit and completes it at once (a zero-latency call).
    pub async fn call(p: &dyn Pacer) {
        p.take().await.expect("permit").complete(Instant::now());
    }

    /// `n` workers that each make one call at once: when each was let
    /// through, in the workers' order.
    pub async fn released<P: Pacer + 'static>(p: &std::sync::Arc<P>, n: usize) -> Vec<Instant> {
        let tasks: Vec<_> = (0..n)
            .map(|_| {
                let p = p.clone();
                tokio::spawn(async move {
                    call(p.as_ref()).await;
                    Instant::now()
                })
            })
            .collect();
        let mut at = Vec::with_capacity(n);
        for t in tasks {
            at.push(t.await.expect("worker"));
        }
        at
    }
}

#[cfg(test)]
mod tests {
    use super::testing::call;
    use super::*;
    use crate::rate::Rate;

    fn per_second(count: u64) -> Limit {
        Limit::Rate(Rate {
            count,
            period: Duration::from_secs(1),
        })
    }

    const NOW: Duration = Duration::from_secs(1_700_000_000);

    /// Calls made at once (zero latency) before the first wait.
    async fn at_once(p: &dyn Pacer) -> u64 {
        let t0 = Instant::now();
        let mut n = 0;
        loop {
            call(p).await;
            if Instant::now() > t0 {
                return n;
            }
            n += 1;
        }
    }

    /// A bare rate's start paces its first window evenly (a bucket with no
    /// burst would refuse the rest), but only a window of a minute at most:
    /// an hour's quota lets a job that fits in it go at once, where its even
    /// start sent one call every 6.6 minutes.
    #[tokio::test(start_paused = true)]
    async fn a_bare_rate_starts_evenly_only_over_a_minute_at_most() {
        let bare = |count, secs| {
            let limit = Limit::Rate(Rate {
                count,
                period: Duration::from_secs(secs),
            });
            let p = Policies {
                specs: &[],
                wait_for_quota: false,
                learn_shape: true,
                start: true,
                last_used: &[],
                recent_sends: &[],
            };
            for_limits(PacerKind::Window, limit, p, None, None, Duration::ZERO, NOW)
                .unwrap()
                .0
        };
        assert_eq!(at_once(bare(10, 3600).as_ref()).await, 10);
        assert!(at_once(bare(10, 60).as_ref()).await < 10);
    }

    #[tokio::test(start_paused = true)]
    async fn each_kind_opens_as_it_should() {
        let open = |kind, burst| for_limit(kind, per_second(20), burst, None, Duration::ZERO, NOW);
        let (p, pause) = open(PacerKind::Window, None).unwrap();
        assert_eq!(pause, Duration::from_secs(1));
        assert_eq!(at_once(p.as_ref()).await, 20, "the whole window");
        let (p, _) = open(PacerKind::Bucket, Some(5)).unwrap();
        assert_eq!(at_once(p.as_ref()).await, 5, "the burst");
        let (p, _) = open(PacerKind::Spike, Some(5)).unwrap();
        assert_eq!(
            at_once(p.as_ref()).await,
            2,
            "a tenth of 20, --burst ignored"
        );
        assert!(open(PacerKind::Bucket, Some(20)).is_err());
        assert!(open(PacerKind::Window, Some(20)).is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn no_limit_is_unpaced_whatever_the_kind() {
        for kind in [PacerKind::Window, PacerKind::Bucket, PacerKind::Spike] {
            let (p, pause) =
                for_limit(kind, Limit::Unlimited, None, Some(3), Duration::ZERO, NOW).unwrap();
            assert_eq!(pause, Duration::from_secs(30));
            let t0 = Instant::now();
            for _ in 0..500 {
                call(p.as_ref()).await;
            }
            assert_eq!(Instant::now(), t0);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_quick_resume_counts_the_previous_runs_window() {
        // The last call 1 s ago on a 1 s window, with the 3 s stamp margin:
        // the window pacer waits out the remaining 3 s.
        let last = NOW - Duration::from_secs(1);
        let (p, _) = for_limit(PacerKind::Window, per_second(20), None, None, last, NOW).unwrap();
        let t0 = Instant::now();
        call(p.as_ref()).await;
        assert_eq!(Instant::now() - t0, Duration::from_secs(3));
        assert!(p.paused_until().is_none(), "not shown as a pause");
        // The spike mirror starts empty: one drip first.
        let (p, _) = for_limit(PacerKind::Spike, per_second(20), None, None, last, NOW).unwrap();
        let t0 = Instant::now();
        call(p.as_ref()).await;
        assert_eq!(Instant::now() - t0, Duration::from_millis(50));
        // Long after, nothing is held.
        let long_ago = NOW - Duration::from_secs(60);
        let (p, _) =
            for_limit(PacerKind::Window, per_second(20), None, None, long_ago, NOW).unwrap();
        assert_eq!(at_once(p.as_ref()).await, 20);
    }

    /// Two limits, the run before filled the long one: a resume waits for
    /// it, not only for the shortest window.
    #[tokio::test(start_paused = true)]
    async fn a_quick_resume_counts_the_previous_runs_use_of_each_window() {
        let specs: Vec<PolicySpec> = ["60/20s", "50/1s"].map(|s| s.parse().unwrap()).to_vec();
        let last = NOW - Duration::from_secs(1);
        let resumed = |used: u64| {
            let last_used = [("60/20s".to_string(), used), ("50ps".to_string(), 50)];
            let p = Policies {
                specs: &specs,
                wait_for_quota: false,
                learn_shape: true,
                start: false,
                last_used: &last_used,
                recent_sends: &[],
            };
            let limit = Limit::Rate(specs[0].rate().unwrap());
            for_limits(PacerKind::Window, limit, p, None, None, last, NOW)
                .unwrap()
                .0
        };
        let p = resumed(60);
        let t0 = Instant::now();
        call(p.as_ref()).await;
        // Answered 3 s after the last stamp (its margin), free 20 s later.
        assert_eq!(Instant::now() - t0, Duration::from_secs(22));
        // Ten of sixty used: fifty go once the short window is waited out.
        let p = resumed(10);
        let t0 = Instant::now();
        let mut at = Vec::new();
        for _ in 0..51 {
            call(p.as_ref()).await;
            at.push(Instant::now() - t0);
        }
        assert_eq!(at[0], Duration::from_secs(3));
        assert!(at[49] < Duration::from_secs(4), "{at:?}");
        assert_eq!(at[50], Duration::from_secs(22));
    }

    /// A policy added (or changed) since the last run has no record of
    /// its use: a resume counts the calls the job's timeline shows sent
    /// within its window, and none sent before it.
    #[tokio::test(start_paused = true)]
    async fn a_resume_counts_the_timelines_calls_in_a_policy_with_no_record() {
        let specs: Vec<PolicySpec> = ["60/20s", "50/1s"].map(|s| s.parse().unwrap()).to_vec();
        let last = NOW - Duration::from_secs(1);
        let now_s = NOW.as_secs();
        let resumed = |recent: &[(u64, u32)]| {
            let p = Policies {
                specs: &specs,
                wait_for_quota: false,
                learn_shape: true,
                start: false,
                last_used: &[],
                recent_sends: recent,
            };
            let limit = Limit::Rate(specs[0].rate().unwrap());
            for_limits(PacerKind::Window, limit, p, None, None, last, NOW)
                .unwrap()
                .0
        };
        // Sixty sent 10 s ago: the 20 s window is full until 20 s after
        // their answers (3 s after the last stamp, its margin).
        let p = resumed(&[(now_s - 30, 60), (now_s - 10, 40), (now_s - 9, 20)]);
        let t0 = Instant::now();
        call(p.as_ref()).await;
        assert_eq!(Instant::now() - t0, Duration::from_secs(22));
        // Sent 30 s ago: outside both windows, the resume goes as with none.
        let times = |p: Arc<dyn Pacer>| async move {
            let t0 = Instant::now();
            let mut at = Vec::new();
            for _ in 0..61 {
                call(p.as_ref()).await;
                at.push(Instant::now() - t0);
            }
            at
        };
        let old = times(resumed(&[(now_s - 30, 60)])).await;
        assert_eq!(old, times(resumed(&[])).await);
        assert!(old[59] < Duration::from_secs(20), "{old:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_learnt_limit_carries_over_to_the_window_pacer() {
        let (p, _) = for_limit(
            PacerKind::Window,
            per_second(20),
            None,
            Some(7),
            Duration::ZERO,
            NOW,
        )
        .unwrap();
        assert_eq!(p.learnt().map(|l| l.limit), Some(7));
        assert_eq!(at_once(p.as_ref()).await, 7);
        let (p, _) = for_limit(
            PacerKind::Bucket,
            per_second(20),
            None,
            Some(7),
            Duration::ZERO,
            NOW,
        )
        .unwrap();
        assert_eq!(p.learnt(), None, "the bucket does not learn");
    }
}
