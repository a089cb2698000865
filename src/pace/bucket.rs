//! The token-bucket pacer: one bucket shared by every worker, sized so that
//! `capacity + rate × window ≤ limit` can never overrun a sliding window.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::header::HeaderMap;
use tokio::time::Instant;

use super::{now_std, ready, BoxFuture, PaceError, PaceNote, Pacer, Permit, Ticket};
use crate::rate::bucket::TokenBucket;
use crate::rate::Rate;

/// The token-bucket pacer.
pub struct BucketPacer {
    bucket: Arc<Mutex<TokenBucket>>,
    period: Duration,
}

/// A token that goes back to the bucket if its call is never sent.
struct Token(Arc<Mutex<TokenBucket>>);

impl Ticket for Token {
    fn complete(self: Box<Self>, _arrived: Instant) {}

    fn cancel(self: Box<Self>) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).refund();
    }
}

impl BucketPacer {
    /// Wraps a bucket; `period` is the window the limit is counted over.
    pub fn new(bucket: TokenBucket, period: Duration) -> BucketPacer {
        BucketPacer {
            bucket: Arc::new(Mutex::new(bucket)),
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
    fn take(&self) -> BoxFuture<'_, Result<Permit, PaceError>> {
        Box::pin(async move {
            loop {
                let next = self.lock().try_take(now_std());
                match next {
                    Ok(()) => return Ok(Permit::tracked(Box::new(Token(self.bucket.clone())))),
                    Err(at) => tokio::time::sleep_until(Instant::from_std(at)).await,
                }
            }
        })
    }

    fn pause(&self, for_: Duration) -> BoxFuture<'_, Result<(), PaceError>> {
        let now = now_std();
        self.lock().pause_until(now + for_, now);
        ready(Ok(()))
    }

    fn observe<'a>(&'a self, headers: &'a HeaderMap) -> BoxFuture<'a, Option<PaceNote>> {
        let note = crate::wire::limit_in_force(headers).and_then(|l| {
            let rate = Rate {
                count: l,
                period: self.period,
            };
            self.lock()
                .shrink_to(rate, now_std())
                .then_some(PaceNote::LimitInForce(l))
        });
        ready(note)
    }

    fn paused_until(&self) -> Option<Instant> {
        self.lock().paused_until(now_std()).map(Instant::from_std)
    }

    /// The refill rate: after its burst, the bucket goes no faster, and a
    /// burst set near the limit leaves it far below the limit's pace.
    fn steady_per_min(&self) -> Option<f64> {
        Some(self.lock().rate_per_sec() * 60.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pace::testing::{call, limit_header, max_in_window, released};
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

    #[tokio::test(start_paused = true)]
    async fn burst_then_drip() {
        let p = starter_scaled();
        let t0 = Instant::now();
        for _ in 0..6 {
            call(&p).await;
        }
        assert_eq!(Instant::now(), t0, "the burst of 6 is free");
        call(&p).await;
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
        p.pause(Duration::from_secs(3)).await.unwrap();
        for at in released(&p, 4).await {
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
                    call(p.as_ref()).await;
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
    async fn a_call_never_sent_gives_its_token_back() {
        let p = starter_scaled();
        for _ in 0..6 {
            drop(p.take().await.unwrap());
        }
        let t0 = Instant::now();
        for _ in 0..6 {
            call(&p).await;
        }
        assert_eq!(Instant::now(), t0, "the whole burst is still there");
        call(&p).await;
        assert!(Instant::now() > t0, "but no more than the burst");
    }

    #[tokio::test(start_paused = true)]
    async fn a_capped_key_slows_the_pacer() {
        let p = starter_scaled();
        assert_eq!(p.observe(&HeaderMap::new()).await, None);
        assert_eq!(p.observe(&limit_header("garbage")).await, None);
        assert_eq!(
            p.observe(&limit_header("20")).await,
            Some(PaceNote::LimitInForce(20))
        );
        assert_eq!(p.observe(&limit_header("60")).await, None, "never grows");
        let t0 = Instant::now();
        for _ in 0..12 {
            call(&p).await;
        }
        // Capacity 2 at (20 - 2) / 1.05 s: 10 more tokens take over half a second.
        assert!(Instant::now() - t0 > Duration::from_millis(500));
    }
}
