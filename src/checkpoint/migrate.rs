//! Jobs checkpointed before the results log existed (layout 0) kept one
//! JSON record per item, body included, in `items:{id}`. Opening such a job
//! moves every record into the results log and the line slots, sets the
//! counts, and drops the old tree, so a job interrupted under the old
//! layout resumes where it stopped.

use serde::{Deserialize, Serialize};

use super::commit::{GroupCommit, Record};
use super::{CheckpointError, ItemState, JobMeta, Store, LAYOUT};

/// One item's outcome in layout 0.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ItemRecord {
    /// Done or failed.
    pub state: ItemState,
    /// The final HTTP status, when there was a response.
    pub status: Option<u16>,
    /// The response body (JSON when it parsed, a string otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<serde_json::Value>,
    /// Why it failed, for failed items.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Calls made for it.
    pub attempts: u32,
}

fn decode(k: &[u8], v: &[u8]) -> Result<(u64, ItemRecord), CheckpointError> {
    let line = <[u8; 8]>::try_from(k)
        .map(u64::from_be_bytes)
        .map_err(|_| CheckpointError::Corrupt("an old item key is not a line".into()))?;
    let rec = serde_json::from_slice(v)
        .map_err(|e| CheckpointError::Corrupt(format!("item at line {line}: {e}")))?;
    Ok((line, rec))
}

/// Moves a layout-0 job to the current layout.
pub fn upgrade(store: &Store, mut meta: JobMeta) -> Result<(), CheckpointError> {
    let old = store.tree(&format!("items:{}", meta.id))?;
    let mut items = super::JobItems::open(store, &meta.id)?;
    let last = match old.last().map_err(|e| store.err(e))? {
        Some((k, v)) => decode(&k, &v)?.0,
        None => 0,
    };
    items.reserve_lines(last);
    // Nothing of this job is in the new layout yet: start from zero.
    meta.layout = LAYOUT;
    meta.done = 0;
    meta.failed = 0;
    let committer = items.committer(meta.clone(), GroupCommit::default())?;
    for kv in old.iter() {
        let (k, v) = kv.map_err(|e| store.err(e))?;
        let (line, rec) = decode(&k, &v)?;
        // A body that was not JSON was kept as a JSON string; written back
        // as that string's text, the outputs show it exactly as before
        // (unless that text is itself JSON: then it stays a quoted string).
        let payload = match (&rec.body, &rec.reason) {
            (Some(serde_json::Value::String(s)), _)
                if serde_json::from_str::<serde::de::IgnoredAny>(s).is_err() =>
            {
                s.clone().into_bytes()
            }
            (Some(body), _) => {
                serde_json::to_vec(body).map_err(|e| CheckpointError::Corrupt(e.to_string()))?
            }
            (None, Some(reason)) => reason.clone().into_bytes(),
            (None, None) => Vec::new(),
        };
        committer.record(Record {
            line,
            state: rec.state,
            status: rec.status,
            attempts: rec.attempts,
            payload,
            unknown: false,
            // What the line held then is not known.
            digest: 0,
        })?;
    }
    // The job record goes out in the new layout even with no record to move.
    committer.save_job(&meta, None, true)?;
    let done = committer.finish();
    if let Some(e) = done.err {
        return Err(e);
    }
    store.db.drop_tree(old.name()).map_err(|e| store.err(e))?;
    store.flush()
}

/// Done and failed counts of a job not yet upgraded, by reading every
/// record (for `batchrun status`, which does not write).
pub fn legacy_counts(store: &Store, id: &str) -> Result<super::Counts, CheckpointError> {
    let mut c = super::Counts::default();
    for kv in store.tree(&format!("items:{id}"))?.iter() {
        let (k, v) = kv.map_err(|e| store.err(e))?;
        match decode(&k, &v)?.1.state {
            ItemState::Done => c.done += 1,
            ItemState::Failed => c.failed += 1,
        }
    }
    Ok(c)
}
