//! The job: its identity, its record in the checkpoint, and the output files
//! written from that checkpoint.

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use sha2::{Digest, Sha256};

use crate::checkpoint::{ItemState, JobItems, JobMeta, Store};
use crate::exit::RunError;
use crate::input;
use crate::settings::Settings;

/// sha256 of `parts`, each followed by a NUL so that parts cannot run
/// into each other, in hex.
pub fn sha_hex(parts: &[&[u8]]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p);
        h.update([0u8]);
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// Wall-clock time since the epoch (zero if the clock is before it).
pub fn unix_now() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

/// How the job's Idempotency-Keys are made: derived for every job this
/// version starts, the nonce-based prefix for jobs started before.
pub fn key_scheme(meta: &JobMeta) -> super::keys::KeyScheme {
    if meta.key_scheme == 0 && !meta.nonce.is_empty() {
        return super::keys::KeyScheme::Legacy {
            prefix: format!(
                "batchrun-{}",
                &sha_hex(&[meta.id.as_bytes(), meta.nonce.as_bytes()])[..20]
            ),
        };
    }
    super::keys::KeyScheme::Derived {
        job: meta.id.clone(),
        epoch: meta.epoch,
    }
}

/// Opens the job for this input and request, or creates it. A job whose
/// input changed since its checkpoint was made is refused: mixing results
/// of two files would be silent corruption.
pub fn open(
    store: &Store,
    settings: &Settings,
    scan: &input::Scan,
    fresh: bool,
) -> Result<JobMeta, RunError> {
    let abs = std::fs::canonicalize(&settings.input)
        .with_context(|| format!("{}", settings.input.display()))?;
    let abs = abs.to_string_lossy().into_owned();
    let id = sha_hex(&[abs.as_bytes(), settings.identity.as_bytes()])[..16].to_string();
    // --fresh means "run them again": a new epoch, so new keys. Read before
    // the old job is discarded (a lost checkpoint starts again at 0, which
    // re-sends the first epoch's keys and so runs nothing twice).
    let mut epoch = 0;
    if fresh {
        if let Ok(Some(old)) = store.job(&id) {
            epoch = old.epoch.saturating_add(1);
        }
        store
            .discard_job(&id)
            .context("discarding the checkpoint")?;
    }
    if let Some(meta) = store.job(&id).context("reading the checkpoint")? {
        if meta.fingerprint != scan.fingerprint {
            let done = store
                .items(&id)
                .and_then(|i| i.counts())
                .map(|c| c.done)
                .unwrap_or(0);
            return Err(RunError::Fatal(anyhow::anyhow!(
                "{} changed since its checkpoint was made ({done} of {} items done then); \
                 refusing to mix results of two different files. Use --fresh to start over \
                 (the old results are discarded), or restore the original file to resume.",
                settings.input.display(),
                meta.total
            )));
        }
        return Ok(meta);
    }
    let nonce = sha_hex(&[
        &unix_now().as_nanos().to_le_bytes(),
        &fastrand::u64(..).to_le_bytes(),
        &std::process::id().to_le_bytes(),
    ]);
    let meta = JobMeta {
        id,
        input: abs,
        fingerprint: scan.fingerprint.clone(),
        total: scan.total,
        template: settings.identity.clone(),
        nonce,
        created_unix: unix_now().as_secs(),
        key_scheme: 1,
        epoch,
        ..JobMeta::default()
    };
    store.save_job(&meta).context("writing the checkpoint")?;
    store.flush().context("flushing the checkpoint")?;
    Ok(meta)
}

/// Writes `--out` and `--failures` from the checkpoint, in input order,
/// through temporary files renamed into place.
pub fn write_outputs(settings: &Settings, items: &JobItems) -> anyhow::Result<()> {
    use std::io::Write;
    let tmp = |p: &Path| p.with_extension("jsonl.tmp");
    let create = |p: &Path| -> anyhow::Result<std::io::BufWriter<std::fs::File>> {
        if let Some(dir) = p.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        Ok(std::io::BufWriter::new(
            std::fs::File::create(tmp(p)).with_context(|| format!("writing {}", p.display()))?,
        ))
    };
    let mut out = create(&settings.out)?;
    let mut fail = create(&settings.failures)?;
    for item in input::Reader::open(&settings.input, settings.format)? {
        let item = item?;
        let Some(rec) = items.get(item.line)? else {
            continue;
        };
        let line = match rec.state {
            ItemState::Done => serde_json::json!({
                "line": item.line, "input": item.value, "status": rec.status, "body": rec.body,
            }),
            ItemState::Failed => serde_json::json!({
                "line": item.line, "input": item.value, "status": rec.status,
                "reason": rec.reason, "attempts": rec.attempts,
            }),
        };
        let w = if rec.state == ItemState::Done {
            &mut out
        } else {
            &mut fail
        };
        serde_json::to_writer(&mut *w, &line)?;
        w.write_all(b"\n")?;
    }
    for (w, p) in [(out, &settings.out), (fail, &settings.failures)] {
        let f = w.into_inner().map_err(|e| e.into_error())?;
        f.sync_all()?;
        std::fs::rename(tmp(p), p).with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}
