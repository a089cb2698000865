//! Streaming the items of the input file.
//!
//! An input file may be far larger than memory, so everything here reads it
//! one line (JSONL) or one record (CSV) at a time. [`scan`] makes the one full
//! pass a run needs before its first request: it proves every item parses and
//! renders, counts them, and fingerprints the file so a resumed run can refuse a
//! file that changed underneath its checkpoint. [`Reader`] then streams the
//! items again for the real run. Because the input is read more than once, a
//! pipe must first be copied to a file by [`spool`].

mod bytes;
mod csv;
mod item;
mod jsonl;
mod numbers;
mod spool;
#[cfg(test)]
mod test_support;

use std::fmt;
use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use self::bytes::{io_reason, open_file, HashingReader};
use self::csv::CsvItems;
pub use self::item::{sorted_json, FieldOrder, Item};
use self::jsonl::JsonlItems;
pub use self::spool::{is_spooled_copy, spool, Spooled};

/// The longest JSONL line accepted, in bytes. Without a cap, a file that is
/// not line-oriented (say, one huge JSON array) would be read whole into memory
/// before failing; 64 MiB is far beyond any sane request body.
const MAX_LINE_BYTES: usize = 64 * 1024 * 1024;

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
/// is not one we know; [`InputError::NoExtension`] when there is no override
/// and no extension at all (standard input, `<(cmd)`).
pub fn detect_format(path: &Path, overridden: Option<Format>) -> Result<Format, InputError> {
    if let Some(format) = overridden {
        return Ok(format);
    }
    let Some(ext) = path.extension() else {
        return Err(InputError::NoExtension { path: label(path) });
    };
    match ext.to_str().map(str::to_ascii_lowercase).as_deref() {
        Some("jsonl" | "ndjson" | "json-lines") => Ok(Format::Jsonl),
        Some("csv") => Ok(Format::Csv),
        _ => Err(InputError::UnknownFormat {
            path: display(path),
        }),
    }
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
    /// No `--format` and no extension at all, as with standard input or a
    /// process substitution (`/dev/fd/63`).
    #[error(
        "{path}: cannot tell the input format without a file extension \
         (standard input, a pipe or <(...) has none); pass --format jsonl or --format csv"
    )]
    NoExtension {
        /// The input path, as given (`standard input` for `-`).
        path: String,
    },
}

impl InputError {
    /// The line the error points at, when it is about one item.
    pub fn line(&self) -> Option<u64> {
        match self {
            InputError::Content { line, .. } | InputError::Template { line, .. } => Some(*line),
            InputError::Io { .. }
            | InputError::UnknownFormat { .. }
            | InputError::NoExtension { .. } => None,
        }
    }
}

/// Spooled copies ([`spool()`]) by the name the user gave their source:
/// a message about a line of one names standard input or the FIFO, not a
/// file of the state dir removed when the run ends. Written by `spool`
/// alone.
static SPOOLED_AS: std::sync::Mutex<Vec<(PathBuf, String)>> = std::sync::Mutex::new(Vec::new());

fn display(path: &Path) -> String {
    let spooled = SPOOLED_AS.lock().unwrap_or_else(|p| p.into_inner());
    match spooled.iter().find(|(copy, _)| copy == path) {
        Some((_, name)) => name.clone(),
        None => path.display().to_string(),
    }
}

/// How messages name an input the user gave: `-` is standard input, not a
/// file called "-".
pub fn label(path: &Path) -> String {
    if is_stdin(path) {
        "standard input".to_owned()
    } else {
        display(path)
    }
}

fn is_stdin(path: &Path) -> bool {
    path == Path::new("-")
}

/// Streams the items of an input file, one line or record in memory at a
/// time. After the first error it yields nothing more.
pub struct Reader<R: Read = File> {
    items: Items<R>,
    path: String,
    field_order: FieldOrder,
}

/// Streams the items like [`Reader`] and fingerprints the bytes as it
/// reads them. The output pass pairs each line with its result through it,
/// so that an input edited while the job ran is seen, not silently paired
/// with another file's results.
pub type CheckedReader = Reader<HashingReader<File>>;

impl Reader {
    /// Opens `path` to be read as `format`.
    ///
    /// # Errors
    ///
    /// [`InputError::Io`] when the file cannot be opened. Content errors come
    /// from the iterator, at the item they concern.
    pub fn open(path: &Path, format: Format) -> Result<Reader, InputError> {
        Ok(Reader::over(open_file(path)?, format, path))
    }
}

impl CheckedReader {
    /// Opens `path` to be read as `format`, fingerprinting its bytes.
    ///
    /// # Errors
    ///
    /// [`InputError::Io`] when the file cannot be opened.
    pub fn open_checked(path: &Path, format: Format) -> Result<CheckedReader, InputError> {
        Ok(Reader::over(
            HashingReader::new(open_file(path)?),
            format,
            path,
        ))
    }

    /// The fingerprint of the whole file as read (what [`scan`] gives an
    /// unchanged file), reading whatever the parser left.
    ///
    /// # Errors
    ///
    /// [`InputError::Io`] on a read error.
    pub fn finish(self) -> Result<String, InputError> {
        hash_rest(self.items.into_inner(), self.path)
    }
}

impl<R: Read> Reader<R> {
    fn over(inner: R, format: Format, path: &Path) -> Reader<R> {
        let path = display(path);
        Reader {
            items: Items::new(inner, format, path.clone()),
            path,
            field_order: FieldOrder::default(),
        }
    }

    /// Fingerprints the items as a job of `order` does.
    pub fn field_order(mut self, order: FieldOrder) -> Reader<R> {
        self.field_order = order;
        self
    }

    /// Goes on past a row that is bad by itself (bad JSON, a ragged CSV
    /// row, bytes that are not UTF-8), yielding its error and then the next
    /// row; an error that spoils what follows still ends the stream.
    pub fn past_bad_rows(mut self) -> Reader<R> {
        self.items.go_on();
        self
    }
}

impl<R: Read> Iterator for Reader<R> {
    type Item = Result<Item, InputError>;

    fn next(&mut self) -> Option<Self::Item> {
        let order = self.field_order;
        self.items
            .next()
            .map(|r| r.map(|item| item.in_order(order)))
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
    scan_with(path, (format, FieldOrder::default()), check, None)
}

/// Like [`scan`], but with `skip`, a bad row (one that does not parse, or
/// that `check` refuses) is handed to `skip` and counted as an item, and
/// the scan goes on; only an error that spoils what follows stops it.
///
/// # Errors
///
/// As [`scan`], for the errors not skipped.
pub fn scan_with(
    path: &Path,
    (format, order): (Format, FieldOrder),
    check: &mut dyn FnMut(&Item) -> Result<(), String>,
    mut skip: Option<&mut dyn FnMut(InputError)>,
) -> Result<Scan, InputError> {
    let mut items = CheckedReader::open_checked(path, format)?.field_order(order);
    if skip.is_some() {
        items = items.past_bad_rows();
    }
    let mut total = 0u64;
    let mut last_line = 0u64;
    while let Some(item) = items.next() {
        let checked = item.and_then(|item| {
            check(&item).map_err(|reason| InputError::Template {
                path: display(path),
                line: item.line,
                reason,
            })?;
            Ok(item.line)
        });
        let line = match (checked, skip.as_mut()) {
            (Ok(line), _) => line,
            // A row whose error ended the stream (an over-long line) is
            // not skipped: what follows it was never read.
            (Err(e), Some(skip)) if e.line().is_some() && !items.items.ended() => {
                let line = e.line().unwrap_or_default();
                skip(e);
                line
            }
            (Err(e), _) => return Err(e),
        };
        total += 1;
        last_line = line;
    }
    Ok(Scan {
        total,
        fingerprint: items.finish()?,
        last_line,
    })
}

/// The fingerprint [`scan`] would give `path`: the lowercase hex SHA-256 of
/// its exact bytes. It reads the file once without parsing anything, so it is
/// cheap enough for a later pass to check the input did not change under the
/// run.
///
/// It takes no format because the fingerprint covers raw bytes whatever the
/// format, BOM included; and it cannot fail on content.
///
/// # Errors
///
/// [`InputError::Io`] when the file cannot be opened or read.
pub fn fingerprint(path: &Path) -> Result<String, InputError> {
    hash_rest(HashingReader::new(open_file(path)?), display(path))
}

/// Reads what is left of `hashing` and returns the fingerprint of all it
/// read. The parsers stop at the end of the input, so after them this
/// normally reads nothing; it is there so the fingerprint covers every byte
/// whatever a parser left unread.
fn hash_rest(mut hashing: HashingReader<File>, path: String) -> Result<String, InputError> {
    io::copy(&mut hashing, &mut io::sink()).map_err(|e| InputError::Io {
        path,
        reason: format!("read error: {}", io_reason(&e)),
    })?;
    Ok(hashing.finish())
}

/// The fingerprint of the whole file at `path`, as a scan computes it: a
/// renamed input is known by it.
pub fn file_fingerprint(path: &Path) -> Result<String, InputError> {
    let file = open_file(path)?;
    hash_through(path, HashingReader::new(file)).map(|(fp, _)| fp)
}

/// The fingerprint of the first `len` bytes of `path`, and whether they end
/// with a line break; `None` when the file is not longer than `len`.
pub fn prefix_fingerprint(path: &Path, len: u64) -> Result<Option<(String, bool)>, InputError> {
    let file = open_file(path)?;
    let size = file.metadata().map(|m| m.len()).unwrap_or(0);
    if size <= len {
        return Ok(None);
    }
    let (fp, last) = hash_through(path, HashingReader::new(io::Read::take(file, len)))?;
    Ok(Some((fp, last == b'\n')))
}

/// Reads `hashing` to its end: its fingerprint, and the last byte read.
fn hash_through<R: io::Read>(
    path: &Path,
    mut hashing: HashingReader<R>,
) -> Result<(String, u8), InputError> {
    let mut last = 0u8;
    let mut buf = [0u8; 64 * 1024];
    loop {
        let n = io::Read::read(&mut hashing, &mut buf).map_err(|e| InputError::Io {
            path: display(path),
            reason: format!("read error: {}", io_reason(&e)),
        })?;
        if n == 0 {
            return Ok((hashing.finish(), last));
        }
        last = buf[n - 1];
    }
}

/// The item stream [`Reader`] yields, over any reader and with the JSONL line
/// cap given, so the parsers can be driven from bytes without a file.
///
/// For the fuzz targets in `fuzz/` only: not a supported API, and hidden from
/// the docs. Errors name the input `fuzz`.
#[doc(hidden)]
pub fn items_from_reader<R: Read>(
    inner: R,
    format: Format,
    max_line: usize,
) -> impl Iterator<Item = Result<Item, InputError>> {
    let path = "fuzz".to_owned();
    match format {
        Format::Jsonl => Items::Jsonl(JsonlItems::new(inner, path, max_line)),
        Format::Csv => Items::Csv(CsvItems::new(inner, path)),
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

    fn ended(&self) -> bool {
        match self {
            Items::Jsonl(j) => j.done,
            Items::Csv(c) => c.done,
        }
    }

    fn go_on(&mut self) {
        match self {
            Items::Jsonl(j) => j.go_on = true,
            Items::Csv(c) => c.go_on = true,
        }
    }

    fn into_inner(self) -> R {
        match self {
            Items::Jsonl(j) => j.into_inner(),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::input::test_support::{no_check, read_all, TempFile};
    use sha2::{Digest, Sha256};
    use std::io::Cursor;

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
    fn missing_extension_asks_for_format_naming_the_input() {
        let err = detect_format(Path::new("/dev/fd/63"), None).unwrap_err();
        assert!(matches!(err, InputError::NoExtension { .. }), "{err}");
        let msg = err.to_string();
        assert!(msg.starts_with("/dev/fd/63: "), "{msg}");
        assert!(msg.contains("without a file extension"), "{msg}");
        assert!(msg.contains("pass --format jsonl or --format csv"), "{msg}");

        let msg = detect_format(Path::new("-"), None).unwrap_err().to_string();
        assert!(msg.starts_with("standard input: "), "{msg}");
        assert_eq!(
            detect_format(Path::new("-"), Some(Format::Jsonl)).ok(),
            Some(Format::Jsonl)
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
    fn scan_with_skip_counts_bad_rows_and_goes_on() {
        let f = TempFile::new(
            "k.jsonl",
            b"{\"n\":1}\n{oops\n{\"n\":3}\n\xff\n{\"m\":5}\n{\"n\":6}\n",
        );
        let mut skipped = Vec::new();
        let mut seen = Vec::new();
        let s = scan_with(
            f.path(),
            (Format::Jsonl, FieldOrder::Ignored),
            &mut |item| {
                seen.push(item.line);
                match item.value.get("n") {
                    Some(_) => Ok(()),
                    None => Err("item has no field \"n\"".to_owned()),
                }
            },
            Some(&mut |e: InputError| skipped.push(e.to_string())),
        )
        .unwrap();
        assert_eq!((s.total, s.last_line), (6, 6));
        assert_eq!(seen, vec![1, 3, 5, 6]);
        let at = |i: usize| {
            skipped[i]
                .split(": ")
                .next()
                .unwrap()
                .rsplit(':')
                .next()
                .unwrap()
                .to_string()
        };
        assert_eq!(skipped.len(), 3, "{skipped:?}");
        assert_eq!((at(0), at(1), at(2)), ("2".into(), "4".into(), "5".into()));
        assert!(skipped[0].contains("invalid JSON"), "{skipped:?}");
        assert!(skipped[2].contains("no field"), "{skipped:?}");
        // Unchanged bytes, unchanged fingerprint: skipping reads them all.
        assert_eq!(s.fingerprint, fingerprint(f.path()).unwrap());
    }

    #[test]
    fn scan_with_skip_still_stops_where_the_rest_cannot_be_read() {
        // A lone carriage return puts two records on one line: what follows
        // cannot be numbered, so it is an error, not a skipped row.
        let f = TempFile::new("cr.csv", b"a,b\n1,2\n3,4\r5,6\n7,8\n");
        let mut skipped = 0;
        let err = scan_with(
            f.path(),
            (Format::Csv, FieldOrder::Ignored),
            &mut no_check,
            Some(&mut |_: InputError| skipped += 1),
        )
        .unwrap_err();
        assert!(err.to_string().contains("lone carriage return"), "{err}");
        assert_eq!(skipped, 0);
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

    #[test]
    fn fingerprint_matches_scan_and_sees_one_changed_byte() {
        let bytes = b"\xEF\xBB\xBFid,name\n1,a\n2,b\n";
        let a = TempFile::new("fa.csv", bytes);
        let b = TempFile::new("fb.csv", bytes);
        let mut changed = bytes.to_vec();
        changed[12] = b'x';
        let c = TempFile::new("fc.csv", &changed);

        let fa = fingerprint(a.path()).unwrap();
        assert_eq!(
            fa,
            scan(a.path(), Format::Csv, &mut no_check)
                .unwrap()
                .fingerprint
        );
        assert_eq!(fingerprint(b.path()).unwrap(), fa, "same content");
        assert_ne!(fingerprint(c.path()).unwrap(), fa, "one byte changed");

        let missing = std::env::temp_dir().join("batchrun-fingerprint-surely-missing.csv");
        assert_eq!(
            fingerprint(&missing).unwrap_err().to_string(),
            format!("{}: no such file", missing.display())
        );
    }
}
