//! Streaming the items of the input file.
//!
//! An input file may be far larger than memory, so everything here reads it
//! one line (JSONL) or one record (CSV) at a time. [`scan`] makes the one full
//! pass a run needs before its first request: it proves every item parses and
//! renders, counts them, and fingerprints the file so a resumed run can refuse a
//! file that changed underneath its checkpoint. [`Reader`] then streams the
//! items again for the real run.

use std::fmt;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::Path;

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

/// The longest JSONL line accepted, in bytes. Without a cap, a file that is
/// not line-oriented (say, one huge JSON array) would be read whole into memory
/// before failing; 64 MiB is far beyond any sane request body.
const MAX_LINE_BYTES: usize = 64 * 1024 * 1024;

const UTF8_BOM: [u8; 3] = [0xEF, 0xBB, 0xBF];

/// The layout of an input file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// One JSON value per line (`.jsonl`, `.ndjson`, `.json-lines`).
    Jsonl,
    /// Comma-separated values with a header row (`.csv`).
    Csv,
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Format::Jsonl => "jsonl",
            Format::Csv => "csv",
        })
    }
}

/// Picks the format of `path`: `overridden` (from `--format`) wins, otherwise
/// the extension decides, ignoring case.
///
/// # Errors
///
/// [`InputError::UnknownFormat`] when there is no override and the extension
/// is not one we know.
pub fn detect_format(path: &Path, overridden: Option<Format>) -> Result<Format, InputError> {
    if let Some(format) = overridden {
        return Ok(format);
    }
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    match ext.as_deref() {
        Some("jsonl" | "ndjson" | "json-lines") => Ok(Format::Jsonl),
        Some("csv") => Ok(Format::Csv),
        _ => Err(InputError::UnknownFormat {
            path: display(path),
        }),
    }
}

/// One item of the input.
#[derive(Debug, Clone, PartialEq)]
pub struct Item {
    /// 1-based physical line of the file where the item starts. It is the
    /// item's identity in the checkpoint and what `{index}` expands to.
    pub line: u64,
    /// The item: any JSON value for JSONL; for CSV an object mapping each
    /// header to that row's field, always as a string.
    pub value: Value,
}

/// Why the input could not be read. Every message starts with the path as the
/// user gave it, and with the line when the problem is in the content.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    /// The file could not be opened or read.
    #[error("{path}: {reason}")]
    Io {
        /// The input path, as given.
        path: String,
        /// What went wrong, in words.
        reason: String,
    },
    /// A line or record is malformed: bad JSON, a ragged CSV row, bytes that
    /// are not UTF-8, an over-long line.
    #[error("{path}:{line}: {reason}")]
    Content {
        /// The input path, as given.
        path: String,
        /// 1-based line where the bad item starts.
        line: u64,
        /// What is wrong with it.
        reason: String,
    },
    /// An item parsed but cannot become a request (the `check` of [`scan`]
    /// refused it, typically because a template names a field it lacks).
    #[error("{path}:{line}: {reason}")]
    Template {
        /// The input path, as given.
        path: String,
        /// 1-based line where the item starts.
        line: u64,
        /// The reason `check` gave.
        reason: String,
    },
    /// No `--format` and an extension that does not tell.
    #[error(
        "{path}: cannot tell the input format from the file name \
         (expected .jsonl, .ndjson, .json-lines or .csv); pass --format jsonl or --format csv"
    )]
    UnknownFormat {
        /// The input path, as given.
        path: String,
    },
}

impl InputError {
    /// The line the error points at, when it is about one item.
    pub fn line(&self) -> Option<u64> {
        match self {
            InputError::Content { line, .. } | InputError::Template { line, .. } => Some(*line),
            InputError::Io { .. } | InputError::UnknownFormat { .. } => None,
        }
    }
}

fn display(path: &Path) -> String {
    path.display().to_string()
}

fn io_reason(err: &io::Error) -> String {
    // The OS text ("No such file or directory (os error 2)") is noisier than
    // the user needs for the common cases.
    match err.kind() {
        io::ErrorKind::NotFound => "no such file".to_owned(),
        io::ErrorKind::PermissionDenied => "permission denied".to_owned(),
        _ => err.to_string(),
    }
}

fn open_file(path: &Path) -> Result<File, InputError> {
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

/// Streams the items of an input file, one line or record in memory at a
/// time. After the first error it yields nothing more.
pub struct Reader {
    items: Items<File>,
}

impl Reader {
    /// Opens `path` to be read as `format`.
    ///
    /// # Errors
    ///
    /// [`InputError::Io`] when the file cannot be opened. Content errors come
    /// from the iterator, at the item they concern.
    pub fn open(path: &Path, format: Format) -> Result<Reader, InputError> {
        let file = open_file(path)?;
        Ok(Reader {
            items: Items::new(file, format, display(path)),
        })
    }
}

impl Iterator for Reader {
    type Item = Result<Item, InputError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.items.next()
    }
}

/// What one full pass over the input found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scan {
    /// Number of items.
    pub total: u64,
    /// Lowercase hex SHA-256 of the file's exact bytes.
    pub fingerprint: String,
    /// Line of the last item (0 when there are none).
    pub last_line: u64,
}

/// Reads the whole input once: parses every item, hands each to `check`,
/// counts them and fingerprints the file's bytes, all in the same streaming
/// pass.
///
/// `check` is where the caller proves each item can become a request (by
/// rendering its templates); an `Err(reason)` stops the scan with
/// [`InputError::Template`] at that item's line.
///
/// # Errors
///
/// The first problem found: I/O, malformed content, or a refused item.
pub fn scan(
    path: &Path,
    format: Format,
    check: &mut dyn FnMut(&Item) -> Result<(), String>,
) -> Result<Scan, InputError> {
    let file = open_file(path)?;
    let mut items = Items::new(HashingReader::new(file), format, display(path));
    let mut total = 0u64;
    let mut last_line = 0u64;
    for item in &mut items {
        let item = item?;
        check(&item).map_err(|reason| InputError::Template {
            path: display(path),
            line: item.line,
            reason,
        })?;
        total += 1;
        last_line = item.line;
    }
    let mut hashing = items.into_inner();
    // The parsers stop at end of input, so this normally reads nothing; it is
    // here so the fingerprint covers every byte whatever a parser left unread.
    io::copy(&mut hashing, &mut io::sink()).map_err(|e| InputError::Io {
        path: display(path),
        reason: format!("read error: {}", io_reason(&e)),
    })?;
    Ok(Scan {
        total,
        fingerprint: hashing.finish(),
        last_line,
    })
}

/// Feeds every byte read through SHA-256, so fingerprinting costs no second
/// read of the file.
struct HashingReader<R> {
    inner: R,
    hasher: Sha256,
}

impl<R: Read> HashingReader<R> {
    fn new(inner: R) -> Self {
        HashingReader {
            inner,
            hasher: Sha256::new(),
        }
    }

    fn finish(self) -> String {
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
struct SkipBom<R> {
    inner: R,
    /// Bytes read while looking for the BOM that turned out not to be one.
    pending: [u8; 3],
    pending_start: usize,
    pending_end: usize,
    checked: bool,
}

impl<R: Read> SkipBom<R> {
    fn new(inner: R) -> Self {
        SkipBom {
            inner,
            pending: [0; 3],
            pending_start: 0,
            pending_end: 0,
            checked: false,
        }
    }

    fn into_inner(self) -> R {
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

/// The format-specific item stream over any reader; generic so [`scan`] can
/// put a [`HashingReader`] underneath and take it back at the end.
enum Items<R: Read> {
    Jsonl(JsonlItems<R>),
    Csv(CsvItems<R>),
}

impl<R: Read> Items<R> {
    fn new(inner: R, format: Format, path: String) -> Self {
        match format {
            Format::Jsonl => Items::Jsonl(JsonlItems::new(inner, path, MAX_LINE_BYTES)),
            Format::Csv => Items::Csv(CsvItems::new(inner, path)),
        }
    }

    fn into_inner(self) -> R {
        match self {
            Items::Jsonl(j) => j.reader.into_inner().into_inner(),
            Items::Csv(c) => c.into_inner(),
        }
    }
}

impl<R: Read> Iterator for Items<R> {
    type Item = Result<Item, InputError>;

    fn next(&mut self) -> Option<Self::Item> {
        match self {
            Items::Jsonl(j) => j.next(),
            Items::Csv(c) => c.next(),
        }
    }
}

struct JsonlItems<R: Read> {
    reader: BufReader<SkipBom<R>>,
    path: String,
    /// Physical lines consumed so far, blank ones included.
    line: u64,
    /// Reused for every line so memory stays at one line.
    buf: Vec<u8>,
    max_line: usize,
    done: bool,
}

impl<R: Read> JsonlItems<R> {
    fn new(inner: R, path: String, max_line: usize) -> Self {
        JsonlItems {
            reader: BufReader::new(SkipBom::new(inner)),
            path,
            line: 0,
            buf: Vec::new(),
            max_line,
            done: false,
        }
    }

    fn content_error(&self, reason: String) -> InputError {
        InputError::Content {
            path: self.path.clone(),
            line: self.line,
            reason,
        }
    }

    /// Reads the next physical line into `buf`; `false` at end of input.
    fn read_line(&mut self) -> Result<bool, InputError> {
        self.buf.clear();
        // Room for the longest allowed content plus "\r\n"; anything that
        // fills it without ending in '\n' is too long, and we stop reading it
        // there rather than buffer the rest.
        let limit = self.max_line.saturating_add(2);
        let n = (&mut self.reader)
            .take(limit as u64)
            .read_until(b'\n', &mut self.buf)
            .map_err(|e| InputError::Io {
                path: self.path.clone(),
                reason: format!("read error after line {}: {}", self.line, io_reason(&e)),
            })?;
        if n == 0 {
            return Ok(false);
        }
        self.line += 1;
        if n >= limit && self.buf.last() != Some(&b'\n') {
            return Err(self.too_long());
        }
        Ok(true)
    }

    fn too_long(&self) -> InputError {
        self.content_error(format!(
            "line is longer than {} bytes; is this really one JSON value per line?",
            self.max_line
        ))
    }

    fn next_item(&mut self) -> Result<Option<Item>, InputError> {
        loop {
            if !self.read_line()? {
                return Ok(None);
            }
            let mut content: &[u8] = &self.buf;
            if let Some(rest) = content.strip_suffix(b"\n") {
                content = rest;
            }
            if let Some(rest) = content.strip_suffix(b"\r") {
                content = rest;
            }
            if content.len() > self.max_line {
                return Err(self.too_long());
            }
            // Only JSON's own whitespace makes a line blank: anything else is
            // content and must parse.
            if content
                .iter()
                .all(|b| matches!(b, b' ' | b'\t' | b'\r' | b'\n'))
            {
                continue;
            }
            let text = std::str::from_utf8(content).map_err(|e| {
                self.content_error(format!(
                    "not valid UTF-8 (bad byte at column {})",
                    e.valid_up_to() + 1
                ))
            })?;
            let value: Value = serde_json::from_str(text)
                .map_err(|e| self.content_error(format!("invalid JSON: {}", json_reason(&e))))?;
            return Ok(Some(Item {
                line: self.line,
                value,
            }));
        }
    }
}

/// serde_json's message without its "at line 1 column N" tail: the line it
/// counts is within our single line, so only the column means anything.
fn json_reason(err: &serde_json::Error) -> String {
    let full = err.to_string();
    let tail = format!(" at line {} column {}", err.line(), err.column());
    match full.strip_suffix(&tail) {
        Some(msg) => format!("{msg} at column {}", err.column()),
        None => full,
    }
}

impl<R: Read> Iterator for JsonlItems<R> {
    type Item = Result<Item, InputError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let res = self.next_item();
        if !matches!(res, Ok(Some(_))) {
            self.done = true;
        }
        res.transpose()
    }
}

/// csv's read buffer size, fixed here because [`RecentBytes`] must remember
/// at least that much.
const CSV_BUFFER: usize = 8 * 1024;

struct CsvItems<R: Read> {
    reader: csv::Reader<RecentBytes<SkipBom<R>>>,
    path: String,
    /// Column names; `None` until the header row has been read.
    headers: Option<Vec<String>>,
    /// Reused for every row so memory stays at one record.
    record: csv::ByteRecord,
    done: bool,
}

impl<R: Read> CsvItems<R> {
    fn new(inner: R, path: String) -> Self {
        let reader = csv::ReaderBuilder::new()
            // The header row and ragged rows are handled here rather than by
            // csv, so that their errors carry the right line.
            .has_headers(false)
            .flexible(true)
            .buffer_capacity(CSV_BUFFER)
            .from_reader(RecentBytes::new(SkipBom::new(inner), CSV_BUFFER + 1));
        CsvItems {
            reader,
            path,
            headers: None,
            record: csv::ByteRecord::new(),
            done: false,
        }
    }

    fn into_inner(self) -> R {
        self.reader.into_inner().inner.into_inner()
    }

    fn content_error(&self, line: u64, reason: String) -> InputError {
        InputError::Content {
            path: self.path.clone(),
            line,
            reason,
        }
    }

    /// The line where the record just read starts.
    ///
    /// csv's own record position is where it *started looking*, which is
    /// before any blank lines it skipped and, in CRLF files, before the
    /// previous row's '\n'; so it is often a line or more early. Counting back
    /// from where the record ended is exact: the end line, less the newlines
    /// inside quoted fields, less one if the row's own terminator was a '\n'
    /// (a '\r' or the end of the file leaves the line count alone).
    fn record_line(&self) -> u64 {
        let end = self.reader.position();
        let inside: u64 = self
            .record
            .iter()
            .map(|f| f.iter().filter(|&&b| b == b'\n').count() as u64)
            .sum();
        let terminator = match end.byte().checked_sub(1) {
            Some(last) => match self.reader.get_ref().byte_at(last) {
                Some(b) => u64::from(b == b'\n'),
                // Cannot happen while the window covers csv's buffer; fall
                // back to csv's own, possibly early, idea of the line.
                None => return self.record.position().map_or(1, csv::Position::line),
            },
            None => 0,
        };
        end.line().saturating_sub(inside + terminator).max(1)
    }

    /// Reads the next raw record; `Some(line)` where it starts, `None` at end.
    fn read_raw(&mut self) -> Result<Option<u64>, InputError> {
        match self.reader.read_byte_record(&mut self.record) {
            Ok(true) => Ok(Some(self.record_line())),
            Ok(false) => Ok(None),
            Err(e) => Err(csv_error(&self.path, &e)),
        }
    }

    fn fields(&self, line: u64) -> Result<Vec<&str>, InputError> {
        self.record
            .iter()
            .enumerate()
            .map(|(i, f)| {
                std::str::from_utf8(f).map_err(|e| {
                    self.content_error(
                        line,
                        format!(
                            "not valid UTF-8 (field {}, byte {})",
                            i + 1,
                            e.valid_up_to() + 1
                        ),
                    )
                })
            })
            .collect()
    }

    /// Reads the header row; `false` when the file has none (it is empty).
    fn read_headers(&mut self) -> Result<bool, InputError> {
        let Some(line) = self.read_raw()? else {
            return Ok(false);
        };
        let mut names: Vec<String> = Vec::with_capacity(self.record.len());
        for name in self.fields(line)? {
            // Two columns with one name would silently lose one of them in the
            // item object.
            if names.iter().any(|n| n == name) {
                return Err(
                    self.content_error(line, format!("the header names column \"{name}\" twice"))
                );
            }
            names.push(name.to_owned());
        }
        self.headers = Some(names);
        Ok(true)
    }

    fn next_item(&mut self) -> Result<Option<Item>, InputError> {
        if self.headers.is_none() && !self.read_headers()? {
            return Ok(None);
        }
        let Some(line) = self.read_raw()? else {
            return Ok(None);
        };
        let headers = self.headers.as_deref().unwrap_or_default();
        if self.record.len() != headers.len() {
            let len = self.record.len();
            return Err(self.content_error(
                line,
                format!(
                    "row has {len} field{}, the header has {}",
                    if len == 1 { "" } else { "s" },
                    headers.len()
                ),
            ));
        }
        let object: Map<String, Value> = headers
            .iter()
            .zip(self.fields(line)?)
            .map(|(k, v)| (k.clone(), Value::String(v.to_owned())))
            .collect();
        Ok(Some(Item {
            line,
            value: Value::Object(object),
        }))
    }
}

impl<R: Read> Iterator for CsvItems<R> {
    type Item = Result<Item, InputError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let res = self.next_item();
        if !matches!(res, Ok(Some(_))) {
            self.done = true;
        }
        res.transpose()
    }
}

fn csv_error(path: &str, err: &csv::Error) -> InputError {
    match err.kind() {
        csv::ErrorKind::Io(e) => InputError::Io {
            path: path.to_owned(),
            reason: format!("read error: {}", io_reason(e)),
        },
        // Neither UTF-8 nor field counts are checked by csv here, so nothing
        // else is expected; keep whatever it says, with a line if it has one.
        _ => match err.position() {
            Some(pos) => InputError::Content {
                path: path.to_owned(),
                line: pos.line(),
                reason: err.to_string(),
            },
            None => InputError::Io {
                path: path.to_owned(),
                reason: err.to_string(),
            },
        },
    }
}

/// Remembers the last bytes that passed through, by absolute offset, so the
/// CSV reader can ask what byte ended a record. The window must exceed csv's
/// read-ahead (its buffer capacity) to always cover the last byte it consumed.
struct RecentBytes<R> {
    inner: R,
    ring: Vec<u8>,
    /// Bytes read so far; byte `k` sits at `ring[k % ring.len()]`.
    total: u64,
}

impl<R> RecentBytes<R> {
    fn new(inner: R, window: usize) -> Self {
        RecentBytes {
            inner,
            ring: vec![0; window.max(1)],
            total: 0,
        }
    }

    fn byte_at(&self, offset: u64) -> Option<u8> {
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
    use std::io::Cursor;
    use std::path::PathBuf;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// A file in the temp dir, unique to this test, removed on drop.
    struct TempFile(PathBuf);

    impl TempFile {
        fn new(name: &str, bytes: &[u8]) -> TempFile {
            static NEXT: AtomicU64 = AtomicU64::new(0);
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let path = std::env::temp_dir()
                .join(format!("batchrun-input-{}-{n}-{name}", std::process::id()));
            std::fs::write(&path, bytes).expect("write temp file");
            TempFile(path)
        }

        fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for TempFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    fn read_all(path: &Path, format: Format) -> Result<Vec<Item>, InputError> {
        Reader::open(path, format)?.collect()
    }

    fn lines(items: &[Item]) -> Vec<u64> {
        items.iter().map(|i| i.line).collect()
    }

    fn no_check(_: &Item) -> Result<(), String> {
        Ok(())
    }

    /// Hands out its bytes one at a time, the worst case for short reads.
    struct Trickle<R>(R);

    impl<R: Read> Read for Trickle<R> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            match buf.first_mut() {
                Some(first) => self.0.read(std::slice::from_mut(first)),
                None => Ok(0),
            }
        }
    }

    /// An endless input: the header (if any), then the same row forever.
    struct Endless {
        head: Cursor<Vec<u8>>,
        row: &'static [u8],
        at: usize,
    }

    impl Read for Endless {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = self.head.read(buf)?;
            if n > 0 {
                return Ok(n);
            }
            for b in buf.iter_mut() {
                *b = self.row[self.at % self.row.len()];
                self.at += 1;
            }
            Ok(buf.len())
        }
    }

    #[test]
    fn detects_format_from_extension_or_override() {
        let d = |p: &str| detect_format(Path::new(p), None).ok();
        assert_eq!(d("a.jsonl"), Some(Format::Jsonl));
        assert_eq!(d("dir/a.NDJSON"), Some(Format::Jsonl));
        assert_eq!(d("a.json-lines"), Some(Format::Jsonl));
        assert_eq!(d("a.Csv"), Some(Format::Csv));
        assert_eq!(
            detect_format(Path::new("a.txt"), Some(Format::Csv)).ok(),
            Some(Format::Csv)
        );
        let err = detect_format(Path::new("data/items.json"), None).unwrap_err();
        let msg = err.to_string();
        assert!(msg.starts_with("data/items.json: "), "{msg}");
        assert!(msg.contains("--format"), "{msg}");
        assert!(detect_format(Path::new("noext"), None).is_err());
    }

    #[test]
    fn jsonl_skips_blanks_and_tolerates_crlf_and_bom() {
        let f = TempFile::new(
            "a.jsonl",
            b"\xEF\xBB\xBF{\"a\":1}\r\n\r\n  \t \n[1,\"x\"]\n\"s\"\r\n\n42",
        );
        let items = read_all(f.path(), Format::Jsonl).unwrap();
        assert_eq!(lines(&items), vec![1, 4, 5, 7]);
        assert_eq!(items[0].value, serde_json::json!({"a": 1}));
        assert_eq!(items[1].value, serde_json::json!([1, "x"]));
        assert_eq!(items[2].value, serde_json::json!("s"));
        assert_eq!(items[3].value, serde_json::json!(42));
    }

    #[test]
    fn jsonl_malformed_line_names_file_and_line() {
        let f = TempFile::new("bad.jsonl", b"{\"a\":1}\n\n{\"a\": }\n{\"a\":3}\n");
        let mut reader = Reader::open(f.path(), Format::Jsonl).unwrap();
        assert_eq!(reader.next().unwrap().unwrap().line, 1);
        let err = reader.next().unwrap().unwrap_err();
        assert_eq!(err.line(), Some(3));
        let msg = err.to_string();
        let want = format!(
            "{}:3: invalid JSON: expected value at column 7",
            f.path().display()
        );
        assert_eq!(msg, want);
        // The iterator is fused after an error.
        assert!(reader.next().is_none());
    }

    #[test]
    fn jsonl_rejects_trailing_garbage_and_bad_utf8() {
        let f = TempFile::new("two.jsonl", b"1 2\n");
        let err = read_all(f.path(), Format::Jsonl).unwrap_err();
        assert!(
            err.to_string()
                .contains(":1: invalid JSON: trailing characters"),
            "{err}"
        );

        let f = TempFile::new("latin1.jsonl", b"\"ok\"\n\"caf\xE9\"\n");
        let err = read_all(f.path(), Format::Jsonl).unwrap_err();
        assert_eq!(err.line(), Some(2));
        assert!(err.to_string().contains("not valid UTF-8"), "{err}");
    }

    #[test]
    fn jsonl_over_long_line_is_an_error_not_a_buffer() {
        let input = b"{}\n[1,2,3,4,5,6,7,8,9]\n{}\n";
        let mut items = JsonlItems::new(Cursor::new(&input[..]), "x.jsonl".into(), 10);
        assert_eq!(items.next().unwrap().unwrap().line, 1);
        let err = items.next().unwrap().unwrap_err();
        assert_eq!(err.line(), Some(2));
        assert!(err.to_string().contains("longer than 10 bytes"), "{err}");
        // Exactly at the limit, with CRLF, is fine.
        let input = b"[1,2,3,44]\r\n";
        let mut items = JsonlItems::new(Cursor::new(&input[..]), "x.jsonl".into(), 10);
        assert!(items.next().unwrap().is_ok());
    }

    #[test]
    fn bom_is_skipped_whatever_the_read_sizes() {
        let input = b"\xEF\xBB\xBF[1]\n\xEF\xBB\xBF\n";
        let items: Vec<_> =
            JsonlItems::new(Trickle(Cursor::new(&input[..])), "t".into(), 100).collect();
        assert_eq!(items.len(), 2);
        assert_eq!(items[0].as_ref().unwrap().value, serde_json::json!([1]));
        // Only the first BOM is one; a later one is content and bad JSON.
        assert_eq!(items[1].as_ref().unwrap_err().line(), Some(2));

        // A prefix of a BOM is not dropped.
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

    #[test]
    fn csv_rows_are_objects_of_strings_with_true_line_numbers() {
        let f = TempFile::new(
            "a.csv",
            b"\xEF\xBB\xBFid,name,note\n1,\"Smith, J\",\"two\nlines\"\n\n2,Ann,\"say \"\"hi\"\"\"\n3,,x",
        );
        let items = read_all(f.path(), Format::Csv).unwrap();
        assert_eq!(lines(&items), vec![2, 5, 6]);
        assert_eq!(
            items[0].value,
            serde_json::json!({"id": "1", "name": "Smith, J", "note": "two\nlines"})
        );
        assert_eq!(
            items[1].value,
            serde_json::json!({"id": "2", "name": "Ann", "note": "say \"hi\""})
        );
        assert_eq!(
            items[2].value,
            serde_json::json!({"id": "3", "name": "", "note": "x"})
        );
    }

    #[test]
    fn csv_crlf_lines_are_not_off_by_one() {
        let f = TempFile::new("crlf.csv", b"a,b\r\n1,2\r\n\r\n\"x\r\ny\",3\r\n4,5\r\n");
        let items = read_all(f.path(), Format::Csv).unwrap();
        assert_eq!(lines(&items), vec![2, 4, 6]);
        assert_eq!(items[1].value, serde_json::json!({"a": "x\r\ny", "b": "3"}));
    }

    #[test]
    fn csv_line_numbers_hold_across_buffer_refills() {
        // Enough rows of mixed shapes to cross csv's buffer many times, read
        // both in big chunks and a byte at a time.
        let mut text = String::from("k,v\r\n");
        let mut want = Vec::new();
        let mut line = 2u64;
        for i in 0..3000u64 {
            match i % 4 {
                0 => {
                    text.push_str(&format!("{i},plain\n"));
                    want.push(line);
                    line += 1;
                }
                1 => {
                    text.push_str(&format!("{i},\"multi\nline\r\nvalue\"\r\n"));
                    want.push(line);
                    line += 3;
                }
                2 => {
                    text.push_str("\n\r\n");
                    line += 2;
                    text.push_str(&format!("{i},after blanks\r\n"));
                    want.push(line);
                    line += 1;
                }
                _ => {
                    text.push_str(&format!("{i},{}\n", "w".repeat((i % 97) as usize * 50)));
                    want.push(line);
                    line += 1;
                }
            }
        }
        let got: Vec<u64> = CsvItems::new(Cursor::new(text.as_bytes()), "t".into())
            .map(|r| r.unwrap().line)
            .collect();
        assert_eq!(got, want);
        let got: Vec<u64> = CsvItems::new(Trickle(Cursor::new(text.as_bytes())), "t".into())
            .map(|r| r.unwrap().line)
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn csv_ragged_row_names_file_line_and_counts() {
        let f = TempFile::new("rag.csv", b"a,b,c\n1,2,3\n\"x\ny\",2\n");
        let err = read_all(f.path(), Format::Csv).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "{}:3: row has 2 fields, the header has 3",
                f.path().display()
            )
        );
        let f = TempFile::new("rag2.csv", b"a,b\n1,2,3\n");
        let err = read_all(f.path(), Format::Csv).unwrap_err();
        assert!(
            err.to_string()
                .ends_with(":2: row has 3 fields, the header has 2"),
            "{err}"
        );
    }

    #[test]
    fn csv_header_problems() {
        let f = TempFile::new("dup.csv", b"a,b,a\n1,2,3\n");
        let err = read_all(f.path(), Format::Csv).unwrap_err();
        assert_eq!(err.line(), Some(1));
        assert!(err.to_string().contains("\"a\" twice"), "{err}");

        let f = TempFile::new("bad.csv", b"a,b\n1,\xFF\n");
        let err = read_all(f.path(), Format::Csv).unwrap_err();
        assert_eq!(err.line(), Some(2));
        assert!(
            err.to_string().contains("not valid UTF-8 (field 2"),
            "{err}"
        );
    }

    #[test]
    fn header_only_and_empty_files_have_no_items() {
        for (name, bytes, format) in [
            ("h.csv", &b"a,b\n"[..], Format::Csv),
            ("h2.csv", b"a,b", Format::Csv),
            ("e.csv", b"", Format::Csv),
            ("e.jsonl", b"", Format::Jsonl),
            ("blank.jsonl", b"\n  \r\n\n", Format::Jsonl),
            ("bom.jsonl", b"\xEF\xBB\xBF", Format::Jsonl),
        ] {
            let f = TempFile::new(name, bytes);
            assert_eq!(read_all(f.path(), format).unwrap(), vec![], "{name}");
            let s = scan(f.path(), format, &mut no_check).unwrap();
            assert_eq!((s.total, s.last_line), (0, 0), "{name}");
        }
    }

    #[test]
    fn io_errors_name_the_path() {
        let missing = std::env::temp_dir().join("batchrun-input-surely-missing.jsonl");
        let err = Reader::open(&missing, Format::Jsonl).err().unwrap();
        assert_eq!(
            err.to_string(),
            format!("{}: no such file", missing.display())
        );
        assert_eq!(err.line(), None);
        let err = scan(&std::env::temp_dir(), Format::Csv, &mut no_check).unwrap_err();
        assert!(err.to_string().contains("is a directory"), "{err}");
    }

    #[test]
    fn scan_counts_checks_and_fingerprints() {
        let bytes = b"{\"id\":1}\n\n{\"id\":2}\n{\"id\":3}\n";
        let f = TempFile::new("s.jsonl", bytes);
        let mut seen = Vec::new();
        let s = scan(f.path(), Format::Jsonl, &mut |item| {
            seen.push(item.line);
            Ok(())
        })
        .unwrap();
        assert_eq!(seen, vec![1, 3, 4]);
        assert_eq!(s.total, 3);
        assert_eq!(s.last_line, 4);
        let want: String = Sha256::digest(bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(s.fingerprint, want);
        assert_eq!(s.fingerprint.len(), 64);

        // Stable across scans; one changed byte changes it.
        let again = scan(f.path(), Format::Jsonl, &mut no_check).unwrap();
        assert_eq!(again, s);
        let mut changed = bytes.to_vec();
        changed[6] = b'9';
        let g = TempFile::new("s2.jsonl", &changed);
        let other = scan(g.path(), Format::Jsonl, &mut no_check).unwrap();
        assert_eq!(other.total, 3);
        assert_ne!(other.fingerprint, s.fingerprint);
    }

    #[test]
    fn fingerprint_covers_bom_and_csv_bytes() {
        let plain = TempFile::new("p.csv", b"a\n1\n");
        let bom = TempFile::new("b.csv", b"\xEF\xBB\xBFa\n1\n");
        let p = scan(plain.path(), Format::Csv, &mut no_check).unwrap();
        let b = scan(bom.path(), Format::Csv, &mut no_check).unwrap();
        assert_eq!((p.total, b.total), (1, 1));
        assert_ne!(p.fingerprint, b.fingerprint);
        let want: String = Sha256::digest(b"\xEF\xBB\xBFa\n1\n")
            .iter()
            .map(|x| format!("{x:02x}"))
            .collect();
        assert_eq!(b.fingerprint, want);
    }

    #[test]
    fn scan_turns_check_failures_into_located_errors() {
        let f = TempFile::new("c.csv", b"id,name\n1,a\n2,b\n3,c\n");
        let mut calls = 0;
        let err = scan(f.path(), Format::Csv, &mut |item| {
            calls += 1;
            if item.value["id"] == "2" {
                Err("item has no field \"user.id\"".to_owned())
            } else {
                Ok(())
            }
        })
        .unwrap_err();
        assert!(matches!(err, InputError::Template { line: 3, .. }));
        assert_eq!(
            err.to_string(),
            format!("{}:3: item has no field \"user.id\"", f.path().display())
        );
        assert_eq!(calls, 2, "the first error stops the scan");
    }

    #[test]
    fn scan_stops_at_malformed_content() {
        let f = TempFile::new("m.jsonl", b"{}\n{\n{}\n");
        let err = scan(f.path(), Format::Jsonl, &mut no_check).unwrap_err();
        assert!(matches!(err, InputError::Content { line: 2, .. }), "{err}");
    }

    #[test]
    fn reading_is_streaming() {
        // An endless input can only yield items if nothing reads to the end
        // first.
        let endless = Endless {
            head: Cursor::new(Vec::new()),
            row: b"{\"a\":1}\n",
            at: 0,
        };
        let got: Vec<u64> = Items::new(endless, Format::Jsonl, "inf".into())
            .take(3)
            .map(|r| r.unwrap().line)
            .collect();
        assert_eq!(got, vec![1, 2, 3]);

        let endless = Endless {
            head: Cursor::new(b"a,b\n".to_vec()),
            row: b"1,2\n",
            at: 0,
        };
        let got: Vec<u64> = Items::new(endless, Format::Csv, "inf".into())
            .take(3)
            .map(|r| r.unwrap().line)
            .collect();
        assert_eq!(got, vec![2, 3, 4]);
    }
}
