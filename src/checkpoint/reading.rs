//! Looking at a checkpoint that cannot be written: a read-only or full file
//! system, an archived job. sled opens its files for writing, so `status`
//! and `report` open a copy of the database in the temp dir instead; the
//! copy goes with the store.

use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::{CheckpointError, Store};

/// A store opened to be read: the checkpoint itself, or a copy of it.
pub struct ReadStore {
    store: Store,
    /// Dropped after the store (fields drop in order): its files are
    /// closed before they go.
    _copy: Option<Copy>,
}

/// A copy of a database in the temp dir, removed when dropped.
struct Copy(PathBuf);

impl Drop for Copy {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Deref for ReadStore {
    type Target = Store;

    fn deref(&self) -> &Store {
        &self.store
    }
}

impl From<Store> for ReadStore {
    fn from(store: Store) -> ReadStore {
        ReadStore { store, _copy: None }
    }
}

impl Store {
    /// Opens the store in `dir` to read it; one that cannot be written is
    /// read from a copy.
    ///
    /// # Errors
    ///
    /// As [`Store::open`], and a copy that cannot be made.
    pub fn open_to_read(dir: &Path) -> Result<ReadStore, CheckpointError> {
        match Store::open(dir) {
            Ok(store) => Ok(ReadStore { store, _copy: None }),
            Err(e) if unwritable(&e) => copied(dir).map_err(|_| e),
            Err(e) => Err(e),
        }
    }
}

/// A store in `dir` that failed to open because nothing can be written
/// there.
fn unwritable(e: &CheckpointError) -> bool {
    let CheckpointError::Store {
        source: sled::Error::Io(io),
        ..
    } = e
    else {
        return false;
    };
    use std::io::ErrorKind::{PermissionDenied, ReadOnlyFilesystem, StorageFull};
    matches!(
        io.kind(),
        PermissionDenied | ReadOnlyFilesystem | StorageFull
    )
}

/// The store in `dir` opened from a copy of its database.
fn copied(dir: &Path) -> Result<ReadStore, CheckpointError> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let copy = std::env::temp_dir().join(format!("batchrun-read-{}-{n}", std::process::id()));
    let made = copy_dir(&dir.join("checkpoint"), &copy.join("checkpoint"));
    let opened = made
        .map_err(|e| CheckpointError::Store {
            dir: dir.to_path_buf(),
            source: sled::Error::Io(e),
        })
        .and_then(|()| Store::open(&copy));
    match opened {
        Ok(store) => Ok(ReadStore {
            store,
            _copy: Some(Copy(copy)),
        }),
        Err(e) => {
            let _ = std::fs::remove_dir_all(&copy);
            Err(e)
        }
    }
}

fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::{JobMeta, LAYOUT};

    /// A checkpoint that cannot be written is read from a copy holding
    /// its jobs; the copy goes with the store. (A read-only file system
    /// cannot be made here without privileges: the copy is opened
    /// directly, and the errors that lead to it are classified.)
    #[test]
    fn a_checkpoint_that_cannot_be_written_is_read_from_a_copy() {
        let dir = std::env::temp_dir().join(format!("batchrun-reading-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        {
            let s = Store::open(&dir).unwrap();
            let meta = JobMeta {
                id: "j1".into(),
                input: "/x/in.jsonl".into(),
                total: 3,
                layout: LAYOUT,
                ..JobMeta::default()
            };
            s.save_job(&meta).unwrap();
            s.flush().unwrap();
        }
        let read = copied(&dir).unwrap();
        assert_eq!(read.jobs().unwrap().len(), 1);
        let copy = read._copy.as_ref().map(|c| c.0.clone()).unwrap();
        assert!(copy.exists());
        drop(read);
        assert!(!copy.exists(), "the copy goes with the store");
        let _ = std::fs::remove_dir_all(&dir);

        let io = |kind| CheckpointError::Store {
            dir: PathBuf::from("/x"),
            source: sled::Error::Io(std::io::Error::from(kind)),
        };
        assert!(unwritable(&io(std::io::ErrorKind::ReadOnlyFilesystem)));
        assert!(unwritable(&io(std::io::ErrorKind::StorageFull)));
        assert!(!unwritable(&io(std::io::ErrorKind::NotFound)));
        assert!(!unwritable(&CheckpointError::Locked(PathBuf::from("/x"))));
    }
}
