//! The SpikeArrest pacer: the async face of
//! [`SpikePace`](crate::rate::spike_pace::SpikePace), for Apigee gateways
//! where `--limit 30ps` or `1800pm` is the policy's messagesPerPeriod.

use std::sync::Arc;
use std::time::Duration;

use reqwest::header::HeaderMap;
use tokio::time::Instant;

use super::{now_std, ready, BoxFuture, Guarded, PaceError, PaceNote, Pacer, Permit, Ticket};
use crate::rate::spike_pace::SpikePace;

/// The SpikeArrest pacer, shared by every worker.
pub struct SpikePacer {
    guarded: Arc<Guarded<SpikePace>>,
}

impl SpikePacer {
    /// Paces to `mirror`.
    pub fn new(mirror: SpikePace) -> SpikePacer {
        SpikePacer {
            guarded: Guarded::new(mirror),
        }
    }
}

struct SpikeTicket {
    guarded: Arc<Guarded<SpikePace>>,
}

impl Ticket for SpikeTicket {
    fn complete(self: Box<Self>, arrived: Instant) {
        self.guarded.lock().complete(arrived.into_std());
        self.guarded.notify();
    }

    fn cancel(self: Box<Self>) {
        self.guarded.lock().cancel();
        self.guarded.notify();
    }
}

impl Pacer for SpikePacer {
    fn take(&self) -> BoxFuture<'_, Result<Permit, PaceError>> {
        Box::pin(async move {
            self.guarded.take(|s, now| s.try_take(now)).await;
            Ok(Permit::tracked(Box::new(SpikeTicket {
                guarded: self.guarded.clone(),
            })))
        })
    }

    fn pause(&self, for_: Duration) -> BoxFuture<'_, Result<(), PaceError>> {
        let now = now_std();
        self.guarded.lock().pause_until(now + for_, now);
        ready(Ok(()))
    }

    fn observe<'a>(&'a self, headers: &'a HeaderMap) -> BoxFuture<'a, Option<PaceNote>> {
        // SpikeArrest itself reports nothing; a gateway in front of another
        // limiter might, and a lower rate is then followed.
        let note = crate::wire::limit_in_force(headers).and_then(|l| {
            self.guarded
                .lock()
                .shrink_to(l, now_std())
                .then_some(PaceNote::LimitInForce(l))
        });
        ready(note)
    }

    fn paused_until(&self) -> Option<Instant> {
        self.guarded
            .lock()
            .paused_until(now_std())
            .map(Instant::from_std)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pace::testing::{call, released};
    use crate::rate::{Limit, Rate};
    use crate::sim::model::spike_arrest::SpikeArrest;
    use std::sync::Mutex;

    fn rate(s: &str) -> Rate {
        s.parse::<Limit>().unwrap().rate().unwrap()
    }

    fn pacer(r: Rate) -> Arc<SpikePacer> {
        Arc::new(SpikePacer::new(SpikePace::new(r, now_std())))
    }

    /// Greedy workers with random round trips against a SpikeArrest
    /// gateway that sees each call at a random point of its round trip.
    /// Returns (passed, refused).
    async fn against_gateway(r: Rate, workers: u64, max_rtt_ms: u64, for_: Duration) -> (u64, u64) {
        let p = pacer(r);
        let t0 = Instant::now();
        let gateway = Arc::new(Mutex::new((SpikeArrest::new(r, t0.into_std()), Vec::new())));
        let mut tasks = Vec::new();
        for seed in 0..workers {
            let (p, gateway) = (p.clone(), gateway.clone());
            tasks.push(tokio::spawn(async move {
                let mut rng = fastrand::Rng::with_seed(seed);
                while Instant::now() < t0 + for_ {
                    let permit = p.take().await.unwrap();
                    let sent = Instant::now();
                    let rtt = Duration::from_millis(rng.u64(0..=max_rtt_ms));
                    tokio::time::sleep(rtt).await;
                    let arrival = sent + rtt.mul_f64(rng.f64());
                    gateway.lock().unwrap().1.push(arrival.into_std());
                    permit.complete(Instant::now());
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let mut g = gateway.lock().unwrap();
        let (gw, arrivals) = &mut *g;
        arrivals.sort();
        let passed = arrivals
            .iter()
            .filter(|&&a| gw.try_acquire(a).is_ok())
            .count() as u64;
        (passed, arrivals.len() as u64 - passed)
    }

    #[tokio::test(start_paused = true)]
    async fn jittery_round_trips_are_never_refused() {
        // Round trips up to 50 ms: under the 100 ms a 30ps bucket of 3
        // takes to fill, so the pace is the gateway's.
        let (passed, refused) = against_gateway(rate("30ps"), 4, 50, Duration::from_secs(10)).await;
        assert_eq!(refused, 0);
        assert!(passed >= 290, "{passed} in 10 s at 30ps");
        // Round trips up to 400 ms: at most 3 in flight, so slower, and
        // still never refused.
        let (passed, refused) =
            against_gateway(rate("30ps"), 8, 400, Duration::from_secs(10)).await;
        assert_eq!(refused, 0);
        assert!(passed >= 100, "{passed}");
    }

    #[tokio::test(start_paused = true)]
    async fn per_minute_units_buy_the_burst() {
        let p = pacer(rate("1800pm"));
        let t0 = Instant::now();
        for _ in 0..180 {
            call(p.as_ref()).await;
        }
        assert_eq!(Instant::now(), t0, "the bucket of 180 is free");
        call(p.as_ref()).await;
        // One drip later, rounded up to the timer's millisecond.
        let waited = Instant::now() - t0;
        assert!(
            waited >= Duration::from_nanos(33_333_334) && waited <= Duration::from_millis(35),
            "{waited:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_pause_holds_every_worker_and_nobody_bursts_after_it() {
        let p = pacer(rate("1800pm"));
        let t0 = Instant::now();
        p.pause(Duration::from_secs(2)).await.unwrap();
        assert_eq!(p.paused_until(), Some(t0 + Duration::from_secs(2)));
        let mut at: Vec<_> = released(&p, 3).await.iter().map(|&t| t - t0).collect();
        at.sort();
        let drip = Duration::from_nanos(33_333_334);
        let start = Duration::from_secs(2);
        assert!(at[0] >= start + drip, "{at:?}");
        assert!(
            at[2] >= start + drip * 3 - Duration::from_nanos(3),
            "{at:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_permit_gives_the_token_back() {
        let p = pacer(rate("10ps"));
        let t0 = Instant::now();
        let held = p.take().await.unwrap();
        drop(held);
        call(p.as_ref()).await;
        assert_eq!(Instant::now(), t0);
    }
}
