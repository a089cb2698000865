//! The results log: an append-only file of finished calls, beside the
//! checkpoint. The response body is stored as the raw bytes that came back
//! (a failure's reason likewise); nothing on the hot path parses it.
//!
//! The file starts with an 8-byte header, then entries, each a 32-byte
//! little-endian header and its payload:
//!
//! ```text
//! magic u8 (0xE5) | state u8 (1 done, 2 failed, 3 failed with its outcome
//! unknown) | status u16 (0: none)
//! attempts u32 | line u64 | item digest u64 | payload length u32
//! crc32 u32 (of the 28 bytes before it and the payload) | payload
//! ```
//!
//! The item digest ([`crate::input::Item::digest`]) is what the line held
//! when its call was made: the outputs pair a result with a line only while
//! the line still holds that item. Logs of version 1 (written before the
//! digest existed) have 20-byte entry headers without it or the checksum,
//! and keep that layout when appended to.
//!
//! Only entries the checkpoint points at count. Anything else (an entry
//! written but never committed, a torn tail after a crash) is never read,
//! and new entries go after it.
//!
//! Each group commit's entries end with a group end: an entry of line 0
//! (no line is 0) with no payload, written in the same append, whose
//! digest is the offset of the group's first entry. A crash between the
//! log and sled leaves groups that opening the job takes from the log
//! (`recover.rs`); the group end says which are whole, so that one call's
//! items (a batch's) are taken all or none.

use std::fs::{File, OpenOptions};
use std::io::{self, Write as _};
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};

use super::{CheckpointError, ItemState};

/// The first bytes of every new results log (version 2).
pub const FILE_HEADER: &[u8; 8] = b"BRLOG\0\0\x02";
/// The first seven bytes of a log of any version; the eighth is it.
const FILE_MAGIC: &[u8; 7] = b"BRLOG\0\0";
const MAGIC: u8 = 0xE5;
/// Bytes of an entry's header in a version 2 log.
pub const ENTRY_HEADER: usize = 32;
/// Bytes of a version 2 header the checksum covers (all before it).
const SUMMED: usize = 28;
/// Bytes of an entry's header in a version 1 log (no digest).
const ENTRY_HEADER_V1: usize = 20;

fn header_len(version: u8) -> usize {
    if version == 1 {
        ENTRY_HEADER_V1
    } else {
        ENTRY_HEADER
    }
}
/// How much of the log a reader holds at a time.
const WINDOW: usize = 64 * 1024;

/// One finished call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry<'a> {
    /// The item's line.
    pub line: u64,
    /// Done or failed.
    pub state: ItemState,
    /// The final HTTP status, when there was a response.
    pub status: Option<u16>,
    /// Calls made for it.
    pub attempts: u32,
    /// The response body (done) or the reason (failed).
    pub payload: &'a [u8],
    /// Failed, but the call may have run: no verdict came back for it.
    pub unknown: bool,
    /// The item's digest when its call was made (None in a version 1 log,
    /// or for a record moved from an older layout).
    pub digest: Option<u64>,
}

impl Entry<'_> {
    /// Appends the entry's bytes to `out`, as a log of `version` holds them.
    pub fn encode(&self, out: &mut Vec<u8>, version: u8) {
        let start = out.len();
        out.push(MAGIC);
        out.push(match self.state {
            ItemState::Done => 1,
            ItemState::Failed if self.unknown => 3,
            ItemState::Failed => 2,
        });
        out.extend_from_slice(&self.status.unwrap_or(0).to_le_bytes());
        out.extend_from_slice(&self.attempts.to_le_bytes());
        out.extend_from_slice(&self.line.to_le_bytes());
        if version != 1 {
            out.extend_from_slice(&self.digest.unwrap_or(0).to_le_bytes());
        }
        // A payload beyond 4 GiB cannot come from an HTTP body reqwest
        // buffered; it is cut rather than mis-framed.
        let len = u32::try_from(self.payload.len()).unwrap_or(u32::MAX);
        out.extend_from_slice(&len.to_le_bytes());
        let payload = &self.payload[..len as usize];
        if version != 1 {
            let mut crc = crc32fast::Hasher::new();
            crc.update(&out[start..]);
            crc.update(payload);
            out.extend_from_slice(&crc.finalize().to_le_bytes());
        }
        out.extend_from_slice(payload);
    }
}

/// Appends a group end (see the module docs) to `out`, as a log of
/// `version` holds it, for the group whose first entry starts at `start`
/// (in the digest's place): a group end closes only the entries from
/// there, never a torn group's before them.
pub fn group_end(out: &mut Vec<u8>, version: u8, start: u64) {
    Entry {
        line: 0,
        state: ItemState::Done,
        status: None,
        attempts: 0,
        payload: &[],
        unknown: false,
        digest: Some(start),
    }
    .encode(out, version);
}

pub(super) fn io_err(path: &Path, e: io::Error) -> CheckpointError {
    CheckpointError::Log {
        path: path.to_path_buf(),
        source: e,
    }
}

/// Appends entries; every append is written and fsynced before it returns.
pub struct LogWriter {
    file: File,
    path: PathBuf,
    end: u64,
    version: u8,
}

impl LogWriter {
    /// Opens the log for appending, creating it (and its directory) if needed.
    pub fn open(path: &Path) -> Result<LogWriter, CheckpointError> {
        let e = |e| io_err(path, e);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(e)?;
        }
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(path)
            .map_err(e)?;
        let mut end = file.metadata().map_err(e)?.len();
        let version = if end < FILE_HEADER.len() as u64 {
            // Created (or torn while being created) with no entry yet:
            // nothing can point into it.
            file.set_len(0).map_err(e)?;
            file.write_all(FILE_HEADER).map_err(e)?;
            file.sync_all().map_err(e)?;
            end = FILE_HEADER.len() as u64;
            FILE_HEADER[7]
        } else {
            check_header(&file, path)?
        };
        Ok(LogWriter {
            file,
            path: path.to_path_buf(),
            end,
            version,
        })
    }

    /// The log's version: how its entries are laid out.
    pub fn version(&self) -> u8 {
        self.version
    }

    /// Where the next entry will start.
    pub fn end(&self) -> u64 {
        self.end
    }

    /// Writes `bytes` (whole entries) at the end and fsyncs them.
    pub fn append(&mut self, bytes: &[u8]) -> Result<(), CheckpointError> {
        let e = |e| io_err(&self.path, e);
        self.file.write_all(bytes).map_err(e)?;
        self.file.sync_data().map_err(e)?;
        self.end += bytes.len() as u64;
        Ok(())
    }
}

/// The log's version, from its header.
fn check_header(file: &File, path: &Path) -> Result<u8, CheckpointError> {
    let mut head = [0u8; 8];
    file.read_exact_at(&mut head, 0)
        .map_err(|e| io_err(path, e))?;
    match (&head[..7] == FILE_MAGIC, head[7]) {
        (true, v @ (1 | 2)) => Ok(v),
        _ => Err(CheckpointError::Corrupt(format!(
            "{} is not a batchrun results log",
            path.display()
        ))),
    }
}

/// Reads entries by offset through a window of the file: entries written in
/// about line order are read in about one sequential pass.
pub struct LogReader {
    window: Window,
    version: u8,
}

impl LogReader {
    /// Opens a log for reading.
    pub fn open(path: &Path) -> Result<LogReader, CheckpointError> {
        let file = File::open(path).map_err(|e| io_err(path, e))?;
        let version = check_header(&file, path)?;
        Ok(LogReader {
            window: Window::new(file, path, WINDOW),
            version,
        })
    }

    /// The log's version: how its entries are laid out.
    pub fn version(&self) -> u8 {
        self.version
    }

    /// Where the entry after one at `offset` of `payload` bytes starts.
    pub fn next(&self, offset: u64, payload: usize) -> u64 {
        offset + (header_len(self.version) + payload) as u64
    }

    /// Whether a whole entry of at most `most` payload bytes, with its
    /// checksum, starts at `offset` of a log `end` bytes long: a cheap
    /// look for one past torn bytes (most offsets fail on their first
    /// byte, and no length reads past the end or beyond `most`).
    pub fn starts_entry(&mut self, offset: u64, end: u64, most: usize) -> bool {
        let hlen = header_len(self.version);
        if hlen != ENTRY_HEADER || offset.saturating_add(hlen as u64) > end {
            return false;
        }
        let Ok(head) = self.window.bytes(offset, hlen) else {
            return false;
        };
        let len = u32::from_le_bytes([head[24], head[25], head[26], head[27]]) as usize;
        let fits = offset.saturating_add((hlen + len) as u64) <= end && len <= most;
        head[0] == MAGIC && matches!(head[1], 1..=3) && fits && self.entry(offset).is_ok()
    }

    /// The entry starting at `offset`.
    pub fn entry(&mut self, offset: u64) -> Result<Entry<'_>, CheckpointError> {
        let hlen = header_len(self.version);
        let head = self.window.bytes(offset, hlen)?;
        let u32_at =
            |i: usize| u32::from_le_bytes([head[i], head[i + 1], head[i + 2], head[i + 3]]);
        let state = match (head[0], head[1]) {
            (MAGIC, 1) => ItemState::Done,
            (MAGIC, 2 | 3) => ItemState::Failed,
            _ => {
                return Err(CheckpointError::Corrupt(format!(
                    "no results log entry at offset {offset} of {}",
                    self.window.path.display()
                )))
            }
        };
        let unknown = head[1] == 3;
        let status = u16::from_le_bytes([head[2], head[3]]);
        let attempts = u32_at(4);
        let u64_at = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&head[i..i + 8]);
            u64::from_le_bytes(b)
        };
        let line = u64_at(8);
        // 0: the item was not known when the entry was written (a record
        // moved from an older layout).
        let v2 = hlen == ENTRY_HEADER;
        let digest = v2.then(|| u64_at(16)).filter(|&d| d != 0);
        let (len, sum) = match v2 {
            true => (u32_at(24) as usize, Some(u32_at(SUMMED))),
            false => (u32_at(16) as usize, None),
        };
        if let Some(sum) = sum {
            let whole = self.window.bytes(offset, hlen + len)?;
            let mut crc = crc32fast::Hasher::new();
            crc.update(&whole[..SUMMED]);
            crc.update(&whole[hlen..]);
            if crc.finalize() != sum {
                return Err(CheckpointError::Corrupt(format!(
                    "the results log entry of line {line} at offset {offset} of {} fails its checksum",
                    self.window.path.display()
                )));
            }
        }
        // Served from the window the check just filled.
        let whole = self.window.bytes(offset, hlen + len)?;
        Ok(Entry {
            line,
            state,
            status: (status != 0).then_some(status),
            attempts,
            payload: &whole[hlen..],
            unknown,
            digest,
        })
    }
}

/// A window over a file read with `pread`: reads that move forward through
/// the file are served from memory most of the time, and memory stays at
/// the window's size however large the file.
pub(super) struct Window {
    file: File,
    pub(super) path: PathBuf,
    size: usize,
    buf: Vec<u8>,
    start: u64,
}

impl Window {
    pub(super) fn new(file: File, path: &Path, size: usize) -> Window {
        Window {
            file,
            path: path.to_path_buf(),
            size,
            buf: Vec::new(),
            start: 0,
        }
    }

    /// `len` bytes at `offset`, from the window or after moving it there.
    pub(super) fn bytes(&mut self, offset: u64, len: usize) -> Result<&[u8], CheckpointError> {
        let in_window =
            offset >= self.start && offset + len as u64 <= self.start + self.buf.len() as u64;
        if !in_window {
            // A length read from damaged bytes may be gigabytes: a read
            // larger than the window is checked against the file first.
            if len > self.size {
                let end = self
                    .file
                    .metadata()
                    .map_err(|e| io_err(&self.path, e))?
                    .len();
                if offset.saturating_add(len as u64) > end {
                    return Err(self.short(offset + len as u64));
                }
            }
            self.buf.resize(len.max(self.size), 0);
            let n = read_at_most(&self.file, &mut self.buf, offset)
                .map_err(|e| io_err(&self.path, e))?;
            self.buf.truncate(n);
            self.start = offset;
            if n < len {
                return Err(self.short(offset + len as u64));
            }
        }
        let at = (offset - self.start) as usize;
        Ok(&self.buf[at..at + len])
    }

    fn short(&self, end: u64) -> CheckpointError {
        CheckpointError::Corrupt(format!("{} ends before offset {end}", self.path.display()))
    }
}

fn read_at_most(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match file.read_at(&mut buf[n..], offset + n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(tag: &str) -> PathBuf {
        let p = std::env::temp_dir().join(format!("batchrun-log-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        p.join("results").join("job.log")
    }

    #[test]
    fn entries_are_read_back_by_offset_across_reopens() {
        let path = tmp("rw");
        let mut w = LogWriter::open(&path).unwrap();
        assert_eq!(w.end(), 8);
        let big = vec![b'x'; WINDOW * 3 + 10];
        let entries = [
            Entry {
                line: 3,
                state: ItemState::Done,
                status: Some(200),
                attempts: 1,
                payload: br#"{"ok":true}"#,
                unknown: false,
                digest: Some(7),
            },
            Entry {
                line: 1,
                state: ItemState::Failed,
                status: None,
                attempts: 5,
                payload: b"timed out",
                unknown: true,
                digest: Some(u64::MAX),
            },
            Entry {
                line: 2,
                state: ItemState::Failed,
                status: Some(400),
                attempts: 1,
                payload: b"bad request",
                unknown: false,
                digest: None,
            },
            Entry {
                line: 9,
                state: ItemState::Done,
                status: Some(201),
                attempts: 2,
                payload: &big,
                unknown: false,
                digest: Some(42),
            },
        ];
        let mut offsets = Vec::new();
        let mut bytes = Vec::new();
        for e in &entries {
            offsets.push(w.end() + bytes.len() as u64);
            e.encode(&mut bytes, w.version());
        }
        w.append(&bytes).unwrap();
        drop(w);
        // A torn tail from a crash: never pointed at, and appended after.
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(&[MAGIC, 1, 0])
            .unwrap();
        let mut w = LogWriter::open(&path).unwrap();
        let later = w.end();
        let mut more = Vec::new();
        entries[0].encode(&mut more, w.version());
        w.append(&more).unwrap();

        let mut r = LogReader::open(&path).unwrap();
        for (e, off) in entries.iter().zip(&offsets).rev() {
            assert_eq!(&r.entry(*off).unwrap(), e);
        }
        assert_eq!(r.entry(later).unwrap(), entries[0]);
        assert!(r.entry(later + 1).is_err(), "not an entry's start");
        let _ = std::fs::remove_dir_all(path.parent().unwrap().parent().unwrap());
    }

    #[test]
    fn a_flipped_bit_fails_the_entrys_checksum() {
        let path = tmp("flip");
        let mut w = LogWriter::open(&path).unwrap();
        let mut bytes = Vec::new();
        Entry {
            line: 5,
            state: ItemState::Done,
            status: Some(200),
            attempts: 1,
            payload: b"{\"ok\":true}",
            unknown: false,
            digest: Some(3),
        }
        .encode(&mut bytes, w.version());
        let at = w.end();
        w.append(&bytes).unwrap();
        drop(w);
        assert!(LogReader::open(&path).unwrap().entry(at).is_ok());
        // One bit of the payload, then one of the line number.
        for (i, bit) in [(bytes.len() - 3, 0x01u8), (9, 0x40)] {
            let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
            let mut b = [bytes[i] ^ bit];
            f.write_all_at(&b, at + i as u64).unwrap();
            let e = LogReader::open(&path).unwrap().entry(at).unwrap_err();
            assert!(e.to_string().contains("checksum"), "{e}");
            b[0] = bytes[i];
            f.write_all_at(&b, at + i as u64).unwrap();
        }
        let _ = std::fs::remove_dir_all(path.parent().unwrap().parent().unwrap());
    }

    #[test]
    fn a_file_that_is_not_a_log_is_refused() {
        let path = tmp("bad");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, b"something else entirely").unwrap();
        assert!(LogWriter::open(&path).is_err());
        assert!(LogReader::open(&path).is_err());
        let _ = std::fs::remove_dir_all(path.parent().unwrap().parent().unwrap());
    }
}
