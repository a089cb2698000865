//! A regenerated input (an export made again, one row corrected): the
//! items it still holds keep their results, found by content, wherever
//! their lines are now; the changed and new ones are pending.
//!
//! The items are matched by their digest ([`crate::input::Item::digest`],
//! recorded with every result): the k-th item of the new file with a given
//! content takes the result of the k-th finished line of the old one with
//! that content. The results are copied into a job of their own (a new id,
//! the old job's keys), then the old job is discarded: a crash in between
//! leaves the old job whole, and the next run does it again.

use std::collections::{HashMap, HashSet, VecDeque};

use anyhow::Context as _;

use super::job::grew;
use crate::checkpoint::{GroupCommit, JobItems, JobMeta, Record, Store, LAYOUT};
use crate::exit::RunError;
use crate::input::{self, Scan};
use crate::settings::Settings;
use crate::util::sha_hex;

/// The job `id`, when it was made from other content than `scan` found
/// and the file did not only grow.
pub(super) fn regenerated(
    store: &Store,
    settings: &Settings,
    id: &str,
    scan: &Scan,
) -> Result<Option<JobMeta>, RunError> {
    let old = store.job(id).context("reading the checkpoint")?;
    // A pipe lands here only when its rows came otherwise and it holds
    // every result of the job (`holds_every_result`).
    Ok(old.filter(|old| old.fingerprint != scan.fingerprint && !grew(settings, old)))
}

/// Whether the input holds every finished item of `old` (found by
/// content, wherever its line is now). A pipe of other content than its
/// job's (the rows of a query without an order, rows inserted) is then
/// that job regenerated, and resumes it by content, its calls that may
/// have run under their keys; a pipe that lost some would lose their
/// results, and is another job.
pub(super) fn holds_every_result(
    store: &Store,
    settings: &Settings,
    old: &JobMeta,
) -> Result<bool, RunError> {
    let items = store.items(&old.id).context("opening the checkpoint")?;
    let states = items.states();
    let pairs = tokio::task::block_in_place(|| pairs(settings, &items, old))?;
    let kept = pairs.iter().filter(|(o, _)| states.is_finished(*o)).count() as u64;
    Ok(kept >= old.done + old.failed)
}

/// Carries the items of `old` that the input still holds over to a new
/// job, and returns its id. No handle on `old`'s items may be open.
pub(super) fn by_content(
    store: &Store,
    settings: &Settings,
    old: &JobMeta,
    scan: &Scan,
) -> Result<String, RunError> {
    let id = &old.id;
    let old_items = store.items(id).context("opening the checkpoint")?;
    let pairs = tokio::task::block_in_place(|| pairs(settings, &old_items, old))?;
    let new_id = sha_hex(&[old.id.as_bytes(), scan.fingerprint.as_bytes()])[..16].to_string();
    // What a run killed half-way through this left.
    store
        .discard_job(&new_id)
        .context("discarding the checkpoint")?;
    let meta = JobMeta {
        id: new_id.clone(),
        fingerprint: scan.fingerprint.clone(),
        total: scan.total,
        input_len: std::fs::metadata(&settings.input).ok().map(|m| m.len()),
        // The same keys as before for a line that still holds its item.
        key_base: Some(old.key_base.clone().unwrap_or_else(|| old.id.clone())),
        done: 0,
        failed: 0,
        revision: 0,
        outputs: None,
        layout: LAYOUT,
        ..old.clone()
    };
    store.save_job(&meta).context("writing the checkpoint")?;
    let mut items = store.items(&new_id).context("opening the checkpoint")?;
    items.reserve_lines(scan.last_line);
    let kept = copy(&old_items, &items, meta, &pairs)?;
    drop(old_items);
    store
        .discard_job(&old.id)
        .context("discarding the checkpoint")?;
    store.flush().context("flushing the checkpoint")?;
    super::owner::hand_over(settings, &old.id, &new_id);
    let rest = match scan.total.saturating_sub(kept) {
        0 => "none is changed or new".to_string(),
        n => format!("the other {n} (changed or new) are pending"),
    };
    // A feed that rolled over drops its old rows' results on purpose; a
    // file cut short drops them by mistake, and its user must hear it.
    let gone = match (old.done + old.failed).saturating_sub(kept) {
        0 => String::new(),
        n => format!(
            "; the results of {n} finished item(s) it no longer holds leave the checkpoint \
             and the outputs (a file cut short? restore it before the next run: its items \
             would go again under their keys, which an API replays only while it keeps them)"
        ),
    };
    crate::report::err_line(&format!(
        "batchrun: {} changed since its checkpoint was made: {kept} item(s) it still holds \
         keep their results (matched by content); {rest}{gone}",
        super::job::shown_input(settings),
    ));
    Ok(new_id)
}

/// (old line, new line) of every item of the new file that an old line
/// held, in old line order: a finished line, or a pending one sent before
/// (a retry generation of its own, its last result's content known).
///
/// A content the new file holds more than once is paired only when the old
/// job had nothing pending: the k-th new row takes the k-th finished old
/// row, which is its own only if every earlier row of that content
/// finished too. Otherwise its rows go again, under keys of their content
/// and order (the API replays those that ran), rather than one row taking
/// another's result and never running.
fn pairs(
    settings: &Settings,
    old: &JobItems,
    old_meta: &JobMeta,
) -> Result<Vec<(u64, u64)>, RunError> {
    let mut by_digest: HashMap<u64, VecDeque<u64>> = HashMap::new();
    let states = old.states();
    let sent: HashSet<u64> = old
        .carried_all()
        .context("reading the checkpoint")?
        .into_iter()
        .filter(|&(_, generation, maybe_ran)| generation > 0 || maybe_ran)
        .map(|(line, ..)| line)
        .collect();
    let mut results = old.results();
    for line in 1..=states.capacity() {
        if !states.is_finished(line) && !sent.contains(&line) {
            continue;
        }
        let entry = results.get(line).context("reading the checkpoint")?;
        if let Some(d) = entry.and_then(|e| e.digest) {
            by_digest.entry(d).or_default().push_back(line);
        }
    }
    let mut found: Vec<(u64, u64, u64)> = Vec::new();
    let mut in_new: HashMap<u64, u32> = HashMap::new();
    let reader = input::Reader::open(&settings.input, settings.format)?
        .past_bad_rows()
        .field_order(old_meta.field_order());
    // A bad row is the scan's to report: here it matches nothing.
    for item in reader.flatten() {
        let d = item.digest();
        if by_digest.contains_key(&d) {
            *in_new.entry(d).or_default() += 1;
        }
        if let Some(old_line) = by_digest.get_mut(&d).and_then(VecDeque::pop_front) {
            found.push((old_line, item.line, d));
        }
    }
    let complete = old_meta.done + old_meta.failed >= old_meta.total;
    let mut pairs: Vec<(u64, u64)> = found
        .into_iter()
        .filter(|(_, _, d)| complete || in_new.get(d).is_some_and(|&n| n == 1))
        .map(|(o, n, _)| (o, n))
        .collect();
    pairs.sort_unstable();
    Ok(pairs)
}

/// Records the old results at their new lines; returns how many.
fn copy(
    old: &JobItems,
    new: &JobItems,
    meta: JobMeta,
    pairs: &[(u64, u64)],
) -> Result<u64, RunError> {
    let committer = new
        .committer(meta, GroupCommit::default())
        .context("opening the results log")?;
    let mut results = old.results();
    let mut kept = 0;
    let states = old.states();
    // Each line's retry generation and whether a call under it may have
    // run go with it: its key is made with them.
    let mut carried = Vec::new();
    for &(old_line, new_line) in pairs {
        let (generation, maybe_ran) = old.carried(old_line).context("reading the checkpoint")?;
        if generation > 0 || maybe_ran {
            carried.push((new_line, generation, maybe_ran));
        }
        if !states.is_finished(old_line) {
            continue;
        }
        let Some(e) = results.get(old_line).context("reading the checkpoint")? else {
            continue;
        };
        committer
            .record(Record {
                line: new_line,
                state: e.state,
                status: e.status,
                attempts: e.attempts,
                payload: e.payload.to_vec(),
                unknown: e.unknown,
                digest: e.digest.unwrap_or(0),
            })
            .context("writing the checkpoint")?;
        kept += 1;
    }
    if let Some(e) = committer.finish().err {
        return Err(anyhow::Error::new(e)
            .context("writing the checkpoint")
            .into());
    }
    new.restore_generations(&carried)
        .context("writing the checkpoint")?;
    Ok(kept)
}
