//! When may the next call go? The async face of the pure rate logic.
//!
//! The pool only sees the [`Pacer`] interface (take / pause / observe), so an
//! exact sliding-window pacer or a pacer shared through Redis can slot in
//! without touching the pool.

use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::time::Duration;

use reqwest::header::HeaderMap;
use tokio::time::Instant;

use crate::rate::bucket::{skew_allowance, TokenBucket};
use crate::rate::Rate;

/// A boxed future, so `Pacer` can be used as a trait object.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Decides when each call may start. Shared by every worker of a run.
pub trait Pacer: Send + Sync {
    /// Waits until one call may start, and claims it.
    fn take(&self) -> BoxFuture<'_, ()>;

    /// A rate-limit 429 arrived: every worker waits `for_` before its next
    /// call, and nobody bursts when the pause ends.
    fn pause(&self, for_: Duration);

    /// Sees every response's headers. The bucket reads the limit the server
    /// says is in force (`x-rate-limit-limit`), so a key capped below its plan
    /// slows it down; it returns that new limit when it changed.
    fn observe(&self, headers: &HeaderMap) -> Option<u64>;

    /// When the current pause ends, if one is in force.
    fn paused_until(&self) -> Option<Instant>;
}

/// `x-rate-limit-limit`, when present and a whole number.
fn limit_in_force(headers: &HeaderMap) -> Option<u64> {
    headers
        .get("x-rate-limit-limit")?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// The token-bucket pacer from the design: one bucket shared by every worker.
pub struct BucketPacer {
    bucket: Mutex<TokenBucket>,
    period: Duration,
}

fn now_std() -> std::time::Instant {
    Instant::now().into_std()
}

impl BucketPacer {
    /// Wraps a bucket; `period` is the window the limit is counted over.
    pub fn new(bucket: TokenBucket, period: Duration) -> BucketPacer {
        BucketPacer {
            bucket: Mutex::new(bucket),
            period,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, TokenBucket> {
        // A panic while holding this lock cannot leave the bucket in a state
        // worse than stale, so carry on with it.
        self.bucket.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Pacer for BucketPacer {
    fn take(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            loop {
                let next = self.lock().try_take(now_std());
                match next {
                    Ok(()) => return,
                    Err(at) => tokio::time::sleep_until(Instant::from_std(at)).await,
                }
            }
        })
    }

    fn pause(&self, for_: Duration) {
        let now = now_std();
        self.lock().pause_until(now + for_, now);
    }

    fn observe(&self, headers: &HeaderMap) -> Option<u64> {
        let limit_in_force = limit_in_force(headers).filter(|&l| l > 0)?;
        let rate = Rate {
            count: limit_in_force,
            period: self.period,
        };
        self.lock()
            .shrink_to(rate, now_std())
            .then_some(limit_in_force)
    }

    fn paused_until(&self) -> Option<Instant> {
        self.lock().paused_until(now_std()).map(Instant::from_std)
    }
}

/// No per-period limit (Mega): calls go at once, but a 429 still pauses
/// everyone. A Mega key can still be capped below its plan: the first
/// `x-rate-limit-limit` it reports turns on a token bucket sized to that
/// limit per minute (the plans' window).
pub struct Unpaced {
    state: Mutex<UnpacedState>,
}

struct UnpacedState {
    paused_until: Option<Instant>,
    capped: Option<TokenBucket>,
    started: Instant,
    taken: u64,
}

impl Default for Unpaced {
    fn default() -> Self {
        Unpaced {
            state: Mutex::new(UnpacedState {
                paused_until: None,
                capped: None,
                started: Instant::now(),
                taken: 0,
            }),
        }
    }
}

/// The window a cap reported without one is read against.
const CAP_WINDOW: Duration = Duration::from_secs(60);

impl Unpaced {
    fn lock(&self) -> std::sync::MutexGuard<'_, UnpacedState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Pacer for Unpaced {
    fn take(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            loop {
                let wait = {
                    let mut s = self.lock();
                    let now = Instant::now();
                    match (s.paused_until.filter(|&u| u > now), s.capped.as_mut()) {
                        (Some(until), _) => Some(until),
                        (None, Some(b)) => b.try_take(now.into_std()).err().map(Instant::from_std),
                        (None, None) => None,
                    }
                };
                match wait {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => {
                        self.lock().taken += 1;
                        return;
                    }
                }
            }
        })
    }

    fn pause(&self, for_: Duration) {
        let now = Instant::now();
        let until = now + for_;
        let mut s = self.lock();
        s.paused_until = Some(s.paused_until.map_or(until, |old| old.max(until)));
        if let Some(b) = s.capped.as_mut() {
            b.pause_until(until.into_std(), now.into_std());
        }
    }

    fn observe(&self, headers: &HeaderMap) -> Option<u64> {
        let cap = limit_in_force(headers).filter(|&l| l > 0)?;
        let rate = Rate {
            count: cap,
            period: CAP_WINDOW,
        };
        let now = Instant::now();
        let mut s = self.lock();
        if let Some(b) = s.capped.as_mut() {
            return b.shrink_to(rate, now.into_std()).then_some(cap);
        }
        let mut b = TokenBucket::for_limit(rate, None, true, now.into_std()).ok()?;
        // Calls already sent inside this window count against the cap.
        if now.saturating_duration_since(s.started) < CAP_WINDOW + skew_allowance(CAP_WINDOW) {
            b.owe(s.taken);
        }
        if let Some(until) = s.paused_until {
            b.pause_until(until.into_std(), now.into_std());
        }
        s.capped = Some(b);
        Some(cap)
    }

    fn paused_until(&self) -> Option<Instant> {
        let s = self.lock();
        s.paused_until.filter(|&u| u > Instant::now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn starter_scaled() -> BucketPacer {
        // 60 per second: capacity 6, refill (60 - 6) / 1.05 s.
        let r = Rate {
            count: 60,
            period: Duration::from_secs(1),
        };
        BucketPacer::new(
            TokenBucket::for_limit(r, None, false, now_std()).unwrap(),
            r.period,
        )
    }

    /// A response's headers carrying `x-rate-limit-limit: l`.
    fn limit_header(l: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert("x-rate-limit-limit", l.parse().unwrap());
        h
    }

    /// The most release times (sorted) inside any span shorter than `w`.
    fn max_in_window(stamps: &[Instant], w: Duration) -> usize {
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

    #[tokio::test(start_paused = true)]
    async fn burst_then_drip() {
        let p = starter_scaled();
        let t0 = Instant::now();
        for _ in 0..6 {
            p.take().await;
        }
        assert_eq!(Instant::now(), t0, "the burst of 6 is free");
        p.take().await;
        let waited = Instant::now() - t0;
        let drip = Duration::from_secs_f64(1.05 / 54.0);
        assert!(
            waited >= drip && waited < drip + Duration::from_millis(2),
            "{waited:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn pause_holds_every_worker() {
        let p = Arc::new(starter_scaled());
        let t0 = Instant::now();
        p.pause(Duration::from_secs(3));
        let mut tasks = Vec::new();
        for _ in 0..4 {
            let p = p.clone();
            tasks.push(tokio::spawn(async move {
                p.take().await;
                Instant::now()
            }));
        }
        for t in tasks {
            let at = t.await.unwrap();
            assert!(at >= t0 + Duration::from_secs(3), "{:?}", at - t0);
        }
        assert!(p.paused_until().is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn one_minute_of_greedy_workers_stays_under_the_limit() {
        let p = Arc::new(starter_scaled());
        let t0 = Instant::now();
        let stamps = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for _ in 0..5 {
            let (p, stamps) = (p.clone(), stamps.clone());
            tasks.push(tokio::spawn(async move {
                while Instant::now() < t0 + Duration::from_secs(10) {
                    p.take().await;
                    stamps.lock().unwrap().push(Instant::now());
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let s = stamps.lock().unwrap();
        let most = max_in_window(&s, Duration::from_secs(1));
        assert!(most <= 60, "{most} in one window");
        assert!(s.len() >= 500, "too slow: {}", s.len());
    }

    #[tokio::test(start_paused = true)]
    async fn unpaced_only_waits_for_pauses() {
        let p = Unpaced::default();
        let t0 = Instant::now();
        for _ in 0..1000 {
            p.take().await;
        }
        assert_eq!(Instant::now(), t0);
        p.pause(Duration::from_secs(2));
        p.take().await;
        assert_eq!(Instant::now(), t0 + Duration::from_secs(2));
    }

    #[tokio::test(start_paused = true)]
    async fn an_unlimited_key_that_reports_a_cap_gets_paced_to_it() {
        let p = Unpaced::default();
        let t0 = Instant::now();
        for _ in 0..5 {
            p.take().await;
        }
        assert_eq!(p.observe(&limit_header("20")), Some(20));
        let stamps = {
            let mut v = vec![t0; 5];
            for _ in 0..40 {
                p.take().await;
                v.push(Instant::now());
            }
            v
        };
        let most = max_in_window(&stamps, Duration::from_secs(60));
        assert!(most <= 20, "{most} in one minute");
    }

    #[tokio::test(start_paused = true)]
    async fn a_capped_key_slows_the_pacer() {
        let p = starter_scaled();
        assert_eq!(p.observe(&HeaderMap::new()), None);
        assert_eq!(p.observe(&limit_header("garbage")), None);
        assert_eq!(p.observe(&limit_header("20")), Some(20));
        assert_eq!(p.observe(&limit_header("60")), None, "never grows");
        let t0 = Instant::now();
        for _ in 0..12 {
            p.take().await;
        }
        // Capacity 2 at (20 - 2) / 1.05 s: 10 more tokens take over half a second.
        assert!(Instant::now() - t0 > Duration::from_millis(500));
    }
}
