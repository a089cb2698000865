//! The run: a fixed pool of workers behind one pacer, a checkpoint that
//! records every item, and a clean stop for credits, Ctrl-C or a rejected key.
//!
//! [`run`] reads as the pipeline: check the input, open the job, build the
//! pacer and the pool, feed it, record what it reports, end the run.
//! Workers send [`events::Event`]s to one loop ([`recorder`]) that records
//! them; the reporter and the alerter consume what that loop sees.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;

mod compact;
pub mod events;
pub mod finish;
mod fleet;
pub mod gate;
pub mod job;
pub mod keys;
pub mod outputs;
pub mod pool;
mod react;
pub mod recorder;
mod slots;
mod start;
#[cfg(test)]
mod tests;
pub mod watch;

use crate::checkpoint::{Backlog, GroupCommit, ItemState, JobItems, JobMeta, Store};
use crate::credits::Alerter;
use crate::credits::{self, CreditMeter, Ledger, MeterConfig, ReserveConfig};
use crate::exit::{RunError, Signal};
use crate::input;
use crate::pace;
use crate::rate::backoff::Backoff;
use crate::report::{Reporter, Summary, View};
use crate::request::HttpTransport;
use crate::settings::Settings;
use events::Stats;
use gate::{Gate, Halt};
use pool::{Pool, PoolConfig, Queue, Queued};
use start::{dry_run, orphaned_results, start_line, steady_per_min, warn_unknown};

/// How long in-flight calls get to finish after Ctrl-C before they are abandoned.
pub const INTERRUPT_GRACE: Duration = Duration::from_secs(5);

/// Runs a job to its end: done, halted, interrupted or failed. `shutdown`
/// resolves with the signal on Ctrl-C or SIGTERM.
pub async fn run(
    mut settings: Settings,
    shutdown: impl Future<Output = Signal> + Send + 'static,
) -> Result<Summary, RunError> {
    let started = Instant::now();
    crate::sys::ensure_open_files(settings.concurrency as u64).map_err(RunError::Usage)?;
    crate::sys::file_size_limit_is_an_error();
    // 1. A pipe can be read only once: it is copied into the state dir
    //    first (named by its content, so the same content resumes the same
    //    job).
    let spooled = tokio::task::block_in_place(|| {
        input::spool(&settings.input, &settings.state_dir.join("spool"))
    })?;
    if spooled.spooled {
        settings.input = spooled.path;
    }
    if let Some(n) = settings.dry_run {
        let spec = settings.request.clone();
        let scan = tokio::task::block_in_place(|| {
            input::scan(&settings.input, settings.format, &mut |item| {
                spec.render(item).map(|_| ())
            })
        })?;
        return dry_run(&settings, n, scan.total, started);
    }
    // A fleet's Redis must answer before anything else happens.
    let fleet = fleet::join(&settings).await?;

    // 2. The checkpoint, then the whole input checked before any request
    //    (a shard checks every item too, and counts its own).
    let Opened {
        store,
        items,
        meta,
        scan,
    } = open_job(&settings)?;
    let counts = meta.counts();
    let pending = scan.total.saturating_sub(counts.done + counts.failed);

    // 3. Credits: the meter, the alerts, the balance and the reserve.
    let reporter = Arc::new(Reporter::new(scan.total, settings.style));
    let alerter = Arc::new(Alerter::new(
        meta.id.clone(),
        settings.credits.webhook.clone(),
        reporter.printer(),
    ));
    let restored = store
        .meter_state(&settings.origin)
        .context("reading the checkpoint")?
        .unwrap_or_else(|| meta.meter.clone());
    let c = &settings.credits;
    let ledger = Ledger::new(
        restored.last,
        c.reserve.map(|floor| ReserveConfig {
            floor,
            allow_partial: c.allow_partial,
            pending_at_start: pending,
        }),
        meta.cost_per_item,
    );
    let meter = CreditMeter::new(
        MeterConfig {
            thresholds: c.alert_at.clone(),
            burn_window: c.burn_window,
        },
        Some(restored),
    );

    // 4. The pacer and the pool.
    let (pacer, default_pause) = match &fleet {
        Some(f) => fleet::pacer(f, &settings),
        None => pace::for_limit(
            settings.pacer,
            settings.limit,
            settings.burst,
            meta.learnt_limit,
            Duration::from_millis(meta.last_active_unix_ms),
            job::unix_now(),
        )
        .map_err(|e| RunError::Usage(e.to_string()))?,
    };
    // Said once the pacer is built: a bucket's pace is its refill rate.
    let pace = (settings.pacer == pace::PacerKind::Bucket)
        .then(|| pacer.steady_per_min())
        .flatten();
    reporter.println(&start_line(&settings, &meta, (pending, scan.total), pace));
    if settings.burst.is_some() && settings.pacer != pace::PacerKind::Bucket {
        reporter.println(&format!(
            "batchrun: note: --burst applies to --pacer bucket only; the {} pacer ignores it",
            match settings.pacer {
                pace::PacerKind::Spike => "spike",
                _ => "window",
            }
        ));
    }
    if let Some(warning) = orphaned_results(&settings, &meta, counts.done + counts.failed) {
        reporter.say(&warning);
    }
    let fleet_alerts = fleet
        .as_ref()
        .map(|f| Arc::new(crate::fleet::FleetAlerts::for_fleet(f)));
    let transport = HttpTransport::new(settings.timeout, settings.concurrency, settings.max_body)
        .context("building the HTTP client")?;
    let (ev_tx, ev_rx) = mpsc::unbounded_channel();
    let pool = Arc::new(Pool {
        spec: settings.request.clone(),
        transport: Arc::new(transport),
        pacer,
        gate: Arc::new(Gate::new(c.probe_every)),
        ledger: ledger.clone(),
        events: ev_tx,
        cfg: PoolConfig {
            keys: job::key_scheme(&meta, &settings.request),
            policy: react::Policy {
                max_attempts: settings.max_attempts,
                default_pause,
                backoff: Backoff::default(),
                wait_for_credits: c.wait_for_credits,
                max_wait: settings.max_wait,
            },
            verbose: settings.verbose,
        },
        limited_since: std::sync::Mutex::new(None),
        watch: watch::Watch::new(settings.fail_fast, settings.max_failures),
        slots: pool::Slots::new(settings.concurrency),
    });
    let stats = Arc::new(Stats::default());
    stats.done.store(counts.done, Ordering::Relaxed);
    stats.failed.store(counts.failed, Ordering::Relaxed);

    // 5. Feed the pool, unless the reserve refuses before any call.
    let committer = items
        .committer(meta.clone(), GroupCommit::default())
        .context("opening the results log")?;
    // No call may go out that cannot be recorded: a failed write (a full
    // disk) stops the pool at once, not at the end of the input.
    committer.on_failure({
        let gate = pool.gate.clone();
        let dir = settings.state_dir.clone();
        move |e| gate.stop(Halt::Checkpoint(checkpoint_failed(&dir, e)))
    });
    let (item_tx, item_rx) = mpsc::channel::<Queued>(settings.concurrency * 2);
    let feeder = spawn_feeder(
        &settings,
        items.clone(),
        scan.total,
        committer.backlog(),
        item_tx,
    );
    precheck(&settings, &pool, &meta, pending, &reporter);
    let queue: Queue = Arc::new(tokio::sync::Mutex::new(item_rx));
    let mut workers = JoinSet::new();
    for _ in 0..settings.concurrency {
        workers.spawn(pool.clone().worker(queue.clone()));
    }
    let steady = steady_per_min(&settings);
    let published = crate::report::status::progress_path(&settings.state_dir, &meta.id);
    let publish = Publish {
        state_dir: settings.state_dir.clone(),
        job: meta.id.clone(),
        input: meta.input.clone(),
        total: scan.total,
    };
    let ticker = spawn_ticker(
        pool.clone(),
        stats.clone(),
        reporter.clone(),
        (started, steady),
        publish,
    );
    let recorder = tokio::spawn(
        recorder::Recorder {
            stats: stats.clone(),
            committer,
            reporter: reporter.clone(),
            alerter: alerter.clone(),
            meta: meta.clone(),
            meter,
            origin: settings.origin.clone(),
            fleet_alerts: fleet_alerts.clone(),
            announced_until: None,
            calls: Default::default(),
        }
        .run(ev_rx),
    );

    // 6. Wait for the pool, or Ctrl-C; then end the run.
    supervise(&pool, &mut workers, shutdown, &reporter).await;
    if !pool.gate.is_stopped() {
        pool.release_held();
    }
    pool.gate.close();
    pool.pacer.flush().await;
    let halt = pool.gate.halt();
    let learnt = pool.pacer.learnt();
    drop(pool);
    ticker.abort();
    let _ = std::fs::remove_file(&published);
    // Closing the queue lets a feeder blocked on a full queue finish.
    drop(queue);
    let feeder_result = feeder.await;
    let mut recorded = recorder.await.context("the recording loop failed")?;
    recorded.meta.learnt_limit = learnt;
    let ending = finish::Ending {
        settings: &settings,
        store: &store,
        items: &items,
        reporter: &reporter,
        alerter: &alerter,
        stats: &stats,
        ledger: &ledger,
        total: scan.total,
        started,
        fleet_alerts: fleet_alerts.as_deref(),
    };
    finish::finish(ending, halt, recorded, feeder_result).await
}

/// A checkpoint that cannot be opened: say what it means and the way forward.
pub(crate) fn damaged(dir: &std::path::Path, e: crate::checkpoint::CheckpointError) -> RunError {
    damaged_when(dir, e, "Nothing was sent")
}

/// A damaged checkpoint; `what` says what this run had done when it was found.
pub(crate) fn damaged_when(
    dir: &std::path::Path,
    e: crate::checkpoint::CheckpointError,
    what: &str,
) -> RunError {
    use crate::checkpoint::CheckpointError;
    if matches!(e, CheckpointError::Locked(_)) {
        return RunError::Fatal(anyhow::Error::new(e));
    }
    RunError::Fatal(anyhow::anyhow!(
        "the checkpoint in {} is damaged ({e}). {what}. Move it aside \
         (mv {0} {0}.damaged) and run the same command: every item goes again \
         under the Idempotency-Key it was last sent with (read back from the \
         outputs), so an API that honours it replays what already ran instead \
         of running it twice",
        dir.display()
    ))
}

/// Why a run stopped when its checkpoint could not be written, and the way on.
pub(crate) fn checkpoint_failed(dir: &std::path::Path, e: &dyn std::fmt::Display) -> String {
    format!(
        "the checkpoint in {} could not be written ({e}); no more calls were sent. \
         Calls that finished but were not recorded (about one group) go again under \
         the same Idempotency-Keys, so an API that honours them replays them. Free \
         space there (or fix the file) and run the same command to resume",
        dir.display()
    )
}

/// The job's checkpoint and its input, checked.
struct Opened {
    store: Store,
    items: JobItems,
    meta: JobMeta,
    scan: input::Scan,
}

/// Opens the checkpoint, checks the whole input before any request is sent,
/// and opens (or creates) the job. The checkpoint comes first: a line that
/// will not be sent again is parsed but not rendered.
fn open_job(settings: &Settings) -> Result<Opened, RunError> {
    let store = Store::open(&settings.state_dir).map_err(|e| damaged(&settings.state_dir, e))?;
    let id = job::job_id(settings)?;
    // A job the checkpoint does not know (lost, or moved aside as damaged)
    // takes back from its earlier outputs the epoch and generations its keys
    // were last made with, so that it sends those keys again and the API
    // replays what already ran.
    let old = store.job(&id).ok().flatten();
    let recovered = match &old {
        None => outputs::recover([&settings.out, &settings.failures], &id),
        Some(_) => outputs::Recovered::default(),
    };
    let mut epoch = old.as_ref().map_or(recovered.epoch, |o| o.epoch);
    // --fresh means "run them again": a new epoch, so new keys.
    if settings.fresh {
        epoch = epoch.saturating_add(1);
        if let Some(old) = &old {
            warn_unknown(&store, old);
        }
        store
            .discard_job(&id)
            .context("discarding the checkpoint")?;
    }
    let mut items = store.items(&id).context("opening the checkpoint")?;
    let spec = &settings.request;
    let states = items.states();
    let retry_failed = settings.retry_failed;
    let mut in_shard = 0u64;
    let mut scan = tokio::task::block_in_place(|| {
        input::scan(&settings.input, settings.format, &mut |item| {
            in_shard += u64::from(settings.shard.map_or(true, |s| s.takes(item.line)));
            match states.state(item.line) {
                Some(ItemState::Done) => Ok(()),
                Some(ItemState::Failed) if !retry_failed => Ok(()),
                _ => spec.render(item).map(|_| ()),
            }
        })
    })?;
    scan.total = in_shard;
    drop(states);
    items.reserve_lines(scan.last_line);
    let mut meta = job::open(&store, settings, &scan, &id, epoch)?;
    if old.is_none() && !settings.fresh {
        items
            .restore_generations(&recovered.generations)
            .context("writing the checkpoint")?;
    }
    items
        .check_counts(&meta, scan.last_line)
        .and_then(|()| items.check_results())
        .map_err(|e| damaged(&settings.state_dir, e))?;
    // Until this run ends, a reader of the checkpoint sees it unfinished.
    meta.last_state = None;
    meta.halt_reason = None;
    if settings.retry_failed {
        items
            .clear_failed(&mut meta)
            .context("clearing failed items")?;
    }
    // New keys from here on: saved beside the outputs before any call, so
    // that a checkpoint lost later still leads back to them.
    if settings.retry_failed || settings.fresh {
        let carried = items.carried_all().context("reading the checkpoint")?;
        outputs::save_keys(&settings.out, &meta.id, meta.epoch, &carried)?;
    }
    Ok(Opened {
        store,
        items,
        meta,
        scan,
    })
}

/// The reserve check before any call, from the checkpoint's last balance.
fn precheck(settings: &Settings, pool: &Pool, meta: &JobMeta, pending: u64, reporter: &Reporter) {
    let c = &settings.credits;
    let p = credits::reserve::precheck(
        c.reserve,
        c.allow_partial,
        c.recheck_credits || c.wait_for_credits,
        pool.ledger.last(),
        meta.cost_per_item,
        pending,
        job::unix_now().as_secs(),
    );
    if let Some(line) = p.line {
        reporter.println(&line);
    }
    if let Some(why) = p.refusal {
        // Nothing is sent: the workers start and find the pool stopped.
        pool.gate.stop(Halt::Reserve(why));
    }
}

/// Streams pending items into a small queue: memory does not grow with
/// the input. Finished lines are skipped from the in-memory bitsets, and
/// reading stops once every pending item (by the same bits) has been
/// queued. Room in the queue is reserved half a queue at a time, so the
/// feeder is woken once per batch rather than once per item; and no room is
/// asked for while the committer is a group behind, which bounds what a
/// `kill -9` can find finished but unrecorded.
fn spawn_feeder(
    settings: &Settings,
    items: JobItems,
    total: u64,
    backlog: Backlog,
    tx: mpsc::Sender<Queued>,
) -> tokio::task::JoinHandle<anyhow::Result<()>> {
    let path = settings.input.clone();
    let format = settings.format;
    let shard = settings.shard;
    let rt = tokio::runtime::Handle::current();
    tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
        let states = items.states();
        let finished = states.counts();
        let pending = total.saturating_sub(finished.done + finished.failed);
        if pending == 0 {
            return Ok(());
        }
        let reopened = items.any_reopened();
        let batch = (tx.max_capacity() / 2).max(1) as u64;
        let mut left = pending;
        let reserve = |left: u64| {
            backlog.wait();
            rt.block_on(tx.reserve_many(batch.min(left) as usize))
        };
        let Ok(mut room) = reserve(left) else {
            return Ok(());
        };
        for item in input::Reader::open(&path, format)? {
            let item = item?;
            if shard.is_some_and(|s| !s.takes(item.line)) {
                continue;
            }
            if states.is_finished(item.line) {
                continue;
            }
            let (generation, maybe_ran) = if reopened {
                items.carried(item.line)?
            } else {
                (0, false)
            };
            let permit = match room.next() {
                Some(p) => p,
                None => {
                    // The queue closed: the run stopped.
                    let Ok(more) = reserve(left) else {
                        return Ok(());
                    };
                    room = more;
                    let Some(p) = room.next() else {
                        return Ok(());
                    };
                    p
                }
            };
            permit.send(Queued {
                item,
                generation,
                maybe_ran,
            });
            left -= 1;
            if left == 0 {
                return Ok(());
            }
        }
        // The scan counted more pending items than the file holds now.
        anyhow::bail!(
            "{} changed while the job ran: it ended with {left} pending item(s) not yet read \
             (lines removed or rewritten). Restore it and run the same command, or use --fresh \
             to start over with the new content",
            path.display()
        )
    })
}

/// Redraws the progress display every tick.
/// What the ticker publishes for `batchrun status` while the run holds the
/// checkpoint.
struct Publish {
    state_dir: std::path::PathBuf,
    job: String,
    input: String,
    total: u64,
}

impl Publish {
    fn write(&self, stats: &Stats, pool: &Pool) {
        let p = crate::report::status::Progress {
            job: self.job.clone(),
            input: self.input.clone(),
            total: self.total,
            done: Stats::get(&stats.done),
            failed: Stats::get(&stats.failed),
            requests: Stats::get(&stats.requests),
            rate_limited: Stats::get(&stats.rate_limited),
            credits_remaining: pool.ledger.last().map(|s| s.remaining),
            pid: std::process::id(),
            updated_unix: job::unix_now().as_secs(),
        };
        // Best effort: a full disk must not stop the run over a status file.
        let _ = p.publish(&self.state_dir);
    }
}

/// How often the progress for `batchrun status` is rewritten.
const PUBLISH_EVERY: Duration = Duration::from_secs(2);

fn spawn_ticker(
    pool: Arc<Pool>,
    stats: Arc<Stats>,
    reporter: Arc<Reporter>,
    (started, steady_per_min): (Instant, Option<f64>),
    publish: Publish,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut every = tokio::time::interval(reporter.tick_every());
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        publish.write(&stats, &pool);
        let mut published = Instant::now();
        every.tick().await;
        loop {
            every.tick().await;
            let now = Instant::now();
            if now - published >= PUBLISH_EVERY {
                publish.write(&stats, &pool);
                published = now;
            }
            reporter.update(&View {
                done: Stats::get(&stats.done),
                failed: Stats::get(&stats.failed),
                done_this_run: Stats::get(&stats.done_this_run),
                elapsed: now - started,
                rate_limited: Stats::get(&stats.rate_limited),
                credits: pool.ledger.last().map(|s| s.remaining),
                paused_for: pool.pacer.paused_until().map(|u| u - now),
                waiting_probe_in: pool.gate.waiting_probe_in(now),
                steady_per_min: pool.pacer.steady_per_min().or(steady_per_min),
                recent_per_min: None,
            });
        }
    })
}

/// Waits for every worker, or for `shutdown`: then the calls in flight get
/// [`INTERRUPT_GRACE`] to finish before they are abandoned (they stay
/// pending; their Idempotency-Key makes the resend safe).
async fn supervise(
    pool: &Pool,
    workers: &mut JoinSet<()>,
    shutdown: impl Future<Output = Signal>,
    reporter: &Reporter,
) {
    tokio::pin!(shutdown);
    let signal = loop {
        tokio::select! {
            r = workers.join_next() => match r {
                None => return,
                Some(Err(e)) if e.is_panic() => pool.gate.stop(Halt::Internal(
                    "a worker crashed (a bug in batchrun); the checkpoint is saved: run the same command to resume".into(),
                )),
                Some(_) => {}
            },
            sig = &mut shutdown => break sig,
        }
    };
    reporter.println(&format!(
        "batchrun: {}: finishing the calls in flight, then saving the checkpoint...",
        signal.describe()
    ));
    pool.gate.stop(Halt::Interrupted(signal));
    let grace = tokio::time::sleep(INTERRUPT_GRACE);
    tokio::pin!(grace);
    loop {
        tokio::select! {
            r = workers.join_next() => if r.is_none() { return },
            _ = &mut grace => {
                workers.abort_all();
                while workers.join_next().await.is_some() {}
                return;
            }
        }
    }
}
