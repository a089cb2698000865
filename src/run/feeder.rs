//! The feeder: pending items from the input into the pool's queue.

use std::path::PathBuf;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::batch::{Blocks, Formation};
use super::pool::Queued;
use super::repeats::Counter;
use crate::checkpoint::{Backlog, JobItems, JobMeta};
use crate::fleet::Shard;
use crate::input::{self, Format};

/// Where the items come from: the part of the settings the feeder reads.
pub(super) struct Source {
    /// The input file (a pipe was spooled to one).
    pub(super) path: PathBuf,
    /// How it is read.
    pub(super) format: Format,
    /// This process's share of the items, in a fleet (split as the job
    /// was made: by content, or by line).
    pub(super) shard: Option<Shard>,
    /// `--skip-invalid`: bad rows were recorded as failed; pass them by.
    pub(super) skip_invalid: bool,
    /// How the job fingerprints its items.
    pub(super) field_order: input::FieldOrder,
    /// The blocks its batches are formed from, under `--batch`.
    pub(super) blocks: Option<Blocks>,
}

impl Source {
    /// The input as the settings name it, read as the job `meta` reads it
    /// (its shards split as it was made, its fingerprints), in the blocks
    /// of the batches this run forms (`formation`).
    pub(super) fn of(
        settings: &crate::settings::Settings,
        meta: &JobMeta,
        formation: Option<&Formation>,
    ) -> Source {
        Source {
            path: settings.input.clone(),
            format: settings.format,
            shard: settings.shard.map(|s| s.by_content(meta.shards_by_content)),
            skip_invalid: settings.skip_invalid,
            field_order: meta.field_order(),
            blocks: formation.map(|f| f.blocks),
        }
    }
}

/// Streams pending items into a small queue: memory does not grow with
/// the input. Finished lines are skipped from the in-memory bitsets, and
/// reading stops once every pending item (by the same bits) has been
/// queued. Room in the queue is reserved half a queue at a time, so the
/// feeder is woken once per batch rather than once per item; and no room is
/// asked for while the committer is a group behind, which bounds what a
/// `kill -9` can find finished but unrecorded.
pub(super) fn spawn(
    source: Source,
    mut repeats: Counter,
    items: JobItems,
    total: u64,
    backlog: Backlog,
    tx: mpsc::Sender<Queued>,
) -> JoinHandle<anyhow::Result<()>> {
    let (shard, skip_invalid) = (source.shard, source.skip_invalid);
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
        // This shard's items so far, done or not: a shard's batch blocks.
        let mut nth = 0u64;
        let reserve = |left: u64| {
            backlog.wait();
            rt.block_on(tx.reserve_many(batch.min(left) as usize))
        };
        let Ok(mut room) = reserve(left) else {
            return Ok(());
        };
        let read = reader(&source.path, source.format, skip_invalid)?;
        for item in read.field_order(source.field_order) {
            let item = match item {
                Ok(item) => item,
                Err(e) if skip_invalid && passed_by(&e, &states, shard) => continue,
                Err(e) => return Err(e.into()),
            };
            // Every item counts, whoever sends it and whether it is done.
            // Digested once, and only if the repeats or a shard by
            // content need it.
            let digest = std::cell::OnceCell::new();
            let digest = || *digest.get_or_init(|| item.digest());
            let repeat = repeats.of(digest);
            if shard.is_some_and(|s| !s.takes(item.line, s.by_content.then(digest))) {
                continue;
            }
            nth += 1;
            if states.is_finished(item.line) {
                continue;
            }
            let (generation, maybe_ran) = match reopened {
                true => items.carried(item.line)?,
                false => (0, false),
            };
            let permit = match room.next() {
                Some(p) => p,
                // The room reserved is used: more, unless the queue closed
                // (the run stopped).
                None => match reserve(left).map(|more| room = more).map(|()| room.next()) {
                    Ok(Some(p)) => p,
                    _ => return Ok(()),
                },
            };
            let block = source.blocks.map_or(0, |b| b.of(item.line, nth));
            permit.send(Queued {
                item,
                generation,
                maybe_ran,
                repeat,
                block,
            });
            left -= 1;
            if left == 0 {
                return Ok(());
            }
        }
        // The scan counted more pending items than the file holds now.
        Err(changed(&source.path, left))
    })
}

/// The input held fewer pending items than the scan counted.
fn changed(path: &std::path::Path, left: u64) -> anyhow::Error {
    anyhow::anyhow!(
        "{} changed while the job ran: it ended with {left} pending item(s) not yet read \
         (lines removed or rewritten). Restore it and run the same command, or use --fresh \
         to start over with the new content",
        path.display()
    )
}

/// The input, read past bad rows with `--skip-invalid`.
fn reader(
    path: &std::path::Path,
    format: Format,
    skip_invalid: bool,
) -> anyhow::Result<input::Reader> {
    let reader = input::Reader::open(path, format)?;
    Ok(match skip_invalid {
        true => reader.past_bad_rows(),
        false => reader,
    })
}

/// A bad row `--skip-invalid` recorded as failed (or another shard's).
fn passed_by(
    e: &input::InputError,
    states: &crate::checkpoint::LineStates,
    shard: Option<Shard>,
) -> bool {
    e.line()
        .is_some_and(|l| states.is_finished(l) || shard.is_some_and(|s| !s.takes(l, None)))
}
