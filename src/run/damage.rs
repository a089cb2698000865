//! What a checkpoint that cannot be read or written means for the
//! operator, and the way forward: the words every part of the run uses.

use std::path::Path;

use crate::checkpoint::CheckpointError;
use crate::exit::RunError;

/// A checkpoint that cannot be opened: say what it means and the way forward.
pub(crate) fn damaged(dir: &Path, e: CheckpointError) -> RunError {
    damaged_when(dir, e, "Nothing was sent")
}

/// A damaged checkpoint; `what` says what this run had done when it was found.
pub(crate) fn damaged_when(dir: &Path, e: CheckpointError, what: &str) -> RunError {
    if matches!(e, CheckpointError::Locked(_)) {
        return RunError::Fatal(anyhow::Error::new(e));
    }
    if let Some(io) = storage_error(&e) {
        return RunError::Fatal(unusable(dir, io, what));
    }
    RunError::Fatal(anyhow::anyhow!(
        "{}",
        crate::checkpoint::damage_advice(dir, &e, what)
    ))
}

/// The system's error when the state directory could not be read or
/// written (not a directory, no space, no permission): nothing says the
/// checkpoint in it is damaged.
fn storage_error(e: &CheckpointError) -> Option<&std::io::Error> {
    let io = match e {
        CheckpointError::Store {
            source: sled::Error::Io(io),
            ..
        } => io,
        CheckpointError::Log { source, .. } => source,
        _ => return None,
    };
    // A file of the checkpoint that is missing or cut short is damage; these
    // are the system refusing to store or reach what is there.
    let refusal = [
        libc::ENOSPC,
        libc::EDQUOT,
        libc::EFBIG,
        libc::EROFS,
        libc::EACCES,
        libc::EPERM,
        libc::ENOTDIR,
        libc::EEXIST,
    ];
    io.raw_os_error()
        .is_some_and(|code| refusal.contains(&code))
        .then_some(io)
}

/// A state directory that cannot be used: what stands in the way, and the
/// way on, which never involves moving the checkpoint aside (that would
/// send every item again).
fn unusable(dir: &Path, io: &std::io::Error, what: &str) -> anyhow::Error {
    // A component that is a file: the error is ENOTDIR or EEXIST, and the
    // plain fact reads better than either.
    let file = dir.ancestors().find(|p| p.exists()).filter(|p| !p.is_dir());
    if let Some(f) = file {
        return anyhow::anyhow!(
            "the state directory {} cannot be made: {} is a file, not a directory. {what}. \
             Give --state-dir a directory (it is created if missing), or move that file away",
            dir.display(),
            f.display()
        );
    }
    let reason = match io.to_string() {
        r if r.starts_with("Os {") => io.kind().to_string(),
        r => r,
    };
    // A new job has no checkpoint to reassure about, nor a place to resume.
    // Its open may have made the directories and empty files before the
    // first write failed: a checkpoint that ever held anything has a
    // non-empty database file.
    let held = crate::checkpoint::held(dir);
    let (state, way_on) = match held {
        true => (
            "this is no sign of damage to the checkpoint in it",
            "the job resumes where it stopped",
        ),
        false => ("it holds no checkpoint yet", "the job starts"),
    };
    anyhow::anyhow!(
        "the state directory {} cannot be read or written ({reason}); {state}. {what}. Free \
         space there or fix its permissions, then run the same command: {way_on}",
        dir.display()
    )
}

/// Why a run stopped when its checkpoint could not be written, and the way on.
pub(crate) fn checkpoint_failed(dir: &Path, e: &dyn std::fmt::Display) -> String {
    format!(
        "the checkpoint in {} could not be written ({e}); no more calls were sent. \
         Calls that finished but were not recorded (about one group) go again under \
         the same Idempotency-Keys, so an API that honours them replays them. Free \
         space there (or fix the file) and run the same command to resume",
        dir.display()
    )
}
