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
//!
//! A group is taken whole or not at all: the log is read from the end the
//! states account for, group by group, up to the last group end (see
//! `log.rs`), and the index is written for what is taken. Through the
//! index alone, a crash among a group's index writes left some of a
//! batch's items done and the rest pending: a resume sent the rest as a
//! batch of their own, under another key, and the API ran them twice. A
//! log without group ends (written before they were) is read through the
//! index as it was.

use sled::transaction::{ConflictableTransactionError, Transactional};

use super::index::{IndexReader, IndexWriter};
use super::log::{LogReader, FILE_HEADER};
use super::{
    progress_key, progress_log_end, progress_value, CheckpointError, ItemState, JobItems, JobMeta,
};

/// A line taken from the log: its state, and where its entry starts.
type Found = (u64, ItemState, u64);

/// The longest payload looked for past torn bytes: a length read from
/// them is read no further (an entry longer than this, right after them,
/// is passed over, and its group is not taken).
const RESYNC_MOST: usize = 16 << 20;

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
        let from = accounted.max(FILE_HEADER.len() as u64);
        let found = match self.logged_groups(from, log_end, last_line) {
            Some(found) => found,
            None => self.logged_from(from, last_line),
        };
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

    /// The entries of the whole groups the log holds from `from` to its
    /// `end`, for lines up to `last_line`: each line's latest, with the state it
    /// records and where it starts, where that state differs from the
    /// line's. An entry that cannot be read is a torn append: reading
    /// goes on at the next whole entry, and a group is taken only when its
    /// group end follows its first entry (named in the group end), so that
    /// neither a torn group nor the part of one read past torn bytes is.
    /// The entries after the last group end are a group a crash cut short,
    /// not taken either. `None` when no group end follows `from` (a log
    /// written before group ends were, or a torn group alone), and for a
    /// version 1 log.
    fn logged_groups(&self, from: u64, end: u64, last_line: u64) -> Option<Vec<Found>> {
        let mut log = LogReader::open(&self.log_path).ok()?;
        // Without checksums, an entry after a torn one cannot be told.
        if log.version() < 2 {
            return None;
        }
        let (mut whole, mut group): (Vec<Found>, Vec<Found>) = (Vec::new(), Vec::new());
        let (mut at, mut ends) = (from, 0);
        while at < end {
            let read = log
                .entry(at)
                .map(|e| (e.line, e.state, e.digest, e.payload.len()));
            match read {
                // A group end closes the entries from where its group
                // began: those before are a torn group's, and a group whose
                // beginning was not read (torn bytes read past into its
                // middle) is not taken.
                Ok((0, _, began, len)) => {
                    if let Some(i) = group.iter().position(|f| Some(f.2) == began) {
                        whole.extend(group.drain(i..));
                    }
                    group.clear();
                    ends += 1;
                    at = log.next(at, len);
                }
                Ok((line, state, _, len)) => {
                    group.push((line, state, at));
                    at = log.next(at, len);
                }
                // A torn append, and groups appended after it (a run went
                // on after the crash): reading goes on at the next entry
                // whole with its checksum.
                Err(_) => match (at + 1..end).find(|&o| log.starts_entry(o, end, RESYNC_MOST)) {
                    Some(next) => at = next,
                    None => break,
                },
            }
        }
        if ends == 0 {
            return None;
        }
        // Each line's latest entry: the last in the log's order, first once
        // reversed (the sort is stable).
        whole.reverse();
        whole.sort_by_key(|f| f.0);
        whole.dedup_by_key(|f| f.0);
        whole.retain(|&(line, state, _)| {
            line <= last_line && self.states.state(line) != Some(state)
        });
        Some(whole)
    }

    /// Lines up to `last_line` whose latest entry starts at `from` or
    /// later, with the state that entry records, where it differs from the
    /// line's. An offset or an entry that cannot be read, or that belongs
    /// to another line, is passed over: that line keeps its state, and if
    /// it is pending it goes again under the key it was sent with.
    fn logged_from(&self, from: u64, last_line: u64) -> Vec<Found> {
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
                found.push((line, entry.state, offset));
            }
        }
        found
    }

    /// Writes `found` into the index and the chunks, with the counts, the
    /// revision and the log end in the progress record, in one transaction
    /// as a group commit does; then the bits.
    fn commit_adopted(
        &self,
        meta: &mut JobMeta,
        found: &[Found],
        log_end: u64,
    ) -> Result<(), CheckpointError> {
        let mut slots: Vec<(u64, u64)> = found.iter().map(|&(l, _, at)| (l, at)).collect();
        IndexWriter::open(&self.index_path)?.write(&mut slots)?;
        let mut next = meta.clone();
        let states = found.iter().map(|&(line, state, _)| (line, state));
        let chunks = self.chunks_set(states, &mut next)?;
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
        for &(line, state, _) in found {
            self.states.set(line, Some(state));
        }
        *meta = next;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use super::super::log::{Entry, ENTRY_HEADER};
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
        let (s, items, mut meta) = lose_database(&dir, s, items, 3);
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
        // With the log end, an entry that fails its checksum is a group a
        // crash cut short: nothing of it is taken, and the line goes again
        // under its key.
        go_back(&s, "j", &(progress, chunk));
        let log = items.log_path.clone();
        let end = std::fs::metadata(&log).unwrap().len();
        overwrite(&log, end - ENTRY_HEADER as u64 - 1, b"X");
        let (items, mut meta) = open(&s, "j", 3);
        assert_eq!(items.adopt_logged(&mut meta, 3).unwrap(), 0);
        assert_eq!(states(&items, 3), [DONE, None, None]);
        drop((items, s));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A crash among a group's index writes (one per run of lines) left
    /// some of its lines pointing at their entries and not the others; sled
    /// had none of it. Taken through the index, some of a batch's items
    /// were done and the rest pending, and a resume sent the rest under
    /// another key. Taken from the log, the group is whole, and the index
    /// is written for it.
    #[test]
    fn a_group_whose_index_a_crash_cut_short_is_taken_whole() {
        let dir = tmp("index-cut");
        let s = Store::open(&dir).unwrap();
        let (items, meta) = open(&s, "j", 9);
        let meta = commit(&items, meta, vec![record(1, ItemState::Done)]);
        let older = older_state(&s, "j");
        let lines = [2, 4, 6, 8];
        let records = lines.iter().map(|&l| record(l, ItemState::Done)).collect();
        commit(&items, meta, records);
        go_back(&s, "j", &older);
        let index = items.index_path.clone();
        for l in [6, 8] {
            overwrite(&index, l * 8, &0u64.to_le_bytes());
        }
        drop(items);
        let (items, mut meta) = open(&s, "j", 9);
        assert_eq!(items.adopt_logged(&mut meta, 9).unwrap(), 4);
        let done: Vec<u64> = (1..=9)
            .filter(|&l| items.states().state(l) == DONE)
            .collect();
        assert_eq!(done, [1, 2, 4, 6, 8]);
        items.check_counts(&meta, 9).unwrap();
        items.check_results().unwrap();
        drop((items, s));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A torn append left in the middle of the log (runs went on after
    /// the crash), then sled lost everything: the groups after it are
    /// taken too, each line at its latest entry. Reading stopped at the
    /// torn bytes, and the results after them went again.
    #[test]
    fn groups_after_a_torn_append_are_taken_too() {
        let dir = tmp("torn-middle");
        let s = Store::open(&dir).unwrap();
        let (items, meta) = open(&s, "j", 3);
        commit(&items, meta, vec![record(1, ItemState::Done)]);
        let torn = entries(&[3]);
        append_raw(&items, &torn[..torn.len() - 5]);
        let (items, meta) = open(&s, "j", 3);
        let meta = commit(&items, meta, vec![record(2, ItemState::Failed)]);
        commit(
            &items,
            meta,
            vec![record(2, ItemState::Done), record(3, ItemState::Done)],
        );
        let (s, items, mut meta) = lose_database(&dir, s, items, 3);
        assert_eq!(items.adopt_logged(&mut meta, 3).unwrap(), 3);
        assert_eq!(states(&items, 3), [DONE, DONE, DONE]);
        items.check_counts(&meta, 3).unwrap();
        items.check_results().unwrap();
        drop((items, s));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A kill that stopped a group's append at an entry boundary leaves
    /// whole entries and no group end; the next run's group follows. Its
    /// group end closes its own entries only: the torn group's calls go
    /// again under their keys (taken in part, a batch's rest went under
    /// another key).
    #[test]
    fn a_group_end_closes_only_its_own_group() {
        let dir = tmp("boundary");
        let s = Store::open(&dir).unwrap();
        let (items, meta) = open(&s, "j", 4);
        commit(&items, meta, vec![record(1, ItemState::Done)]);
        append_raw(&items, &entries(&[2, 3]));
        let (items, meta) = open(&s, "j", 4);
        commit(&items, meta, vec![record(4, ItemState::Done)]);
        let (s, items, mut meta) = lose_database(&dir, s, items, 4);
        assert_eq!(items.adopt_logged(&mut meta, 4).unwrap(), 2);
        assert_eq!(states(&items, 4), [DONE, None, None, DONE]);
        items.check_results().unwrap();
        drop((items, s));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A crash in the middle of a group's log append (before its index
    /// writes): its first entry is whole, its last one and its group end
    /// are not. The whole group before it is taken, none of this one.
    #[test]
    fn a_group_a_crash_cut_short_in_the_log_is_not_taken() {
        let dir = tmp("log-cut");
        let s = Store::open(&dir).unwrap();
        let (items, meta) = open(&s, "j", 5);
        let meta = commit(&items, meta, vec![record(1, ItemState::Done)]);
        let older = older_state(&s, "j");
        let meta = commit(&items, meta, vec![record(2, ItemState::Done)]);
        let records = vec![record(3, ItemState::Done), record(4, ItemState::Done)];
        commit(&items, meta, records);
        go_back(&s, "j", &older);
        for l in [3, 4] {
            overwrite(&items.index_path, l * 8, &0u64.to_le_bytes());
        }
        let log = std::fs::OpenOptions::new()
            .write(true)
            .open(&items.log_path)
            .unwrap();
        let end = log.metadata().unwrap().len();
        // The group end, and half of line 4's entry.
        log.set_len(end - ENTRY_HEADER as u64 - 20).unwrap();
        drop((log, items));
        let (items, mut meta) = open(&s, "j", 5);
        assert_eq!(items.adopt_logged(&mut meta, 5).unwrap(), 1);
        assert_eq!(states(&items, 5), [DONE, DONE, None, None, None]);
        items.check_results().unwrap();
        drop((items, s));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The log entries of `lines`, done, as a group commit encodes them
    /// (with no group end).
    fn entries(lines: &[u64]) -> Vec<u8> {
        let mut out = Vec::new();
        for &line in lines {
            let r = record(line, ItemState::Done);
            Entry {
                line,
                state: r.state,
                status: r.status,
                attempts: r.attempts,
                payload: &r.payload,
                unknown: false,
                digest: Some(r.digest),
            }
            .encode(&mut out, 2);
        }
        out
    }

    /// Appends `bytes` to the job's log as a torn append left them.
    fn append_raw(items: &JobItems, bytes: &[u8]) {
        let mut log = std::fs::OpenOptions::new()
            .append(true)
            .open(&items.log_path)
            .unwrap();
        std::io::Write::write_all(&mut log, bytes).unwrap();
    }

    /// sled's files are gone (the log and index stay); the job `j` of
    /// `total` lines opened again.
    fn lose_database(
        dir: &Path,
        s: Store,
        items: JobItems,
        total: u64,
    ) -> (Store, JobItems, JobMeta) {
        drop((items, s));
        std::fs::remove_dir_all(dir.join("checkpoint")).unwrap();
        let s = Store::open(dir).unwrap();
        let (items, meta) = open(&s, "j", total);
        (s, items, meta)
    }

    fn overwrite(path: &Path, at: u64, bytes: &[u8]) {
        use std::os::unix::fs::FileExt as _;
        let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
        f.write_all_at(bytes, at).unwrap();
    }
}
