//! One job's items: the line slots in sled, the done/failed bitsets loaded
//! from them, the retry generations, and the way back to each result.

use std::path::PathBuf;
use std::sync::Arc;

use sled::transaction::{TransactionError, Transactional};

use super::chunks::{Chunk, LINES_PER_CHUNK};
use super::index::IndexReader;
use super::log::{Entry, LogReader};
use super::{to_json, CheckpointError, Counts, ItemState, JobMeta, LineStates, OutputStamp, Store};

/// Chunks rewritten per transaction by `--retry-failed`, so that reopening
/// a million failures does not build one enormous transaction.
const CLEAR_BATCH: usize = 1024;

/// A chunk with lines made pending, and for each line its retry generation,
/// whether a call under that key may have run, and its former state.
type Reopened = (Chunk, Vec<(u64, (u32, bool), ItemState)>);

/// One job's items.
#[derive(Clone)]
pub struct JobItems {
    pub(super) id: String,
    pub(super) dir: PathBuf,
    pub(super) db: sled::Db,
    pub(super) lines: sled::Tree,
    pub(super) retries: sled::Tree,
    pub(super) jobs: sled::Tree,
    pub(super) log_path: PathBuf,
    pub(super) index_path: PathBuf,
    pub(super) states: Arc<LineStates>,
}

impl JobItems {
    /// Opens the job's trees and loads the state of every line.
    pub(super) fn open(store: &Store, id: &str) -> Result<JobItems, CheckpointError> {
        let lines = store.tree(&format!("lines:{id}"))?;
        let mut states = LineStates::default();
        if let Some(Ok((k, _))) = lines.last().transpose() {
            let last = u64::from_be_bytes(k.as_ref().try_into().unwrap_or([0; 8]));
            states.grow((last + 1) * super::LINES_PER_CHUNK - 1);
        }
        for kv in lines.iter() {
            let (k, v) = kv.map_err(|e| store.err(e))?;
            let chunk = Chunk::decode(&k, &v)?;
            for (line, state) in chunk.finished() {
                states.set(line, Some(state));
            }
        }
        Ok(JobItems {
            id: id.to_string(),
            dir: store.dir.clone(),
            db: store.db.clone(),
            lines,
            retries: store.tree(&format!("retries:{id}"))?,
            jobs: store.jobs.clone(),
            log_path: store.log_path(id),
            index_path: store.log_path(id).with_extension("idx"),
            states: Arc::new(states),
        })
    }

    pub(super) fn err(&self, source: sled::Error) -> CheckpointError {
        CheckpointError::Store {
            dir: self.dir.clone(),
            source,
        }
    }

    /// The done/failed bitsets, shared with whoever reads them.
    pub fn states(&self) -> Arc<LineStates> {
        self.states.clone()
    }

    /// Makes room in the bitsets for every line up to `last_line`. Call it
    /// before the states are shared: a shared copy would not see the room.
    pub fn reserve_lines(&mut self, last_line: u64) {
        Arc::make_mut(&mut self.states).grow(last_line);
    }

    /// The job record as it is on disk.
    pub fn job(&self) -> Result<Option<JobMeta>, CheckpointError> {
        match self.jobs.get(&self.id).map_err(|e| self.err(e))? {
            None => Ok(None),
            Some(v) => super::read_job(&self.jobs, &self.id, &v, |e| self.err(e)).map(Some),
        }
    }

    /// Done and failed counts, as the job record holds them (no counting).
    pub fn counts(&self) -> Result<Counts, CheckpointError> {
        Ok(self.job()?.map(|m| m.counts()).unwrap_or_default())
    }

    /// Checks the job record against the line states it counts, and those
    /// against the input (whose last item is on `last_line`): the record and
    /// the states are written in one transaction, so any difference is
    /// damage (a record lost or restored apart from its lines), and resuming
    /// from it would skip or repeat items.
    pub fn check_counts(&self, meta: &JobMeta, last_line: u64) -> Result<(), CheckpointError> {
        let bits = self.states.counts();
        if bits != meta.counts() {
            return Err(CheckpointError::Corrupt(format!(
                "job {} records {} done and {} failed, but its line states hold {} done and {} failed",
                self.id, meta.done, meta.failed, bits.done, bits.failed
            )));
        }
        // The bitsets end at the end of the last chunk: at most a chunk's
        // worth of lines to look at.
        if let Some(line) =
            (last_line + 1..=self.states.capacity()).find(|&l| self.states.is_finished(l))
        {
            return Err(CheckpointError::Corrupt(format!(
                "job {} has a result for line {line}, past the input's last item (line {last_line})",
                self.id
            )));
        }
        Ok(())
    }

    /// Failed items whose outcome is unknown (their calls may have run).
    pub fn unknown_failures(&self) -> Result<u64, CheckpointError> {
        let mut results = self.results();
        let mut n = 0;
        for line in 1..=self.states.capacity() {
            if self.states.state(line) == Some(ItemState::Failed)
                && results.get(line)?.is_some_and(|e| e.unknown)
            {
                n += 1;
            }
        }
        Ok(n)
    }

    /// Checks that the result of every finished line can be read back, each
    /// log entry whole and matching its checksum: a results log or index
    /// deleted, cut short or damaged is found before any call, not when the
    /// outputs are written after a whole run's calls. It reads the index and
    /// the log once, mostly in order, through their small windows.
    pub fn check_results(&self) -> Result<(), CheckpointError> {
        let mut results = self.results();
        for line in 1..=self.states.capacity() {
            if self.states.is_finished(line) && results.get(line)?.is_none() {
                return Err(CheckpointError::Corrupt(format!(
                    "the result of line {line} is missing"
                )));
            }
        }
        Ok(())
    }

    /// Records what the outputs were just written from.
    pub fn save_outputs(&self, stamp: OutputStamp) -> Result<(), CheckpointError> {
        let Some(mut meta) = self.job()? else {
            return Ok(());
        };
        meta.outputs = Some(stamp);
        self.jobs
            .insert(self.id.as_bytes(), to_json(&meta)?)
            .map_err(|e| self.err(e))?;
        self.db.flush().map_err(|e| self.err(e))?;
        Ok(())
    }

    /// The chunk record holding `index`'s lines (empty when none is stored).
    pub(super) fn chunk(&self, index: u64) -> Result<Chunk, CheckpointError> {
        let key = index.to_be_bytes();
        match self.lines.get(key).map_err(|e| self.err(e))? {
            Some(v) => Chunk::decode(&key, &v),
            None => Ok(Chunk::empty(index)),
        }
    }

    /// The chunks `lines` touch, each line set to its state, and `meta`'s
    /// counts moved accordingly (what a line was, done or failed, counted
    /// off first): what a group commit and a catch-up from the log write.
    pub(super) fn chunks_set(
        &self,
        lines: impl IntoIterator<Item = (u64, ItemState)>,
        meta: &mut JobMeta,
    ) -> Result<Vec<Chunk>, CheckpointError> {
        let mut chunks: Vec<Chunk> = Vec::new();
        for (line, state) in lines {
            let index = line / LINES_PER_CHUNK;
            let at = match chunks.iter().position(|c| c.index == index) {
                Some(at) => at,
                None => {
                    chunks.push(self.chunk(index)?);
                    chunks.len() - 1
                }
            };
            match chunks[at].set(line, Some(state)) {
                Some(ItemState::Done) => meta.done = meta.done.saturating_sub(1),
                Some(ItemState::Failed) => meta.failed = meta.failed.saturating_sub(1),
                None => {}
            }
            match state {
                ItemState::Done => meta.done += 1,
                ItemState::Failed => meta.failed += 1,
            }
        }
        Ok(chunks)
    }

    /// Makes every failed item pending again (`--retry-failed`), with a new
    /// retry generation for its Idempotency-Key, except where the failure's
    /// outcome is unknown: that call may have run, and only its old key lets
    /// the server answer with what it did instead of running it again.
    /// `meta` is the job record: its counts change in the same transactions
    /// as the slots.
    pub fn clear_failed(&self, meta: &mut JobMeta) -> Result<u64, CheckpointError> {
        let mut n = 0;
        let mut group = Vec::new();
        let mut results = self.results();
        for kv in self.lines.iter() {
            let (k, v) = kv.map_err(|e| self.err(e))?;
            let mut chunk = Chunk::decode(&k, &v)?;
            let failed: Vec<u64> = chunk
                .finished()
                .filter(|&(_, state)| state == ItemState::Failed)
                .map(|(line, _)| line)
                .collect();
            if failed.is_empty() {
                continue;
            }
            let mut reopened = Vec::with_capacity(failed.len());
            for line in failed {
                let (unknown, answered) = results
                    .get(line)?
                    .map_or((false, false), |e| (e.unknown, e.status.is_some()));
                chunk.set(line, None);
                // A new key gets past a failure the API answered (and may
                // replay under the old one). One it never answered (a
                // refused connection, a row never sent) keeps its key: a
                // call of a killed run under it may have run.
                let generation = self.generation(line)? + u32::from(answered && !unknown);
                reopened.push((line, (generation, unknown), ItemState::Failed));
            }
            group.push((chunk, reopened));
            if group.len() == CLEAR_BATCH {
                n += self.reopen(meta, std::mem::take(&mut group))?;
            }
        }
        if !group.is_empty() {
            n += self.reopen(meta, group)?;
        }
        Ok(n)
    }

    /// Makes `lines` (in increasing order) pending again, each under the
    /// retry generation it has: the outputs found that they no longer hold
    /// the item their result was for. Sent again as they are now, a line
    /// whose content is what was sent before gets its old key (the API
    /// replays it), and one whose content changed gets a new one.
    pub fn reopen_lines(&self, meta: &mut JobMeta, lines: &[u64]) -> Result<u64, CheckpointError> {
        let mut n = 0;
        let mut group: Vec<Reopened> = Vec::new();
        for &line in lines {
            let Some(was) = self.states.state(line) else {
                continue;
            };
            let index = line / super::LINES_PER_CHUNK;
            if group.last().map_or(true, |(c, _)| c.index != index) {
                if group.len() == CLEAR_BATCH {
                    n += self.reopen(meta, std::mem::take(&mut group))?;
                }
                group.push((self.chunk(index)?, Vec::new()));
            }
            if let Some((chunk, reopened)) = group.last_mut() {
                chunk.set(line, None);
                reopened.push((line, self.carried(line)?, was));
            }
        }
        if !group.is_empty() {
            n += self.reopen(meta, group)?;
        }
        Ok(n)
    }

    fn reopen(&self, meta: &mut JobMeta, group: Vec<Reopened>) -> Result<u64, CheckpointError> {
        let n: u64 = group.iter().map(|(_, r)| r.len() as u64).sum();
        let mut next = meta.clone();
        for (_, _, was) in group.iter().flat_map(|(_, r)| r) {
            match was {
                ItemState::Done => next.done = next.done.saturating_sub(1),
                ItemState::Failed => next.failed = next.failed.saturating_sub(1),
            }
        }
        next.revision += 1;
        let record = to_json(&next)?;
        let writes: Vec<_> = group.iter().map(|(c, _)| (c.key(), c.encode())).collect();
        (&self.lines, &self.retries, &self.jobs)
            .transaction(|(lines, retries, jobs)| {
                for (k, v) in &writes {
                    lines.insert(&k[..], v.as_slice())?;
                }
                for (line, (generation, maybe_ran), _) in group.iter().flat_map(|(_, r)| r) {
                    let mut v = generation.to_be_bytes().to_vec();
                    v.push(u8::from(*maybe_ran));
                    retries.insert(&line.to_be_bytes()[..], v)?;
                }
                jobs.insert(self.id.as_bytes(), record.as_slice())?;
                Ok::<_, sled::transaction::ConflictableTransactionError<()>>(())
            })
            .map_err(|e| self.tx_err(e))?;
        self.db.flush().map_err(|e| self.err(e))?;
        for (line, ..) in group.iter().flat_map(|(_, r)| r) {
            self.states.set(*line, None);
        }
        *meta = next;
        Ok(n)
    }

    pub(super) fn tx_err(&self, e: TransactionError<()>) -> CheckpointError {
        match e {
            TransactionError::Storage(e) => self.err(e),
            TransactionError::Abort(()) => {
                CheckpointError::Corrupt("a checkpoint transaction was aborted".into())
            }
        }
    }

    /// Puts back retry generations read from earlier outputs, for a job
    /// whose checkpoint was lost: its lines are then sent under the keys
    /// they were last sent under, and those whose call may have run stay of
    /// unknown outcome.
    pub fn restore_generations(&self, gens: &[(u64, u32, bool)]) -> Result<(), CheckpointError> {
        if gens.is_empty() {
            return Ok(());
        }
        let mut batch = sled::Batch::default();
        for (line, generation, maybe_ran) in gens {
            let mut v = generation.to_be_bytes().to_vec();
            v.push(u8::from(*maybe_ran));
            batch.insert(&line.to_be_bytes()[..], v);
        }
        self.retries.apply_batch(batch).map_err(|e| self.err(e))?;
        self.db.flush().map_err(|e| self.err(e))?;
        Ok(())
    }

    /// Every line `--retry-failed` reopened: its generation, and whether a
    /// call under that key may have run.
    pub fn carried_all(&self) -> Result<Vec<(u64, u32, bool)>, CheckpointError> {
        let mut out = Vec::new();
        for kv in self.retries.iter() {
            let (k, _) = kv.map_err(|e| self.err(e))?;
            let Ok(line) = <[u8; 8]>::try_from(k.as_ref()).map(u64::from_be_bytes) else {
                continue;
            };
            let (generation, maybe_ran) = self.carried(line)?;
            out.push((line, generation, maybe_ran));
        }
        Ok(out)
    }

    /// How many times `--retry-failed` re-opened the item with a new key
    /// (0 for most).
    pub fn generation(&self, line: u64) -> Result<u32, CheckpointError> {
        Ok(self.carried(line)?.0)
    }

    /// The item's retry generation, and whether a call under that key in an
    /// earlier run may have run (it failed with its outcome unknown): then
    /// its outcome stays unknown until a call gets a verdict, so that a
    /// later `--retry-failed` still keeps the key.
    pub fn carried(&self, line: u64) -> Result<(u32, bool), CheckpointError> {
        let v = self
            .retries
            .get(line.to_be_bytes())
            .map_err(|e| self.err(e))?;
        let Some(v) = v else {
            return Ok((0, false));
        };
        let generation = v
            .get(..4)
            .and_then(|b| <[u8; 4]>::try_from(b).ok())
            .map_or(0, u32::from_be_bytes);
        Ok((generation, v.get(4) == Some(&1)))
    }

    /// True when `--retry-failed` ever re-opened an item: only then is a
    /// generation worth looking up.
    pub fn any_reopened(&self) -> bool {
        !self.retries.is_empty()
    }

    /// Reads results back in line order, for the outputs.
    pub fn results(&self) -> Results {
        Results {
            states: self.states.clone(),
            files: None,
            log_path: self.log_path.clone(),
            index_path: self.index_path.clone(),
        }
    }
}

/// Finished items' results, looked up by line in increasing line order.
pub struct Results {
    states: Arc<LineStates>,
    files: Option<(IndexReader, LogReader)>,
    log_path: PathBuf,
    index_path: PathBuf,
}

impl Results {
    /// The line's result; None while it is pending.
    pub fn get(&mut self, line: u64) -> Result<Option<Entry<'_>>, CheckpointError> {
        let Some(state) = self.states.state(line) else {
            return Ok(None);
        };
        let (index, log) = match &mut self.files {
            Some(files) => files,
            none => none.insert((
                IndexReader::open(&self.index_path)?,
                LogReader::open(&self.log_path)?,
            )),
        };
        let offset = index.offset(line)?;
        let entry = log.entry(offset)?;
        if entry.line != line || entry.state != state {
            return Err(CheckpointError::Corrupt(format!(
                "line {line} points at the results log entry of line {} at offset {offset}",
                entry.line
            )));
        }
        Ok(Some(entry))
    }
}
