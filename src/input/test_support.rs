//! Helpers shared by the input tests.

use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::{InputError, Item, Reader};
use crate::input::Format;

fn unique(name: &str) -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    std::env::temp_dir().join(format!("batchrun-input-{}-{n}-{name}", std::process::id()))
}

/// A file in the temp dir, unique to this test, removed on drop.
pub(crate) struct TempFile(PathBuf);

impl TempFile {
    pub(crate) fn new(name: &str, bytes: &[u8]) -> TempFile {
        let path = unique(name);
        std::fs::write(&path, bytes).expect("write temp file");
        TempFile(path)
    }

    pub(crate) fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A directory path in the temp dir, unique to this test, not created here
/// (so a test can see who creates it), removed with its content on drop.
pub(crate) struct TempDir(PathBuf);

impl TempDir {
    pub(crate) fn new(name: &str) -> TempDir {
        TempDir(unique(name))
    }

    pub(crate) fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub(crate) fn read_all(path: &Path, format: Format) -> Result<Vec<Item>, InputError> {
    Reader::open(path, format)?.collect()
}

pub(crate) fn lines(items: &[Item]) -> Vec<u64> {
    items.iter().map(|i| i.line).collect()
}

pub(crate) fn no_check(_: &Item) -> Result<(), String> {
    Ok(())
}

/// Hands out its bytes one at a time, the worst case for short reads.
pub(crate) struct Trickle<R>(pub(crate) R);

impl<R: Read> Read for Trickle<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match buf.first_mut() {
            Some(first) => self.0.read(std::slice::from_mut(first)),
            None => Ok(0),
        }
    }
}
