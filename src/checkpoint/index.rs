//! The results log's index: where each line's latest entry starts.
//!
//! `<id>.idx`, beside the log, holds one little-endian u64 per line at byte
//! `line * 8`: the offset of the line's latest entry in `<id>.log` (0: none;
//! no entry starts at 0, the log's header is there). Lines never written are
//! holes in a sparse file. A value counts only for a line the checkpoint
//! marks finished: the index is written and fsynced after the log and before
//! the sled commit, so a value the checkpoint vouches for always points at
//! an entry that is on disk. A value written by a group that never
//! reached sled points past the log end sled accounts for: opening the job
//! takes that entry in (`recover.rs`).
//!
//! Keeping the offsets here rather than in sled is what keeps sled small:
//! eight bytes a line in a file read and written with `pread`/`pwrite` cost
//! no memory, where the same bytes in sled stay in its cache.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};

use super::log::{io_err, Window};
use super::CheckpointError;

/// Lines' offsets read at a time (16 KiB: 2048 lines).
const WINDOW: usize = 16 * 1024;

/// Writes lines' offsets.
pub struct IndexWriter {
    file: File,
    path: PathBuf,
    buf: Vec<u8>,
}

impl IndexWriter {
    /// Opens the index for writing, creating it if needed.
    pub fn open(path: &Path) -> Result<IndexWriter, CheckpointError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(|e| io_err(path, e))?;
        Ok(IndexWriter {
            file,
            path: path.to_path_buf(),
            buf: Vec::new(),
        })
    }

    /// Writes `(line, offset)` pairs and fsyncs them. Runs of consecutive
    /// lines (most of a group) go out in one write each. A line given twice
    /// keeps its larger offset: the entry appended last.
    pub fn write(&mut self, slots: &mut [(u64, u64)]) -> Result<(), CheckpointError> {
        slots.sort_unstable();
        let mut i = 0;
        while i < slots.len() {
            let first = slots[i].0;
            self.buf.clear();
            let mut next = first;
            while i < slots.len() && slots[i].0 <= next {
                if slots[i].0 < next {
                    self.buf.truncate(self.buf.len() - 8);
                }
                self.buf.extend_from_slice(&slots[i].1.to_le_bytes());
                next = slots[i].0 + 1;
                i += 1;
            }
            self.file
                .write_all_at(&self.buf, first * 8)
                .map_err(|e| io_err(&self.path, e))?;
        }
        self.file.sync_data().map_err(|e| io_err(&self.path, e))
    }
}

/// Reads lines' offsets, mostly in increasing line order.
pub struct IndexReader {
    window: Window,
}

impl IndexReader {
    /// Opens the index for reading.
    pub fn open(path: &Path) -> Result<IndexReader, CheckpointError> {
        let file = File::open(path).map_err(|e| io_err(path, e))?;
        Ok(IndexReader {
            window: Window::new(file, path, WINDOW),
        })
    }

    /// The offset of the line's latest entry (0: none written).
    pub fn offset(&mut self, line: u64) -> Result<u64, CheckpointError> {
        let b = self.window.bytes(line * 8, 8)?;
        let mut v = [0u8; 8];
        v.copy_from_slice(b);
        Ok(u64::from_le_bytes(v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_are_read_back_and_rewritten_in_place() {
        let dir = std::env::temp_dir().join(format!("batchrun-idx-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("job.idx");
        let mut w = IndexWriter::open(&path).unwrap();
        w.write(&mut [(5, 800), (3, 100), (4, 750), (9000, 9), (4, 700)])
            .unwrap();
        drop(w);
        let mut w = IndexWriter::open(&path).unwrap();
        w.write(&mut [(3, 333)]).unwrap();
        let mut r = IndexReader::open(&path).unwrap();
        assert_eq!(r.offset(3).unwrap(), 333, "rewritten in place");
        assert_eq!(r.offset(4).unwrap(), 750, "the entry appended last wins");
        assert_eq!(r.offset(5).unwrap(), 800);
        assert_eq!(r.offset(6).unwrap(), 0, "a hole reads as none");
        assert_eq!(r.offset(9000).unwrap(), 9);
        assert!(r.offset(9001).is_err(), "beyond the file");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
