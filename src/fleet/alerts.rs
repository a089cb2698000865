//! Billing alerts once per fleet: each threshold (and the projection, the
//! exhaustion, the reserve) fires once per billing cycle across every
//! process on the key, not once per process.
//!
//! Each process still decides locally which alerts are due (the
//! [`crate::credits::CreditMeter`]); before sending one it claims it with
//! `SET batchrun:{ID}:alert:CYCLE:ALERT <who> NX`, and only the process whose
//! claim wins sends it. When Redis cannot be asked the alert is sent anyway:
//! a duplicate alert beats a missing one.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use super::Fleet;
use crate::credits::{Alert, Alerter};
use crate::util::unix_now;
use crate::util::BoxFuture;

/// How long a claim is retried before the alert is sent regardless.
const CLAIM_WITHIN: Duration = Duration::from_secs(2);
/// How long a claim is kept when the cycle's renewal is unknown.
const UNKNOWN_CYCLE_TTL: Duration = Duration::from_secs(35 * 86_400);

/// Decides which process of a fleet sends an alert.
pub trait AlertClaim: Send + Sync {
    /// True when this process is the one to send alert `id` of the billing
    /// cycle renewing at `cycle` (unix seconds; `None` when unknown).
    fn claim<'a>(&'a self, cycle: Option<u64>, id: &'a str) -> BoxFuture<'a, bool>;

    /// Forgets the claim, so the alert may fire again this cycle (an
    /// exhaustion that ended makes the next one a new outage).
    fn release<'a>(&'a self, cycle: Option<u64>, id: &'a str) -> BoxFuture<'a, ()>;
}

/// Claims in the fleet's Redis.
pub struct RedisClaim {
    fleet: Fleet,
    account: String,
    who: String,
}

impl RedisClaim {
    /// Claims alerts of the credit `account` ([`super::keys::account_of`])
    /// for this process in `fleet`.
    pub fn new(fleet: Fleet, account: String) -> RedisClaim {
        RedisClaim {
            fleet,
            account,
            who: format!("pid {}", std::process::id()),
        }
    }
}

/// A claim lasts until a day after the cycle renews.
fn claim_ttl(cycle: Option<u64>) -> Duration {
    let now = unix_now();
    match cycle.map(Duration::from_secs) {
        Some(r) if r > now => r - now + Duration::from_secs(86_400),
        _ => UNKNOWN_CYCLE_TTL,
    }
}

impl AlertClaim for RedisClaim {
    fn claim<'a>(&'a self, cycle: Option<u64>, id: &'a str) -> BoxFuture<'a, bool> {
        Box::pin(async move {
            let key = self.fleet.keys().alert(&self.account, cycle, id);
            let ttl = claim_ttl(cycle).as_millis() as u64;
            let won = self
                .fleet
                .retry(
                    CLAIM_WITHIN,
                    |mut c| {
                        let cmd = redis::cmd("SET")
                            .arg(&key)
                            .arg(&self.who)
                            .arg("NX")
                            .arg("PX")
                            .arg(ttl)
                            .clone();
                        async move { cmd.query_async::<Option<String>>(&mut c).await }
                    },
                    |_| {},
                )
                .await;
            // Unanswered: send it. A duplicate alert beats a missing one.
            won.map_or(true, |r| r.is_some())
        })
    }

    fn release<'a>(&'a self, cycle: Option<u64>, id: &'a str) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let key = self.fleet.keys().alert(&self.account, cycle, id);
            let _ = self
                .fleet
                .retry(
                    CLAIM_WITHIN,
                    |mut c| {
                        let cmd = redis::cmd("DEL").arg(&key).clone();
                        async move { cmd.query_async::<i64>(&mut c).await }
                    },
                    |_| {},
                )
                .await;
        })
    }
}

/// Sends alerts through an [`Alerter`] once per fleet, without blocking the
/// caller: the claim runs in the background, and [`FleetAlerts::settle`]
/// waits for the claims still out before the process exits.
pub struct FleetAlerts {
    claim: Arc<dyn AlertClaim>,
    pending: Arc<Pending>,
}

#[derive(Default)]
struct Pending {
    count: AtomicUsize,
    done: Notify,
}

struct PendingGuard(Arc<Pending>);

impl Drop for PendingGuard {
    fn drop(&mut self) {
        self.0.count.fetch_sub(1, Ordering::SeqCst);
        self.0.done.notify_waiters();
    }
}

impl FleetAlerts {
    /// Alerts deduplicated by `claim`.
    pub fn new(claim: Arc<dyn AlertClaim>) -> FleetAlerts {
        FleetAlerts {
            claim,
            pending: Arc::default(),
        }
    }

    /// Alerts of the credit `account` ([`super::keys::account_of`])
    /// deduplicated in `fleet`'s Redis.
    pub fn for_fleet(fleet: &Fleet, account: String) -> FleetAlerts {
        FleetAlerts::new(Arc::new(RedisClaim::new(fleet.clone(), account)))
    }

    /// Whether this process is the one to send `a`.
    pub async fn claim(&self, a: &Alert) -> bool {
        self.claim.claim(a.renewal, &a.id).await
    }

    fn spawn(&self, work: impl std::future::Future<Output = ()> + Send + 'static) -> bool {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return false;
        };
        self.pending.count.fetch_add(1, Ordering::SeqCst);
        let guard = PendingGuard(self.pending.clone());
        rt.spawn(async move {
            work.await;
            drop(guard);
        });
        true
    }

    /// Sends `a` through `alerter` unless another process of the fleet
    /// already sent it this cycle.
    pub fn send(&self, alerter: &Arc<Alerter>, a: &Alert) {
        let (claim, to, alert) = (self.claim.clone(), alerter.clone(), a.clone());
        let spawned = self.spawn(async move {
            if claim.claim(alert.renewal, &alert.id).await {
                to.send(&alert);
            }
        });
        if !spawned {
            alerter.send(a);
        }
    }

    /// Lets alert `id` of cycle `cycle` fire again in the fleet.
    pub fn release(&self, cycle: Option<u64>, id: &str) {
        let (claim, id) = (self.claim.clone(), id.to_string());
        self.spawn(async move { claim.release(cycle, &id).await });
    }

    /// Waits (at most `grace`) for the claims still out.
    pub async fn settle(&self, grace: Duration) {
        let deadline = tokio::time::Instant::now() + grace;
        loop {
            let done = self.pending.done.notified();
            if self.pending.count.load(Ordering::SeqCst) == 0 {
                return;
            }
            if tokio::time::timeout_at(deadline, done).await.is_err() {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::credits::AlertKind;
    use std::collections::HashSet;
    use std::sync::Mutex;

    /// A fleet's claims kept in memory, shared by several "processes".
    #[derive(Default)]
    struct Shared(Mutex<HashSet<String>>);

    impl AlertClaim for Shared {
        fn claim<'a>(&'a self, cycle: Option<u64>, id: &'a str) -> BoxFuture<'a, bool> {
            let won = self.0.lock().unwrap().insert(format!("{cycle:?}/{id}"));
            Box::pin(std::future::ready(won))
        }
        fn release<'a>(&'a self, cycle: Option<u64>, id: &'a str) -> BoxFuture<'a, ()> {
            self.0.lock().unwrap().remove(&format!("{cycle:?}/{id}"));
            Box::pin(std::future::ready(()))
        }
    }

    fn alert(id: &str, renewal: u64) -> Alert {
        let mut a = Alert::new(AlertKind::Threshold, id, format!("{id} reached"), None);
        a.renewal = Some(renewal);
        a
    }

    #[tokio::test]
    async fn each_alert_is_sent_by_one_process_per_cycle() {
        let shared: Arc<dyn AlertClaim> = Arc::new(Shared::default());
        let lines = Arc::new(Mutex::new(Vec::<String>::new()));
        let procs: Vec<(FleetAlerts, Arc<Alerter>)> = (0..3)
            .map(|_| {
                let l = lines.clone();
                let print: Box<dyn Fn(&str) + Send + Sync> =
                    Box::new(move |s: &str| l.lock().unwrap().push(s.to_string()));
                (
                    FleetAlerts::new(shared.clone()),
                    Arc::new(Alerter::new("job".into(), None, print)),
                )
            })
            .collect();
        for (f, a) in &procs {
            f.send(a, &alert("pct-0.5", 100));
            f.send(a, &alert("pct-0.8", 100));
        }
        // A new cycle fires again.
        procs[2].0.send(&procs[2].1, &alert("pct-0.5", 200));
        for (f, _) in &procs {
            f.settle(Duration::from_secs(1)).await;
        }
        let sent: usize = procs.iter().map(|(_, a)| a.fired().len()).sum();
        assert_eq!(sent, 3, "{:?}", lines.lock().unwrap());
        procs[0].0.release(Some(100), "pct-0.8");
        procs[0].0.settle(Duration::from_secs(1)).await;
        assert!(procs[1].0.claim(&alert("pct-0.8", 100)).await);
    }

    #[test]
    fn claims_outlive_their_cycle_by_a_day() {
        let r = unix_now().as_secs() + 10 * 86_400;
        let ttl = claim_ttl(Some(r));
        assert!(
            ttl > Duration::from_secs(11 * 86_400 - 5) && ttl <= Duration::from_secs(11 * 86_400)
        );
        assert_eq!(claim_ttl(Some(5)), UNKNOWN_CYCLE_TTL);
        assert_eq!(claim_ttl(None), UNKNOWN_CYCLE_TTL);
    }
}
