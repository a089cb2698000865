//! The default pacer: the async face of
//! [`PolicySet`](crate::rate::policies::PolicySet), one
//! [`ExactWindow`](crate::rate::exact::ExactWindow) per sliding window of
//! calls and a [`Kept`](crate::rate::kept::Kept) policy per other shape. Waiting is a
//! sleep until the instant the state machine names, cut short when a call
//! ends or gives its place back.

use std::sync::Arc;
use std::time::Duration;

use reqwest::header::HeaderMap;
use tokio::time::Instant;

use super::{
    now_std, ready, BoxFuture, Guarded, PaceError, PaceNote, Pacer, Permit, Ticket, Weight,
};
use crate::rate::exact::ExactWindow;
use crate::rate::learn::Learnt;
use crate::rate::policies::{Heard, Note, PolicySet, SetSlot};
use crate::rate::policy::{PolicySpec, Used};
use crate::rate::Rate;

/// The exact sliding-window pacer, shared by every worker.
pub struct WindowPacer {
    guarded: Arc<Guarded<PolicySet>>,
    /// `--wait-for-quota`: a used-up quota is waited for, however long.
    wait_for_quota: bool,
}

impl WindowPacer {
    /// Paces to `window`.
    pub fn new(window: ExactWindow) -> WindowPacer {
        WindowPacer::of(PolicySet::new(window, Vec::new()))
    }

    /// Paces to every window of `set`.
    pub fn of(set: PolicySet) -> WindowPacer {
        WindowPacer {
            guarded: Guarded::new(set),
            wait_for_quota: false,
        }
    }

    /// Waits for a used-up quota however far away it resets, instead of
    /// failing takes (which halts the run resumably).
    pub fn waiting_for_quota(mut self, wait: bool) -> WindowPacer {
        self.wait_for_quota = wait;
        self
    }
}

/// The policies a window pacer keeps, and what it does when one is used up.
#[derive(Debug, Clone, Copy)]
pub struct Policies<'a> {
    /// Every policy, the primary one first (empty: a sliding window at the
    /// primary limit).
    pub specs: &'a [PolicySpec],
    /// `--wait-for-quota`: wait for a used-up quota however far its reset,
    /// instead of failing takes (which halts the run resumably).
    pub wait_for_quota: bool,
    /// Learn a bare rate's shape (a bucket paced evenly): off when a call
    /// may weigh several (`--batch-weight items`), whose places an even
    /// pace could never hand out at once.
    pub learn_shape: bool,
    /// Whether the shape is unknown from the start (a rate given with
    /// `--limit`, not a plan's window): the first window then sends few
    /// calls ahead of the even pace (see
    /// [`START_AHEAD`](crate::rate::learn::START_AHEAD)), if it is no longer
    /// than [`START_WITHIN`](crate::rate::learn::START_WITHIN).
    pub start: bool,
    /// What each told policy held at the last save of the job's last run
    /// (by name): counted again on a resume ([`PolicySet::resume_use`]).
    pub last_used: &'a [(String, u64)],
    /// The calls the job's timeline shows sent in each of its last seconds
    /// (unix second, calls), oldest first: a told policy of calls with no
    /// record in `last_used` counts those within its window on a resume.
    pub recent_sends: &'a [(u64, u32)],
}

/// The set of `p`'s policies (the primary one first, of rate `r`): its
/// sliding windows of calls as exact windows, the primary one first (the
/// envelope of the primary policy when it is of another shape, see
/// [`envelope`](crate::rate::kept::envelope)), every other shape kept.
pub(super) fn policy_set(
    p: Policies<'_>,
    r: Rate,
    learnt: Option<Learnt>,
    now: std::time::Instant,
) -> PolicySet {
    use crate::rate::kept::{envelope, is_sliding_calls, Kept};
    let policies = p.specs;
    let (n, w) = envelope(&policies[0]).unwrap_or((r.count, r.period));
    // A bare rate says nothing of the server's shape: learn it. A policy
    // told with its shape keeps it, and its envelope only learns the rate.
    let primary = if p.learn_shape && is_sliding_calls(&policies[0]) {
        let w = ExactWindow::new(n, w, now).learning_shape(learnt);
        match p.start && w.window() <= crate::rate::learn::START_WITHIN {
            true => w,
            false => w.without_start(),
        }
    } else {
        ExactWindow::new(n, w, now)
            .with_learnt(learnt.map(|l| l.limit))
            .probing_at_most(learnt.and_then(|l| l.shape.most))
    };
    let others = policies[1..]
        .iter()
        .filter(|p| is_sliding_calls(p))
        .filter_map(PolicySpec::rate)
        .map(|f| ExactWindow::new(f.count, f.period, now))
        .collect();
    let kept = policies
        .iter()
        .filter(|p| !is_sliding_calls(p))
        .filter_map(|p| Kept::new(*p))
        .collect();
    let set = PolicySet::new(primary, others).with_kept(kept);
    match is_sliding_calls(&policies[0]) {
        true => set,
        false => set.primary_is_envelope(),
    }
}

/// One call's place in every window.
struct WindowTicket {
    guarded: Arc<Guarded<PolicySet>>,
    slot: SetSlot,
}

impl Ticket for WindowTicket {
    fn complete(self: Box<Self>, arrived: Instant) {
        self.complete_used(arrived, None);
    }

    fn complete_used(self: Box<Self>, arrived: Instant, used: Option<Used>) {
        self.guarded
            .lock()
            .complete_used(self.slot, arrived.into_std(), used);
        // The place now has a known end, possibly sooner than a waiter
        // assumed for a call in flight.
        self.guarded.notify();
    }

    fn complete_refused(self: Box<Self>, arrived: Instant) {
        self.guarded
            .lock()
            .complete_refused(self.slot, arrived.into_std());
        self.guarded.notify();
    }

    fn cancel(self: Box<Self>) {
        if self.guarded.lock().cancel(self.slot) {
            self.guarded.notify();
        }
    }
}

/// The error a take fails with while a quota is used up beyond the bound.
fn quota_error(e: &crate::rate::policies::Exhausted, now: std::time::Instant) -> PaceError {
    PaceError::quota_exhausted(e.name.clone(), e.until.saturating_duration_since(now))
}

/// A note for the run: a lowering of the primary window without a stated
/// window is said as it always was.
fn to_note(n: Note) -> PaceNote {
    match n {
        Note::Learning(l) => PaceNote::from(l),
        Note::Heard(Heard::Lowered {
            quota,
            window: None,
            tokens: false,
            ..
        }) => PaceNote::LimitInForce(quota),
        Note::Heard(h) => PaceNote::Heard(h),
    }
}

impl Pacer for WindowPacer {
    fn take(&self) -> BoxFuture<'_, Result<Permit, PaceError>> {
        self.take_weighted(Weight::default())
    }

    fn take_weighted(&self, weight: Weight) -> BoxFuture<'_, Result<Permit, PaceError>> {
        Box::pin(async move {
            let wait = self.wait_for_quota;
            let slot = self
                .guarded
                .take(|w, now| match w.exhausted(now) {
                    Some(e) if !wait => Ok(Err(quota_error(e, now))),
                    _ => w
                        .try_take_weighted(now, weight.calls, weight.tokens)
                        .map(Ok),
                })
                .await?;
            Ok(Permit::tracked(Box::new(WindowTicket {
                guarded: self.guarded.clone(),
                slot,
            })))
        })
    }

    fn pause(&self, for_: Duration) -> BoxFuture<'_, Result<(), PaceError>> {
        let now = now_std();
        let mut s = self.guarded.lock();
        // Learning first: it must see whether an earlier pause still holds.
        s.rate_limited(now);
        s.widen_buckets();
        s.primary_mut().pause_until(now + for_);
        ready(Ok(()))
    }

    fn hold(&self, for_: Duration) -> BoxFuture<'_, Result<(), PaceError>> {
        let now = now_std();
        self.guarded.lock().primary_mut().pause_until(now + for_);
        ready(Ok(()))
    }

    fn observe<'a>(&'a self, headers: &'a HeaderMap) -> BoxFuture<'a, Option<PaceNote>> {
        let now = now_std();
        let policies = crate::rate::announce::read(headers, crate::util::unix_now());
        let mut s = self.guarded.lock();
        // A report can replace a lower learnt limit; then waiters may go.
        let exhausted = s.exhausted(now).is_some();
        let grew = s.announce(&policies, now);
        // Waiters held by the quota learn it is too far away to wait for.
        let grew = grew || (!exhausted && s.exhausted(now).is_some());
        let note = s.take_note(now).map(to_note);
        drop(s);
        if grew {
            self.guarded.notify();
        }
        ready(note)
    }

    fn note(&self) -> Option<PaceNote> {
        // What one response announced may be more than one note.
        self.guarded
            .lock()
            .take_heard()
            .map(|h| to_note(Note::Heard(h)))
    }

    fn paused_until(&self) -> Option<Instant> {
        self.guarded
            .lock()
            .primary()
            .paused_until(now_std())
            .map(Instant::from_std)
    }

    fn held_until(&self) -> Option<Instant> {
        self.guarded
            .lock()
            .held_until(now_std())
            .map(Instant::from_std)
    }

    fn learnt(&self) -> Option<crate::rate::learn::Learnt> {
        let g = self.guarded.lock();
        let w = g.primary();
        let limit = w.learnt()?;
        Some(crate::rate::learn::Learnt {
            limit,
            shape: w.learnt_shape(),
        })
    }

    fn occupancy(&self) -> Vec<crate::rate::Occupancy> {
        self.guarded.lock().occupancy(now_std())
    }

    fn most_stated_tokens(&self) -> Option<(u64, String)> {
        self.guarded.lock().most_stated_tokens()
    }

    fn steady_per_min(&self) -> Option<f64> {
        let per_second = self.guarded.lock().per_second();
        per_second.is_finite().then_some(per_second * 60.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pace::testing::{call, limit_header, max_in_window, released};
    use std::sync::Mutex;

    fn pacer(limit: u64, window: Duration) -> Arc<WindowPacer> {
        Arc::new(WindowPacer::new(ExactWindow::new(limit, window, now_std())))
    }

    /// Greedy workers whose calls take a random round trip and reach the
    /// server at a random point of it, until `until`. Returns the arrivals,
    /// sorted.
    async fn greedy(
        p: Arc<WindowPacer>,
        workers: u64,
        max_rtt_ms: u64,
        until: Instant,
    ) -> Vec<Instant> {
        let arrivals = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for seed in 0..workers {
            let (p, arrivals) = (p.clone(), arrivals.clone());
            tasks.push(tokio::spawn(async move {
                let mut rng = fastrand::Rng::with_seed(seed);
                while Instant::now() < until {
                    let permit = p.take().await.unwrap();
                    let sent = Instant::now();
                    if sent >= until {
                        break; // the permit goes back unused
                    }
                    let rtt = Duration::from_millis(rng.u64(0..=max_rtt_ms));
                    tokio::time::sleep(rtt).await;
                    arrivals.lock().unwrap().push(sent + rtt.mul_f64(rng.f64()));
                    permit.complete(Instant::now());
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let mut a = arrivals.lock().unwrap().clone();
        a.sort();
        a
    }

    #[tokio::test(start_paused = true)]
    async fn greedy_workers_never_put_more_than_the_limit_in_a_server_window() {
        let p = pacer(20, Duration::from_secs(1));
        let t0 = Instant::now();
        let a = greedy(p, 6, 300, t0 + Duration::from_secs(10)).await;
        let most = max_in_window(&a, Duration::from_secs(1));
        assert!(most <= 20, "{most} arrivals in one window");
        // Each call holds its place for W plus its round trip (150 ms on
        // average): about 20 / 1.15 a second.
        assert!(a.len() >= 160, "too slow: {}", a.len());
    }

    #[tokio::test(start_paused = true)]
    async fn with_a_short_round_trip_it_uses_the_whole_window() {
        let p = pacer(60, Duration::from_secs(1));
        let t0 = Instant::now();
        let a = greedy(p, 10, 2, t0 + Duration::from_secs(10)).await;
        assert!(max_in_window(&a, Duration::from_secs(1)) <= 60);
        assert!(a.len() >= 590, "{} calls in ten windows of 60", a.len());
    }

    #[tokio::test(start_paused = true)]
    async fn a_pause_holds_every_worker() {
        let p = pacer(60, Duration::from_secs(1));
        let t0 = Instant::now();
        p.pause(Duration::from_secs(3)).await.unwrap();
        assert_eq!(p.paused_until(), Some(t0 + Duration::from_secs(3)));
        for at in released(&p, 4).await {
            assert_eq!(at, t0 + Duration::from_secs(3));
        }
        assert!(p.paused_until().is_none());
    }

    /// A told bucket with no burst refused all the same: the pause's end
    /// spaces calls by twice the jitter allowance from then on.
    #[tokio::test(start_paused = true)]
    async fn a_429_widens_a_told_buckets_spacing() {
        let spec: PolicySpec = "10/1s,burst=0".parse().unwrap();
        let policies = Policies {
            specs: &[spec],
            wait_for_quota: false,
            learn_shape: true,
            start: false,
            last_used: &[],
            recent_sends: &[],
        };
        let r = spec.rate().unwrap();
        let p = WindowPacer::of(policy_set(policies, r, None, now_std()));
        async fn gap(p: &WindowPacer) -> Duration {
            p.take().await.unwrap().complete(Instant::now());
            let from = Instant::now();
            p.take().await.unwrap().complete(Instant::now());
            Instant::now() - from
        }
        let ms = |d: Duration| d.as_millis();
        assert!((105..=106).contains(&ms(gap(&p).await)));
        // A second of calls at that pace, then a 429 (the envelope learns
        // what the window accepted, which the bucket's pace stays under).
        for _ in 0..5 {
            gap(&p).await;
        }
        p.pause(Duration::from_secs(1)).await.unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(
            (110..=111).contains(&ms(gap(&p).await)),
            "twice the allowance"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_capped_key_shrinks_the_window_at_once() {
        let p = pacer(60, Duration::from_secs(1));
        assert_eq!(p.observe(&HeaderMap::new()).await, None);
        assert_eq!(p.observe(&limit_header("garbage")).await, None);
        assert_eq!(
            p.observe(&limit_header("20")).await,
            Some(PaceNote::LimitInForce(20))
        );
        assert_eq!(p.observe(&limit_header("60")).await, None, "never grows");
        let t0 = Instant::now();
        let a = greedy(p, 5, 0, t0 + Duration::from_secs(3)).await;
        assert!(max_in_window(&a, Duration::from_secs(1)) <= 20);
        assert!(a.len() >= 60, "{}", a.len());
    }

    #[tokio::test(start_paused = true)]
    async fn policies_announced_in_ietf_fields_are_all_kept() {
        let p = pacer(60, Duration::from_secs(1));
        let mut h = HeaderMap::new();
        h.insert(
            "ratelimit-policy",
            r#""a";q=20;w=1, "b";q=30;w=3, "t";q=9;w=1;qu="tokens""#
                .parse()
                .unwrap(),
        );
        let first = p.observe(&h).await;
        assert!(
            matches!(
                first,
                Some(PaceNote::Heard(Heard::Lowered { quota: 20, .. }))
            ),
            "{first:?}"
        );
        let rest: Vec<_> = std::iter::from_fn(|| p.note()).collect();
        assert!(
            matches!(
                &rest[..],
                [
                    PaceNote::Heard(Heard::Added { quota: 30, .. }),
                    PaceNote::Heard(Heard::Added {
                        quota: 9,
                        tokens: true,
                        ..
                    })
                ]
            ),
            "{rest:?}"
        );
        assert_eq!(p.observe(&h).await, None, "said once");
        assert_eq!(p.steady_per_min(), Some(600.0), "30 per 3 s");
        let t0 = Instant::now();
        let a = greedy(p, 5, 50, t0 + Duration::from_secs(9)).await;
        assert!(max_in_window(&a, Duration::from_secs(1)) <= 20);
        assert!(max_in_window(&a, Duration::from_secs(3)) <= 30);
        assert!(a.len() >= 80, "{}", a.len());
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_server_window_holds_calls_until_one_of_ours_ends() {
        let p = pacer(60, Duration::from_secs(1));
        let t0 = Instant::now();
        tokio::time::sleep(Duration::from_millis(100)).await;
        call(p.as_ref()).await;
        let mut h = HeaderMap::new();
        h.insert(crate::wire::RATE_LIMIT_REMAINING, "0".parse().unwrap());
        assert_eq!(p.observe(&h).await, None);
        call(p.as_ref()).await;
        assert_eq!(Instant::now(), t0 + Duration::from_millis(1100));
        assert!(p.paused_until().is_none(), "a hold is not a pause");
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_permit_lets_a_waiter_go_at_once() {
        let p = pacer(1, Duration::from_secs(60));
        let t0 = Instant::now();
        let held = p.take().await.unwrap();
        let waiter = {
            let p = p.clone();
            tokio::spawn(async move {
                call(p.as_ref()).await;
                Instant::now()
            })
        };
        tokio::time::sleep(Duration::from_millis(10)).await;
        drop(held);
        assert_eq!(waiter.await.unwrap(), t0 + Duration::from_millis(10));
    }

    /// A quota waited for holds every worker as a pause does, and
    /// teaches nothing: after a day's wait the run goes on at its limit.
    #[tokio::test(start_paused = true)]
    async fn a_quota_waited_for_holds_every_worker_and_teaches_nothing() {
        let p = pacer(10, Duration::from_secs(1));
        for _ in 0..4 {
            call(p.as_ref()).await;
        }
        let t0 = Instant::now();
        p.hold(Duration::from_secs(3)).await.unwrap();
        assert_eq!(p.paused_until(), Some(t0 + Duration::from_secs(3)));
        assert_eq!(p.learnt(), None);
        assert_eq!(p.observe(&HeaderMap::new()).await, None);
        for at in released(&p, 4).await {
            assert_eq!(at, t0 + Duration::from_secs(3));
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_secret_limit_is_learnt_announced_and_settled() {
        let p = pacer(10, Duration::from_secs(1));
        for _ in 0..4 {
            call(p.as_ref()).await;
        }
        // The fourth was refused, and no response carried limit headers:
        // three were accepted.
        p.pause(Duration::from_secs(1)).await.unwrap();
        assert_eq!(p.learnt().map(|l| l.limit), Some(3));
        assert_eq!(
            p.observe(&HeaderMap::new()).await,
            Some(PaceNote::Learnt(3))
        );
        assert_eq!(p.observe(&HeaderMap::new()).await, None);
        // A window without 429 once the pause is over: it holds.
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(
            p.observe(&HeaderMap::new()).await,
            Some(PaceNote::LearntSettled(3))
        );
        let t0 = Instant::now();
        let a = greedy(p.clone(), 4, 0, t0 + Duration::from_millis(900)).await;
        assert_eq!(a.len(), 3, "paced to the learnt limit");
    }

    /// Resets and windows of billions of years (garbled, or hostile) in
    /// every dialect that states them: a take fails as a quota used up
    /// until a year and a day away at most, said with its date, where the
    /// clock's arithmetic overflowed and the date's formatting panicked.
    #[tokio::test(start_paused = true)]
    async fn a_reset_or_window_of_billions_of_years_is_a_quota_used_up_for_a_year() {
        let huge = "18446744073709551615";
        let cases: [&[(&str, String)]; 5] = [
            &[
                ("ratelimit-policy", format!("\"a\";q={huge};w={huge}")),
                ("ratelimit", "\"a\";r=0;t=5".into()),
            ],
            &[
                ("x-ratelimit-limit", "10".into()),
                ("x-ratelimit-remaining", "0".into()),
                ("x-ratelimit-reset", "9223372036854775807".into()),
            ],
            &[
                ("ratelimit-limit", "10".into()),
                ("ratelimit-remaining", "0".into()),
                ("ratelimit-reset", "9223372036854775807".into()),
            ],
            &[("ratelimit", "\"d\";r=0;t=9223372036854775807".into())],
            &[
                ("ratelimit-policy", format!("\"a\";q=5;w={huge}")),
                ("ratelimit", "\"a\";r=0;t=9223372036854775807".into()),
            ],
        ];
        for case in cases {
            let mut h = HeaderMap::new();
            for (n, v) in case {
                h.insert(*n, v.parse().unwrap());
            }
            let p = pacer(100, Duration::from_secs(60));
            p.observe(&h).await;
            match p.take().await {
                Err(PaceError::QuotaExhausted { in_, resets_at, .. }) => {
                    assert!(in_ <= crate::rate::retry_after::MAX_QUOTA_RESET, "{case:?}");
                    assert!(resets_at.starts_with("20"), "{resets_at}");
                }
                // The first case's reset (5 s) is near: it holds, then goes.
                Ok(_permit) => assert_eq!(case[1].1, "\"a\";r=0;t=5"),
                Err(e) => panic!("{case:?}: {e}"),
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_quota_used_up_for_an_hour_fails_takes_unless_told_to_wait() {
        let mut h = HeaderMap::new();
        h.insert("x-ratelimit-limit", "100".parse().unwrap());
        h.insert("x-ratelimit-remaining", "0".parse().unwrap());
        h.insert("x-ratelimit-reset", "3600".parse().unwrap());
        let p = pacer(100, Duration::from_secs(60));
        p.observe(&h).await;
        let e = p.take().await.unwrap_err();
        assert!(
            matches!(&e, PaceError::QuotaExhausted { in_, .. } if *in_ == Duration::from_secs(3600)),
            "{e}"
        );
        let waits = Arc::new(
            WindowPacer::new(ExactWindow::new(100, Duration::from_secs(60), now_std()))
                .waiting_for_quota(true),
        );
        waits.observe(&h).await;
        let t0 = Instant::now();
        call(waits.as_ref()).await;
        assert_eq!(Instant::now(), t0 + Duration::from_secs(3600));
    }
}
