//! `--metrics-addr`: Prometheus metrics served while the run goes, on one
//! tiny axum route (`GET /metrics`, OpenMetrics text), with the
//! `prometheus-client` crate's types and encoder.
//!
//! An observer like the job log: it only consumes what the recording loop
//! shows the sinks (calls sent and answered, 429s, ticks) and decides
//! nothing. The counters a scrape reads equal the run's summary:
//! `batchrun_requests_total` is bumped on the same event as the summary's
//! `requests`, `batchrun_rate_limited_total` on the same as its
//! `rate_limited`, and the items are read from the run's own counters on
//! every tick and at the end.
//!
//! The server is a task of the run's runtime and lives until the process
//! exits: `--metrics-linger` keeps the process up after the summary so a
//! scraper that comes every 15 s still sees a short run's final values.

use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use super::calls::Answer;
use super::timeline::Moment;

/// The run's item counts, as its counters say (over every run of the job).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Items {
    /// Items done.
    pub done: u64,
    /// Items recorded as failed.
    pub failed: u64,
    /// Items in the input.
    pub total: u64,
}

/// Reads the run's item counts: the run owns them, the metrics only look.
pub type ReadItems = Box<dyn Fn() -> Items + Send + Sync>;

/// A label set: `prometheus-client` encodes `(name, value)` pairs.
type Labels = Vec<(&'static str, String)>;

/// The latency buckets: 5 ms doubling to about 41 s (14 buckets), wide
/// enough for a fast echo and a slow model call alike.
fn latency_buckets() -> impl Iterator<Item = f64> {
    exponential_buckets(0.005, 2.0, 14)
}

/// The credits' burn-rate forecast as gauges.
struct ProjectionGauges {
    per_hour: Gauge<f64, AtomicU64>,
    runs_out_in: Gauge<f64, AtomicU64>,
    before_renewal: Gauge,
}

/// The metrics of one run, and the server that shows them.
pub struct Metrics {
    registry: Arc<Mutex<Registry>>,
    addr: SocketAddr,
    read_items: ReadItems,
    done: Counter,
    failed: Counter,
    pending: Gauge,
    requests: Counter,
    responses: Family<Labels, Counter>,
    rate_limited: Counter,
    pauses: Family<Labels, Counter>,
    paused: Family<Labels, Gauge>,
    in_flight: Gauge,
    learnt: Gauge,
    credits: Option<Gauge>,
    /// Each policy in force: what it allows and what occupies it.
    policy_limit: Family<Labels, Gauge>,
    policy_used: Family<Labels, Gauge>,
    /// The credits' forecast, registered with the first one.
    projection: Option<ProjectionGauges>,
    running: Gauge,
    latency: Histogram,
    /// Calls sent and answered, for the calls in flight.
    sent_answered: (u64, u64),
    /// The items last published, so the counters only ever go up by the
    /// difference.
    last_items: Items,
    /// The state of the last tick: a pause is counted when it begins.
    was_paused: bool,
    was_waiting: bool,
}

impl Metrics {
    /// Binds `addr` (port 0 picks one: see [`Metrics::addr`]): a usage
    /// error when it cannot be, said before the checkpoint is touched (a
    /// `--fresh` applied and then refused would have lost the job).
    pub fn bind(addr: SocketAddr) -> Result<tokio::net::TcpListener, String> {
        std::net::TcpListener::bind(addr)
            .and_then(|l| l.set_nonblocking(true).map(|()| l))
            .and_then(tokio::net::TcpListener::from_std)
            .map_err(|e| format!("--metrics-addr {addr} cannot be bound: {e}"))
    }

    /// Serves the metrics on `listener` (see [`Metrics::bind`]) from the
    /// run's runtime.
    pub fn serve(
        listener: tokio::net::TcpListener,
        limit: Option<(u64, Duration)>,
        read_items: ReadItems,
    ) -> Result<Metrics, String> {
        let addr = listener
            .local_addr()
            .map_err(|e| format!("--metrics-addr: {e}"))?;
        let m = Metrics::registered(addr, read_items);
        if let Some((count, window)) = limit {
            let mut reg = m.registry.lock().unwrap_or_else(|p| p.into_inner());
            let g: Gauge = Gauge::default();
            g.set(i64::try_from(count).unwrap_or(i64::MAX));
            reg.register(
                "batchrun_limit",
                "Calls the limit in force allows per window (--limit)",
                g,
            );
            let w = Gauge::<f64, AtomicU64>::default();
            w.set(window.as_secs_f64());
            reg.register(
                "batchrun_limit_window_seconds",
                "The window of the limit in force, in seconds",
                w,
            );
        }
        let mut m = m;
        m.running.set(1);
        m.publish_items();
        let app = axum::Router::new()
            .route("/metrics", axum::routing::get(scrape))
            .with_state(m.registry.clone());
        tokio::spawn(async move {
            // A server that dies only loses the metrics, never the run.
            let _ = axum::serve(listener, app).await;
        });
        Ok(m)
    }

    /// Every metric, registered with its help text.
    fn registered(addr: SocketAddr, read_items: ReadItems) -> Metrics {
        let mut reg = Registry::default();
        let mut m = Metrics {
            registry: Arc::default(),
            addr,
            read_items,
            done: Counter::default(),
            failed: Counter::default(),
            pending: Gauge::default(),
            requests: Counter::default(),
            responses: Family::default(),
            rate_limited: Counter::default(),
            pauses: Family::default(),
            paused: Family::default(),
            in_flight: Gauge::default(),
            learnt: Gauge::default(),
            credits: None,
            policy_limit: Family::default(),
            policy_used: Family::default(),
            projection: None,
            running: Gauge::default(),
            latency: Histogram::new(latency_buckets()),
            sent_answered: (0, 0),
            last_items: Items::default(),
            was_paused: false,
            was_waiting: false,
        };
        m.register(&mut reg);
        // Every series from the start, at 0: `increase()` and an alert
        // need the 0 before the first pause, not a series that appears.
        for c in ["rate_limit", "credits"] {
            m.pauses.get_or_create(&cause(c)).inc_by(0);
            m.paused.get_or_create(&cause(c)).set(0);
        }
        m.registry = Arc::new(Mutex::new(reg));
        m
    }

    /// Registers every metric but the balance (see [`Metrics::credits_gauge`])
    /// and the limit, with its help text.
    fn register(&self, reg: &mut Registry) {
        let m = self;
        let c = |x: &Counter| x.clone();
        reg.register(
            "batchrun_items_done",
            "Items done, over every run of the job",
            c(&m.done),
        );
        reg.register(
            "batchrun_items_failed",
            "Items recorded as failed, over every run of the job",
            c(&m.failed),
        );
        reg.register(
            "batchrun_items_pending",
            "Items neither done nor failed",
            m.pending.clone(),
        );
        reg.register(
            "batchrun_requests",
            "Calls sent by this run",
            c(&m.requests),
        );
        reg.register("batchrun_responses", "Calls of this run by what they got back: the HTTP status, or timeout, connect, connection_lost, out_of_handles, unreadable, transport_error", m.responses.clone());
        reg.register(
            "batchrun_rate_limited",
            "Rate-limit 429s this run received",
            c(&m.rate_limited),
        );
        reg.register("batchrun_pauses", "Pauses this run began, by cause: rate_limit (every worker held by a 429), credits (waiting for credits)", m.pauses.clone());
        reg.register(
            "batchrun_paused",
            "1 while the run is paused, by cause",
            m.paused.clone(),
        );
        reg.register(
            "batchrun_calls_in_flight",
            "Calls sent and not yet answered",
            m.in_flight.clone(),
        );
        reg.register(
            "batchrun_learnt_limit",
            "The limit the pacer learnt from 429s, per window (0 until it learns one)",
            m.learnt.clone(),
        );
        reg.register(
            "batchrun_policy_limit",
            "What each policy in force allows, by policy (as --limit spells it): calls or tokens per window (a learnt limit once learnt), or a bucket's burst and one",
            m.policy_limit.clone(),
        );
        reg.register(
            "batchrun_policy_used",
            "What occupies each policy in force now: the calls or tokens in its window, or the calls' worth a bucket holds",
            m.policy_used.clone(),
        );
        reg.register("batchrun_running", "1 while the run goes, 0 once it ended (while --metrics-linger serves the final values)", m.running.clone());
        reg.register(
            "batchrun_call_duration_seconds",
            "Latency of this run's answered calls",
            m.latency.clone(),
        );
    }

    /// Where the metrics are served.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A call went out.
    pub fn sent(&mut self) {
        self.requests.inc();
        self.sent_answered.0 += 1;
        self.publish_in_flight();
    }

    /// A 429 paused the run (or one worker, for concurrency).
    pub fn rate_limited(&mut self, concurrency: bool) {
        self.rate_limited.inc();
        if !concurrency && !self.was_paused {
            // Later 429s of the same overrun are the same pause.
            self.was_paused = true;
            self.pauses.get_or_create(&cause("rate_limit")).inc();
        }
    }

    /// A call came back (or failed to).
    pub fn answered(&mut self, answer: Answer, latency: Option<Duration>) {
        self.responses
            .get_or_create(&vec![("outcome", answer.key())])
            .inc();
        if let Some(l) = latency {
            self.latency.observe(l.as_secs_f64());
        }
        self.sent_answered.1 += 1;
        self.publish_in_flight();
    }

    /// A tick of the recording loop: the gauges read anew.
    pub fn tick(&mut self, m: &Moment) {
        self.publish_items();
        if m.waiting_credits && !self.was_waiting {
            self.pauses.get_or_create(&cause("credits")).inc();
        }
        self.was_paused = m.paused;
        self.was_waiting = m.waiting_credits;
        self.paused
            .get_or_create(&cause("rate_limit"))
            .set(i64::from(m.paused));
        self.paused
            .get_or_create(&cause("credits"))
            .set(i64::from(m.waiting_credits));
        self.learnt
            .set(m.learnt.map_or(0, |l| i64::try_from(l).unwrap_or(i64::MAX)));
        if let Some(c) = m.credits {
            self.credits_gauge().set(c);
        }
        for p in &m.policies {
            let l = vec![("policy", p.policy.clone())];
            let n = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
            self.policy_limit.get_or_create(&l).set(n(p.limit));
            self.policy_used.get_or_create(&l).set(n(p.used));
        }
        if let Some(p) = m.projection {
            let g = self.projection_gauges();
            g.per_hour.set(p.per_hour);
            g.runs_out_in.set(p.runs_out_in.as_secs_f64());
            g.before_renewal.set(i64::from(p.before_renewal.is_some()));
        }
    }

    /// The forecast's gauges, registered with the first forecast (it needs
    /// half an hour of spending: a 0 before would say "run out now").
    fn projection_gauges(&mut self) -> &ProjectionGauges {
        let registry = &self.registry;
        self.projection.get_or_insert_with(|| {
            let g = ProjectionGauges {
                per_hour: Gauge::default(),
                runs_out_in: Gauge::default(),
                before_renewal: Gauge::default(),
            };
            let mut reg = registry.lock().unwrap_or_else(|p| p.into_inner());
            reg.register(
                "batchrun_credits_burn_per_hour",
                "Credits spent per hour over the trailing --burn-window",
                g.per_hour.clone(),
            );
            reg.register(
                "batchrun_credits_runs_out_in_seconds",
                "How long the balance lasts at that burn rate",
                g.runs_out_in.clone(),
            );
            reg.register(
                "batchrun_credits_run_out_before_renewal",
                "1 when at that burn rate the balance runs out before the credits renew",
                g.before_renewal.clone(),
            );
            g
        })
    }

    /// The run is over: the final values stay served.
    pub fn end(&mut self, m: &Moment) {
        self.tick(m);
        self.paused.get_or_create(&cause("rate_limit")).set(0);
        self.paused.get_or_create(&cause("credits")).set(0);
        self.running.set(0);
    }

    /// The balance's gauge, registered with the first balance seen: a run
    /// whose API tells no balance has no such series (a 0 would fire a
    /// credits-low alert).
    fn credits_gauge(&mut self) -> &Gauge {
        let registry = &self.registry;
        self.credits.get_or_insert_with(|| {
            let g = Gauge::default();
            registry.lock().unwrap_or_else(|p| p.into_inner()).register(
                "batchrun_credits_remaining",
                "The last credit balance the API reported",
                g.clone(),
            );
            g
        })
    }

    fn publish_items(&mut self) {
        let now = (self.read_items)();
        let last = self.last_items;
        self.done.inc_by(now.done.saturating_sub(last.done));
        self.failed.inc_by(now.failed.saturating_sub(last.failed));
        let left = now.total.saturating_sub(now.done + now.failed);
        self.pending.set(i64::try_from(left).unwrap_or(i64::MAX));
        self.last_items = Items {
            done: last.done.max(now.done),
            failed: last.failed.max(now.failed),
            total: now.total,
        };
    }

    fn publish_in_flight(&self) {
        let (sent, answered) = self.sent_answered;
        let n = sent.saturating_sub(answered);
        self.in_flight.set(i64::try_from(n).unwrap_or(i64::MAX));
    }
}

/// `--metrics-linger`: the process stays up with the final metrics served
/// (a scraper every 15 s would miss a 5 s run's end), until `d` passes or
/// a signal comes.
pub async fn linger(d: Duration, reporter: &super::Reporter) {
    if d.is_zero() {
        return;
    }
    // Listening before the line is said: a signal sent on seeing it is
    // heard (a signal stream only hears what comes after its first poll).
    let stop = crate::sys::stop_signal();
    tokio::pin!(stop);
    tokio::select! {
        biased;
        _ = &mut stop => return,
        () = std::future::ready(()) => {}
    }
    reporter.println(&format!(
        "batchrun: serving the final metrics for {} (--metrics-linger)",
        humantime::format_duration(d)
    ));
    tokio::select! {
        _ = tokio::time::sleep(d) => {}
        _ = stop => {}
    }
}

fn cause(c: &str) -> Labels {
    vec![("cause", c.to_string())]
}

/// `GET /metrics`: the registry in the OpenMetrics text format, which
/// Prometheus reads.
async fn scrape(
    axum::extract::State(registry): axum::extract::State<Arc<Mutex<Registry>>>,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let mut body = String::new();
    let encoded = {
        let reg = registry.lock().unwrap_or_else(|p| p.into_inner());
        prometheus_client::encoding::text::encode(&mut body, &reg)
    };
    match encoded {
        Ok(()) => (
            [(
                axum::http::header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            body,
        )
            .into_response(),
        Err(_) => axum::http::StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(m: &Metrics) -> String {
        let mut out = String::new();
        let reg = m.registry.lock().unwrap();
        prometheus_client::encoding::text::encode(&mut out, &reg).unwrap();
        out
    }

    fn moment(paused: bool, credits: Option<i64>) -> Moment {
        Moment {
            paused,
            credits,
            ..Moment::default()
        }
    }

    #[test]
    fn one_overrun_is_one_pause_and_no_balance_is_no_series() {
        let items = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let read = items.clone();
        let mut m = Metrics::registered(
            "127.0.0.1:0".parse().unwrap(),
            Box::new(move || Items {
                done: read.load(std::sync::atomic::Ordering::Relaxed),
                failed: 0,
                total: 10,
            }),
        );
        for _ in 0..3 {
            m.sent();
        }
        // Three 429s of one overrun, then one after the pause ended.
        for _ in 0..3 {
            m.rate_limited(false);
        }
        m.tick(&moment(true, None));
        m.tick(&moment(false, None));
        m.rate_limited(false);
        m.answered(Answer::Status(200), Some(Duration::from_millis(3)));
        items.store(4, std::sync::atomic::Ordering::Relaxed);
        m.tick(&moment(false, None));
        let t = text(&m);
        assert!(t.contains("batchrun_rate_limited_total 4\n"), "{t}");
        assert!(
            t.contains("batchrun_pauses_total{cause=\"rate_limit\"} 2\n"),
            "{t}"
        );
        assert!(
            t.contains("batchrun_pauses_total{cause=\"credits\"} 0\n"),
            "{t}"
        );
        assert!(t.contains("batchrun_calls_in_flight 2\n"), "{t}");
        assert!(t.contains("batchrun_items_done_total 4\n"), "{t}");
        assert!(t.contains("batchrun_items_pending 6\n"), "{t}");
        assert!(
            t.contains("batchrun_call_duration_seconds_bucket{le=\"0.005\"} 1\n"),
            "{t}"
        );
        assert!(!t.contains("batchrun_credits_remaining"), "{t}");
        m.end(&moment(false, Some(7)));
        let t = text(&m);
        assert!(t.contains("batchrun_credits_remaining 7\n"), "{t}");
        assert!(t.contains("batchrun_running 0\n"), "{t}");
    }

    #[test]
    fn every_policy_in_force_and_the_forecast_are_gauges() {
        let mut m = Metrics::registered("127.0.0.1:0".parse().unwrap(), Box::new(Items::default));
        let occ = |policy: &str, limit, used| crate::rate::Occupancy {
            policy: policy.to_string(),
            limit,
            used,
        };
        m.tick(&Moment {
            policies: vec![occ("10ps", 10, 7), occ("1000/1h,fixed", 1000, 412)],
            ..Moment::default()
        });
        let t = text(&m);
        assert!(
            t.contains("batchrun_policy_used{policy=\"1000/1h,fixed\"} 412\n"),
            "{t}"
        );
        assert!(
            t.contains("batchrun_policy_limit{policy=\"10ps\"} 10\n"),
            "{t}"
        );
        assert!(!t.contains("batchrun_credits_runs_out_in_seconds"), "{t}");
        m.tick(&Moment {
            projection: Some(crate::credits::Projection {
                per_hour: 250.0,
                runs_out_in: Duration::from_secs(7200),
                before_renewal: Some(Duration::from_secs(60)),
            }),
            ..Moment::default()
        });
        let t = text(&m);
        assert!(
            t.contains("batchrun_credits_runs_out_in_seconds 7200.0\n"),
            "{t}"
        );
        assert!(
            t.contains("batchrun_credits_run_out_before_renewal 1\n"),
            "{t}"
        );
        assert!(t.contains("batchrun_credits_burn_per_hour 250.0\n"), "{t}");
    }
}
