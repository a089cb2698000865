//! The checkpoint: every job's identity and every item's outcome, in sled.
//!
//! An item is *pending* until it has a record; only a finished call writes
//! one. sled flushes in the background, so a `kill -9` can lose the last
//! moments of records: those items are simply pending again, and resending
//! them with the same Idempotency-Key makes the server replay rather than
//! repeat them. The outputs are produced from these records, never appended
//! as calls return, so they can never hold a duplicate.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::credits::MeterState;

/// Checkpoint failures the caller branches on.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// Another process holds the state directory.
    #[error("the state directory {0} is in use by another batchrun process (or a stale lock); wait for it to finish or use another --state-dir")]
    Locked(PathBuf),
    /// sled failed.
    #[error("checkpoint store in {dir}: {source}")]
    Store {
        /// The state directory.
        dir: PathBuf,
        /// sled's error.
        source: sled::Error,
    },
    /// A record could not be decoded (written by an incompatible version?).
    #[error("checkpoint record is unreadable: {0}")]
    Corrupt(String),
}

/// What a job is: which input, which requests, and how far it got.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct JobMeta {
    /// Stable id: a hash of the input's path and the request template.
    pub id: String,
    /// The input file, as an absolute path.
    pub input: String,
    /// sha256 of the input when the job was created.
    pub fingerprint: String,
    /// Items in the input.
    pub total: u64,
    /// The request template, described (never includes the API key).
    pub template: String,
    /// Random per job; part of every Idempotency-Key so `--fresh` gets new keys.
    pub nonce: String,
    /// When the job was created (unix seconds).
    pub created_unix: u64,
    /// The last time a call was sent (unix ms), to pace a quick resume.
    pub last_active_unix_ms: u64,
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
    /// 0: Idempotency-Keys from the random nonce (jobs of earlier versions);
    /// 1: derived from the job and the item alone, so a lost checkpoint
    /// sends the same keys again.
    #[serde(default)]
    pub key_scheme: u8,
    /// Advanced by `--fresh` only: part of every derived key.
    #[serde(default)]
    pub epoch: u32,
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

/// One item's outcome.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ItemRecord {
    /// Done or failed.
    pub state: ItemState,
    /// The final HTTP status, when there was a response.
    pub status: Option<u16>,
    /// The response body (JSON when it parsed, a string otherwise), for done items.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<serde_json::Value>,
    /// Why it failed, for failed items.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Calls made for it (not counting rate-limit requeues).
    pub attempts: u32,
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

/// One job's item records.
#[derive(Clone)]
pub struct JobItems {
    tree: sled::Tree,
    /// How many times `--retry-failed` re-opened each item: part of its
    /// Idempotency-Key, because an API that stored the failed response
    /// would otherwise replay the failure instead of trying again.
    retries: sled::Tree,
}

fn key(line: u64) -> [u8; 8] {
    line.to_be_bytes()
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
            // grow with its length.
            .cache_capacity(64 * 1024 * 1024)
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
            Some(v) => serde_json::from_slice(&v)
                .map(Some)
                .map_err(|e| CheckpointError::Corrupt(format!("job {id}: {e}"))),
        }
    }

    /// Every job recorded for an input file (absolute path).
    pub fn jobs_for_input(&self, input: &str) -> Result<Vec<JobMeta>, CheckpointError> {
        Ok(self
            .jobs()?
            .into_iter()
            .filter(|m| m.input == input)
            .collect())
    }

    /// Every job in the store.
    pub fn jobs(&self) -> Result<Vec<JobMeta>, CheckpointError> {
        let mut out = Vec::new();
        for kv in self.jobs.iter() {
            let (k, v) = kv.map_err(|e| self.err(e))?;
            if k.starts_with(b"meter:") {
                continue;
            }
            let meta: JobMeta = serde_json::from_slice(&v)
                .map_err(|e| CheckpointError::Corrupt(format!("job: {e}")))?;
            out.push(meta);
        }
        Ok(out)
    }

    /// Writes a job's metadata.
    pub fn save_job(&self, meta: &JobMeta) -> Result<(), CheckpointError> {
        let v = serde_json::to_vec(meta).map_err(|e| CheckpointError::Corrupt(e.to_string()))?;
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
        match self
            .jobs
            .get(format!("meter:{origin}"))
            .map_err(|e| self.err(e))?
        {
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
        let v = serde_json::to_vec(state).map_err(|e| CheckpointError::Corrupt(e.to_string()))?;
        self.jobs
            .insert(format!("meter:{origin}"), v)
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    /// Removes a job and all its records (`--fresh`).
    pub fn discard_job(&self, id: &str) -> Result<(), CheckpointError> {
        self.jobs.remove(id).map_err(|e| self.err(e))?;
        for tree in [format!("items:{id}"), format!("retries:{id}")] {
            self.db.drop_tree(tree).map_err(|e| self.err(e))?;
        }
        Ok(())
    }

    /// A job's item records.
    pub fn items(&self, id: &str) -> Result<JobItems, CheckpointError> {
        let tree = self
            .db
            .open_tree(format!("items:{id}"))
            .map_err(|e| self.err(e))?;
        let retries = self
            .db
            .open_tree(format!("retries:{id}"))
            .map_err(|e| self.err(e))?;
        Ok(JobItems { tree, retries })
    }

    /// Makes everything written so far durable. Called at every halt and exit.
    pub fn flush(&self) -> Result<(), CheckpointError> {
        self.db.flush().map_err(|e| self.err(e))?;
        Ok(())
    }
}

impl JobItems {
    /// Records an item's outcome.
    pub fn record(&self, line: u64, rec: &ItemRecord) -> Result<(), CheckpointError> {
        let v = serde_json::to_vec(rec).map_err(|e| CheckpointError::Corrupt(e.to_string()))?;
        self.tree
            .insert(key(line), v)
            .map_err(|e| CheckpointError::Corrupt(e.to_string()))?;
        Ok(())
    }

    /// An item's outcome, if it has one.
    pub fn get(&self, line: u64) -> Result<Option<ItemRecord>, CheckpointError> {
        match self
            .tree
            .get(key(line))
            .map_err(|e| CheckpointError::Corrupt(e.to_string()))?
        {
            None => Ok(None),
            Some(v) => serde_json::from_slice(&v)
                .map(Some)
                .map_err(|e| CheckpointError::Corrupt(format!("item at line {line}: {e}"))),
        }
    }

    /// Forgets every failed record so those items are pending again (`--retry-failed`).
    pub fn clear_failed(&self) -> Result<u64, CheckpointError> {
        let mut n = 0;
        for kv in self.tree.iter() {
            let (k, v) = kv.map_err(|e| CheckpointError::Corrupt(e.to_string()))?;
            let rec: ItemRecord =
                serde_json::from_slice(&v).map_err(|e| CheckpointError::Corrupt(e.to_string()))?;
            if rec.state == ItemState::Failed {
                let generation = self.generation_of(&k)? + 1;
                self.retries
                    .insert(&k, &generation.to_be_bytes())
                    .map_err(|e| CheckpointError::Corrupt(e.to_string()))?;
                self.tree
                    .remove(k)
                    .map_err(|e| CheckpointError::Corrupt(e.to_string()))?;
                n += 1;
            }
        }
        Ok(n)
    }

    /// How many times `--retry-failed` re-opened the item (0 for most).
    pub fn generation(&self, line: u64) -> Result<u32, CheckpointError> {
        self.generation_of(&key(line))
    }

    fn generation_of(&self, k: &[u8]) -> Result<u32, CheckpointError> {
        let v = self
            .retries
            .get(k)
            .map_err(|e| CheckpointError::Corrupt(e.to_string()))?;
        Ok(v.and_then(|v| <[u8; 4]>::try_from(v.as_ref()).ok())
            .map_or(0, u32::from_be_bytes))
    }

    /// Done and failed counts.
    pub fn counts(&self) -> Result<Counts, CheckpointError> {
        let mut c = Counts::default();
        for kv in self.tree.iter() {
            let (_, v) = kv.map_err(|e| CheckpointError::Corrupt(e.to_string()))?;
            let rec: ItemRecord =
                serde_json::from_slice(&v).map_err(|e| CheckpointError::Corrupt(e.to_string()))?;
            match rec.state {
                ItemState::Done => c.done += 1,
                ItemState::Failed => c.failed += 1,
            }
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(tag: &str) -> PathBuf {
        let p = std::env::temp_dir().join(format!("batchrun-ckpt-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        p
    }

    #[test]
    fn records_survive_reopen_and_count() {
        let dir = tmp("reopen");
        {
            let s = Store::open(&dir).unwrap();
            let meta = JobMeta {
                id: "j1".into(),
                input: "/x/in.jsonl".into(),
                total: 3,
                ..JobMeta::default()
            };
            s.save_job(&meta).unwrap();
            let items = s.items("j1").unwrap();
            let done = ItemRecord {
                state: ItemState::Done,
                status: Some(200),
                body: Some(serde_json::json!({"ok": true})),
                reason: None,
                attempts: 1,
            };
            items.record(1, &done).unwrap();
            items
                .record(
                    3,
                    &ItemRecord {
                        state: ItemState::Failed,
                        status: Some(422),
                        body: None,
                        reason: Some("bad".into()),
                        attempts: 1,
                    },
                )
                .unwrap();
            s.flush().unwrap();
        }
        let s = Store::open(&dir).unwrap();
        assert_eq!(s.job("j1").unwrap().unwrap().total, 3);
        assert_eq!(s.jobs_for_input("/x/in.jsonl").unwrap().len(), 1);
        let items = s.items("j1").unwrap();
        assert_eq!(items.counts().unwrap(), Counts { done: 1, failed: 1 });
        assert_eq!(items.get(2).unwrap(), None);
        assert_eq!(items.generation(3).unwrap(), 0);
        assert_eq!(items.clear_failed().unwrap(), 1);
        assert_eq!(
            items.generation(3).unwrap(),
            1,
            "a retried item gets a new key"
        );
        assert_eq!(items.generation(1).unwrap(), 0, "a done item keeps its key");
        assert_eq!(items.counts().unwrap(), Counts { done: 1, failed: 0 });
        s.discard_job("j1").unwrap();
        assert!(s.job("j1").unwrap().is_none());
        assert_eq!(s.items("j1").unwrap().counts().unwrap(), Counts::default());
        drop(s);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
