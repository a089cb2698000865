//! The job: its identity, its record in the checkpoint, and the stamp of
//! the outputs written from it ([`super::outputs`]).

use std::path::Path;
use std::time::UNIX_EPOCH;

use anyhow::Context as _;

use crate::checkpoint::{JobMeta, OutputStamp, Store, LAYOUT};
use crate::exit::RunError;
use crate::input;
use crate::rate::learn::{Learnt, LearntShape};
use crate::settings::{Settings, SIM_ORIGIN};
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
        job: meta.key_base.clone().unwrap_or_else(|| meta.id.clone()),
        epoch: meta.epoch,
        varying,
        by_content: meta.keys_by_content,
        sorted_body: meta.keys_sorted_body,
    }
}

/// Whether calls of `m` may have run with nothing recorded: a run of it
/// was killed (found so, or not yet) with items pending.
pub(super) fn unsettled(m: &JobMeta) -> bool {
    let pending = m.done + m.failed < m.total;
    m.unsettled || (pending && m.last_run().is_some_and(|r| r.ended_unix_ms.is_none()))
}

/// Whether `m` is a job of this input's name made for this request (as
/// recorded now, or before the key was hidden from it).
pub(super) fn of_this_request(settings: &Settings, m: &JobMeta) -> bool {
    m.input_name == settings.input_name && settings.same_request(&m.template)
}

/// The id of a job made for this request on this input: a hash of the
/// input's name and the request (and, for a pipe, of the content it started
/// with), never of a path, so that a moved input, or one reached through a
/// symlink, keeps its job and its keys.
pub fn job_id(settings: &Settings) -> String {
    let spooled = settings.spooled.as_deref().unwrap_or_default();
    sha_hex(&[
        settings.input_name.as_bytes(),
        settings
            .id_basis
            .as_ref()
            .unwrap_or(&settings.identity)
            .as_bytes(),
        spooled.as_bytes(),
    ])[..16]
        .to_string()
}

/// Which job a run continues, and what else the checkpoint knows of its
/// input.
#[derive(Debug, Default)]
pub(super) struct Located {
    /// The job's id: of the job this run continues, or of the one it makes.
    pub(super) id: String,
    /// Jobs on the same input (the same content, for a pipe) and the same
    /// outputs, made for another request, that have items done: a new job would send those
    /// items again, so the run stops unless told which way to go.
    pub(super) changed: Vec<JobMeta>,
    /// Jobs on the same input with nothing done: a new job replaces them.
    pub(super) idle: Vec<String>,
    /// What the last job on the same API origin left of the server's
    /// window: a new job starts from there.
    pub(super) window: OriginWindow,
    /// For a pipe of new content, the last job of this request and these
    /// outputs on a pipe: the job this run resumes by content if the
    /// content holds every result of it.
    pub(super) pipe_before: Option<JobMeta>,
}

/// When the last call of a job on an API origin went out, and what it
/// learnt of the limit: a new job on that origin starts from there (the
/// API's window does not know jobs).
#[derive(Debug, Clone, Copy, Default)]
pub struct OriginWindow {
    /// Unix ms.
    last_active_unix_ms: u64,
    /// What it learnt of the limit, with its shape.
    learnt: Option<Learnt>,
}

impl OriginWindow {
    fn of(m: &JobMeta) -> OriginWindow {
        OriginWindow {
            last_active_unix_ms: m.last_active_unix_ms,
            learnt: learnt(m),
        }
    }
}

/// The limit a job's record says was learnt, with its shape.
pub(super) fn learnt(m: &JobMeta) -> Option<Learnt> {
    m.learnt_limit.map(|limit| Learnt {
        limit,
        shape: LearntShape {
            burst: m.learnt_burst,
            fixed_too: m.learnt_fixed_too,
            fixed: m.learnt_fixed,
            most: m.learnt_most,
        },
    })
}

/// Keeps `learnt` in a job's record (`None`: nothing learnt). The record
/// keeps the fields flat, as checkpoints older than the shape have the
/// count alone.
pub(super) fn keep_learnt(m: &mut JobMeta, learnt: Option<Learnt>) {
    let shape = learnt.map(|l| l.shape).unwrap_or_default();
    m.learnt_limit = learnt.map(|l| l.limit);
    m.learnt_burst = shape.burst;
    m.learnt_fixed_too = shape.fixed_too;
    m.learnt_fixed = shape.fixed;
    m.learnt_most = shape.most;
}

/// The input job `m` was last run from, when it is another file of this
/// input's name that is still there, given by another path: a
/// `--state-dir` given to two inputs of one name (a cron job's dated
/// folders), which took one for the other, dropping the first's results
/// and sending them again. A file moved (its old path gone), one replaced
/// in place, one reached through the same link (a release directory's
/// `current`), and a copy of a directory with its own checkpoint (the
/// default state dir, beside the input) are the same job, as ever.
fn another_file_of_this_name(settings: &Settings, m: &JobMeta) -> Option<String> {
    let default = crate::settings::state_dir_for(&settings.input, None);
    if settings.spooled.is_some()
        || m.input_name != settings.input_name
        || crate::util::same_file(&settings.state_dir, &default)
        || settings.state_dir.starts_with(&default)
    {
        return None;
    }
    let there = Path::new(&m.input_given);
    let other = !m.input_given.is_empty()
        && m.input_given != given_path(settings)
        && there.exists()
        && !crate::util::same_file(there, &settings.input);
    other.then(|| m.input_given.clone())
}

/// The input's path as given, made absolute (links not resolved).
fn given_path(settings: &Settings) -> String {
    std::path::absolute(&settings.input)
        .unwrap_or_else(|_| settings.input.clone())
        .to_string_lossy()
        .into_owned()
}

/// Finds the job for this input and request in `store`: the one made for
/// it, or one a changed request was carried over to (`--keep-done`); for a
/// pipe, one whose content this content is, or starts with.
pub(super) fn locate(store: &Store, settings: &Settings) -> Result<Located, RunError> {
    let made = job_id(settings);
    let jobs = store.jobs().context("reading the checkpoint")?;
    // A rehearsal (`--sim`) and a real run are never one job: a rehearsal
    // carried over to, discarding or replacing a real job would mark done
    // items the API never ran, or send again those it did.
    let jobs: Vec<JobMeta> = jobs
        .into_iter()
        .filter(|m| (m.origin == SIM_ORIGIN) == (settings.origin == SIM_ORIGIN))
        .collect();
    let this_input = |m: &&JobMeta| {
        m.input_name == settings.input_name
            && match &settings.spooled {
                None => true,
                Some(sha) => m.fingerprint == *sha || grew(settings, m),
            }
    };
    // A renamed file, or one reached through a link of another name, is
    // found by its content: a job of this request whose input this file
    // is, or starts with (what it sends is what it is, not its name).
    let renamed = |m: &&JobMeta| {
        settings.spooled.is_none()
            && m.input_name != settings.input_name
            && settings.same_request(&m.template)
            && m.done > 0
            && (grew(settings, m)
                || (m.input_len.is_some()
                    && file_len(&settings.input) == m.input_len
                    && input::file_fingerprint(&settings.input).is_ok_and(|f| f == m.fingerprint)))
    };
    let found = jobs
        .iter()
        .find(|m| m.id == made)
        .or_else(|| {
            jobs.iter()
                .filter(this_input)
                .find(|m| settings.same_request(&m.template))
        })
        .or_else(|| {
            jobs.iter()
                .filter(renamed)
                .max_by_key(|m| m.last_active_unix_ms)
        });
    let window = jobs
        .iter()
        .filter(|m| m.origin == settings.origin)
        .max_by_key(|m| m.last_active_unix_ms)
        .map_or(OriginWindow::default(), OriginWindow::of);
    // A job with outputs of its own (another --out) is another job on
    // purpose, say on another endpoint: only one that wrote, or would
    // write, these outputs is this command changed.
    // The paths as given may be relative to another directory: the owner
    // beside the files says it whatever the directory.
    let these_outputs = |m: &&JobMeta| {
        let owned = |p: &Path| super::owner::owner_of(p).is_some_and(|o| o.job == m.id);
        m.outputs.as_ref().map_or(true, |o| {
            o.out == settings.out.display().to_string()
                || o.failures == settings.failures.display().to_string()
        }) || owned(&settings.out)
            || owned(&settings.failures)
    };
    if let Some(m) = found {
        if let Some(other) = another_file_of_this_name(settings, m) {
            return Err(RunError::Usage(format!(
                "{} holds the job of {other}, another file named {} that is still there: \
                 two inputs never share a checkpoint; give this one a --state-dir of its own \
                 (by default each has its own, .batchrun beside it)",
                settings.state_dir.display(),
                settings.input_name
            )));
        }
        return Ok(Located {
            id: m.id.clone(),
            window,
            ..Located::default()
        });
    }
    let (changed, idle): (Vec<&JobMeta>, Vec<&JobMeta>) = jobs
        .iter()
        .filter(this_input)
        .filter(these_outputs)
        // A job that finished nothing is replaced, unless a run of it was
        // killed: its calls in flight may have run.
        .partition(|m| m.done > 0 || unsettled(m));
    Ok(Located {
        id: made,
        changed: changed.into_iter().cloned().collect(),
        idle: idle.into_iter().map(|m| m.id.clone()).collect(),
        window,
        pipe_before: pipe_before(settings, &jobs, these_outputs),
    })
}

/// For a pipe of content no job was made from: the last job of this
/// request on a pipe, writing these outputs. If this content holds every
/// result of it (a query's rows in another order, rows inserted), the run
/// resumes it by content ([`Located::pipe_before`]).
fn pipe_before(
    settings: &Settings,
    jobs: &[JobMeta],
    these_outputs: impl Fn(&&JobMeta) -> bool,
) -> Option<JobMeta> {
    settings.spooled.as_ref()?;
    jobs.iter()
        .filter(|m| of_this_request(settings, m))
        .filter(these_outputs)
        .max_by_key(|m| m.last_active_unix_ms)
        .cloned()
}

/// What differs between the request a job was made for and this one, one
/// line each: `header X-Trace: nightly (added)`.
pub(super) fn request_diff(old: &str, new: &str) -> Vec<String> {
    let part = |l: &str| -> (String, String) {
        match l.split_once(": ") {
            Some((k, v)) if !k.contains(' ') || k == "key header" => {
                let what = if k == "body" || k == "key header" || k == "format" {
                    k.to_string()
                } else {
                    format!("header {k}")
                };
                (what, v.to_string())
            }
            _ => ("URL".to_string(), l.to_string()),
        }
    };
    let (old, new): (Vec<_>, Vec<_>) = (
        old.lines().map(part).collect(),
        new.lines().map(part).collect(),
    );
    let mut out = Vec::new();
    for (k, v) in &new {
        match old.iter().find(|(ok, _)| ok == k) {
            None => out.push(format!("{k}: {v} (added)")),
            Some((_, ov)) if ov != v => out.push(format!("{k}: {ov} -> {v}")),
            Some(_) => {}
        }
    }
    for (k, v) in &old {
        if !new.iter().any(|(nk, _)| nk == k) {
            out.push(format!("{k}: {v} (removed)"));
        }
    }
    // Read by name, the two are alike: they differ in what a name lookup
    // does not see (the list of differences was empty).
    if out.is_empty() && old != new {
        let sorted = |v: &[(String, String)]| {
            let mut v = v.to_vec();
            v.sort();
            v
        };
        out.push(match sorted(&old) == sorted(&new) {
            true => "the order of the -H headers".to_string(),
            false => "a header given more than once".to_string(),
        });
    }
    out
}

/// The input as the user gave it: a pipe's spooled copy is named by its
/// digest and removed when the run ends, so a message naming that path
/// would point at nothing the user knows.
pub(super) fn shown_input(settings: &Settings) -> String {
    if settings.spooled.is_some() {
        format!("the piped input ({})", settings.input_name)
    } else {
        settings.input.display().to_string()
    }
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

/// Opens the job `id` for this input and request, or creates it (its
/// items fingerprinted by `order`). A job
/// whose input changed since its checkpoint was made is refused: mixing
/// results of two files would be silent corruption.
pub fn open(
    store: &Store,
    settings: &Settings,
    scan: &input::Scan,
    (id, epoch, order): (&str, u32, input::FieldOrder),
    window: OriginWindow,
) -> Result<JobMeta, RunError> {
    let abs = std::fs::canonicalize(&settings.input)
        .with_context(|| format!("{}", settings.input.display()))?
        .to_string_lossy()
        .into_owned();
    let given = given_path(settings);
    if let Some(mut meta) = store.job(id).context("reading the checkpoint")? {
        // A record made before the key was hidden from it: hidden now.
        if meta.template != settings.identity && settings.same_request(&meta.template) {
            meta.template = settings.identity.clone();
            store.save_job(&meta).context("writing the checkpoint")?;
        }
        // Where the input lives now (moved, or reached by another path):
        // `status` finds the job from there.
        if meta.input != abs || meta.input_given != given {
            meta.input = abs.clone();
            meta.input_given = given;
            store.save_job(&meta).context("writing the checkpoint")?;
        }
        if meta.fingerprint != scan.fingerprint && grew(settings, &meta) {
            // The old content is an unchanged prefix of the new: the same
            // lines are the same items, and the appended ones are pending.
            // Blank lines alone add no item: nothing to say.
            let added = scan.total.saturating_sub(meta.total);
            if added > 0 && !settings.style.quiet {
                crate::report::err_line(&format!(
                    "batchrun: {} grew by {added} item(s) since its checkpoint was made: they are added to the job",
                    shown_input(settings),
                ));
            }
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
    let mut meta = JobMeta {
        id: id.to_string(),
        input: abs,
        input_given: given,
        input_name: settings.input_name.clone(),
        origin: settings.origin.clone(),
        // The API's window does not know jobs: a new one starts from the
        // last calls any job of this origin made.
        last_active_unix_ms: window.last_active_unix_ms,
        fingerprint: scan.fingerprint.clone(),
        total: scan.total,
        template: settings.identity.clone(),
        created_unix: unix_now().as_secs(),
        epoch,
        input_len: file_len(&settings.input),
        layout: LAYOUT,
        keys_by_content: true,
        // A job the checkpoint lost keys bodies as it did (its outputs'
        // owner record says how); a new one by their content.
        keys_sorted_body: super::owner::sorted_body_of(settings, id).unwrap_or(true),
        shards_by_content: true,
        any_field_order: order == input::FieldOrder::Ignored,
        ..JobMeta::default()
    };
    keep_learnt(&mut meta, window.learnt);
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
        format: match settings.out_format {
            crate::settings::values::OutFormat::Jsonl => None,
            crate::settings::values::OutFormat::Csv => Some("csv".into()),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::request_diff;

    #[test]
    fn a_request_diff_names_the_header_url_and_body_that_differ() {
        let old =
            "GET http://x/v1/a?n={n}\nX-Team: ops\nbody: {\"a\":1}\nkey header: idempotency-key";
        let added = format!("{old}\nX-Trace: nightly");
        assert_eq!(
            request_diff(old, &added),
            vec!["header X-Trace: nightly (added)"]
        );
        assert_eq!(
            request_diff(&added, old),
            vec!["header X-Trace: nightly (removed)"]
        );
        let moved = old.replace("v1/a", "v2/a").replace("ops", "dev");
        assert_eq!(
            request_diff(old, &moved),
            vec![
                "URL: GET http://x/v1/a?n={n} -> GET http://x/v2/a?n={n}",
                "header X-Team: ops -> dev"
            ]
        );
        let body = old.replace("{\"a\":1}", "<item as JSON>");
        assert_eq!(
            request_diff(old, &body),
            vec!["body: {\"a\":1} -> <item as JSON>"]
        );
        assert!(request_diff(old, old).is_empty());
        let two = format!("{old}\nX-Trace: nightly");
        let swapped = two.replace("X-Team: ops\n", "") + "\nX-Team: ops";
        let swapped =
            swapped.replace("\nkey header: idempotency-key", "") + "\nkey header: idempotency-key";
        assert_eq!(
            request_diff(&two, &swapped),
            vec!["the order of the -H headers"]
        );
        let cased = old.replace("X-Team", "x-team");
        assert_eq!(
            request_diff(old, &cased),
            vec!["header x-team: ops (added)", "header X-Team: ops (removed)"]
        );
    }
}
