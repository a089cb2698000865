//! Opening a job: its checkpoint, and its whole input checked before any
//! request is sent.

use anyhow::Context as _;

use super::damage::damaged;
use super::start::warn_unknown;
use crate::checkpoint::{ItemState, JobItems, JobMeta, Store};
use crate::exit::RunError;
use crate::input;
use crate::settings::Settings;

/// The job's checkpoint and its input, checked.
pub(super) struct Opened {
    pub(super) store: Store,
    pub(super) items: JobItems,
    pub(super) meta: JobMeta,
    pub(super) scan: input::Scan,
}

/// Opens the checkpoint, checks the whole input before any request is sent,
/// and opens (or creates) the job. The checkpoint comes first: a line that
/// will not be sent again is parsed but not rendered.
pub(super) fn open_job(settings: &Settings) -> Result<Opened, RunError> {
    let store = Store::open(&settings.state_dir).map_err(|e| damaged(&settings.state_dir, e))?;
    let id = super::job::job_id(settings)?;
    // A job the checkpoint does not know (lost, or moved aside as damaged)
    // takes back from its earlier outputs the epoch and generations its keys
    // were last made with, so that it sends those keys again and the API
    // replays what already ran.
    let old = store.job(&id).ok().flatten();
    let recovered = match &old {
        None => super::outputs::recover([&settings.out, &settings.failures], &id),
        Some(_) => super::outputs::Recovered::default(),
    };
    let mut epoch = old.as_ref().map_or(recovered.epoch, |o| o.epoch);
    // --fresh means "run them again": a new epoch, so new keys.
    if settings.fresh {
        epoch = epoch.saturating_add(1);
        if let Some(old) = &old {
            warn_unknown(&store, old);
        }
        store
            .discard_job(&id)
            .context("discarding the checkpoint")?;
    }
    let mut items = store.items(&id).context("opening the checkpoint")?;
    let spec = &settings.request;
    let states = items.states();
    let retry_failed = settings.retry_failed;
    let mut in_shard = 0u64;
    let mut scan = tokio::task::block_in_place(|| {
        input::scan(&settings.input, settings.format, &mut |item| {
            in_shard += u64::from(settings.shard.map_or(true, |s| s.takes(item.line)));
            match states.state(item.line) {
                Some(ItemState::Done) => Ok(()),
                Some(ItemState::Failed) if !retry_failed => Ok(()),
                _ => spec.render(item).map(|_| ()),
            }
        })
    })?;
    scan.total = in_shard;
    drop(states);
    items.reserve_lines(scan.last_line);
    let mut meta = super::job::open(&store, settings, &scan, &id, epoch)?;
    if old.is_none() && !settings.fresh {
        items
            .restore_generations(&recovered.generations)
            .context("writing the checkpoint")?;
    }
    items
        .check_counts(&meta, scan.last_line)
        .and_then(|()| items.check_results())
        .map_err(|e| damaged(&settings.state_dir, e))?;
    // Until this run ends, a reader of the checkpoint sees it unfinished.
    meta.last_state = None;
    meta.halt_reason = None;
    if settings.retry_failed {
        items
            .clear_failed(&mut meta)
            .context("clearing failed items")?;
    }
    // New keys from here on: saved beside the outputs before any call, so
    // that a checkpoint lost later still leads back to them.
    if settings.retry_failed || settings.fresh {
        let carried = items.carried_all().context("reading the checkpoint")?;
        super::outputs::save_keys(&settings.out, &meta.id, meta.epoch, &carried)?;
    }
    Ok(Opened {
        store,
        items,
        meta,
        scan,
    })
}

impl Opened {
    /// Items of the input not yet finished.
    pub(super) fn pending(&self) -> u64 {
        let counts = self.meta.counts();
        self.scan.total.saturating_sub(counts.done + counts.failed)
    }
}
