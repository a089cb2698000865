//! The input's jobs in other layouts: run whole, or as shards of another
//! count. Each layout keeps a checkpoint of its own (`shard-I-of-N/` under
//! the input's state dir), so a new job in one layout knows nothing of what
//! another sent; it would send it all again.

use std::path::{Path, PathBuf};

use crate::checkpoint::{CheckpointError, JobMeta, Store};
use crate::exit::RunError;
use crate::fleet::shard::Shard;
use crate::settings::Settings;

/// A job of this input and request, with items done, in another layout.
struct Elsewhere {
    /// "run whole", or "as shard 2/3".
    layout: String,
    /// Its items done; `None` while it runs (its checkpoint in use).
    done: Option<u64>,
}

/// Stops a new job before any call when the same input and request has
/// items done in another layout (`--shard` dropped, added or of another
/// count), or a run in one now (its checkpoint in use: it may be this
/// input's), unless `--fresh` says to send them again.
pub(super) fn check(settings: &Settings) -> Result<(), RunError> {
    if settings.fresh {
        return Ok(());
    }
    let elsewhere = other_layouts(settings)
        .into_iter()
        .filter_map(|(shard, dir)| done_in(settings, shard, &dir))
        .collect::<Vec<_>>();
    if elsewhere.is_empty() {
        return Ok(());
    }
    let done: u64 = elsewhere.iter().filter_map(|e| e.done).sum();
    let list: Vec<String> = elsewhere
        .iter()
        .map(|e| match e.done {
            Some(n) => format!("{n} item(s) done {}", e.layout),
            None => format!("running now {}", e.layout),
        })
        .collect();
    let this = settings
        .shard
        .map_or("whole".to_string(), |s| format!("as shard {s}"));
    Err(RunError::Usage(format!(
        "{} was run in another layout with this request ({}). Run {this}, it would start \
         a job of its own and send those {done} item(s) again, and those still to come \
         there. Nothing was sent. Run it as before (the same --shard I/N for each part, or \
         none), or add --fresh to send them again in this layout",
        settings.input.display(),
        list.join("; ")
    )))
}

/// The state dirs of the input's other layouts that hold a checkpoint.
fn other_layouts(settings: &Settings) -> Vec<(Option<Shard>, PathBuf)> {
    let base = match settings.shard {
        Some(_) => settings.state_dir.parent().map(Path::to_path_buf),
        None => Some(settings.state_dir.clone()),
    };
    let Some(base) = base else {
        return Vec::new();
    };
    let mut out = Vec::new();
    if settings.shard.is_some() && crate::checkpoint::held(&base) {
        out.push((None, base.clone()));
    }
    // Shards of the same count are parts of this layout.
    let others = crate::settings::shard_checkpoints(&base)
        .into_iter()
        .filter(|(s, _)| settings.shard.map_or(true, |mine| mine.count != s.count));
    out.extend(others.map(|(s, p)| (Some(s), p)));
    out
}

/// What the checkpoint in `dir` has done of this input and request.
fn done_in(settings: &Settings, shard: Option<Shard>, dir: &Path) -> Option<Elsewhere> {
    let layout = shard.map_or("run whole".to_string(), |s| format!("as shard {s}"));
    let store = match Store::open(dir) {
        Ok(s) => s,
        // A run in that layout now: whatever it sends, a job here would
        // send again.
        Err(CheckpointError::Locked(_)) => return Some(Elsewhere { layout, done: None }),
        // Unreadable: not this run's to judge.
        Err(_) => return None,
    };
    let jobs = store.jobs().ok()?;
    let this: Vec<_> = jobs
        .iter()
        .filter(|m| super::job::of_this_request(settings, m))
        .collect();
    let done: u64 = this.iter().map(|m| m.done).sum();
    // A killed run there may have run calls with nothing done yet: here
    // they would go again, in other batches under other keys.
    let unsettled = this.iter().any(|m| super::job::unsettled(m));
    (done > 0 || unsettled).then_some(Elsewhere {
        layout: match unsettled {
            true => format!("{layout}, with calls that may have run"),
            false => layout,
        },
        done: Some(done),
    })
}

/// How the other shards of this count made their jobs, which a new shard
/// among them must follow or the shards would not partition the input.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Siblings {
    /// They split the input by line (jobs made before shards followed
    /// content).
    pub split_by_line: bool,
    /// They fingerprint their items with their fields in file order (jobs
    /// made before field order was left out): a new shard that splits by
    /// content must digest as they do.
    pub keep_field_order: bool,
}

/// How the other shards of this count made their jobs, read in one pass
/// over their checkpoints.
pub(super) fn siblings_made(settings: &Settings) -> Siblings {
    siblings(settings).fold(Siblings::default(), |seen, m| Siblings {
        split_by_line: seen.split_by_line || !m.shards_by_content,
        keep_field_order: seen.keep_field_order || !m.any_field_order,
    })
}

/// The jobs of this input and request in the other shards of this count.
fn siblings(settings: &Settings) -> impl Iterator<Item = JobMeta> + '_ {
    let found = match (settings.shard, settings.state_dir.parent()) {
        (Some(mine), Some(base)) => crate::settings::shard_checkpoints(base)
            .into_iter()
            .filter(|(s, _)| s.count == mine.count && s.index != mine.index)
            .collect(),
        _ => Vec::new(),
    };
    found
        .into_iter()
        .filter_map(|(_, dir)| Store::open_to_read(&dir).ok())
        .filter_map(|store| store.jobs().ok())
        .flatten()
        .filter(|m| super::job::of_this_request(settings, m))
}
