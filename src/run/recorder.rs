//! The one loop that records what the workers report: every item in the
//! checkpoint (through the group committer), the counters, the credit meter
//! and its alerts; and on every tick, the progress. The reporter and the
//! alerter only consume what this loop tells them. It ends when the pool
//! does: the event channel closes with the pool's last sender.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::events::{Event, Stats};
use super::gate::Halt;
use super::ticks::Ticks;
use crate::checkpoint::{Committer, ItemState, JobMeta, Record};
use crate::credits::Alerter;
use crate::credits::{self, AlertKind, CreditMeter};
use crate::exit::Signal;
use crate::fleet::FleetAlerts;
use crate::pace::PaceNote;
use crate::rate::learn::Learnt;
use crate::report::calls::CallStats;
use crate::report::Reporter;
use crate::util::unix_now;

/// How often the job's pacing stamp and fired alerts reach disk at most.
const SAVE_EVERY: Duration = Duration::from_secs(1);

/// The recording loop's state.
pub struct Recorder {
    /// Counters it keeps.
    pub stats: Arc<Stats>,
    /// Writes the job's items and record to the checkpoint, in groups.
    pub committer: Committer,
    /// Progress and notes.
    pub reporter: Arc<Reporter>,
    /// Billing alerts.
    pub alerter: Arc<Alerter>,
    /// The job record, kept current.
    pub meta: JobMeta,
    /// The credit meter: the one place that knows which alerts fired.
    pub meter: CreditMeter,
    /// Whose credits these are, for the per-origin alert state.
    pub origin: String,
    /// With `--redis`: the fleet decides which process sends an alert.
    pub fleet_alerts: Option<Arc<FleetAlerts>>,
    /// When the last pause announced ends: later 429s of the same overrun
    /// are counted, not announced again.
    pub announced_until: Option<Instant>,
    /// What the calls got back, and their latencies.
    pub calls: CallStats,
    /// The progress, redrawn every tick.
    pub ticks: Ticks,
    /// The observers that keep a record of the run (`--joblog`).
    pub sinks: crate::report::sinks::Sinks,
}

/// What the recorder tells the workers' supervisor when a signal comes:
/// give the calls in flight their grace, or abandon them now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// The first signal: the calls in flight get [`super::INTERRUPT_GRACE`].
    Grace,
    /// A second signal: the calls in flight are abandoned and stay pending.
    Now,
}

/// The signals the recorder listens for: each call of `next` waits for the
/// next Ctrl-C, SIGTERM or SIGHUP; what they mean goes to `stops`.
pub struct Signals<F> {
    /// Waits for the next signal.
    pub next: Box<dyn Fn() -> F + Send>,
    /// The first wait, already listening (polled once before any call went
    /// out), if it was.
    pub first: Option<std::pin::Pin<Box<F>>>,
    /// The supervisor of the workers. Closed once the pool is over, after
    /// which a signal changes nothing.
    pub stops: mpsc::UnboundedSender<Stop>,
}

/// Whether what was recorded is on disk.
struct Saving {
    /// When the job record was last saved.
    at: Instant,
    /// The run's first call is on disk.
    stamped: bool,
    /// The first error met while recording, if any.
    err: Option<anyhow::Error>,
}

/// What the loop hands back when the pool is over.
pub struct Recorded {
    /// The job record as last recorded, with the committed counts.
    pub meta: JobMeta,
    /// The meter, with every alert fired.
    pub meter: CreditMeter,
    /// The first error met while recording, if any.
    pub err: Option<anyhow::Error>,
    /// What the calls got back, and their latencies.
    pub calls: CallStats,
}

impl Recorder {
    /// Records events, shows the progress every tick and hears the signals
    /// (nextest's dispatcher shape: one loop, every input), until every
    /// sender of events is gone.
    pub async fn run<F>(
        mut self,
        mut rx: mpsc::UnboundedReceiver<Event>,
        mut signals: Signals<F>,
    ) -> Recorded
    where
        F: Future<Output = Signal> + Send + 'static,
    {
        let mut every = tokio::time::interval(self.reporter.tick_every());
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let mut saving = Saving {
            at: Instant::now(),
            stamped: false,
            err: None,
        };
        let mut signal = match signals.first.take() {
            Some(first) => first,
            None => Box::pin((signals.next)()),
        };
        let mut heard = 0;
        loop {
            tokio::select! {
                ev = rx.recv() => match ev {
                    Some(ev) => self.take(ev, &mut saving),
                    None => break,
                },
                sig = &mut signal, if heard < 2 => {
                    heard = self.signalled(sig, heard, &signals.stops);
                    signal = Box::pin((signals.next)());
                }
                _ = every.tick() => {
                    while let Some(note) = self.ticks.gauges.pacer.note() {
                        self.take(Event::Pace(note), &mut saving);
                    }
                    self.ticks.tick(&self.stats, &self.reporter);
                    let moment = self.moment();
                    let changed = self.keep_use(&moment.policies);
                    self.sinks.tick(moment);
                    // What each window holds goes to disk (flushed) as it
                    // changes, event or none (a window full, a pause): a
                    // kill -9 then finds it.
                    if changed && saving.at.elapsed() >= SAVE_EVERY.mul_f64(0.9) {
                        saving.at = Instant::now();
                        if let Err(e) = self.persist(true) {
                            saving.err.get_or_insert(e);
                        }
                    }
                }
            }
        }
        self.ticks.end();
        let moment = self.moment();
        self.keep_use(&moment.policies);
        self.sinks.end(moment);
        // The pacer owns the limit it learnt (it also probes upward without
        // a note); the job record takes its last word.
        super::job::keep_learnt(&mut self.meta, self.ticks.gauges.pacer.learnt());
        self.wind_down(saving.err).await
    }

    /// What each told policy holds, for a resume to count again (the
    /// stated ones come back with the server's next answer).
    /// Whether that changed.
    fn keep_use(&mut self, policies: &[crate::rate::Occupancy]) -> bool {
        let used: Vec<(String, u64)> = policies
            .iter()
            .filter(|o| o.used > 0 && !o.policy.ends_with(crate::rate::STATED))
            .map(|o| (o.policy.clone(), o.used))
            .collect();
        let changed = used != self.meta.last_used;
        self.meta.last_used = used;
        changed
    }

    /// What the observers see on a tick: the gauges, and the credits'
    /// forecast the meter keeps.
    fn moment(&self) -> crate::report::timeline::Moment {
        crate::report::timeline::Moment {
            projection: self.meter.projection(SystemTime::now()),
            ..self.ticks.moment()
        }
    }

    /// A signal came (the `heard`th before it): the first stops the run
    /// cleanly, the second abandons the calls in flight. Returns how many
    /// have been heard; once the pool is over, none counts.
    fn signalled(&self, sig: Signal, heard: u8, stops: &mpsc::UnboundedSender<Stop>) -> u8 {
        if stops.is_closed() {
            return 2;
        }
        if heard == 0 {
            self.reporter.println(&format!(
                "batchrun: {}: finishing the calls in flight (again to stop at once), then saving the checkpoint...",
                sig.describe()
            ));
            self.ticks.gauges.gate.stop(Halt::Interrupted(sig));
            let _ = stops.send(Stop::Grace);
            return 1;
        }
        self.reporter
            .println("batchrun: stopping now: the calls in flight are abandoned and stay pending");
        let _ = stops.send(Stop::Now);
        2
    }

    /// Records one event, and saves the job record when it is due.
    fn take(&mut self, ev: Event, saving: &mut Saving) {
        let first_call = !saving.stamped && matches!(ev, Event::Sent);
        saving.stamped |= first_call;
        // The first call of the run goes to disk at once: a kill -9 a
        // moment later must still let the next run know it is resuming
        // quickly. So does a change to the fired alerts.
        let urgent = match self.handle(ev) {
            Ok(fired) => fired || first_call,
            Err(e) => {
                saving.err.get_or_insert(e);
                first_call
            }
        };
        if urgent || saving.at.elapsed() >= SAVE_EVERY {
            saving.at = Instant::now();
            if let Err(e) = self.persist(urgent) {
                saving.err.get_or_insert(e);
            }
        }
    }

    /// The pool is over: the alerts settled, the job record saved and the
    /// last group written.
    async fn wind_down(mut self, mut err: Option<anyhow::Error>) -> Recorded {
        if let Some(f) = &self.fleet_alerts {
            f.settle(Duration::from_secs(3)).await;
        }
        if let Err(e) = self.persist(false) {
            err.get_or_insert(e);
        }
        let Recorder {
            committer,
            mut meta,
            meter,
            calls,
            ..
        } = self;
        // The last group is written off the async threads.
        match tokio::task::spawn_blocking(move || committer.finish()).await {
            Ok(done) => {
                if let Some(committed) = &done.meta {
                    meta.adopt_committed(committed);
                }
                if let Some(e) = done.err {
                    err.get_or_insert(e.into());
                }
            }
            Err(e) => {
                err.get_or_insert(anyhow::anyhow!("the checkpoint writer failed: {e}"));
            }
        }
        Recorded {
            meta,
            meter,
            err,
            calls,
        }
    }

    /// Keeps the job's pacing time and the alerts fired current on disk, so
    /// a kill -9 neither bursts into the window on resume nor repeats an alert.
    fn persist(&mut self, flush: bool) -> anyhow::Result<()> {
        self.meta.meter = self.meter.state();
        // What a run killed now would have done, for status and the report.
        if let Some(run) = self.meta.last_run_mut() {
            run.seen_unix_ms = Some(crate::util::unix_now().as_millis() as u64);
            self.stats.count_in(run);
        }
        self.committer
            .save_job(&self.meta, Some((&self.origin, &self.meta.meter)), flush)?;
        Ok(())
    }

    /// Sends a billing alert: in a fleet, only if no other process sent it
    /// this cycle.
    fn raise(&self, a: &credits::Alert) {
        match &self.fleet_alerts {
            Some(f) => f.send(&self.alerter, a),
            None => self.alerter.send(a),
        }
    }

    /// Records one event. True when the fired-alert set changed.
    fn handle(&mut self, ev: Event) -> anyhow::Result<bool> {
        let ev = match record_of(ev) {
            Ok(record) => {
                let done = record.state == ItemState::Done;
                self.calls.finished(record.line);
                self.committer.record(record)?;
                if done {
                    return Ok(self.done());
                }
                Stats::bump(&self.stats.failed);
                return Ok(false);
            }
            Err(ev) => ev,
        };
        let stats = &self.stats;
        match ev {
            Event::Sent => {
                self.sinks.sent();
                Stats::bump(&stats.requests);
                self.meta.last_active_unix_ms = unix_now().as_millis() as u64;
            }
            // Taken as records above.
            Event::Done { .. } | Event::Failed { .. } => {}
            Event::Settled(events) => return self.settled(events),
            Event::RateLimited {
                pause,
                concurrency,
                message,
            } => {
                self.sinks.rate_limited(concurrency);
                self.rate_limited(pause, concurrency, message);
            }
            Event::Answered(answer, latency, id) => {
                self.sinks.answered(id, answer, latency);
                self.calls.add(answer, latency);
                self.calls.note_outcome(id.line, answer);
            }
            Event::Replayed => self.calls.add_replayed(),
            Event::Retry => Stats::bump(&stats.retries),
            Event::Credits(s) => return Ok(self.credits(s)),
            Event::Pace(note) => return Ok(self.pace_note(note)),
            Event::Note(line) => self.reporter.println(&line),
            Event::Alert(a) => return Ok(self.alert(a)),
        }
        Ok(false)
    }

    /// A batch's items, recorded in one commit. True when that ended an
    /// exhaustion.
    fn settled(&mut self, events: Vec<Event>) -> anyhow::Result<bool> {
        let mut records = Vec::with_capacity(events.len());
        let (mut done, mut failed) = (0, 0);
        for ev in events {
            match record_of(ev) {
                Ok(r) => {
                    match r.state {
                        ItemState::Done => done += 1,
                        _ => failed += 1,
                    }
                    self.calls.finished(r.line);
                    records.push(r);
                }
                // Only items are settled together; anything else on its own.
                Err(other) => {
                    self.handle(other)?;
                }
            }
        }
        self.committer.record_all(records)?;
        self.stats
            .failed
            .fetch_add(failed, std::sync::atomic::Ordering::Relaxed);
        let mut over = false;
        for _ in 0..done {
            over |= self.done();
        }
        Ok(over)
    }

    /// An item is done (and recorded). True when that ended an exhaustion.
    fn done(&mut self) -> bool {
        Stats::bump(&self.stats.done);
        Stats::bump(&self.stats.done_this_run);
        // A call went through: any exhaustion is over, and the next one is
        // a new outage with its own alert.
        let over = self.meter.unmark_fired(credits::ID_EXHAUSTED);
        if let Some(f) = &self.fleet_alerts {
            let cycle = self.meter.state().cycle_renewal;
            for id in &over {
                f.release(cycle, id);
            }
        }
        !over.is_empty()
    }

    /// A 429. Workers hit by one overrun each report it: one line per
    /// pause, not one per worker.
    fn rate_limited(&mut self, pause: Duration, concurrency: bool, message: Option<String>) {
        Stats::bump(&self.stats.rate_limited);
        let until = Instant::now() + pause;
        let news = self
            .announced_until
            .map_or(true, |a| until > a + Duration::from_millis(500));
        if !concurrency && news {
            self.announced_until = Some(until);
            let said = message
                .map(|m| format!(" (the server said: {m})"))
                .unwrap_or_default();
            self.reporter.println(&format!(
                "batchrun: rate limited: pausing every worker for {:.1}s{said}",
                pause.as_secs_f64()
            ));
        }
    }

    /// A newer balance: the alerts it crosses go out. True when any did.
    fn credits(&mut self, s: credits::CreditSnapshot) -> bool {
        let alerts = self.meter.observe(s, SystemTime::now());
        for a in &alerts {
            self.raise(a);
        }
        !alerts.is_empty()
    }

    /// A billing alert from the pool: a waiting spell's every time, the
    /// others once per cycle. True when the fired set changed.
    fn alert(&mut self, a: credits::Alert) -> bool {
        match a.kind {
            AlertKind::Waiting | AlertKind::Resumed => self.alerter.send(&a),
            _ if self.meter.mark_fired(&a.id) => {
                self.raise(&a);
                return true;
            }
            _ => {}
        }
        false
    }

    /// What the pacer learnt: said once, and kept in the job record (on
    /// disk at once when it is a learnt limit: a resume must not overrun
    /// again). True when it must be flushed now.
    fn pace_note(&mut self, note: PaceNote) -> bool {
        let (line, learnt, flush) = match note {
            PaceNote::StoreLost { at, cause, waits } => {
                self.reporter.say(&format!(
                    "batchrun: fleet: Redis at {at} is not answering ({cause}); no call goes out until it does, for up to {}",
                    humantime::format_duration(waits)
                ));
                return false;
            }
            PaceNote::Heard(h) => {
                self.reporter.println(&format!("batchrun: {h}"));
                return false;
            }
            PaceNote::FleetPacedEvenly { limit, told } => {
                self.reporter.println(&format!(
                    "batchrun: fleet: a burst was refused: pacing every process evenly to {limit} calls per window, with no burst, as a bucket (nginx limit_req, SpikeArrest) allows; the fleet learns no burst: name it to keep one, --limit {told},burst=N (docs/fleet.md)"
                ));
                return false;
            }
            PaceNote::LimitInForce(l) => (
                format!("batchrun: the server reports a limit of {l} per window for this key, below the configured one: slowing down to it"),
                None,
                false,
            ),
            PaceNote::Learnt(l) => (
                format!("batchrun: rate limited by a limit the server does not state: pacing to the {l} calls per window it had accepted, probing upward slowly"),
                Some(l),
                true,
            ),
            PaceNote::LearntSettled(l) => (
                format!("batchrun: learnt limit settled at {l} calls per window"),
                Some(l),
                true,
            ),
            PaceNote::LearntFixedWindow(l) => (
                format!("batchrun: the server keeps a fixed window of {l} calls: pacing to it"),
                Some(l),
                true,
            ),
            PaceNote::LearntBucket { limit, burst } => (
                format!("batchrun: the server keeps a bucket: {limit} calls per window paced evenly, with a burst of {burst}; pacing evenly to it"),
                Some(limit),
                true,
            ),
        };
        self.keep_learnt(learnt);
        self.reporter.println(&line);
        flush
    }

    /// The job record takes the limit a note said was learnt (`limit`) and
    /// what the pacer learnt it to be beyond its count.
    fn keep_learnt(&mut self, limit: Option<u64>) {
        let shape = self.ticks.gauges.pacer.learnt().map(|l| l.shape);
        let shape = shape.unwrap_or_default();
        let learnt = limit.map(|limit| Learnt { limit, shape });
        super::job::keep_learnt(&mut self.meta, learnt);
    }
}

/// The checkpoint record of an item's outcome (`Done` or `Failed`); any
/// other event is given back.
fn record_of(ev: Event) -> Result<Record, Event> {
    Ok(match ev {
        Event::Done {
            line,
            status,
            body,
            attempts,
            digest,
        } => Record {
            line,
            state: ItemState::Done,
            status: Some(status),
            attempts,
            payload: body,
            unknown: false,
            digest,
        },
        Event::Failed {
            line,
            status,
            reason,
            attempts,
            unknown,
            digest,
        } => Record {
            line,
            state: ItemState::Failed,
            status,
            attempts,
            payload: reason.into_bytes(),
            unknown,
            digest,
        },
        other => return Err(other),
    })
}
