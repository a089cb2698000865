//! `--out` and `--failures`, written from the checkpoint in input order.
//!
//! The outputs are the one place a line meets its result again, so they
//! check that it is still the same line: every result carries the digest
//! of the item that was sent, and a line that no longer holds that item is
//! set pending again instead of being paired with a result that is not its
//! own. The whole file is fingerprinted again in the same pass.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::Context as _;

use super::job::{current_stamp, grew};
use crate::checkpoint::{CheckpointError, Entry, ItemState, JobItems, JobMeta};
use crate::input::{self, InputError, Item};
use crate::settings::values::OutFormat;
use crate::settings::Settings;

/// Why the outputs were not written.
#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    /// The input no longer holds what the results are for; the message
    /// says what was done and the way on.
    #[error("{0}")]
    Changed(String),
    /// The checkpoint could not be read back.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// The input could not be read.
    #[error(transparent)]
    Input(#[from] InputError),
    /// The files could not be written (a full disk): the results are safe
    /// in the checkpoint, and the next run writes them.
    #[error("{0:#}")]
    Write(anyhow::Error),
}

/// The temporary file an output is written to before it is renamed into
/// place: unique per process, so two jobs writing one `--out`, or `--out
/// X.a --failures X.b`, never share one.
fn tmp_for(p: &Path, pid: u32) -> PathBuf {
    let name = p
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    p.with_file_name(format!(".{name}.{pid}.tmp"))
}

/// Removes what earlier processes left of their temporary files for `p`
/// (killed, or stopped by a full disk), never those of a process alive.
fn clear_leftovers(p: &Path) {
    let Some(name) = p.file_name().map(|n| n.to_string_lossy().into_owned()) else {
        return;
    };
    let dir = match p.parent().filter(|d| !d.as_os_str().is_empty()) {
        Some(d) => d.to_path_buf(),
        None => PathBuf::from("."),
    };
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return;
    };
    let prefix = format!(".{name}.");
    for entry in entries.flatten() {
        let file = entry.file_name().to_string_lossy().into_owned();
        let pid = file
            .strip_prefix(&prefix)
            .and_then(|r| r.strip_suffix(".tmp"))
            .and_then(|pid| pid.parse::<u32>().ok());
        if pid.is_some_and(|pid| !alive(pid)) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Whether a process with this id exists (this one included).
fn alive(pid: u32) -> bool {
    if pid == std::process::id() {
        return true;
    }
    let Ok(pid) = i32::try_from(pid) else {
        return false;
    };
    // SAFETY: signal 0 only asks whether the process exists.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Writes `--out` and `--failures` in input order, through temporary files
/// renamed into place: one pass over the input, reading each finished
/// item's result from the results log. When nothing changed since they were
/// last written (same files, untouched, same revision of the checkpoint),
/// they are left as they are. Nothing is left behind when it fails.
pub fn write_outputs(settings: &Settings, items: &JobItems) -> Result<(), OutputError> {
    let Some(mut meta) = items.job()? else {
        return Ok(());
    };
    if meta.outputs.is_some() && meta.outputs == current_stamp(settings, meta.revision) {
        return Ok(());
    }
    let paths = [&settings.out, &settings.failures];
    for p in paths {
        clear_leftovers(p);
    }
    let r = write_both(settings, items, &mut meta);
    if r.is_err() {
        for p in paths {
            let _ = std::fs::remove_file(tmp_for(p, std::process::id()));
        }
    }
    r
}

fn create(p: &Path) -> Result<BufWriter<File>, OutputError> {
    let w = || -> anyhow::Result<BufWriter<File>> {
        if let Some(dir) = p.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        let tmp = tmp_for(p, std::process::id());
        let f = File::create(&tmp).with_context(|| format!("writing {}", tmp.display()))?;
        Ok(BufWriter::with_capacity(64 * 1024, f))
    };
    w().map_err(OutputError::Write)
}

fn write_both(
    settings: &Settings,
    items: &JobItems,
    meta: &mut JobMeta,
) -> Result<(), OutputError> {
    let mut out = Results::create(settings)?;
    let mut fail = create(&settings.failures)?;
    let mut results = items.results();
    let mut reader = input::CheckedReader::open_checked(&settings.input, settings.format)?
        .field_order(meta.field_order());
    if settings.skip_invalid {
        reader = reader.past_bad_rows();
    }
    let reopened = items.any_reopened();
    // Lines whose result is for another item than the one they hold now.
    let mut stale = Vec::new();
    for item in &mut reader {
        let item = match (item, settings.skip_invalid) {
            (Ok(item), _) => item,
            // A bad row skipped by --skip-invalid: its failure, without
            // an item to show.
            (Err(e), true) if e.line().is_some() => {
                let line = e.line().unwrap_or_default();
                if let Some(e) = results.get(line)? {
                    let keyed = Keyed {
                        epoch: meta.epoch,
                        generation: 0,
                    };
                    written(settings, failed_line(&mut fail, (line, None), &e, keyed))?;
                }
                continue;
            }
            (Err(e), _) => return Err(e.into()),
        };
        let Some(e) = results.get(item.line)? else {
            continue;
        };
        if e.digest.is_some_and(|d| d != item.digest()) {
            stale.push(item.line);
            continue;
        }
        // What the item's key was made of, beside its result: a checkpoint
        // rebuilt after a loss takes it back from here (see `recover`).
        let generation = match reopened {
            true => items.generation(item.line)?,
            false => 0,
        };
        let keyed = Keyed {
            epoch: meta.epoch,
            generation,
        };
        written(
            settings,
            match e.state {
                ItemState::Done => out.done(&item, &e, keyed),
                ItemState::Failed => {
                    failed_line(&mut fail, (item.line, Some(&item.value)), &e, keyed)
                }
            },
        )?;
    }
    let read = reader.finish()?;
    let same_file = read == meta.fingerprint || grew(settings, meta);
    if !stale.is_empty() {
        drop(results);
        items.reopen_lines(meta, &stale)?;
        return Err(OutputError::Changed(edited(settings, &stale, same_file)));
    }
    // A file edited under the run would pair its lines with the results of
    // other lines: such outputs are never put in place. Lines appended
    // under it are fine: they are pending, and the old ones are unchanged.
    if !same_file {
        return Err(OutputError::Changed(changed_under_run(settings)));
    }
    let out = written(settings, out.into_inner())?;
    put_in_place([(out, &settings.out), (fail, &settings.failures)], meta)?;
    if let Some(stamp) = current_stamp(settings, meta.revision) {
        items.save_outputs(stamp)?;
    }
    Ok(())
}

/// Why the outputs of an input edited under the run were not written.
fn changed_under_run(settings: &Settings) -> String {
    format!(
        "{} changed while the job ran: {} and {} were not written, so that no line is \
         paired with another line's result. Every result is kept in the checkpoint: \
         restore the file and run the same command to write them (nothing is sent \
         again), or use --fresh to start over with the new content",
        settings.input.display(),
        settings.out.display(),
        settings.failures.display()
    )
}

/// The results file being written, in its format.
enum Results {
    Jsonl(BufWriter<File>),
    Csv(Box<super::csv_out::CsvOut>),
}

impl Results {
    fn create(settings: &Settings) -> Result<Results, OutputError> {
        match settings.out_format {
            OutFormat::Jsonl => Ok(Results::Jsonl(create(&settings.out)?)),
            OutFormat::Csv => {
                let columns = super::csv_out::columns(settings)?;
                let w = create(&settings.out)?;
                let csv = super::csv_out::CsvOut::new(w, columns);
                Ok(Results::Csv(Box::new(written(settings, csv)?)))
            }
        }
    }

    fn done(&mut self, item: &Item, e: &Entry<'_>, keyed: Keyed) -> anyhow::Result<()> {
        match self {
            Results::Jsonl(w) => done_line(w, item, e, keyed),
            Results::Csv(c) => c.row(item, e),
        }
    }

    fn into_inner(self) -> anyhow::Result<BufWriter<File>> {
        match self {
            Results::Jsonl(w) => Ok(w),
            Results::Csv(c) => c.into_inner(),
        }
    }
}

/// What was written to the outputs, or why not.
fn written<T>(settings: &Settings, r: anyhow::Result<T>) -> Result<T, OutputError> {
    r.with_context(|| format!("writing {}", settings.out.display()))
        .map_err(OutputError::Write)
}

/// Renames the written outputs into place, each with its owner beside it.
fn put_in_place(
    files: [(BufWriter<File>, &PathBuf); 2],
    meta: &JobMeta,
) -> Result<(), OutputError> {
    for (w, p) in files {
        let put = || -> anyhow::Result<()> {
            let f = w.into_inner().map_err(|e| e.into_error())?;
            f.sync_all()?;
            std::fs::rename(tmp_for(p, std::process::id()), p)?;
            Ok(())
        };
        put()
            .with_context(|| format!("writing {}", p.display()))
            .map_err(OutputError::Write)?;
        let owner = super::owner::Owner {
            job: meta.id.clone(),
            input: meta.input.clone(),
            rehearsal: meta.origin == crate::settings::SIM_ORIGIN,
            field_order: meta.field_order(),
            sorted_body: meta.keys_sorted_body,
        };
        super::owner::write_owner(p, &owner).map_err(OutputError::Write)?;
    }
    Ok(())
}

/// What the outputs say when lines no longer hold the item their result
/// was for.
fn edited(settings: &Settings, stale: &[u64], same_file: bool) -> String {
    let way_on = if same_file {
        "run the same command to send them as they are now"
    } else {
        "the file also differs from the one the job started with: restore it and run \
         the same command (a line sent before with the content it has then is replayed by \
         the API under the same Idempotency-Key, not run again), or use --fresh to start \
         over with the new content"
    };
    format!(
        "{} line(s) of {} (the first: line {}) no longer hold the item their result was \
         for: the file was edited while the job ran. Those lines are pending again, and {} \
         and {} were not written; {way_on}",
        stale.len(),
        settings.input.display(),
        stale[0],
        settings.out.display(),
        settings.failures.display()
    )
}

/// One `--out` line: `{"line","input","status","body"}`. The body is the
/// response's JSON when it parses, else its text as a JSON string; this is
/// the one place a body is parsed, once per output, not as calls return.
/// The parts of an item's Idempotency-Key that `--fresh` and
/// `--retry-failed` advance: written beside its result when not 0.
#[derive(Debug, Clone, Copy)]
struct Keyed {
    epoch: u32,
    generation: u32,
}

impl Keyed {
    fn write(self, w: &mut impl Write) -> std::io::Result<()> {
        if self.epoch > 0 {
            write!(w, ",\"epoch\":{}", self.epoch)?;
        }
        if self.generation > 0 {
            write!(w, ",\"generation\":{}", self.generation)?;
        }
        Ok(())
    }
}

/// What earlier outputs say of the keys a job used, for a job whose
/// checkpoint is gone: the highest epoch, and each line's generation.
#[derive(Debug, Default, PartialEq)]
pub struct Recovered {
    /// The epoch the outputs were last written in.
    pub epoch: u32,
    /// Lines whose generation is not 0, or whose last call may have run
    /// (they failed with their outcome unknown): the generation, and that.
    pub generations: Vec<(u64, u32, bool)>,
}

/// Where the job's key state is kept beside `--out`: `.NAME.keys`.
pub fn keys_path(out: &Path) -> PathBuf {
    let name = out
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    out.with_file_name(format!(".{name}.keys"))
}

/// Writes the job's key state beside `--out` before any call of a run that
/// advanced it (`--fresh`, `--retry-failed`): the outputs only carry it once
/// they are written at the end, and a run killed before that would leave a
/// lost checkpoint to recover older keys. First line `{"job","epoch"}`, then
/// `[line, generation, maybe_ran]` per reopened line.
pub fn save_keys(
    out: &Path,
    job: &str,
    epoch: u32,
    carried: &[(u64, u32, bool)],
) -> anyhow::Result<()> {
    let path = keys_path(out);
    let tmp = tmp_for(&path, std::process::id());
    let write = || -> anyhow::Result<()> {
        let mut w = BufWriter::new(File::create(&tmp)?);
        writeln!(w, "{}", serde_json::json!({ "job": job, "epoch": epoch }))?;
        for (line, generation, maybe_ran) in carried {
            writeln!(w, "[{line},{generation},{}]", u8::from(*maybe_ran))?;
        }
        let f = w.into_inner().map_err(|e| e.into_error())?;
        f.sync_all()?;
        std::fs::rename(&tmp, &path)?;
        Ok(())
    };
    write().with_context(|| format!("writing {}", path.display()))
}

/// What [`save_keys`] left for `job`, if anything.
fn saved_keys(out: &Path, job: &str) -> Recovered {
    use std::io::BufRead;
    let mut r = Recovered::default();
    let Ok(f) = File::open(keys_path(out)) else {
        return r;
    };
    let mut lines = std::io::BufReader::new(f).lines();
    let head = lines.next().and_then(Result::ok).unwrap_or_default();
    let Ok(head) = serde_json::from_str::<serde_json::Value>(&head) else {
        return r;
    };
    if head["job"] != job {
        return r;
    }
    r.epoch = head["epoch"]
        .as_u64()
        .and_then(|e| u32::try_from(e).ok())
        .unwrap_or(0);
    for line in lines.map_while(Result::ok) {
        if let Ok((l, g, m)) = serde_json::from_str::<(u64, u32, u8)>(&line) {
            r.generations.push((l, g, m == 1));
        }
    }
    r
}

/// Reads the epoch and generations back from the outputs (`--out` and
/// `--failures`), so that a job rebuilt after its checkpoint was lost sends
/// the keys it sent last, not those of its first epoch. Unreadable lines
/// are skipped: this only ever makes keys match more calls already made.
pub fn recover(outputs: [&Path; 2], job: &str) -> Recovered {
    use std::io::BufRead;
    // What the last run that advanced the keys saved before its calls: the
    // outputs may be older than that run.
    let mut r = saved_keys(outputs[0], job);
    let saved_epoch = r.epoch;
    let mut found: Vec<(u64, u32, bool, u32)> = Vec::new();
    for p in outputs {
        let Ok(f) = File::open(p) else { continue };
        let mut reader = std::io::BufReader::new(f);
        let mut line = String::new();
        loop {
            line.clear();
            match reader.read_line(&mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            // Most lines carry none of the three fields (they are written only
            // when not 0 or false): those need no parse. A `\u` escape could
            // spell a field's name, so a line with one is parsed regardless.
            if !["epoch", "generation", "outcome_unknown", "\\u"]
                .iter()
                .any(|k| line.contains(k))
            {
                continue;
            }
            let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else {
                continue;
            };
            let num = |k: &str| v.get(k).and_then(|x| x.as_u64());
            let epoch = u32::try_from(num("epoch").unwrap_or(0)).unwrap_or(u32::MAX);
            r.epoch = r.epoch.max(epoch);
            let generation = u32::try_from(num("generation").unwrap_or(0)).unwrap_or(u32::MAX);
            let unknown = v.get("outcome_unknown") == Some(&serde_json::Value::Bool(true));
            if let (Some(line), true) = (num("line"), generation > 0 || unknown) {
                found.push((line, generation, unknown, epoch));
            }
        }
    }
    // Generations belong to their epoch: `--fresh` started them all again
    // at 0, so those of an older epoch than the last say nothing of its keys.
    if saved_epoch < r.epoch {
        r.generations.clear();
    }
    r.generations.extend(
        found
            .into_iter()
            .filter(|&(.., epoch)| epoch == r.epoch)
            .map(|(line, generation, unknown, _)| (line, generation, unknown)),
    );
    // A line known from both: its latest generation, and "may have run" if
    // either says so of that generation.
    r.generations
        .sort_unstable_by_key(|&(line, generation, _)| (line, generation));
    let mut merged: Vec<(u64, u32, bool)> = Vec::with_capacity(r.generations.len());
    for (line, generation, unknown) in r.generations.drain(..) {
        match merged.last_mut() {
            Some(last) if last.0 == line && last.1 == generation => last.2 |= unknown,
            Some(last) if last.0 == line => *last = (line, generation, unknown),
            _ => merged.push((line, generation, unknown)),
        }
    }
    r.generations = merged;
    r
}

fn done_line(w: &mut impl Write, item: &Item, e: &Entry<'_>, keyed: Keyed) -> anyhow::Result<()> {
    write!(w, "{{\"line\":{},\"input\":", item.line)?;
    serde_json::to_writer(&mut *w, &item.value)?;
    write!(w, ",\"status\":{},\"body\":", status(e.status))?;
    // The key was scrubbed from the body, escaped forms included, before
    // it was stored.
    match crate::util::compact_json(e.payload) {
        Some(body) => w.write_all(body.as_bytes())?,
        None => serde_json::to_writer(&mut *w, &String::from_utf8_lossy(e.payload))?,
    }
    keyed.write(w)?;
    w.write_all(b"}\n")?;
    Ok(())
}

/// One `--failures` line: `{"line","input","status","reason","attempts"}`,
/// and `"outcome_unknown":true` when the call may have run.
fn failed_line(
    w: &mut impl Write,
    (line, input): (u64, Option<&serde_json::Value>),
    e: &Entry<'_>,
    keyed: Keyed,
) -> anyhow::Result<()> {
    write!(w, "{{\"line\":{line},\"input\":")?;
    serde_json::to_writer(&mut *w, &input)?;
    write!(w, ",\"status\":{},\"reason\":", status(e.status))?;
    serde_json::to_writer(&mut *w, &String::from_utf8_lossy(e.payload))?;
    write!(w, ",\"attempts\":{}", e.attempts)?;
    if e.unknown {
        w.write_all(b",\"outcome_unknown\":true")?;
    }
    keyed.write(w)?;
    w.write_all(b"}\n")?;
    Ok(())
}

fn status(s: Option<u16>) -> String {
    s.map_or_else(|| "null".to_string(), |s| s.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epoch_and_generations_come_back_from_the_outputs() {
        let dir = std::env::temp_dir().join(format!("batchrun-recover-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (out, fail) = (dir.join("out.jsonl"), dir.join("fail.jsonl"));
        std::fs::write(
            &out,
            "{\"line\":1,\"input\":{},\"status\":200,\"body\":{},\"epoch\":2}\n\
             {\"line\":2,\"input\":{},\"status\":200,\"body\":{},\"epoch\":2,\"generation\":3}\n\
             not json\n",
        )
        .unwrap();
        std::fs::write(
            &fail,
            "{\"line\":5,\"input\":{},\"status\":500,\"reason\":\"x\",\"attempts\":5,\"epoch\":2,\"generation\":1}\n\
             {\"line\":6,\"input\":{},\"status\":null,\"reason\":\"y\",\"attempts\":1,\"outcome_unknown\":true,\"epoch\":2}\n",
        )
        .unwrap();
        let r = recover([&out, &fail], "job");
        assert_eq!(
            r,
            Recovered {
                epoch: 2,
                generations: vec![(2, 3, false), (5, 1, false), (6, 0, true)],
            }
        );
        let none = recover([&dir.join("missing"), &dir.join("missing2")], "job");
        assert_eq!(none, Recovered::default());
        // Saved by a --retry-failed of the same epoch, killed before its
        // outputs: both count, the saved ones winning for a line.
        save_keys(&out, "job", 2, &[(2, 4, false), (9, 1, true)]).unwrap();
        let r = recover([&out, &fail], "job");
        assert_eq!(r.epoch, 2);
        assert_eq!(
            r.generations,
            vec![(2, 4, false), (5, 1, false), (6, 0, true), (9, 1, true)]
        );
        // Saved by a later epoch: the outputs' generations are of an older
        // one, and another job's saved keys are ignored.
        save_keys(&out, "job", 3, &[(9, 1, true)]).unwrap();
        let r = recover([&out, &fail], "job");
        assert_eq!(r.epoch, 3);
        assert_eq!(r.generations, vec![(9, 1, true)]);
        let other = recover([&out, &fail], "another");
        assert_eq!(other.epoch, 2, "the outputs alone");
        // A later --fresh (epoch 4), killed before its outputs: the older
        // epoch's generations no longer apply.
        save_keys(&out, "job", 4, &[]).unwrap();
        let r = recover([&out, &fail], "job");
        assert_eq!(
            r,
            Recovered {
                epoch: 4,
                generations: Vec::new()
            }
        );
        // A field name spelt with an escape still counts (the lines without
        // any of the names are skipped unparsed).
        std::fs::write(
            &out,
            "{\"line\":7,\"input\":{},\"status\":200,\"body\":{},\"\\u0065poch\":5,\"g\\u0065neration\":2}\n\
             {\"line\":8,\"input\":{},\"status\":200,\"body\":{}}\n",
        )
        .unwrap();
        std::fs::remove_file(&fail).unwrap();
        let r = recover([&out, &fail], "another");
        assert_eq!(
            r,
            Recovered {
                epoch: 5,
                generations: vec![(7, 2, false)]
            }
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
