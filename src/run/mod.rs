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

pub mod events;
pub mod finish;
pub mod gate;
pub mod job;
pub mod pool;
pub mod recorder;
#[cfg(test)]
mod tests;

use crate::checkpoint::{Backlog, GroupCommit, ItemState, JobItems, JobMeta, Store};
use crate::credits::Alerter;
use crate::credits::{self, CreditMeter, Ledger, MeterConfig, ReserveConfig};
use crate::exit::RunError;
use crate::input::{self, Item};
use crate::pace;
use crate::rate::backoff::Backoff;
use crate::report::{Reporter, Summary, View};
use crate::request::HttpTransport;
use crate::settings::Settings;
use events::Stats;
use gate::{Gate, Halt};
use pool::{Pool, PoolConfig, Queue};

/// How long in-flight calls get to finish after Ctrl-C before they are abandoned.
pub const INTERRUPT_GRACE: Duration = Duration::from_secs(5);

/// Runs a job to its end: done, halted, interrupted or failed. `shutdown`
/// resolves on Ctrl-C or SIGTERM.
pub async fn run(
    settings: Settings,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<Summary, RunError> {
    let started = Instant::now();
    // 1-2. The checkpoint, then the whole input checked before any request.
    let Opened {
        store,
        items,
        meta,
        scan,
    } = open_job(&settings)?;
    let counts = meta.counts();
    let pending = scan.total.saturating_sub(counts.done + counts.failed);

    // 3. Credits: the meter, the alerts, the balance and the reserve.
    let reporter = Arc::new(Reporter::new(scan.total));
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
    let (pacer, default_pause) = pace::for_limit(
        settings.limit,
        settings.burst,
        Duration::from_millis(meta.last_active_unix_ms),
        job::unix_now(),
    )
    .map_err(|e| RunError::Usage(e.to_string()))?;
    let transport = HttpTransport::new(settings.timeout, settings.concurrency)
        .context("building the HTTP client")?;
    let (ev_tx, ev_rx) = mpsc::unbounded_channel();
    let pool = Arc::new(Pool {
        spec: settings.request.clone(),
        transport: Arc::new(transport),
        pacer,
        gate: Gate::new(c.probe_every),
        ledger: ledger.clone(),
        events: ev_tx,
        cfg: PoolConfig {
            idem_prefix: job::idempotency_prefix(&meta),
            max_attempts: settings.max_attempts,
            default_pause,
            backoff: Backoff::default(),
            wait_for_credits: c.wait_for_credits,
        },
    });
    let stats = Arc::new(Stats::default());
    stats.done.store(counts.done, Ordering::Relaxed);
    stats.failed.store(counts.failed, Ordering::Relaxed);

    // 5. Feed the pool, unless the reserve refuses before any call.
    let committer = items
        .committer(meta.clone(), GroupCommit::default())
        .context("opening the results log")?;
    let (item_tx, item_rx) = mpsc::channel::<(Item, u32)>(settings.concurrency * 2);
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
    let ticker = spawn_ticker(pool.clone(), stats.clone(), reporter.clone(), started);
    let recorder = tokio::spawn(
        recorder::Recorder {
            stats: stats.clone(),
            committer,
            reporter: reporter.clone(),
            alerter: alerter.clone(),
            meta: meta.clone(),
            meter,
            origin: settings.origin.clone(),
        }
        .run(ev_rx),
    );

    // 6. Wait for the pool, or Ctrl-C; then end the run.
    supervise(&pool, &mut workers, shutdown, &reporter).await;
    pool.gate.close();
    let halt = pool.gate.halt();
    drop(pool);
    ticker.abort();
    // Closing the queue lets a feeder blocked on a full queue finish.
    drop(queue);
    let feeder_result = feeder.await;
    let recorded = recorder.await.context("the recording loop failed")?;
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
    };
    finish::finish(ending, halt, recorded, feeder_result).await
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
    let store =
        Store::open(&settings.state_dir).map_err(|e| RunError::Fatal(anyhow::Error::new(e)))?;
    let id = job::job_id(settings)?;
    if settings.fresh {
        store
            .discard_job(&id)
            .context("discarding the checkpoint")?;
    }
    let mut items = store.items(&id).context("opening the checkpoint")?;
    let spec = &settings.request;
    let states = items.states();
    let retry_failed = settings.retry_failed;
    let scan = tokio::task::block_in_place(|| {
        input::scan(
            &settings.input,
            settings.format,
            &mut |item| match states.state(item.line) {
                Some(ItemState::Done) => Ok(()),
                Some(ItemState::Failed) if !retry_failed => Ok(()),
                _ => spec.render(item).map(|_| ()),
            },
        )
    })?;
    drop(states);
    items.reserve_lines(scan.last_line);
    let mut meta = job::open(&store, settings, &scan, &id)?;
    // Until this run ends, a reader of the checkpoint sees it unfinished.
    meta.last_state = None;
    meta.halt_reason = None;
    if settings.retry_failed {
        items
            .clear_failed(&mut meta)
            .context("clearing failed items")?;
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
    tx: mpsc::Sender<(Item, u32)>,
) -> tokio::task::JoinHandle<anyhow::Result<()>> {
    let path = settings.input.clone();
    let format = settings.format;
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
            if states.is_finished(item.line) {
                continue;
            }
            let generation = if reopened {
                items.generation(item.line)?
            } else {
                0
            };
            let permit = match room.next() {
                Some(p) => p,
                None => {
                    let Ok(more) = reserve(left) else {
                        break;
                    };
                    room = more;
                    let Some(p) = room.next() else { break };
                    p
                }
            };
            permit.send((item, generation));
            left -= 1;
            if left == 0 {
                break;
            }
        }
        Ok(())
    })
}

/// Redraws the progress display every tick.
fn spawn_ticker(
    pool: Arc<Pool>,
    stats: Arc<Stats>,
    reporter: Arc<Reporter>,
    started: Instant,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut every = tokio::time::interval(reporter.tick_every());
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        every.tick().await;
        loop {
            every.tick().await;
            let now = Instant::now();
            reporter.update(&View {
                done: Stats::get(&stats.done),
                failed: Stats::get(&stats.failed),
                done_this_run: Stats::get(&stats.done_this_run),
                elapsed: now - started,
                rate_limited: Stats::get(&stats.rate_limited),
                credits: pool.ledger.last().map(|s| s.remaining),
                paused_for: pool.pacer.paused_until().map(|u| u - now),
                waiting_probe_in: pool.gate.waiting_probe_in(now),
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
    shutdown: impl Future<Output = ()>,
    reporter: &Reporter,
) {
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            r = workers.join_next() => match r {
                None => return,
                Some(Err(e)) if e.is_panic() => pool.gate.stop(Halt::Internal(
                    "a worker crashed (a bug in batchrun); the checkpoint is saved: run the same command to resume".into(),
                )),
                Some(_) => {}
            },
            _ = &mut shutdown => break,
        }
    }
    reporter.println(
        "batchrun: interrupted: finishing the calls in flight, then saving the checkpoint...",
    );
    pool.gate.stop(Halt::Interrupted);
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
