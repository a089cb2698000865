//! Items a run sent alone to learn the balance at the reserve (`--reserve`
//! with `--batch`): a batch's Idempotency-Key is made of its items', so an
//! item sent alone whose call may have run must go alone again, never in a
//! batch under another key. Each is written to `alone-<job>` in the state
//! dir, and synced, before its call; a later run sends the ones still
//! pending alone too, whatever its own reckoning of the balance.

use std::collections::HashSet;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::checkpoint::LineStates;

/// The lines sent alone, and where new ones are written.
#[derive(Debug)]
pub struct Alone {
    path: PathBuf,
    lines: Mutex<HashSet<u64>>,
}

impl Alone {
    /// The record of job `job` in `state_dir`, keeping the lines `states`
    /// still has pending (rewritten so; a record that cannot be read is
    /// empty, and one that cannot be rewritten keeps its finished lines).
    pub fn open(state_dir: &Path, job: &str, states: &LineStates) -> Alone {
        let path = state_dir.join(format!("alone-{job}"));
        let lines: HashSet<u64> = std::fs::read_to_string(&path)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .filter(|&l| !states.is_finished(l))
            .collect();
        let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
        let _ = std::fs::write(&path, text);
        Alone {
            path,
            lines: Mutex::new(lines),
        }
    }

    /// Whether `line` went alone in an earlier run and may have run.
    pub fn was(&self, line: u64) -> bool {
        self.lock().contains(&line)
    }

    /// Records that `line` is about to go alone, on disk before its call.
    /// An error means it must not go alone.
    pub fn record(&self, line: u64) -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)?;
        writeln!(f, "{line}")?;
        f.sync_data()?;
        self.lock().insert(line);
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<u64>> {
        self.lines
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a run records reaches the next one, less the lines finished
    /// since.
    #[test]
    fn lines_sent_alone_are_kept_while_pending() {
        let dir = std::env::temp_dir().join(format!("batchrun-alone-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut states = LineStates::default();
        states.grow(20);
        let a = Alone::open(&dir, "j", &states);
        assert!(!a.was(1));
        a.record(1).unwrap();
        a.record(11).unwrap();
        assert!(a.was(11));
        states.set(1, Some(crate::checkpoint::ItemState::Done));
        let b = Alone::open(&dir, "j", &states);
        assert!(!b.was(1), "finished");
        assert!(b.was(11), "still pending: alone again");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
