//! The byte layer under the parsers: opening the file, hashing what is read,
//! dropping a BOM and remembering the last bytes for the CSV line count.

use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

use sha2::{Digest, Sha256};

use super::{display, InputError};

const UTF8_BOM: [u8; 3] = [0xEF, 0xBB, 0xBF];

pub(super) fn io_reason(err: &io::Error) -> String {
    // The OS text ("No such file or directory (os error 2)") is noisier than
    // the user needs for the common cases.
    match err.kind() {
        io::ErrorKind::NotFound => "no such file".to_owned(),
        io::ErrorKind::PermissionDenied => "permission denied".to_owned(),
        _ => err.to_string(),
    }
}

pub(super) fn open_file(path: &Path) -> Result<File, InputError> {
    let file = File::open(path).map_err(|e| InputError::Io {
        path: display(path),
        reason: io_reason(&e),
    })?;
    // Opening a directory succeeds on Unix; reading it would fail with a
    // confusing "Is a directory" only later.
    match file.metadata() {
        Ok(meta) if meta.is_dir() => Err(InputError::Io {
            path: display(path),
            reason: "is a directory, not a file".to_owned(),
        }),
        _ => Ok(file),
    }
}

/// Feeds every byte read through SHA-256, so fingerprinting costs no second
/// read of the file.
pub struct HashingReader<R> {
    inner: R,
    hasher: Sha256,
}

impl<R: Read> HashingReader<R> {
    pub(super) fn new(inner: R) -> Self {
        HashingReader {
            inner,
            hasher: Sha256::new(),
        }
    }

    /// The lowercase hex SHA-256 of every byte read so far.
    pub(super) fn finish(self) -> String {
        self.hasher
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        // `get` rather than slicing: a misbehaving reader claiming more than
        // the buffer must not panic us.
        if let Some(read) = buf.get(..n) {
            self.hasher.update(read);
        }
        Ok(n)
    }
}

/// Drops a UTF-8 byte order mark at the very start of the stream. Doing it
/// below the parsers means neither the CSV header nor the first JSON line ever
/// sees it, while the fingerprint (taken further down) still covers it.
pub(super) struct SkipBom<R> {
    inner: R,
    /// Bytes read while looking for the BOM that turned out not to be one.
    pending: [u8; 3],
    pending_start: usize,
    pending_end: usize,
    checked: bool,
}

impl<R: Read> SkipBom<R> {
    pub(super) fn new(inner: R) -> Self {
        SkipBom {
            inner,
            pending: [0; 3],
            pending_start: 0,
            pending_end: 0,
            checked: false,
        }
    }

    pub(super) fn into_inner(self) -> R {
        self.inner
    }
}

impl<R: Read> Read for SkipBom<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if !self.checked {
            // Short reads are legal, so keep reading until we have three bytes
            // or the stream ends.
            while self.pending_end < UTF8_BOM.len() {
                match self.inner.read(&mut self.pending[self.pending_end..]) {
                    Ok(0) => break,
                    Ok(n) => self.pending_end += n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
            self.checked = true;
            if self.pending[..self.pending_end] == UTF8_BOM {
                self.pending_end = 0;
            }
        }
        if self.pending_start < self.pending_end {
            let rest = &self.pending[self.pending_start..self.pending_end];
            let n = rest.len().min(buf.len());
            buf[..n].copy_from_slice(&rest[..n]);
            self.pending_start += n;
            return Ok(n);
        }
        self.inner.read(buf)
    }
}

/// A closing quote followed by something other than a comma or a line end,
/// found by [`StrayQuotes`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Stray {
    /// Offset of the byte after the closing quote.
    pub(super) offset: u64,
    /// Line where the quoted field opened.
    pub(super) opened: u64,
    /// Line of the closing quote.
    pub(super) closed: u64,
    /// The byte after the closing quote.
    pub(super) byte: u8,
}

/// Where a quote scan stands, as the csv crate reads RFC 4180.
#[derive(Clone, Copy)]
enum Quoting {
    FieldStart,
    Unquoted,
    Quoted { opened: u64 },
    QuoteInQuoted { opened: u64 },
}

/// Watches the quotes of CSV bytes as they pass, noting each closing quote
/// followed by a stray byte. csv reads such a field leniently (`"ab"cd` is
/// `abcd`), which silently merges rows when a stray quote on one line is
/// "closed" by another on a later line: every row between them becomes part
/// of one field, and their items are lost. The reader refuses such a record.
pub(super) struct StrayQuotes<R> {
    inner: R,
    state: Quoting,
    line: u64,
    total: u64,
    /// Strays read ahead of the records csv has returned; csv reads ahead by
    /// at most its buffer, so this stays small.
    found: std::collections::VecDeque<Stray>,
}

impl<R> StrayQuotes<R> {
    pub(super) fn new(inner: R) -> Self {
        StrayQuotes {
            inner,
            state: Quoting::FieldStart,
            line: 1,
            total: 0,
            found: std::collections::VecDeque::new(),
        }
    }

    pub(super) fn into_inner(self) -> R {
        self.inner
    }

    /// The first stray before `end` (a record's end offset), dropping every
    /// stray before it: they are all that record's.
    pub(super) fn take_before(&mut self, end: u64) -> Option<Stray> {
        let first = self.found.front().copied().filter(|s| s.offset < end)?;
        while self.found.front().is_some_and(|s| s.offset < end) {
            self.found.pop_front();
        }
        Some(first)
    }

    fn feed(&mut self, b: u8) {
        let ends_field = matches!(b, b',' | b'\n' | b'\r');
        self.state = match self.state {
            Quoting::FieldStart | Quoting::Unquoted if ends_field => Quoting::FieldStart,
            Quoting::FieldStart if b == b'"' => Quoting::Quoted { opened: self.line },
            Quoting::FieldStart | Quoting::Unquoted => Quoting::Unquoted,
            Quoting::Quoted { opened } if b == b'"' => Quoting::QuoteInQuoted { opened },
            Quoting::Quoted { opened } => Quoting::Quoted { opened },
            Quoting::QuoteInQuoted { opened } if b == b'"' => Quoting::Quoted { opened },
            Quoting::QuoteInQuoted { .. } if ends_field => Quoting::FieldStart,
            Quoting::QuoteInQuoted { opened } => {
                self.found.push_back(Stray {
                    offset: self.total,
                    opened,
                    closed: self.line,
                    byte: b,
                });
                Quoting::Unquoted
            }
        };
        self.line += u64::from(b == b'\n');
        self.total += 1;
    }
}

impl<R: Read> Read for StrayQuotes<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        for &b in buf.get(..n).unwrap_or_default() {
            self.feed(b);
        }
        Ok(n)
    }
}

/// Remembers the last bytes that passed through, by absolute offset, so the
/// CSV reader can ask what byte ended a record. The window must exceed csv's
/// read-ahead (its buffer capacity) to always cover the last byte it consumed.
pub(super) struct RecentBytes<R> {
    inner: R,
    ring: Vec<u8>,
    /// Bytes read so far; byte `k` sits at `ring[k % ring.len()]`.
    total: u64,
    /// A read found the end of the input.
    ended: bool,
}

impl<R> RecentBytes<R> {
    pub(super) fn new(inner: R, window: usize) -> Self {
        RecentBytes {
            inner,
            ring: vec![0; window.max(1)],
            total: 0,
            ended: false,
        }
    }

    pub(super) fn into_inner(self) -> R {
        self.inner
    }

    pub(super) fn get_mut(&mut self) -> &mut R {
        &mut self.inner
    }

    /// Whether `offset` is the end of the input, the end having been read.
    pub(super) fn is_end(&self, offset: u64) -> bool {
        self.ended && offset == self.total
    }

    pub(super) fn byte_at(&self, offset: u64) -> Option<u8> {
        let window = self.ring.len() as u64;
        if offset >= self.total || self.total - offset > window {
            return None;
        }
        usize::try_from(offset % window)
            .ok()
            .and_then(|i| self.ring.get(i).copied())
    }
}

impl<R: Read> Read for RecentBytes<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.ended |= n == 0 && !buf.is_empty();
        let window = self.ring.len() as u64;
        for &b in buf.get(..n).unwrap_or_default() {
            if let Some(slot) = usize::try_from(self.total % window)
                .ok()
                .and_then(|i| self.ring.get_mut(i))
            {
                *slot = b;
            }
            self.total += 1;
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::input::test_support::Trickle;
    use std::io::Cursor;

    #[test]
    fn bom_prefix_is_not_dropped() {
        let mut out = Vec::new();
        SkipBom::new(Trickle(Cursor::new(&b"\xEF\xBBx"[..])))
            .read_to_end(&mut out)
            .unwrap();
        assert_eq!(out, b"\xEF\xBBx");
        let mut out = Vec::new();
        SkipBom::new(Cursor::new(&b"ab"[..]))
            .read_to_end(&mut out)
            .unwrap();
        assert_eq!(out, b"ab");
    }
}
