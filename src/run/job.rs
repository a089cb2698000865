//! The job: its identity, its record in the checkpoint, and the stamp of
//! the outputs written from it ([`super::outputs`]).

use std::path::Path;
use std::time::UNIX_EPOCH;

use anyhow::Context as _;

use crate::checkpoint::{JobMeta, OutputStamp, Store, LAYOUT};
use crate::exit::RunError;
use crate::input;
use crate::settings::Settings;
use crate::util::{sha_hex, unix_now};

/// How the job's Idempotency-Keys are made.
pub fn key_scheme(meta: &JobMeta, spec: &crate::request::RequestSpec) -> super::keys::KeyScheme {
    let varying = spec
        .headers
        .iter()
        .filter(|(name, t)| !t.is_static() && *name != spec.key_header)
        .map(|(name, _)| name.clone())
        .fold(Vec::new(), |mut v, name| {
            if !v.contains(&name) {
                v.push(name);
            }
            v
        });
    super::keys::KeyScheme {
        job: meta.id.clone(),
        epoch: meta.epoch,
        varying,
    }
}

/// The job's id: a hash of the input's absolute path and the request.
pub fn job_id(settings: &Settings) -> Result<String, RunError> {
    let abs = match std::fs::canonicalize(&settings.input) {
        Ok(abs) => abs,
        Err(e) => {
            // An unreadable input is the user's to fix: the reader's own
            // error says so, with the usage exit code.
            input::Reader::open(&settings.input, settings.format)?;
            return Err(RunError::Fatal(
                anyhow::Error::new(e).context(settings.input.display().to_string()),
            ));
        }
    };
    let abs = abs.to_string_lossy();
    Ok(sha_hex(&[abs.as_bytes(), settings.identity.as_bytes()])[..16].to_string())
}

fn file_len(p: &Path) -> Option<u64> {
    std::fs::metadata(p).ok().map(|m| m.len())
}

/// Whether the input only grew since the job was made: the bytes the
/// fingerprint covered are still the file's first bytes, byte for byte,
/// and they ended a line (so no old item was extended).
pub(super) fn grew(settings: &Settings, meta: &JobMeta) -> bool {
    let Some(len) = meta.input_len else {
        return false;
    };
    match input::prefix_fingerprint(&settings.input, len) {
        Ok(Some((fp, ends_line))) => fp == meta.fingerprint && (len == 0 || ends_line),
        _ => false,
    }
}

/// Opens the job `id` for this input and request, or creates it. A job
/// whose input changed since its checkpoint was made is refused: mixing
/// results of two files would be silent corruption.
pub fn open(
    store: &Store,
    settings: &Settings,
    scan: &input::Scan,
    id: &str,
    epoch: u32,
) -> Result<JobMeta, RunError> {
    if let Some(mut meta) = store.job(id).context("reading the checkpoint")? {
        if meta.fingerprint != scan.fingerprint && grew(settings, &meta) {
            // The old content is an unchanged prefix of the new: the same
            // lines are the same items, and the appended ones are pending.
            crate::report::err_line(&format!(
                "batchrun: {} grew by {} item(s) since its checkpoint was made: they are added to the job",
                settings.input.display(),
                scan.total.saturating_sub(meta.total)
            ));
            meta.fingerprint = scan.fingerprint.clone();
            meta.total = scan.total;
            meta.input_len = file_len(&settings.input);
            store.save_job(&meta).context("writing the checkpoint")?;
            return Ok(meta);
        }
        if meta.fingerprint != scan.fingerprint {
            return Err(RunError::Fatal(anyhow::anyhow!(
                "{} changed since its checkpoint was made ({} of {} items done then); \
                 refusing to mix results of two different files. Use --fresh to start over \
                 (the old results are discarded), or restore the original file to resume.",
                settings.input.display(),
                meta.done,
                meta.total
            )));
        }
        return Ok(meta);
    }
    let abs = std::fs::canonicalize(&settings.input)
        .with_context(|| format!("{}", settings.input.display()))?;
    let meta = JobMeta {
        id: id.to_string(),
        input: abs.to_string_lossy().into_owned(),
        fingerprint: scan.fingerprint.clone(),
        total: scan.total,
        template: settings.identity.clone(),
        created_unix: unix_now().as_secs(),
        epoch,
        input_len: file_len(&settings.input),
        layout: LAYOUT,
        ..JobMeta::default()
    };
    store.save_job(&meta).context("writing the checkpoint")?;
    store.flush().context("flushing the checkpoint")?;
    Ok(meta)
}

/// Length and modification time (ns since the epoch) of a file, if it exists.
pub(super) fn file_stamp(p: &Path) -> Option<(u64, u64)> {
    let m = std::fs::metadata(p).ok()?;
    let mtime = m.modified().ok()?.duration_since(UNIX_EPOCH).ok()?;
    Some((m.len(), u64::try_from(mtime.as_nanos()).unwrap_or(u64::MAX)))
}

/// The stamp the outputs would carry now, if both files exist.
pub(super) fn current_stamp(settings: &Settings, revision: u64) -> Option<OutputStamp> {
    Some(OutputStamp {
        out: settings.out.display().to_string(),
        failures: settings.failures.display().to_string(),
        revision,
        out_file: file_stamp(&settings.out)?,
        failures_file: file_stamp(&settings.failures)?,
    })
}
