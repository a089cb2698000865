//! The job: its identity, its record in the checkpoint, and the output files
//! written from that checkpoint.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use sha2::{Digest, Sha256};

use crate::checkpoint::{Entry, ItemState, JobItems, JobMeta, OutputStamp, Store, LAYOUT};
use crate::exit::RunError;
use crate::input::{self, Item};
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
fn grew(settings: &Settings, meta: &JobMeta) -> bool {
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
    let nonce = sha_hex(&[
        &unix_now().as_nanos().to_le_bytes(),
        &fastrand::u64(..).to_le_bytes(),
        &std::process::id().to_le_bytes(),
    ]);
    let meta = JobMeta {
        id: id.to_string(),
        input: abs.to_string_lossy().into_owned(),
        fingerprint: scan.fingerprint.clone(),
        total: scan.total,
        template: settings.identity.clone(),
        nonce,
        created_unix: unix_now().as_secs(),
        key_scheme: 1,
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
fn file_stamp(p: &Path) -> Option<(u64, u64)> {
    let m = std::fs::metadata(p).ok()?;
    let mtime = m.modified().ok()?.duration_since(UNIX_EPOCH).ok()?;
    Some((m.len(), u64::try_from(mtime.as_nanos()).unwrap_or(u64::MAX)))
}

/// The stamp the outputs would carry now, if both files exist.
fn current_stamp(settings: &Settings, revision: u64) -> Option<OutputStamp> {
    Some(OutputStamp {
        out: settings.out.display().to_string(),
        failures: settings.failures.display().to_string(),
        revision,
        out_file: file_stamp(&settings.out)?,
        failures_file: file_stamp(&settings.failures)?,
    })
}

/// Writes `--out` and `--failures` in input order, through temporary files
/// renamed into place: one pass over the input, reading each finished
/// item's result from the results log. When nothing changed since they were
/// last written (same files, untouched, same revision of the checkpoint),
/// they are left as they are.
pub fn write_outputs(settings: &Settings, items: &JobItems) -> anyhow::Result<()> {
    let Some(meta) = items.job()? else {
        return Ok(());
    };
    if meta.outputs.is_some() && meta.outputs == current_stamp(settings, meta.revision) {
        return Ok(());
    }
    // Unique per file and per process: two jobs writing one --out, or
    // --out X.a --failures X.b, never share a temporary file.
    let tmp = |p: &Path| {
        let name = p
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        p.with_file_name(format!(".{name}.{}.tmp", std::process::id()))
    };
    let create = |p: &Path| -> anyhow::Result<BufWriter<File>> {
        if let Some(dir) = p.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        Ok(BufWriter::with_capacity(
            64 * 1024,
            File::create(tmp(p)).with_context(|| format!("writing {}", p.display()))?,
        ))
    };
    let mut out = create(&settings.out)?;
    let mut fail = create(&settings.failures)?;
    let mut results = items.results();
    let mut reader = input::CheckedReader::open(&settings.input, settings.format)?;
    for item in &mut reader {
        let item = item?;
        let Some(e) = results.get(item.line)? else {
            continue;
        };
        match e.state {
            ItemState::Done => done_line(&mut out, &item, &e)?,
            ItemState::Failed => failed_line(&mut fail, &item, &e)?,
        }
    }
    // A file edited under the run would pair its lines with the results of
    // other lines: such outputs are never put in place. Lines appended
    // under it are fine: they are pending, and the old ones are unchanged.
    let read = reader.finish()?;
    if read != meta.fingerprint && !grew(settings, &meta) {
        drop((out, fail));
        let _ = std::fs::remove_file(tmp(&settings.out));
        let _ = std::fs::remove_file(tmp(&settings.failures));
        anyhow::bail!(
            "{} changed while the job ran: {} and {} were not written, so that no line is \
             paired with another line's result. The results are kept in the checkpoint \
             (a line edited in place before it was sent went out as edited): restore the \
             file and run the same command to write them (nothing is sent again), or use \
             --fresh to start over with the new content",
            settings.input.display(),
            settings.out.display(),
            settings.failures.display()
        );
    }
    for (w, p) in [(out, &settings.out), (fail, &settings.failures)] {
        let f = w.into_inner().map_err(|e| e.into_error())?;
        f.sync_all()?;
        std::fs::rename(tmp(p), p).with_context(|| format!("writing {}", p.display()))?;
    }
    if let Some(stamp) = current_stamp(settings, meta.revision) {
        items.save_outputs(stamp)?;
    }
    Ok(())
}

/// One `--out` line: `{"line","input","status","body"}`. The body is the
/// response's JSON when it parses, else its text as a JSON string; this is
/// the one place a body is parsed, once per output, not as calls return.
fn done_line(w: &mut impl Write, item: &Item, e: &Entry<'_>) -> anyhow::Result<()> {
    write!(w, "{{\"line\":{},\"input\":", item.line)?;
    serde_json::to_writer(&mut *w, &item.value)?;
    write!(w, ",\"status\":{},\"body\":", status(e.status))?;
    match serde_json::from_slice::<serde_json::Value>(e.payload) {
        Ok(body) => serde_json::to_writer(&mut *w, &body)?,
        Err(_) => serde_json::to_writer(&mut *w, &String::from_utf8_lossy(e.payload))?,
    }
    w.write_all(b"}\n")?;
    Ok(())
}

/// One `--failures` line: `{"line","input","status","reason","attempts"}`,
/// and `"outcome_unknown":true` when the call may have run.
fn failed_line(w: &mut impl Write, item: &Item, e: &Entry<'_>) -> anyhow::Result<()> {
    write!(w, "{{\"line\":{},\"input\":", item.line)?;
    serde_json::to_writer(&mut *w, &item.value)?;
    write!(w, ",\"status\":{},\"reason\":", status(e.status))?;
    serde_json::to_writer(&mut *w, &String::from_utf8_lossy(e.payload))?;
    write!(w, ",\"attempts\":{}", e.attempts)?;
    if e.unknown {
        w.write_all(b",\"outcome_unknown\":true")?;
    }
    w.write_all(b"}\n")?;
    Ok(())
}

fn status(s: Option<u16>) -> String {
    s.map_or_else(|| "null".to_string(), |s| s.to_string())
}
