//! The run: a fixed pool of workers behind one pacer, a checkpoint that
//! records every item, and a clean stop for credits, Ctrl-C or a rejected key.
//!
//! [`run`] reads as the pipeline: check the input, open the job, build the
//! pacer and the pool, feed it, record what it reports, end the run.
//! Workers send [`events::Event`]s to one loop ([`recorder`]) that records
//! them and shows the progress; the reporter and the alerter consume what
//! that loop sees.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio::sync::mpsc;
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

mod admit;
mod alone;
mod batch;
mod batch_pool;
mod batch_settle;
mod csv_out;
mod damage;
pub mod events;
mod feeder;
pub mod finish;
mod fleet;
pub mod gate;
pub mod job;
pub mod keys;
mod layouts;
mod open;
pub mod outputs;
mod owner;
pub mod pool;
mod react;
pub mod recorder;
mod regen;
mod repeats;
mod send;
mod slots;
mod start;
mod supervise;
#[cfg(test)]
mod tests;
mod ticks;
pub mod watch;
mod worker;

use crate::checkpoint::{Committer, JobMeta};
use crate::credits::{self, Alerter, CreditMeter, Ledger, MeterConfig, ReserveConfig};
use crate::exit::{RunError, Signal};
use crate::fleet::{Fleet, FleetAlerts};
use crate::input;
use crate::pace::{self, Pacer};
use crate::rate::backoff::Backoff;
use crate::report::{Reporter, Summary};
use crate::settings::{CreditSettings, PoolSize, Settings};
use crate::transport::HttpTransport;
use damage::checkpoint_failed;
use events::{Event, Stats};
use finish::{Ending, FeederResult};
use gate::{Gate, Halt};
use open::{open_job, Opened};
use pool::{Pool, PoolConfig, Queue, Queued};
use recorder::{Recorded, Recorder, Signals};
use start::{announce, dry_run, steady_per_min};
use supervise::supervise;
use ticks::{Gauges, Publish, Ticks};

/// How long in-flight calls get to finish after Ctrl-C before they are abandoned.
pub const INTERRUPT_GRACE: Duration = Duration::from_secs(5);
/// How long the pacer may take to hand back what it owes once a signal
/// stopped the run.
const STOP_FLUSH_WITHIN: Duration = Duration::from_secs(1);

/// Runs a job to its end: done, halted, interrupted or failed. Each call
/// of `signals` waits for the next Ctrl-C or SIGTERM: the first stops the
/// run cleanly, a second abandons the calls still in flight at once.
pub async fn run<F>(
    mut settings: Settings,
    signals: impl Fn() -> F + Send + 'static,
) -> Result<Summary, RunError>
where
    F: Future<Output = Signal> + Send + 'static,
{
    let started = Instant::now();
    crate::sys::ensure_open_files(settings.concurrency as u64).map_err(RunError::Usage)?;
    crate::sys::file_size_limit_is_an_error();
    // 1. The input, readable more than once.
    spool_input(&mut settings)?;
    let _spool = SpoolGuard(settings.spooled.as_ref().map(|_| settings.input.clone()));
    if let Some(n) = settings.dry_run {
        // A batch job shows its first batch, as it would be sent.
        let n = match &settings.batch {
            Some(b) => batch_pool::show_first_batch(&settings, b).map(|()| 0)?,
            None => n,
        };
        return dry_run(&settings, n, started);
    }
    // A fleet's Redis must answer before anything else happens.
    let fleet = fleet::join(&settings).await?;
    // A taken address refuses the run before the checkpoint is touched.
    let listener = (settings.metrics_addr)
        .map(crate::report::metrics::Metrics::bind)
        .transpose()
        .map_err(RunError::Usage)?;
    // 2. The checkpoint, then the whole input checked before any request
    //    (a shard checks every item too, and counts its own).
    let job = open_job(&settings)?;
    // 3. Credits: the meter, the alerts, the balance and the reserve.
    let (shared, meter) = Shared::open(&settings, &job, fleet.as_ref(), started)?;
    // 4. The pacer and the pool.
    let (pacer, default_pause) = build_pacer(&settings, fleet.as_ref(), &job.meta)?;
    let (events, reports) = mpsc::unbounded_channel();
    let paced = (pacer, default_pause);
    let pool = build_pool(&settings, &job.meta, paced, &shared.ledger, events)?;
    // Nothing refuses the run from here but what it leaves the fleet for.
    let told = match &fleet {
        Some(f) => Some(fleet::enter(&settings, f).await),
        None => None,
    };
    let items = (job.pending(), job.scan.total);
    announce(
        &settings,
        (&job.meta, items, job.formation.as_ref()),
        pool.pacer.as_ref(),
        &shared.reporter,
    );
    let ran = drive(
        &settings,
        &job,
        pool,
        &shared,
        meter,
        (reports, listener),
        signals,
    )
    .await;
    if let Some(told) = told {
        told.leave().await;
    }
    let summary = ran?;
    if settings.metrics_addr.is_some() {
        crate::report::metrics::linger(settings.metrics_linger, &shared.reporter).await;
    }
    Ok(summary)
}

/// Steps 5 and 6 of [`run`]: feeds the pool (unless the reserve refuses
/// before any call), records what it reports and hears the signals; then
/// ends the run.
async fn drive<F>(
    settings: &Settings,
    job: &Opened,
    pool: Arc<Pool>,
    shared: &Shared,
    meter: CreditMeter,
    (reports, listener): (
        mpsc::UnboundedReceiver<Event>,
        Option<tokio::net::TcpListener>,
    ),
    signals: impl Fn() -> F + Send + 'static,
) -> Result<Summary, RunError>
where
    F: Future<Output = Signal> + Send + 'static,
{
    let (stops, stopped) = mpsc::unbounded_channel();
    // Listening before the first call goes out: a signal stream hears only
    // what comes after its first poll, and until then a Ctrl-C kills the
    // process instead of stopping the run cleanly.
    let mut first = Box::pin(signals());
    let heard_already = futures_util::FutureExt::now_or_never(first.as_mut()).is_some();
    let signals = Signals {
        next: Box::new(signals),
        stops,
        first: (!heard_already).then_some(first),
    };
    let observers = (reports, signals, listener);
    let mut running = start(settings, job, &pool, shared, meter, observers)?;
    // 6. Wait for the pool, or a signal; then end the run.
    supervise(&pool, &mut running.workers, stopped).await;
    let (halt, recorded, feeder) = running.wind_down(pool).await?;
    finish::finish(shared.ending(settings, job), halt, recorded, feeder).await
}

/// `--metrics-addr`: the server, on the address bound before the
/// checkpoint was opened, reading the run's own item counters.
fn metrics(
    settings: &Settings,
    job: &Opened,
    shared: &Shared,
    listener: Option<tokio::net::TcpListener>,
) -> Result<Option<crate::report::metrics::Metrics>, RunError> {
    let Some(listener) = listener else {
        return Ok(None);
    };
    let (stats, total) = (shared.stats.clone(), job.scan.total);
    let items = Box::new(move || crate::report::metrics::Items {
        done: Stats::get(&stats.done),
        failed: Stats::get(&stats.failed),
        total,
    });
    let limit = settings.limit.rate().map(|r| (r.count, r.period));
    let m =
        crate::report::metrics::Metrics::serve(listener, limit, items).map_err(RunError::Usage)?;
    shared
        .reporter
        .say(&format!("batchrun: metrics on http://{}/metrics", m.addr()));
    Ok(Some(m))
}

/// A pipe can be read only once: it is copied into the state dir first
/// (named by its content: the same content, or more of it, resumes the
/// same job; see [`job::locate`]).
fn spool_input(settings: &mut Settings) -> Result<(), RunError> {
    let spooled = tokio::task::block_in_place(|| {
        input::spool(&settings.input, &settings.state_dir.join("spool"))
    })?;
    if spooled.unterminated {
        // A writer that died mid-line leaves its last item cut short, and
        // a CSV row cut within its last field still parses.
        crate::report::err_line(&format!(
            "batchrun: warning: {}'s last line ends without a newline: if what wrote it \
             stopped part-way, that item is cut short (check it in the results)",
            input::label(&settings.input)
        ));
    }
    if spooled.spooled {
        settings.input = spooled.path;
        settings.spooled = spooled.sha256;
    }
    Ok(())
}

/// Removes a pipe's spooled copy when the run ends, however it ends: the
/// checkpoint keeps what the job needs of it (its fingerprint and length),
/// and the next run spools the pipe again.
struct SpoolGuard(Option<std::path::PathBuf>);

impl Drop for SpoolGuard {
    fn drop(&mut self) {
        if let Some(p) = &self.0 {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// What the run's parts share from the start to the summary.
struct Shared {
    /// Progress and notes.
    reporter: Arc<Reporter>,
    /// Billing alerts.
    alerter: Arc<Alerter>,
    /// The balance and the reserve.
    ledger: Arc<Ledger>,
    /// The counters.
    stats: Arc<Stats>,
    /// With `--redis`: the fleet decides which process sends an alert.
    fleet_alerts: Option<Arc<FleetAlerts>>,
    /// When the run started.
    started: Instant,
}

impl Shared {
    /// The reporter, the alerts, and the balance and meter as the
    /// checkpoint last saw them.
    fn open(
        settings: &Settings,
        job: &Opened,
        fleet: Option<&Fleet>,
        started: Instant,
    ) -> Result<(Shared, CreditMeter), RunError> {
        let meta = &job.meta;
        let reporter = Arc::new(Reporter::new(job.scan.total, settings.style));
        let c = &settings.credits;
        let alerter = Alerter::new(meta.id.clone(), c.webhook.clone(), reporter.printer())
            .for_input(&settings.input);
        let restored = job
            .store
            .meter_state(&settings.origin)
            .context("reading the checkpoint")?
            .unwrap_or_else(|| meta.meter.clone());
        let reserve = c.reserve.map(|floor| ReserveConfig {
            floor,
            require_full: c.require_full,
            pending_at_start: job.pending(),
            per_call: settings.batch.as_ref().map_or(1, |b| b.size.max(1) as u64),
            // Not while a killed run's calls may have run: the lone item
            // could be one of them.
            alone: !meta.unsettled,
        });
        let ledger = Ledger::new(
            restored.last,
            reserve,
            meta.cost_per_item,
            restored.out_of_credits(),
        );
        let config = MeterConfig {
            thresholds: c.alert_at.clone(),
            burn_window: c.burn_window,
            in_flight: settings.concurrency as u64,
        };
        let meter = CreditMeter::new(config, Some(restored));
        let shared = Shared {
            reporter,
            alerter: Arc::new(alerter),
            ledger,
            stats: Arc::new(Stats::resumed(meta.counts())),
            fleet_alerts: fleet.map(|f| {
                let key = settings.request.key.as_ref().map_or("", |k| k.expose());
                let account = crate::fleet::keys::account_of(&settings.origin, key);
                Arc::new(FleetAlerts::for_fleet(f, account))
            }),
            started,
        };
        Ok((shared, meter))
    }

    /// What the end of the run reads.
    fn ending<'a>(&'a self, settings: &'a Settings, job: &'a Opened) -> Ending<'a> {
        Ending {
            settings,
            store: &job.store,
            items: &job.items,
            reporter: &self.reporter,
            alerter: &self.alerter,
            stats: &self.stats,
            ledger: &self.ledger,
            total: job.scan.total,
            started: self.started,
            fleet_alerts: self.fleet_alerts.as_deref(),
        }
    }
}

/// The calls the job's timeline shows sent within its longest told window
/// of calls, for a resume to count in a policy the last run kept no record
/// of ([`pace::Policies::recent_sends`]). None where a call counts as its
/// items (`--batch-weight items`): the timeline counts calls.
fn recent_sends(settings: &Settings, meta: &JobMeta) -> Vec<(u64, u32)> {
    let by_items =
        (settings.batch.as_ref()).is_some_and(|b| b.weight == crate::request::BatchWeight::Items);
    let longest = (settings.policies.iter())
        .filter(|p| p.unit == crate::rate::policy::Unit::Calls)
        .filter_map(|p| p.rate())
        .map(|r| r.period)
        .max();
    let (Some(longest), false) = (longest, by_items) else {
        return Vec::new();
    };
    let since = crate::util::unix_now().saturating_sub(longest).as_secs();
    let path = crate::report::timeline::path(&settings.state_dir, &meta.id);
    // Unreadable: the last run's own record of its use still counts.
    crate::report::timeline::sent_since(&path, since).unwrap_or_default()
}

/// The pacer, and the pause of a 429 without a usable Retry-After.
type Paced = (Arc<dyn Pacer>, Duration);

/// The fleet's pacer, or this process's own for the limit (resuming what
/// the job learnt and its last call's time).
fn build_pacer(
    settings: &Settings,
    fleet: Option<&Fleet>,
    meta: &JobMeta,
) -> Result<Paced, RunError> {
    match fleet {
        Some(f) => {
            use crate::fleet::pacer::{fleet_policies, for_fleet, FleetPacing, FleetRule};
            let (limit, rest) = fleet_policies(settings.limit, &settings.policies);
            for_fleet(
                f.clone(),
                FleetPacing {
                    limit,
                    concurrency: settings.concurrency,
                    timeout: settings.timeout,
                    wait_for_quota: settings.wait_for_quota,
                    shape_unknown: settings.shape_unknown,
                    learnt: job::learnt(meta),
                    ran_lately: {
                        let last = last_active(settings, meta);
                        !last.is_zero()
                            && crate::util::unix_now().saturating_sub(last)
                                < Duration::from_secs(3600)
                    },
                },
                FleetRule::of(settings.pacer, settings.burst),
                &rest,
            )
            .map_err(|e| RunError::Usage(e.to_string()))
        }
        None => pace::for_limits(
            settings.pacer,
            settings.limit,
            pace::Policies {
                recent_sends: &recent_sends(settings, meta),
                specs: &settings.policies,
                wait_for_quota: settings.wait_for_quota,
                learn_shape: !settings
                    .batch
                    .as_ref()
                    .is_some_and(|b| b.weight == crate::request::BatchWeight::Items),
                start: settings.shape_unknown,
                last_used: &meta.last_used,
            },
            settings.burst,
            job::learnt(meta),
            last_active(settings, meta),
            crate::util::unix_now(),
        )
        .map_err(|e| RunError::Usage(e.to_string())),
    }
}

/// When the API last saw a call of this job or of the last one on its
/// origin (unix time; zero for never). A rehearsal's in-process sim is new
/// with every run: no window of it outlives its run.
pub(super) fn last_active(settings: &Settings, meta: &JobMeta) -> Duration {
    match settings.origin == crate::settings::SIM_ORIGIN {
        true => Duration::ZERO,
        false => Duration::from_millis(meta.last_active_unix_ms),
    }
}

/// The pool: what to send, how, when, and what a call's outcome leads to.
fn build_pool(
    settings: &Settings,
    meta: &JobMeta,
    (pacer, default_pause): Paced,
    ledger: &Arc<Ledger>,
    events: mpsc::UnboundedSender<Event>,
) -> Result<Arc<Pool>, RunError> {
    // A batch's answer holds every item's result: each may be --max-body.
    let cap = match &settings.batch {
        Some(b) => batch::answer_cap(settings.max_body, b.size),
        None => settings.max_body,
    };
    let transport = HttpTransport::new(settings.timeout, settings.concurrency, cap)
        .context("building the HTTP client")?;
    let c = &settings.credits;
    Ok(Arc::new(Pool {
        spec: settings.request.clone(),
        transport: Arc::new(transport),
        pacer,
        gate: Arc::new(Gate::new(c.probe_every)),
        ledger: ledger.clone(),
        events,
        cfg: PoolConfig {
            keys: job::key_scheme(meta, &settings.request),
            policy: react::Policy {
                max_attempts: settings.max_attempts,
                default_pause,
                backoff: Backoff::default(),
                wait_for_credits: c.wait_for_credits,
                max_wait: settings.max_wait,
                wait_for_quota: settings.wait_for_quota,
            },
            verbose: settings.verbose,
            cost: Some(Arc::new(settings.costing.clone())),
            max_body: settings.max_body,
        },
        limited_since: std::sync::Mutex::new(None),
        got_through: Default::default(),
        refusals_in_a_row: Default::default(),
        deferred: Default::default(),
        long_wait_said: Default::default(),
        scrub_said: Default::default(),
        watch: watch::Watch::new(settings.fail_fast, settings.max_failures).with_silence(
            watch::SilenceLimit::for_concurrency(
                match settings.pool {
                    PoolSize::Grows(start) => start,
                    PoolSize::Fixed => settings.concurrency,
                },
                settings.timeout,
            ),
        ),
        slots: Arc::new(slots(settings)),
    }))
}

/// The calls in flight: fixed, or growing to what the limit needs.
fn slots(settings: &Settings) -> pool::Slots {
    let per_second = settings.limit.rate().map(|r| r.per_second());
    match settings.pool {
        PoolSize::Fixed => pool::Slots::sized(
            settings.concurrency,
            settings.concurrency,
            false,
            per_second,
        ),
        PoolSize::Grows(start) => pool::Slots::sized(start, settings.concurrency, true, per_second),
    }
}

/// What goes on while the pool works.
struct Running {
    workers: JoinSet<()>,
    /// The feeder's queue, held so that closing it lets the feeder end.
    queue: Queue,
    feeder: JoinHandle<anyhow::Result<()>>,
    recorder: JoinHandle<Recorded>,
}

/// Starts the feeder, the workers and the recording loop.
/// What the run's observers hear from: the pool's events, the signals,
/// and the metrics' listener when `--metrics-addr` bound one.
type Observers<F> = (
    mpsc::UnboundedReceiver<Event>,
    Signals<F>,
    Option<tokio::net::TcpListener>,
);

fn start<F>(
    settings: &Settings,
    job: &Opened,
    pool: &Arc<Pool>,
    shared: &Shared,
    meter: CreditMeter,
    (reports, signals, listener): Observers<F>,
) -> Result<Running, RunError>
where
    F: Future<Output = Signal> + Send + 'static,
{
    // Before any call: a job log that cannot be written stops here.
    let sinks = crate::report::sinks::Sinks::open(
        &crate::report::sinks::SinkPaths {
            joblog: settings.joblog.as_deref(),
            timeline: Some(&crate::report::timeline::path(
                &settings.state_dir,
                &job.meta.id,
            )),
            limit: settings.limit.rate().map(|r| (r.count, r.period)),
        },
        shared.reporter.printer(),
    )
    .map_err(RunError::Usage)?
    .with_metrics(metrics(settings, job, shared, listener)?);
    let (meta, committer) = job.start_recording(&settings.state_dir)?;
    // No call may go out that cannot be recorded: a failed write (a full
    // disk) stops the pool at once, not at the end of the input.
    committer.on_failure({
        let gate = pool.gate.clone();
        let dir = settings.state_dir.clone();
        move |e| gate.stop(Halt::Checkpoint(checkpoint_failed(&dir, e)))
    });
    // A batch worker waits for a whole batch: room for two per worker.
    let room = settings.batch.as_ref().map_or(1, |b| b.size.max(1));
    let (item_tx, item_rx) = mpsc::channel::<Queued>(settings.concurrency * 2 * room);
    // Only keys that follow content need the counts.
    let repeats = match job.meta.keys_by_content {
        true => std::mem::take(&mut *job.repeats.lock().unwrap_or_else(|p| p.into_inner())),
        false => repeats::Counter::default(),
    };
    let feeder = feeder::spawn(
        feeder::Source::of(settings, &job.meta, job.formation.as_ref()),
        repeats,
        job.items.clone(),
        job.scan.total,
        committer.backlog(),
        item_tx,
    );
    precheck(
        &settings.credits,
        pool,
        &job.meta,
        job.pending(),
        &shared.reporter,
    );
    let queue: Queue = Arc::new(tokio::sync::Mutex::new(item_rx));
    let mut workers = JoinSet::new();
    let batching = settings.batch.clone().map(|spec| {
        let states = job.items.states();
        let alone = alone::Alone::open(&settings.state_dir, &job.meta.id, &states);
        batch_pool::Batching::new(spec, alone)
    });
    for _ in 0..settings.concurrency {
        match &batching {
            Some(b) => workers.spawn(pool.clone().batch_worker(queue.clone(), b.clone())),
            None => workers.spawn(pool.clone().worker(queue.clone())),
        };
    }
    let recorder = recorder(settings, job, pool, shared, (meta, meter), committer, sinks);
    Ok(Running {
        workers,
        queue,
        feeder,
        recorder: tokio::spawn(recorder.run(reports, signals)),
    })
}

/// The recording loop, over the pool's shared parts (never the pool
/// itself, whose end closes the loop's channel).
fn recorder(
    settings: &Settings,
    job: &Opened,
    pool: &Pool,
    shared: &Shared,
    (meta, meter): (JobMeta, CreditMeter),
    committer: Committer,
    sinks: crate::report::sinks::Sinks,
) -> Recorder {
    let gauges = Gauges {
        slots: pool.slots.clone(),
        pacer: pool.pacer.clone(),
        gate: pool.gate.clone(),
        ledger: pool.ledger.clone(),
    };
    let publish = Publish {
        state_dir: settings.state_dir.clone(),
        job: job.meta.id.clone(),
        input: job.meta.input.clone(),
        total: job.scan.total,
        started_unix_ms: crate::util::unix_now().as_millis() as u64,
        before: (job.meta.requests, job.meta.rate_limited),
    };
    let steady = steady_per_min(settings);
    Recorder {
        stats: shared.stats.clone(),
        committer,
        reporter: shared.reporter.clone(),
        alerter: shared.alerter.clone(),
        meta,
        meter,
        origin: settings.origin.clone(),
        fleet_alerts: shared.fleet_alerts.clone(),
        announced_until: None,
        calls: Default::default(),
        ticks: Ticks::new(gauges, publish, shared.started, steady),
        sinks,
    }
}

impl Running {
    /// The pool is over: what the watch still holds is recorded, the pacer
    /// hands back what it owes, and the feeder and the recording loop end.
    async fn wind_down(
        self,
        pool: Arc<Pool>,
    ) -> Result<(Option<Halt>, Recorded, FeederResult), RunError> {
        if !pool.gate.is_stopped() {
            pool.release_held();
        }
        pool.gate.close();
        let halt = pool.gate.halt();
        // A signal asked the run to stop: what the pacer hands back (the
        // slots of the calls that ended) waits a moment, not its whole
        // bound, should its store not answer.
        match halt {
            Some(Halt::Interrupted(_)) => {
                let _ = tokio::time::timeout(STOP_FLUSH_WITHIN, pool.pacer.flush()).await;
            }
            _ => pool.pacer.flush().await,
        }
        // The pool holds the recording loop's last sender: it ends now.
        drop(pool);
        // Closing the queue lets a feeder blocked on a full queue finish.
        drop(self.queue);
        let feeder = self.feeder.await;
        let recorded = self.recorder.await.context("the recording loop failed")?;
        Ok((halt, recorded, feeder))
    }
}

/// What the reserve makes of the checkpoint's last balance before any
/// call: the projection, or that one call learns the balance afresh. It
/// never stops the run: that balance may be stale (a top-up, the renewal).
fn precheck(c: &CreditSettings, pool: &Pool, meta: &JobMeta, pending: u64, reporter: &Reporter) {
    let line = credits::reserve::precheck(
        (c.reserve, c.require_full),
        pool.ledger.last(),
        meta.cost_per_item,
        pending,
        crate::util::unix_now().as_secs(),
    );
    if pool.ledger.first_alone() && pool.ledger.last().is_some() {
        reporter.println(
            "batchrun: the last known balance is less than a batch's cost above the reserve: a call of one item learns it afresh",
        );
    } else if let Some(line) = line {
        reporter.println(&line);
    } else if pool.ledger.learning_first() {
        reporter.println(
            "batchrun: the job's last run found the credits exhausted: one call learns whether they are back",
        );
    }
}
