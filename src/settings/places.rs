//! Where a run keeps its state and writes its outputs: the state dir beside
//! the input (or the one given, or a renamed input's), and a shard's own.

use std::path::{Path, PathBuf};

use super::{check_joblog, check_outputs, default_output};
use crate::cli::RunArgs;
use crate::exit::RunError;
use crate::fleet::Shard;

/// The shards' state dirs under `base` (`shard-I-of-N/`) that hold a
/// checkpoint, in shard order: what `status` shows beside the whole run's,
/// and the other layouts a new job looks at.
pub fn shard_checkpoints(base: &Path) -> Vec<(Shard, PathBuf)> {
    let mut shards: Vec<(Shard, PathBuf)> = std::fs::read_dir(base)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let shard = Shard::from_tag(&e.file_name().to_string_lossy())?;
            let p = e.path();
            crate::checkpoint::held(&p).then_some((shard, p))
        })
        .collect();
    shards.sort_by_key(|(s, _)| (s.count, s.index));
    shards
}

/// The state dir and the outputs. A shard keeps its own checkpoint and
/// outputs: N processes on one machine cannot share one sled directory,
/// nor one results file.
pub(super) fn places(args: &RunArgs) -> Result<(PathBuf, PathBuf, PathBuf), RunError> {
    let base = state_dir_for(&args.input, args.state_dir.as_deref());
    let (state_dir, out_suffix) = match args.shard {
        Some(s) => (base.join(s.tag()), format!("{}.", s.tag())),
        None => (base.clone(), String::new()),
    };
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| default_output(&args.input, &format!("{out_suffix}results")));
    let failures = args
        .failures
        .clone()
        .unwrap_or_else(|| default_output(&args.input, &format!("{out_suffix}failures")));
    check_outputs(&args.input, &out, &failures)?;
    // Never, whatever --force-outputs says: a checkpoint overwritten loses
    // every result it holds.
    for (flag, p) in [("--out", &out), ("--failures", &failures)] {
        if of_the_state(&base, p) {
            return Err(RunError::Usage(format!(
                "{flag} {} is inside the checkpoint ({}): writing it would damage the checkpoint",
                p.display(),
                base.display()
            )));
        }
    }
    if let Some(j) = &args.joblog {
        check_joblog((&args.input, &out, &failures), &state_dir, j)?;
    }
    Ok((state_dir, through_link(out), through_link(failures)))
}

/// Whether `p` is (or would be) one of batchrun's own files in the state
/// dir `base`: the checkpoint, the results logs, a spooled pipe (or a hard
/// link to one of them), a timeline or a running job's progress. Any other
/// file there is not: `--state-dir .` keeps outputs and joblogs beside it.
pub(super) fn of_the_state(base: &Path, p: &Path) -> bool {
    let ours = ["checkpoint", "results", "spool"];
    if ours.iter().any(|d| crate::util::within(&base.join(d), p)) {
        return true;
    }
    let beside = p.parent().map(crate::util::resolved) == Some(crate::util::resolved(base));
    let name = p.file_name().map(|n| n.to_string_lossy().into_owned());
    beside && name.is_some_and(|n| n.starts_with("timeline-") || n.starts_with("running-"))
}

/// An output named by a symbolic link is written where the link points:
/// the outputs are renamed into place, which would otherwise replace the
/// link with a file and leave its target stale.
fn through_link(p: PathBuf) -> PathBuf {
    match std::fs::symlink_metadata(&p) {
        Ok(m) if m.file_type().is_symlink() => match std::fs::canonicalize(&p) {
            Ok(target) => target,
            // A link to a file not made yet: where it points, from its folder.
            Err(_) => match std::fs::read_link(&p) {
                Ok(t) => p.parent().map_or(t.clone(), |dir| dir.join(&t)),
                Err(_) => p,
            },
        },
        _ => p,
    }
}

/// The state dir of a job on `input`: the one given, else
/// `.batchrun/<file name>` beside the input, so the same input resumes the
/// same job whatever the current directory, and two inputs in one folder
/// never share (and lock) one checkpoint. A `./.batchrun` made by earlier
/// versions, whose default it was, is still used while the new place does
/// not exist: its jobs must resume, not start again.
pub fn state_dir_for(input: &Path, given: Option<&Path>) -> PathBuf {
    if let Some(d) = given {
        return d.to_path_buf();
    }
    let pipe = piped(input);
    let (dir, name) = if pipe {
        (PathBuf::from("."), "stdin".to_string())
    } else {
        let dir = input
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
        let name = input
            .file_name()
            .map_or_else(|| "input".to_string(), |n| n.to_string_lossy().into_owned());
        (dir, name)
    };
    let own = dir.join(".batchrun").join(&name);
    if own.exists() || pipe {
        return own;
    }
    renamed_from(&dir, input)
        .or_else(|| linked_from(&dir, input))
        .unwrap_or(own)
}

/// For a link in another folder than the file it points at: the state dir
/// the file has in its own folder, under its name or another
/// ([`renamed_from`]). A job run on the file, then on a link to it from
/// elsewhere, resumes; where the file's folder holds none, the link's own
/// is made.
fn linked_from(dir: &Path, input: &Path) -> Option<PathBuf> {
    let target = std::fs::canonicalize(input).ok()?;
    let there = target.parent()?;
    if std::fs::canonicalize(dir).is_ok_and(|d| d == there) {
        return None;
    }
    renamed_from(there, input)
}

/// A path under `/dev` or `/proc`: `<(cmd)` (`/dev/fd/63`, a number
/// the shell picks afresh each time), `/dev/stdin`. It is a pipe, as `-`
/// is: its job is found by content, under `.batchrun/stdin` of the
/// current directory, not by a name that changes from run to run.
pub fn special(input: &Path) -> bool {
    input.starts_with("/dev") || input.starts_with("/proc")
}

/// Whether `input` is a pipe: `-`, or a [`special`] path. Its jobs live
/// under `.batchrun/stdin` and are found by content.
pub fn piped(input: &Path) -> bool {
    input == Path::new("-") || special(input)
}

/// The input as its jobs record it, for `status` and `report`, which read
/// no input: none for a pipe (`-`, `<(cmd)`), whose jobs are found by its
/// state dir alone; else [`crate::util::recorded_path`].
pub fn recorded_input(input: &Path) -> anyhow::Result<Option<String>> {
    use anyhow::Context as _;
    if piped(input) {
        return Ok(None);
    }
    let path = crate::util::recorded_path(input)
        .with_context(|| format!("{}: cannot read", input.display()))?;
    Ok(Some(path.to_string_lossy().into_owned()))
}

/// The state dir of the same file under another name: a link of another
/// name to it, or the name it had before a rename (a state dir whose input
/// is gone and which holds a job of this content; the newest such). The job inside is then found by content
/// (`run::job`), so a renamed input resumes instead of sending its items
/// again under new keys; a state dir of another content holds no job this
/// input matches, and the run starts a new one beside the old.
fn renamed_from(dir: &Path, input: &Path) -> Option<PathBuf> {
    let this = std::fs::canonicalize(input).ok()?;
    let states = std::fs::read_dir(dir.join(".batchrun")).ok()?;
    let mut gone = Vec::new();
    for state in states.flatten() {
        // A checkpoint moved aside as damaged (the advice says
        // `mv DIR DIR.damaged`) is nobody's state any more.
        if state.file_name().to_string_lossy().ends_with(".damaged") {
            continue;
        }
        let was = dir.join(state.file_name());
        match std::fs::canonicalize(&was) {
            Ok(p) if p == this => return Some(state.path()),
            Ok(_) => {}
            Err(_) => {
                let at = state.metadata().and_then(|m| m.modified()).ok();
                gone.push((at, state.path()));
            }
        }
    }
    // A gone name's state dir is this input's only if it holds a job of
    // this very content: an unrelated new input never borrows one (its job
    // would be made there, and lost when another name goes). A FIFO or a
    // `<(cmd)` can be read only once, and that read is the spool's.
    if !std::fs::metadata(input).is_ok_and(|m| m.is_file()) {
        return None;
    }
    let content = crate::input::file_fingerprint(input).ok()?;
    gone.sort_by_key(|(at, _)| std::cmp::Reverse(*at));
    gone.into_iter().map(|(_, p)| p).find(|dir| {
        crate::checkpoint::Store::open(dir)
            .and_then(|store| store.jobs())
            .is_ok_and(|jobs| jobs.iter().any(|j| j.fingerprint == content))
    })
}
