//! Group commit: one thread writes every finished call of the run, a few
//! milliseconds' worth at a time, so a million items cost thousands of
//! commits rather than a million.
//!
//! Finished calls go into an inbox under a mutex; the committing thread is
//! woken only when it has nothing at all to do, when a group is full, or
//! when the job record must reach the disk at once (the first call of a run,
//! a fired alert). Otherwise it lets a group gather for
//! [`GroupCommit::max_wait`], so recording a call costs a lock and a push,
//! not a wake-up. Each commit follows the order the module docs of
//! [`crate::checkpoint`] explain: log entries written and fsynced (closed
//! by a group end, so that a crash's catch-up takes a group whole), their
//! offsets written to the index and fsynced, then one sled transaction for
//! the line states, the counts and the job record, then a sled flush, and
//! only then the in-memory bits. While a group is written the next one
//! gathers, so a `kill -9` loses at most those two.
//!
//! During a run this thread is the only writer of the job record: the
//! recording loop hands it the record's other fields, and it keeps the
//! counts and the revision, which only it knows.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use sled::transaction::Transactional;

use super::chunks::Chunk;
use super::index::IndexWriter;
use super::items::JobItems;
use super::log::{Entry, LogWriter};
use super::{meter_key, to_json, CheckpointError, ItemState, JobMeta};
use crate::credits::MeterState;

/// Records a group's buffers keep room for between groups.
const KEEP_RECORDS: usize = 1024;
/// Encoded log bytes the group buffer keeps room for between groups.
const KEEP_BYTES: usize = 256 * 1024;

/// When a group of records is committed.
#[derive(Debug, Clone, Copy)]
pub struct GroupCommit {
    /// Records per group at most.
    pub max_records: usize,
    /// How long the first record of a group waits for company at most.
    pub max_wait: Duration,
}

impl Default for GroupCommit {
    fn default() -> Self {
        GroupCommit {
            max_records: 512,
            max_wait: Duration::from_millis(5),
        }
    }
}

/// One finished call, as the committer records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The item's line.
    pub line: u64,
    /// Done or failed.
    pub state: ItemState,
    /// The final HTTP status, when there was a response.
    pub status: Option<u16>,
    /// Calls made for it.
    pub attempts: u32,
    /// The raw response body (done) or the reason (failed).
    pub payload: Vec<u8>,
    /// Failed with its outcome unknown: the call may have run.
    pub unknown: bool,
    /// The item's digest ([`crate::input::Item::digest`]); 0 when unknown.
    pub digest: u64,
}

/// The job record's fields from the recording loop, with the meter state
/// of the API origin when it has one.
type JobUpdate = (Box<JobMeta>, Option<(String, MeterState)>);

/// What waits for the committing thread.
#[derive(Default)]
struct Inbox {
    records: Vec<Record>,
    job: Option<JobUpdate>,
    /// Commit and flush without waiting for the group to fill.
    flush: bool,
    /// No more messages: commit what is there and stop.
    closed: bool,
    /// The thread waits for anything at all: the next message must wake it.
    idle: bool,
    /// The thread is gone (it crashed): nothing queued would be written.
    dead: bool,
    /// Records of the group being written.
    committing: usize,
    /// Told once, from the committing thread, when a write fails.
    on_failure: Option<FailureHook>,
}

/// Called with the error when the checkpoint cannot be written.
pub type FailureHook = Box<dyn FnOnce(&CheckpointError) + Send>;

impl Inbox {
    /// Finished calls not yet recorded: queued, or being written.
    fn backlog(&self) -> usize {
        self.records.len() + self.committing
    }
}

struct Shared {
    inbox: Mutex<Inbox>,
    wake: Condvar,
    /// Signalled after every commit, for [`Backlog::wait`].
    drained: Condvar,
    max_records: usize,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Inbox> {
        // The inbox holds plain data, consistent after any panic.
        self.inbox.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Marks the inbox dead if the committing thread unwinds.
struct DeathNotice(Arc<Shared>);

impl Drop for DeathNotice {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.lock().dead = true;
            self.0.drained.notify_all();
        }
    }
}

/// Lets the feeder hold new items back while the committer is behind, so
/// that a `kill -9` finds about one group of finished calls unrecorded, not
/// however many piled up while the disk stalled.
#[derive(Clone)]
pub struct Backlog(Arc<Shared>);

impl Backlog {
    /// Returns once fewer than a group's worth of finished calls wait to be
    /// recorded (or the committer has stopped).
    pub fn wait(&self) {
        let shared = &self.0;
        let mut inbox = shared.lock();
        while inbox.backlog() >= shared.max_records && !inbox.dead && !inbox.closed {
            inbox = shared
                .drained
                .wait(inbox)
                .unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// The handle of the committing thread.
pub struct Committer {
    shared: Arc<Shared>,
    thread: JoinHandle<Committed>,
    items: JobItems,
}

/// What the committer leaves when it is done.
#[derive(Debug)]
pub struct Committed {
    /// The job record as last committed (counts and revision included);
    /// None only if the committing thread crashed and the record cannot be
    /// read back either.
    pub meta: Option<JobMeta>,
    /// The first error met; after it nothing more was recorded, so the
    /// items concerned are still pending.
    pub err: Option<CheckpointError>,
}

fn gone() -> CheckpointError {
    CheckpointError::Corrupt("the checkpoint writer stopped".into())
}

impl JobItems {
    /// Starts the group committer that records this run's results (here,
    /// not in `items`, so that the items know nothing of their writer).
    pub fn committer(
        &self,
        meta: JobMeta,
        policy: GroupCommit,
    ) -> Result<Committer, CheckpointError> {
        Committer::start(self.clone(), meta, policy)
    }
}

impl Committer {
    pub(super) fn start(
        items: JobItems,
        meta: JobMeta,
        policy: GroupCommit,
    ) -> Result<Committer, CheckpointError> {
        let log = LogWriter::open(&items.log_path)?;
        let index = IndexWriter::open(&items.index_path)?;
        let shared = Arc::new(Shared {
            inbox: Mutex::new(Inbox::default()),
            wake: Condvar::new(),
            drained: Condvar::new(),
            max_records: policy.max_records.max(1),
        });
        let writer = Writer {
            items: items.clone(),
            log,
            index,
            slots: Vec::new(),
            meta,
            meter: None,
            dirty: false,
            buf: Vec::new(),
            batch: Vec::new(),
            err: None,
        };
        let notice = DeathNotice(shared.clone());
        let thread = std::thread::Builder::new()
            .name("batchrun-commit".into())
            .spawn(move || {
                let notice = notice;
                writer.run(&notice.0, policy.max_wait)
            })
            .map_err(|e| {
                CheckpointError::Corrupt(format!("starting the checkpoint writer: {e}"))
            })?;
        Ok(Committer {
            shared,
            thread,
            items,
        })
    }

    /// The handle the feeder waits on while the committer is behind.
    pub fn backlog(&self) -> Backlog {
        Backlog(self.shared.clone())
    }

    /// Calls `hook` from the committing thread as soon as a write fails, so
    /// the run can stop sending calls it could not record. After a failure
    /// nothing more is written; what is queued stays pending.
    pub fn on_failure(&self, hook: impl FnOnce(&CheckpointError) + Send + 'static) {
        self.shared.lock().on_failure = Some(Box::new(hook));
    }

    /// Queues a finished call for the next group.
    pub fn record(&self, r: Record) -> Result<(), CheckpointError> {
        let mut inbox = self.shared.lock();
        if inbox.dead {
            return Err(gone());
        }
        inbox.records.push(r);
        let wake = inbox.idle || inbox.records.len() == self.shared.max_records;
        inbox.idle &= !wake;
        drop(inbox);
        if wake {
            self.shared.wake.notify_one();
        }
        Ok(())
    }

    /// Queues several finished calls for the same group: they are
    /// committed together or not at all (a batch's items).
    pub fn record_all(&self, rs: Vec<Record>) -> Result<(), CheckpointError> {
        let mut inbox = self.shared.lock();
        if inbox.dead {
            return Err(gone());
        }
        inbox.records.extend(rs);
        let wake = inbox.idle || inbox.records.len() >= self.shared.max_records;
        inbox.idle &= !wake;
        drop(inbox);
        if wake {
            self.shared.wake.notify_one();
        }
        Ok(())
    }

    /// Queues the job record's fields (all but the counts and the revision)
    /// and the origin's meter state; with `flush`, they are committed and
    /// flushed at once.
    pub fn save_job(
        &self,
        meta: &JobMeta,
        meter: Option<(&str, &MeterState)>,
        flush: bool,
    ) -> Result<(), CheckpointError> {
        let mut inbox = self.shared.lock();
        if inbox.dead {
            return Err(gone());
        }
        let meter = meter.map(|(o, s)| (o.to_string(), s.clone()));
        inbox.job = Some((Box::new(meta.clone()), meter));
        inbox.flush |= flush;
        let wake = inbox.idle || flush;
        inbox.idle &= !wake;
        drop(inbox);
        if wake {
            self.shared.wake.notify_one();
        }
        Ok(())
    }

    /// Commits what is queued and stops the thread.
    pub fn finish(self) -> Committed {
        self.shared.lock().closed = true;
        self.shared.wake.notify_one();
        self.shared.drained.notify_all();
        let items = self.items;
        self.thread.join().unwrap_or_else(|_| Committed {
            // What the disk holds is what was committed.
            meta: items.job().ok().flatten(),
            err: Some(gone()),
        })
    }
}

struct Writer {
    items: JobItems,
    log: LogWriter,
    index: IndexWriter,
    /// Scratch for the group's (line, offset) pairs.
    slots: Vec<(u64, u64)>,
    meta: JobMeta,
    meter: Option<(String, MeterState)>,
    /// The job record or the meter state changed since the last commit.
    dirty: bool,
    /// The group's log entries, encoded.
    buf: Vec<u8>,
    /// The group's lines, their states and where their entries will be.
    batch: Vec<(u64, ItemState, u64)>,
    err: Option<CheckpointError>,
}

/// One group taken from the inbox.
struct Group {
    job: Option<JobUpdate>,
    flush: bool,
    last: bool,
}

impl Writer {
    fn run(mut self, shared: &Shared, max_wait: Duration) -> Committed {
        let mut records = Vec::new();
        loop {
            let group = Self::gather(shared, max_wait, &mut records);
            for r in records.drain(..) {
                self.add(r);
            }
            if let Some((meta, meter)) = group.job {
                self.adopt(*meta, meter);
            }
            let failed_before = self.err.is_some();
            self.commit(group.flush || group.last);
            if let (false, Some(e)) = (failed_before, &self.err) {
                let hook = shared.lock().on_failure.take();
                if let Some(hook) = hook {
                    hook(e);
                }
            }
            records.shrink_to(KEEP_RECORDS);
            shared.lock().committing = 0;
            shared.drained.notify_all();
            if group.last {
                break;
            }
        }
        Committed {
            meta: Some(self.meta),
            err: self.err,
        }
    }

    /// Waits for work, lets the group fill, and takes it (swapping the
    /// inbox's records with the empty `records`).
    fn gather(shared: &Shared, max_wait: Duration, records: &mut Vec<Record>) -> Group {
        let mut inbox = shared.lock();
        while inbox.records.is_empty() && inbox.job.is_none() && !inbox.closed {
            inbox.idle = true;
            inbox = shared.wake.wait(inbox).unwrap_or_else(|e| e.into_inner());
        }
        inbox.idle = false;
        let deadline = Instant::now() + max_wait;
        while !inbox.flush && !inbox.closed && inbox.records.len() < shared.max_records {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            inbox = shared
                .wake
                .wait_timeout(inbox, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        std::mem::swap(records, &mut inbox.records);
        inbox.committing = records.len();
        Group {
            job: inbox.job.take(),
            flush: std::mem::take(&mut inbox.flush),
            last: inbox.closed,
        }
    }

    /// Adds a finished call to the group.
    fn add(&mut self, r: Record) {
        let offset = self.log.end() + self.buf.len() as u64;
        Entry {
            line: r.line,
            state: r.state,
            status: r.status,
            attempts: r.attempts,
            payload: &r.payload,
            unknown: r.unknown,
            digest: Some(r.digest),
        }
        .encode(&mut self.buf, self.log.version());
        self.batch.push((r.line, r.state, offset));
    }

    /// Takes the recording loop's job record, keeping what only this
    /// thread knows.
    fn adopt(&mut self, mut meta: JobMeta, meter: Option<(String, MeterState)>) {
        meta.adopt_committed(&self.meta);
        self.meta = meta;
        if meter.is_some() {
            self.meter = meter;
        }
        self.dirty = true;
    }

    fn commit(&mut self, flush: bool) {
        // After an error nothing more is recorded: those items stay
        // pending and are sent again on resume.
        if self.err.is_none() {
            let r = if !self.batch.is_empty() {
                self.commit_batch()
            } else if self.dirty {
                self.commit_job(flush)
            } else {
                Ok(())
            };
            if let Err(e) = r {
                self.err = Some(e);
            }
        }
        self.buf.clear();
        self.batch.clear();
        // A stalled disk can leave one huge group behind: do not keep its
        // buffers for the rest of the run.
        self.buf.shrink_to(KEEP_BYTES);
        self.batch.shrink_to(KEEP_RECORDS);
        self.slots.shrink_to(KEEP_RECORDS);
    }

    fn commit_job(&mut self, flush: bool) -> Result<(), CheckpointError> {
        let items = &self.items;
        items
            .jobs
            .insert(items.id.as_bytes(), to_json(&self.meta)?)
            .map_err(|e| items.err(e))?;
        if let Some((origin, state)) = &self.meter {
            items
                .jobs
                .insert(meter_key(origin), to_json(state)?)
                .map_err(|e| items.err(e))?;
        }
        if flush {
            items.db.flush().map_err(|e| items.err(e))?;
        }
        self.dirty = false;
        Ok(())
    }

    fn commit_batch(&mut self) -> Result<(), CheckpointError> {
        let states = &self.items.states;
        if let Some((line, ..)) = self.batch.iter().find(|(l, ..)| *l > states.capacity()) {
            return Err(CheckpointError::Corrupt(format!(
                "line {line} is beyond the input's last line"
            )));
        }
        // 1. The results, then where they are, on disk for good before the
        // checkpoint vouches for them; the group end says they are whole.
        super::log::group_end(&mut self.buf, self.log.version(), self.log.end());
        self.log.append(&self.buf)?;
        self.slots.clear();
        self.slots
            .extend(self.batch.iter().map(|&(line, _, offset)| (line, offset)));
        self.index.write(&mut self.slots)?;
        // 2. The states, the counts and the job record, all or nothing.
        let mut meta = self.meta.clone();
        let chunks = self.updated_chunks(&mut meta)?;
        meta.revision += 1;
        let progress = super::progress_value(&meta, self.log.end());
        // The job record and the meter change far less often than a group
        // commits: they go along only when they did.
        let record = match self.dirty {
            true => Some(to_json(&meta)?),
            false => None,
        };
        let meter = match (&self.meter, self.dirty) {
            (Some((origin, state)), true) => Some((meter_key(origin), to_json(state)?)),
            _ => None,
        };
        let items = &self.items;
        let progress_key = super::progress_key(&items.id);
        (&items.lines, &items.jobs)
            .transaction(|(lines, jobs)| {
                for c in &chunks {
                    lines.insert(&c.key()[..], c.encode())?;
                }
                jobs.insert(progress_key.as_bytes(), &progress[..])?;
                if let Some(record) = &record {
                    jobs.insert(items.id.as_bytes(), record.as_slice())?;
                }
                if let Some((k, v)) = &meter {
                    jobs.insert(k.as_bytes(), v.as_slice())?;
                }
                Ok::<_, sled::transaction::ConflictableTransactionError<()>>(())
            })
            .map_err(|e| items.tx_err(e))?;
        // 3. Out of the process, so that a kill -9 from here on keeps it.
        items.db.flush().map_err(|e| items.err(e))?;
        // 4. Only now may the bits say so.
        for &(line, state, _) in &self.batch {
            states.set(line, Some(state));
        }
        self.meta = meta;
        self.dirty = false;
        Ok(())
    }

    /// The chunks the group touches, with its states set, and the counts
    /// moved accordingly. A line is fed once per run, so it is normally
    /// pending here; counting what it was keeps the counts right
    /// regardless.
    fn updated_chunks(&self, meta: &mut JobMeta) -> Result<Vec<Chunk>, CheckpointError> {
        let lines = self.batch.iter().map(|&(line, state, _)| (line, state));
        self.items.chunks_set(lines, meta)
    }
}
