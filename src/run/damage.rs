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
    RunError::Fatal(anyhow::anyhow!(
        "the checkpoint in {} is damaged ({e}). {what}. Move it aside \
         (mv {0} {0}.damaged) and run the same command: every item goes again \
         under the Idempotency-Key it was last sent with (read back from the \
         outputs), so an API that honours it replays what already ran instead \
         of running it twice",
        dir.display()
    ))
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
