//! No per-period limit (Mega): calls go at once, but a 429 still pauses
//! everyone. A Mega key can still be capped below its plan: the first
//! `x-rate-limit-limit` it reports turns on a token bucket sized to that
//! limit per minute (the plans' window).

use std::sync::Mutex;
use std::time::Duration;

use reqwest::header::HeaderMap;
use tokio::time::Instant;

use super::{ready, BoxFuture, PaceError, PaceNote, Pacer, Permit};
use crate::rate::bucket::{skew_allowance, TokenBucket};
use crate::rate::Rate;

/// The pacer for an unlimited plan.
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

    fn cap(&self, cap: u64) -> Option<PaceNote> {
        let rate = Rate {
            count: cap,
            period: CAP_WINDOW,
        };
        let now = Instant::now();
        let mut s = self.lock();
        if let Some(b) = s.capped.as_mut() {
            return b
                .shrink_to(rate, now.into_std())
                .then_some(PaceNote::LimitInForce(cap));
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
        Some(PaceNote::LimitInForce(cap))
    }
}

impl Pacer for Unpaced {
    fn take(&self) -> BoxFuture<'_, Result<Permit, PaceError>> {
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
                        return Ok(Permit::untracked());
                    }
                }
            }
        })
    }

    fn pause(&self, for_: Duration) -> BoxFuture<'_, Result<(), PaceError>> {
        let now = Instant::now();
        let until = now + for_;
        let mut s = self.lock();
        s.paused_until = Some(s.paused_until.map_or(until, |old| old.max(until)));
        if let Some(b) = s.capped.as_mut() {
            b.pause_until(until.into_std(), now.into_std());
        }
        ready(Ok(()))
    }

    fn observe<'a>(&'a self, headers: &'a HeaderMap) -> BoxFuture<'a, Option<PaceNote>> {
        ready(crate::wire::limit_in_force(headers).and_then(|c| self.cap(c)))
    }

    fn paused_until(&self) -> Option<Instant> {
        let s = self.lock();
        s.paused_until.filter(|&u| u > Instant::now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pace::testing::{call, limit_header, max_in_window};

    #[tokio::test(start_paused = true)]
    async fn unpaced_only_waits_for_pauses() {
        let p = Unpaced::default();
        let t0 = Instant::now();
        for _ in 0..1000 {
            call(&p).await;
        }
        assert_eq!(Instant::now(), t0);
        p.pause(Duration::from_secs(2)).await.unwrap();
        call(&p).await;
        assert_eq!(Instant::now(), t0 + Duration::from_secs(2));
    }

    #[tokio::test(start_paused = true)]
    async fn an_unlimited_key_that_reports_a_cap_gets_paced_to_it() {
        let p = Unpaced::default();
        let t0 = Instant::now();
        for _ in 0..5 {
            call(&p).await;
        }
        assert_eq!(
            p.observe(&limit_header("20")).await,
            Some(PaceNote::LimitInForce(20))
        );
        let stamps = {
            let mut v = vec![t0; 5];
            for _ in 0..40 {
                call(&p).await;
                v.push(Instant::now());
            }
            v
        };
        let most = max_in_window(&stamps, Duration::from_secs(60));
        assert!(most <= 20, "{most} in one minute");
    }
}
