//! Catching the line states up with the results log.
//!
//! A group's entries are written and fsynced to the log before sled vouches
//! for them, and every group's sled transaction also records how far into
//! the log its line states account for (the progress record's log end).
//! sled opens a database that was cut short or has damaged bytes at the
//! last state it can still read, without a word: an older state, or an
//! empty one. The log still holds the results of the calls that state
//! forgot, and sending those items again would run them twice on an API
//! that does not honour Idempotency-Keys. So when a job is opened, every
//! line whose latest entry (found through the index) starts at or past the
//! log end the states account for takes its state from that entry, if the
//! entry is whole and passes its checksum.
//!
//! Entries before that end are ones the states already saw: a line held
//! pending despite one was reopened on purpose (`--retry-failed`, or an
//! edited line the outputs set pending again) and stays pending. The same
//! catch-up takes the entries of a group whose sled commit a crash cut
//! off: those calls finished and their results are on disk.

use sled::transaction::{ConflictableTransactionError, Transactional};

use super::index::IndexReader;
use super::log::{LogReader, FILE_HEADER};
use super::{
    progress_key, progress_log_end, progress_value, CheckpointError, ItemState, JobItems, JobMeta,
};

impl JobItems {
    /// Takes into the line states the results the log holds beyond the
    /// part of it they account for, for lines up to `last_line` (the
    /// input's last item), and updates `meta`'s counts and revision with
    /// them in the same transaction. Returns how many lines it changed:
    /// more than none means the checkpoint had lost them (or a crash cut
    /// off their commit). Call it after `reserve_lines`, before the job's
    /// counts are checked.
    pub fn adopt_logged(&self, meta: &mut JobMeta, last_line: u64) -> Result<u64, CheckpointError> {
        let Some(accounted) = self.log_accounted(meta)? else {
            return Ok(0);
        };
        let Ok(log_end) = std::fs::metadata(&self.log_path).map(|m| m.len()) else {
            return Ok(0);
        };
        if log_end <= accounted {
            return Ok(0);
        }
        let found = self.logged_from(accounted.max(FILE_HEADER.len() as u64), last_line);
        if found.is_empty() {
            return Ok(0);
        }
        self.commit_adopted(meta, &found, log_end)?;
        Ok(found.len() as u64)
    }

    /// Where the part of the log the line states do not account for begins;
    /// None when the checkpoint does not say (a progress record an earlier
    /// version wrote), and then nothing is taken from the log.
    fn log_accounted(&self, meta: &JobMeta) -> Result<Option<u64>, CheckpointError> {
        let key = progress_key(&self.id);
        match self.jobs.get(key).map_err(|e| self.err(e))? {
            Some(v) => Ok(progress_log_end(&v)),
            // No group was ever committed (a job just made, perhaps in
            // place of one the checkpoint lost): none of the log is.
            None if meta.revision == 0 => Ok(Some(0)),
            None => Ok(None),
        }
    }

    /// Lines up to `last_line` whose latest entry starts at `from` or
    /// later, with the state that entry records, where it differs from the
    /// line's. An offset or an entry that cannot be read, or that belongs
    /// to another line, is passed over: that line keeps its state, and if
    /// it is pending it goes again under the key it was sent with.
    fn logged_from(&self, from: u64, last_line: u64) -> Vec<(u64, ItemState)> {
        let opened = (
            std::fs::metadata(&self.index_path),
            IndexReader::open(&self.index_path),
            LogReader::open(&self.log_path),
        );
        let (Ok(meta), Ok(mut index), Ok(mut log)) = opened else {
            return Vec::new();
        };
        let last = last_line.min((meta.len() / 8).saturating_sub(1));
        let mut found = Vec::new();
        for line in 1..=last {
            let offset = match index.offset(line) {
                Ok(offset) if offset >= from => offset,
                _ => continue,
            };
            let Ok(entry) = log.entry(offset) else {
                continue;
            };
            if entry.line == line && self.states.state(line) != Some(entry.state) {
                found.push((line, entry.state));
            }
        }
        found
    }

    /// Writes `found` into the chunks, with the
    /// counts, the revision and the log end in the progress record, in one
    /// transaction as a group commit does; then the bits.
    fn commit_adopted(
        &self,
        meta: &mut JobMeta,
        found: &[(u64, ItemState)],
        log_end: u64,
    ) -> Result<(), CheckpointError> {
        let mut next = meta.clone();
        let chunks = self.chunks_set(found.iter().copied(), &mut next)?;
        next.revision += 1;
        let progress = progress_value(&next, log_end);
        let key = progress_key(&self.id);
        (&self.lines, &self.jobs)
            .transaction(|(lines, jobs)| {
                for c in &chunks {
                    lines.insert(&c.key()[..], c.encode())?;
                }
                jobs.insert(key.as_bytes(), &progress[..])?;
                Ok::<_, ConflictableTransactionError<()>>(())
            })
            .map_err(|e| self.tx_err(e))?;
        self.db.flush().map_err(|e| self.err(e))?;
        for &(line, state) in found {
            self.states.set(line, Some(state));
        }
        *meta = next;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use super::super::{Counts, GroupCommit, Record, Store, LAYOUT};
    use super::*;

    fn tmp(tag: &str) -> PathBuf {
        let p = std::env::temp_dir().join(format!("batchrun-recover-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        p
    }

    fn record(line: u64, state: ItemState) -> Record {
        Record {
            line,
            state,
            status: Some(200),
            attempts: 1,
            payload: b"{}".to_vec(),
            unknown: false,
            digest: 1,
        }
    }

    /// Opens `id` (making a job of `total` lines when the store has none)
    /// with room for every line.
    fn open(s: &Store, id: &str, total: u64) -> (JobItems, JobMeta) {
        let meta = s.job(id).unwrap().unwrap_or_else(|| {
            let meta = JobMeta {
                id: id.into(),
                total,
                layout: LAYOUT,
                ..JobMeta::default()
            };
            s.save_job(&meta).unwrap();
            meta
        });
        let mut items = s.items(id).unwrap();
        items.reserve_lines(total);
        (items, meta)
    }

    /// Commits `records` as one group; returns the job record after it.
    fn commit(items: &JobItems, meta: JobMeta, records: Vec<Record>) -> JobMeta {
        let c = items.committer(meta, GroupCommit::default()).unwrap();
        c.record_all(records).unwrap();
        let committed = c.finish();
        assert!(committed.err.is_none(), "{:?}", committed.err);
        committed.meta.unwrap()
    }

    /// The records a cut database would go back to: the progress record
    /// and the first chunk of `id`, as they are now.
    fn older_state(s: &Store, id: &str) -> (Vec<u8>, Vec<u8>) {
        let progress = s.jobs.get(progress_key(id)).unwrap().unwrap();
        let chunk = s.tree(&format!("lines:{id}")).unwrap();
        let chunk = chunk.get(0u64.to_be_bytes()).unwrap().unwrap();
        (progress.to_vec(), chunk.to_vec())
    }

    fn go_back(s: &Store, id: &str, (progress, chunk): &(Vec<u8>, Vec<u8>)) {
        s.jobs
            .insert(progress_key(id), progress.as_slice())
            .unwrap();
        let lines = s.tree(&format!("lines:{id}")).unwrap();
        lines.insert(0u64.to_be_bytes(), chunk.as_slice()).unwrap();
    }

    fn states(items: &JobItems, last: u64) -> Vec<Option<ItemState>> {
        (1..=last).map(|l| items.states().state(l)).collect()
    }

    const DONE: Option<ItemState> = Some(ItemState::Done);
    const FAILED: Option<ItemState> = Some(ItemState::Failed);

    #[test]
    fn results_a_database_gone_back_forgot_are_taken_from_the_log() {
        let dir = tmp("back");
        let s = Store::open(&dir).unwrap();
        let (items, meta) = open(&s, "j", 5);
        let meta = commit(&items, meta, vec![record(1, ItemState::Done)]);
        let older = older_state(&s, "j");
        let failed = record(3, ItemState::Failed);
        commit(&items, meta, vec![record(2, ItemState::Done), failed]);
        go_back(&s, "j", &older);
        drop(items);
        let (items, mut meta) = open(&s, "j", 5);
        assert_eq!(states(&items, 5), [DONE, None, None, None, None]);
        // Line 5 of the input is not there yet: only lines up to 4 count.
        assert_eq!(items.adopt_logged(&mut meta, 4).unwrap(), 2);
        assert_eq!(states(&items, 5), [DONE, DONE, FAILED, None, None]);
        assert_eq!(meta.counts(), Counts { done: 2, failed: 1 });
        items.check_counts(&meta, 5).unwrap();
        items.check_results().unwrap();
        // Recorded: read back the same, and nothing left to take.
        drop(items);
        let (items, mut meta) = open(&s, "j", 5);
        assert_eq!(meta.counts(), Counts { done: 2, failed: 1 });
        assert_eq!(states(&items, 5), [DONE, DONE, FAILED, None, None]);
        assert_eq!(items.adopt_logged(&mut meta, 5).unwrap(), 0);
        drop((items, s));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_lost_database_takes_every_result_back_from_the_log() {
        let dir = tmp("lost");
        let s = Store::open(&dir).unwrap();
        let (items, meta) = open(&s, "j", 3);
        commit(&items, meta, vec![record(1, ItemState::Done)]);
        let (items, meta) = open(&s, "j", 3);
        commit(&items, meta, vec![record(3, ItemState::Done)]);
        drop((items, s));
        std::fs::remove_dir_all(dir.join("checkpoint")).unwrap();
        let s = Store::open(&dir).unwrap();
        let (items, mut meta) = open(&s, "j", 3);
        assert_eq!(items.adopt_logged(&mut meta, 3).unwrap(), 2);
        assert_eq!(states(&items, 3), [DONE, None, DONE]);
        items.check_counts(&meta, 3).unwrap();
        items.check_results().unwrap();
        drop((items, s));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_line_reopened_after_its_result_stays_pending() {
        let dir = tmp("reopened");
        let s = Store::open(&dir).unwrap();
        let (items, meta) = open(&s, "j", 3);
        let records = vec![record(1, ItemState::Done), record(2, ItemState::Failed)];
        let mut meta = commit(&items, meta, records);
        // An edited line, and --retry-failed: pending on purpose.
        assert_eq!(items.reopen_lines(&mut meta, &[1]).unwrap(), 1);
        assert_eq!(items.clear_failed(&mut meta).unwrap(), 1);
        drop(items);
        let (items, mut meta) = open(&s, "j", 3);
        assert_eq!(items.adopt_logged(&mut meta, 3).unwrap(), 0);
        assert_eq!(states(&items, 3), [None, None, None]);
        drop((items, s));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn without_the_log_end_or_a_readable_entry_nothing_is_taken() {
        let dir = tmp("unknown");
        let s = Store::open(&dir).unwrap();
        let (items, meta) = open(&s, "j", 3);
        let meta = commit(&items, meta, vec![record(1, ItemState::Done)]);
        let (progress, chunk) = older_state(&s, "j");
        commit(&items, meta, vec![record(2, ItemState::Done)]);
        // A progress record an earlier version wrote says nothing of the log.
        go_back(&s, "j", &(progress[..24].to_vec(), chunk.clone()));
        let (items, mut meta) = open(&s, "j", 3);
        assert_eq!(items.adopt_logged(&mut meta, 3).unwrap(), 0);
        // With the log end, an index pointing past the log's accounted end
        // but at no entry's start is passed over: the line goes again under
        // its key.
        go_back(&s, "j", &(progress, chunk));
        let index = items.index_path.clone();
        let at = std::fs::read(&index).unwrap()[2 * 8..3 * 8].to_vec();
        let at = u64::from_le_bytes(at.try_into().unwrap());
        overwrite(&index, 2 * 8, &(at + 1).to_le_bytes());
        let (items, mut meta) = open(&s, "j", 3);
        assert_eq!(items.adopt_logged(&mut meta, 3).unwrap(), 0);
        assert_eq!(states(&items, 3), [DONE, None, None]);
        drop((items, s));
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn overwrite(path: &Path, at: u64, bytes: &[u8]) {
        use std::os::unix::fs::FileExt as _;
        let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
        f.write_all_at(bytes, at).unwrap();
    }
}
