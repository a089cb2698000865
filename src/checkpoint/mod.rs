//! The checkpoint: every job's identity and every item's outcome.
//!
//! sled keeps the job records and, per job, a 2-bit state per line (4096
//! lines to a record, [`chunks`]); response bodies and failure reasons go
//! to an append-only results log beside it ([`log`]), found through an index
//! of offsets ([`index`]). The done/failed lines
//! are also held in memory as two bitsets ([`LineStates`]); the job record
//! carries their counts, committed in the same sled transaction as the states.
//! `docs/checkpoint.md` describes the layout.
//!
//! An item is *pending* until its state says otherwise; only a finished call
//! changes it. Finished calls are committed in groups ([`Committer`]): the
//! group's log entries are written and fsynced first, then one sled
//! transaction marks their lines finished and updates the counts, then sled is
//! flushed. That order is what makes a crash safe: a crash between the two
//! steps leaves the items pending in sled, and either their entries are
//! taken from the log when the job is next opened ([`JobItems::adopt_logged`],
//! which also catches up a damaged database that sled opened at an older
//! state), or, when nothing points at them yet, a pending item is simply
//! sent again under the same Idempotency-Key, which the server answers from
//! its stored response instead of repeating the call. The other order could leave an item "done" whose body never reached
//! the disk: it would never be sent again, and its result would be lost.
//! A `kill -9` loses at most the group being gathered and the one being
//! written. The outputs are produced from the log through the line states, never
//! appended as calls return, so they can never hold a duplicate.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::credits::MeterState;

mod chunks;
mod commit;
mod index;
mod items;
mod log;
mod reading;
mod recover;
mod runs;
mod states;

pub use chunks::LINES_PER_CHUNK;
pub use commit::{Backlog, Committed, Committer, GroupCommit, Record};
pub use items::{JobItems, Results};
pub use log::Entry;
pub use reading::ReadStore;
pub use runs::{RunRecord, RUNS_KEPT};
pub use states::LineStates;

/// The layout of the item records this version writes (see the module docs).
pub const LAYOUT: u32 = 2;

/// Checkpoint failures the caller branches on.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// Another process holds the state directory.
    #[error("the state directory {0} is in use by another batchrun process (or a stale lock); wait for it to finish or use another --state-dir")]
    Locked(PathBuf),
    /// sled failed.
    #[error("checkpoint store in {}: {}", dir.display(), sled_reason(source))]
    Store {
        /// The state directory.
        dir: PathBuf,
        /// sled's error.
        source: sled::Error,
    },
    /// A record could not be decoded (written by an incompatible version?).
    #[error("checkpoint record is unreadable: {0}")]
    Corrupt(String),
    /// The results log could not be read or written.
    #[error("results log {path}: {source}")]
    Log {
        /// The log file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// sled's own words, except for an I/O error, which sled may carry as a
/// debug dump (`Os { code: 27, .. }`): its kind reads better.
fn sled_reason(e: &sled::Error) -> String {
    match e {
        sled::Error::Io(io) if io.to_string().starts_with("Os {") => {
            format!("I/O error: {}", io.kind())
        }
        sled::Error::Io(io) => format!("I/O error: {io}"),
        other => other.to_string(),
    }
}

/// What a job is: which input, which requests, and how far it got.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct JobMeta {
    /// Stable id: a hash of the input's name and the request template it
    /// was made for (and, for a pipe, its first content). Never of a path.
    pub id: String,
    /// The input file, as an absolute path, where it was last run from.
    pub input: String,
    /// The same path as it was given (made absolute, links not resolved):
    /// `current/items.jsonl` through a release link is one input whatever
    /// release it leads to, where two folders' `items.jsonl` are two.
    /// Empty in records made before it was kept.
    #[serde(default)]
    pub input_given: String,
    /// The input's name (its file name, `stdin` for a pipe): what finds
    /// the job wherever the input lives now.
    #[serde(default)]
    pub input_name: String,
    /// The API origin its calls went to: a new job on the same origin
    /// starts from the window this one left.
    #[serde(default)]
    pub origin: String,
    /// What the job's Idempotency-Keys are derived from, when not its id:
    /// a job whose request changed (`--keep-done`) sends its pending items
    /// under keys of the new request.
    #[serde(default)]
    pub key_base: Option<String>,
    /// sha256 of the input when the job was created.
    pub fingerprint: String,
    /// Items in the input.
    pub total: u64,
    /// The request template, described (never includes the API key).
    pub template: String,
    /// When the job was created (unix seconds).
    pub created_unix: u64,
    /// The last time a call was sent (unix ms), to pace a quick resume.
    pub last_active_unix_ms: u64,
    /// What each policy told (`--limit`) held at the last save, by its
    /// name (`1000/1h`): a resume within a long window counts the last
    /// run's calls there, not only in the shortest window it waits out.
    #[serde(default)]
    pub last_used: Vec<(String, u64)>,
    /// Credit meter state: last balance and alerts fired this cycle.
    pub meter: MeterState,
    /// Why the last run stopped, if it halted.
    pub halt_reason: Option<String>,
    /// How the last run ended: done, halted, interrupted, failed.
    pub last_state: Option<String>,
    /// Requests sent over every run of this job.
    pub requests: u64,
    /// Rate-limit 429s over every run.
    pub rate_limited: u64,
    /// Retries of transient failures over every run.
    pub retries: u64,
    /// Observed credits per successful call, for projecting the remaining cost.
    pub cost_per_item: Option<f64>,
    /// The limit learnt from a server that keeps its own secret, so a
    /// resume starts from it instead of overrunning again.
    #[serde(default)]
    pub learnt_limit: Option<u64>,
    /// The burst of the bucket the learnt limit was learnt to be; `None`
    /// for a window, and in a checkpoint older than shape learning.
    #[serde(default)]
    pub learnt_burst: Option<u64>,
    /// The fixed window a refusal of that bucket switches to (the answers
    /// fitted both; see `rate/learn/fitted.rs`), while none came.
    #[serde(default)]
    pub learnt_fixed_too: Option<u64>,
    /// Whether the learnt limit is a fixed window's (not probed above).
    #[serde(default)]
    pub learnt_fixed: bool,
    /// The most probing goes to: what the fit that learnt the limit
    /// allows, or one below a limit refused; a resumed run probes no
    /// higher (`None` when nothing was refused above the learnt limit, and
    /// in older checkpoints).
    #[serde(default)]
    pub learnt_most: Option<u64>,
    /// Advanced by `--fresh` only: part of every derived key.
    #[serde(default)]
    pub epoch: u32,
    /// The input's length in bytes when `fingerprint` was taken: a file that
    /// only grew past it (a nightly file appended to) keeps its job.
    #[serde(default)]
    pub input_len: Option<u64>,
    /// The layout of this job's item records ([`LAYOUT`]).
    #[serde(default)]
    pub layout: u32,
    /// Items done. Committed in the same sled transaction as the line states,
    /// so it always equals the done lines of the bitset loaded from them.
    #[serde(default)]
    pub done: u64,
    /// Items failed, kept like `done`.
    #[serde(default)]
    pub failed: u64,
    /// Bumped by every commit that changes a line's state: outputs written
    /// at one revision need no rewrite at the same revision.
    #[serde(default)]
    pub revision: u64,
    /// What `--out` and `--failures` were last written from.
    #[serde(default)]
    pub outputs: Option<OutputStamp>,
    /// The job's last runs, oldest first ([`RunRecord`]).
    #[serde(default)]
    pub runs: Vec<RunRecord>,
    /// How the last run formed its batches (`--batch` and what cuts a
    /// batch short), `None` when it sent one item per call: a batch's
    /// Idempotency-Key is made of its items', so a call of unknown outcome
    /// is sent under its old key only if batches are formed as before.
    #[serde(default)]
    pub batching: Option<String>,
    /// Its Idempotency-Keys follow each item's content, not its line (see
    /// `run/keys.rs`): true for jobs made since; older jobs keep their
    /// lines' keys.
    #[serde(default)]
    pub keys_by_content: bool,
    /// Its Idempotency-Keys take a JSON body by its content, its fields in
    /// any order (see `run/keys.rs`): true for jobs made since; older jobs
    /// keep the keys of their bodies as sent.
    #[serde(default)]
    pub keys_sorted_body: bool,
    /// `--shard` splits its items by their content, not their lines (see
    /// `fleet/shard.rs`): true for jobs made since; older jobs keep the
    /// split by line.
    #[serde(default)]
    pub shards_by_content: bool,
    /// The order of an item's fields is not part of its content (see
    /// [`crate::input::FieldOrder`]): true for jobs made since; older jobs
    /// keep theirs, as their results and keys were recorded.
    #[serde(default)]
    pub any_field_order: bool,
    /// A run was killed with items pending, or ended with items pending
    /// after calls that may have run got no answer (timed out, lost their
    /// connection) or ran unrecorded (the checkpoint could not be
    /// written): those calls may have run, and nothing says which. Until every item is finished (or
    /// `--fresh`), nothing may send them under other keys (other batches,
    /// a lone call at the reserve, a regenerated input's moved blocks).
    #[serde(default)]
    pub unsettled: bool,
}

impl JobMeta {
    /// How its items are fingerprinted, for its life.
    pub fn field_order(&self) -> crate::input::FieldOrder {
        match self.any_field_order {
            true => crate::input::FieldOrder::Ignored,
            false => crate::input::FieldOrder::Kept,
        }
    }

    /// Done and failed counts, as committed.
    pub fn counts(&self) -> Counts {
        Counts {
            done: self.done,
            failed: self.failed,
        }
    }

    /// Takes from `committed` the fields only the committer keeps: the
    /// layout, the counts, the revision and the outputs stamp.
    pub fn adopt_committed(&mut self, committed: &JobMeta) {
        self.layout = committed.layout;
        self.done = committed.done;
        self.failed = committed.failed;
        self.revision = committed.revision;
        self.outputs = committed.outputs.clone();
    }
}

/// The outputs as last written: where, at which revision, and what the
/// files looked like then. When all of it still holds, nothing changed and
/// the outputs are not written again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputStamp {
    /// `--out`, as given.
    pub out: String,
    /// `--failures`, as given.
    pub failures: String,
    /// The job's revision they were written at.
    pub revision: u64,
    /// Length and modification time (ns since the epoch) of `--out`.
    pub out_file: (u64, u64),
    /// Length and modification time of `--failures`.
    pub failures_file: (u64, u64),
    /// The results file's format when not JSON lines (`csv`): a rerun
    /// asking for another writes the file again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<String>,
}

/// An item's final state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ItemState {
    /// The call succeeded.
    Done,
    /// The call failed for good (permanent error or attempts used up).
    Failed,
}

/// Done and failed counts for a job.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Items done.
    pub done: u64,
    /// Items failed.
    pub failed: u64,
}

/// The sled database under a state directory.
#[derive(Clone)]
pub struct Store {
    db: sled::Db,
    jobs: sled::Tree,
    dir: PathBuf,
}

/// sled's page cache. The output pass reads chunks once, in order, so a
/// larger cache would only hold records that are not read again.
const CACHE_BYTES: u64 = 4 * 1024 * 1024;

/// The jobs-tree key of an API origin's credit meter state.
fn meter_key(origin: &str) -> String {
    format!("meter:{origin}")
}

/// The jobs-tree key of a job's progress record: the revision and the
/// counts, which every group commit changes. The job record itself (about
/// 1 KB) is rewritten only when something else in it changed: rewritten by
/// every group, it made up most of what sled held and wrote.
fn progress_key(id: &str) -> String {
    format!("progress:{id}")
}

/// A progress record: revision, done, failed, and the end of the results
/// log the line states account for, each a u64 LE. The log's end is what
/// lets a checkpoint that went back to an older state (sled opens a cut or
/// damaged database at the last state it can read) be caught up from the
/// log instead of sending again what the log holds ([`JobItems::adopt_logged`]).
fn progress_value(meta: &JobMeta, log_end: u64) -> [u8; PROGRESS_LEN] {
    let mut v = [0; PROGRESS_LEN];
    v[..8].copy_from_slice(&meta.revision.to_le_bytes());
    v[8..16].copy_from_slice(&meta.done.to_le_bytes());
    v[16..24].copy_from_slice(&meta.failed.to_le_bytes());
    v[24..].copy_from_slice(&log_end.to_le_bytes());
    v
}

/// Bytes of a progress record; earlier versions wrote the first 24 only
/// (no log end).
const PROGRESS_LEN: usize = 32;

/// The results log's end a progress record `v` says its line states
/// account for; `None` in a record an earlier version wrote.
fn progress_log_end(v: &[u8]) -> Option<u64> {
    let end: [u8; 8] = v.get(24..PROGRESS_LEN)?.try_into().ok()?;
    (v.len() == PROGRESS_LEN).then(|| u64::from_le_bytes(end))
}

/// The job `id` from its record `raw`, as every reader sees it: with its
/// progress record applied, when that is at least as new as the counts in
/// the job record (a job record written alone, by an older version or a
/// transaction that reopened lines, carries a newer revision).
fn read_job(
    jobs: &sled::Tree,
    id: &str,
    raw: &[u8],
    err: impl Fn(sled::Error) -> CheckpointError,
) -> Result<JobMeta, CheckpointError> {
    let mut meta: JobMeta = serde_json::from_slice(raw)
        .map_err(|e| CheckpointError::Corrupt(format!("job {id}: {e}")))?;
    let Some(v) = jobs.get(progress_key(id)).map_err(err)? else {
        return Ok(meta);
    };
    if v.len() != 24 && v.len() != PROGRESS_LEN {
        return Err(CheckpointError::Corrupt(format!(
            "job {id}: a damaged progress record"
        )));
    }
    let num = |i: usize| u64::from_le_bytes(v[i..i + 8].try_into().unwrap_or_default());
    if num(0) >= meta.revision {
        (meta.revision, meta.done, meta.failed) = (num(0), num(8), num(16));
    }
    Ok(meta)
}

fn to_json<T: Serialize>(v: &T) -> Result<Vec<u8>, CheckpointError> {
    serde_json::to_vec(v).map_err(|e| CheckpointError::Corrupt(e.to_string()))
}

/// Whether `e` says the checkpoint's data is damaged (not that the system
/// refused to reach it, nor that a run holds it): moving it aside is then
/// the way forward, and only then.
pub fn is_damage(e: &CheckpointError) -> bool {
    match e {
        CheckpointError::Corrupt(_) => true,
        CheckpointError::Store { source, .. } => !matches!(source, sled::Error::Io(_)),
        _ => false,
    }
}

/// What a damaged checkpoint in `dir` means, and the way forward; `what`
/// says what the caller did meanwhile ("Nothing was sent"). The words a
/// run, `status` and `report` share.
pub fn damage_advice(dir: &Path, e: &CheckpointError, what: &str) -> String {
    format!(
        "the checkpoint in {} is damaged ({e}). {what}. Move it aside \
         (mv {0} {0}.damaged) and run the job's command again: every item goes again \
         under the Idempotency-Key it was last sent with (read back from the \
         outputs), so an API that honours it replays what already ran instead \
         of running it twice",
        dir.display()
    )
}

/// Whether `dir` (a state dir) holds a checkpoint sled ever wrote: its
/// database file, not merely the folder, which opening a store makes. What
/// only reads (`status`, `report`, a new job looking at other layouts)
/// tests this first, so that it leaves no store behind where none was.
pub fn held(dir: &Path) -> bool {
    std::fs::metadata(dir.join("checkpoint").join("db")).is_ok_and(|m| m.len() > 0)
}

impl Store {
    /// Opens (or creates) the store in `dir`.
    pub fn open(dir: &Path) -> Result<Store, CheckpointError> {
        let store_err = |source| CheckpointError::Store {
            dir: dir.to_path_buf(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(|e| store_err(sled::Error::Io(e)))?;
        // sled's flusher thread can hold the file lock a moment after the
        // last handle is dropped: a store just closed (in this process or
        // one that just exited) is worth a few short retries.
        let mut tries = 0;
        let db = loop {
            match Self::open_db(dir) {
                Err(CheckpointError::Locked(_)) if tries < 10 => {
                    tries += 1;
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
                r => break r?,
            }
        };
        let jobs = db.open_tree("jobs").map_err(store_err)?;
        Ok(Store {
            db,
            jobs,
            dir: dir.to_path_buf(),
        })
    }

    fn open_db(dir: &Path) -> Result<sled::Db, CheckpointError> {
        sled::Config::new()
            .path(dir.join("checkpoint"))
            .flush_every_ms(Some(500))
            // sled caches up to 1 GiB by default; a job's memory should not
            // grow with its length. The hot records are the few chunks at
            // the commit frontier and the job record.
            .cache_capacity(CACHE_BYTES)
            .open()
            .map_err(|e| match e {
                sled::Error::Io(ref io) if io.kind() == std::io::ErrorKind::WouldBlock => {
                    CheckpointError::Locked(dir.to_path_buf())
                }
                sled::Error::Io(ref io) if io.to_string().contains("lock") => {
                    CheckpointError::Locked(dir.to_path_buf())
                }
                e => CheckpointError::Store {
                    dir: dir.to_path_buf(),
                    source: e,
                },
            })
    }

    fn err(&self, source: sled::Error) -> CheckpointError {
        CheckpointError::Store {
            dir: self.dir.clone(),
            source,
        }
    }

    /// A job's metadata, if the job exists.
    pub fn job(&self, id: &str) -> Result<Option<JobMeta>, CheckpointError> {
        match self.jobs.get(id).map_err(|e| self.err(e))? {
            None => Ok(None),
            Some(v) => read_job(&self.jobs, id, &v, |e| self.err(e)).map(Some),
        }
    }

    /// Every job recorded for an input file (absolute path): those last
    /// run from that path, else those of an input of its file name, as a
    /// run finds a moved or copied input's job (the path is no part of a
    /// job): `status` and `report` find it before the next run does.
    pub fn jobs_for_input(&self, input: &str) -> Result<Vec<JobMeta>, CheckpointError> {
        let jobs = self.jobs()?;
        if jobs.iter().any(|m| m.input == input) {
            return Ok(jobs.into_iter().filter(|m| m.input == input).collect());
        }
        let name = Path::new(input).file_name().map(|n| n.to_string_lossy());
        Ok(jobs
            .into_iter()
            .filter(|m| name.as_deref() == Some(m.input_name.as_str()))
            .collect())
    }

    /// Every job in the store.
    pub fn jobs(&self) -> Result<Vec<JobMeta>, CheckpointError> {
        let mut out = Vec::new();
        for kv in self.jobs.iter() {
            let (k, v) = kv.map_err(|e| self.err(e))?;
            if k.starts_with(b"meter:") || k.starts_with(b"progress:") {
                continue;
            }
            let id = String::from_utf8_lossy(&k);
            out.push(read_job(&self.jobs, &id, &v, |e| self.err(e))?);
        }
        Ok(out)
    }

    /// Writes a job's metadata.
    pub fn save_job(&self, meta: &JobMeta) -> Result<(), CheckpointError> {
        let v = to_json(meta)?;
        self.jobs
            .insert(meta.id.as_bytes(), v)
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    /// The credit meter's state for an API origin (scheme, host and port).
    ///
    /// Credits belong to the account, not to one job: a nightly backfill that
    /// starts a new job every night must not re-announce "50% used" every
    /// night, so what was fired is kept per origin, beside the jobs.
    pub fn meter_state(&self, origin: &str) -> Result<Option<MeterState>, CheckpointError> {
        match self.jobs.get(meter_key(origin)).map_err(|e| self.err(e))? {
            None => Ok(None),
            Some(v) => serde_json::from_slice(&v)
                .map(Some)
                .map_err(|e| CheckpointError::Corrupt(format!("meter state: {e}"))),
        }
    }

    /// Saves the credit meter's state for an API origin.
    pub fn save_meter_state(
        &self,
        origin: &str,
        state: &MeterState,
    ) -> Result<(), CheckpointError> {
        let v = to_json(state)?;
        self.jobs
            .insert(meter_key(origin), v)
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    /// Removes a job, its records and its results log (`--fresh`).
    pub fn discard_job(&self, id: &str) -> Result<(), CheckpointError> {
        self.jobs.remove(id).map_err(|e| self.err(e))?;
        self.jobs
            .remove(progress_key(id))
            .map_err(|e| self.err(e))?;
        for tree in [
            format!("lines:{id}"),
            format!("items:{id}"),
            format!("retries:{id}"),
        ] {
            self.db.drop_tree(tree).map_err(|e| self.err(e))?;
        }
        let log = self.log_path(id);
        for path in [log.with_extension("idx"), log] {
            match std::fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(CheckpointError::Log { path, source: e });
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// A job's items: their states loaded into memory. A job record of
    /// another layout (written by a pre-release build) is refused, not
    /// guessed at.
    pub fn items(&self, id: &str) -> Result<JobItems, CheckpointError> {
        if let Some(meta) = self.job(id)? {
            if meta.layout != LAYOUT {
                return Err(CheckpointError::Corrupt(format!(
                    "job {id} is in layout {} of the checkpoint; this build reads layout {LAYOUT} only",
                    meta.layout
                )));
            }
        }
        JobItems::open(self, id)
    }

    /// Where a job's results log lives: beside the sled directory.
    pub fn log_path(&self, id: &str) -> PathBuf {
        self.dir.join("results").join(format!("{id}.log"))
    }

    fn tree(&self, name: &str) -> Result<sled::Tree, CheckpointError> {
        self.db.open_tree(name).map_err(|e| self.err(e))
    }

    /// Makes everything written so far durable. Called at every halt and exit.
    pub fn flush(&self) -> Result<(), CheckpointError> {
        self.db.flush().map_err(|e| self.err(e))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests;
