//! JSON Lines: one JSON value per line, blank lines skipped.

use std::io::{BufRead, BufReader, Read};

use serde_json::Value;

use super::bytes::{io_reason, SkipBom};
use super::numbers::first_rounded;
use super::{InputError, Item};

pub(super) struct JsonlItems<R: Read> {
    reader: BufReader<SkipBom<R>>,
    path: String,
    /// Physical lines consumed so far, blank ones included.
    line: u64,
    /// Reused for every line so memory stays at one line.
    buf: Vec<u8>,
    max_line: usize,
    pub(super) done: bool,
    /// Go on past a bad row ([`super::Reader::past_bad_rows`]) instead of
    /// ending at it.
    pub(super) go_on: bool,
    /// The error just returned is about one row only: the next row can
    /// still be read.
    row_error: bool,
}

impl<R: Read> JsonlItems<R> {
    pub(super) fn new(inner: R, path: String, max_line: usize) -> Self {
        JsonlItems {
            reader: BufReader::new(SkipBom::new(inner)),
            path,
            line: 0,
            buf: Vec::new(),
            max_line,
            done: false,
            go_on: false,
            row_error: false,
        }
    }

    pub(super) fn into_inner(self) -> R {
        self.reader.into_inner().into_inner()
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
            // The line is read whole: a bad one spoils only itself.
            self.row_error = true;
            let text = std::str::from_utf8(content).map_err(|e| {
                self.content_error(format!(
                    "not valid UTF-8 (bad byte at column {}){}",
                    e.valid_up_to() + 1,
                    utf16_hint(content)
                ))
            })?;
            let value: Value = serde_json::from_str(text).map_err(|e| {
                self.content_error(format!("invalid JSON: {}{}", json_reason(&e), hint(text)))
            })?;
            if has_float(&value) {
                if let Some(r) = first_rounded(text) {
                    let (column, literal) = (r.column, r.literal);
                    return Err(self.content_error(match r.sent {
                        None => format!(
                            "the integer {literal} at column {column} does not fit in 64 bits: \
                             it would be sent rounded; quote it as a string"
                        ),
                        Some(sent) if sent.trim_start_matches('-') == "0.0" => format!(
                            "the number {literal} at column {column} is too small for a \
                             64-bit float: it would be sent as {sent}; quote it as a string"
                        ),
                        Some(sent) => format!(
                            "the number {literal} at column {column} has more digits than a \
                             64-bit float holds: it would be sent as {sent}; quote it as a string"
                        ),
                    }));
                }
            }
            self.row_error = false;
            return Ok(Some(Item::new(self.line, value)));
        }
    }
}

/// Whether `v` holds a number kept as a float: a decimal, or an integer
/// too wide for 64 bits (serde_json reads it as the nearest f64).
fn has_float(v: &Value) -> bool {
    match v {
        Value::Number(n) => n.is_f64(),
        Value::Array(a) => a.iter().any(has_float),
        Value::Object(o) => o.values().any(has_float),
        _ => false,
    }
}

/// serde_json's message without its "at line 1 column N" tail: the line it
/// counts is within our single line, so only the column means anything.
/// What a line that is no JSON says of the file, when it says something a
/// parser's words ("expected value at column 1") would not: a byte-order
/// mark in the middle (two files joined), lines ending with CR alone (an
/// old Mac's), whose whole file reads as one line.
fn hint(text: &str) -> &'static str {
    if text.starts_with('\u{feff}') {
        "; the line begins with a byte-order mark (U+FEFF): two files joined? Remove it"
    } else if text.contains('\r') {
        "; the lines end with CR alone (an old Mac's): convert them to LF (or CRLF)"
    } else {
        ""
    }
}

/// A line of UTF-16 (a byte-order mark `FF FE` or `FE FF`, or a NUL every
/// other byte) is said as such, with the way to convert it.
fn utf16_hint(line: &[u8]) -> &'static str {
    let bom = line.starts_with(&[0xFF, 0xFE]) || line.starts_with(&[0xFE, 0xFF]);
    let nuls = line.len() >= 4 && line.iter().filter(|&&b| b == 0).count() * 3 >= line.len();
    match bom || nuls {
        true => "; the file looks like UTF-16: convert it to UTF-8 (iconv -f UTF-16 -t UTF-8)",
        false => "",
    }
}

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
        let row_only = std::mem::take(&mut self.row_error) && self.go_on;
        if !matches!(res, Ok(Some(_))) && !row_only {
            self.done = true;
        }
        res.transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::input::test_support::{lines, read_all, TempFile, Trickle};
    use crate::input::{Format, Reader};
    use std::io::Cursor;

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
    fn an_integer_too_wide_for_64_bits_is_refused_not_sent_rounded() {
        let f = TempFile::new(
            "ids.jsonl",
            b"{\"id\": 18446744073709551615, \"x\": -9223372036854775808, \"p\": 2.5e3}\n\
              {\"note\": \"123456789012345678901234567890\", \"f\": 1.5}\n\
              {\"a\": [1.5, {\"id\": 123456789012345678901234567890}]}\n",
        );
        let mut reader = Reader::open(f.path(), Format::Jsonl).unwrap();
        // u64::MAX and i64::MIN fit; digits in a string are text.
        assert_eq!(reader.next().unwrap().unwrap().value["id"], u64::MAX);
        assert!(reader.next().unwrap().is_ok());
        let msg = reader.next().unwrap().unwrap_err().to_string();
        assert!(
            msg.ends_with(":3: the integer 123456789012345678901234567890 at column 20 does not fit in 64 bits: it would be sent rounded; quote it as a string"),
            "{msg}"
        );
    }

    #[test]
    fn a_decimal_a_float_cannot_hold_is_refused_not_sent_rounded() {
        let f = TempFile::new(
            "pay.jsonl",
            b"{\"amount\": 12.5, \"rate\": 1e2}\n{\"amount\": 1234567890123456.78}\n",
        );
        let mut reader = Reader::open(f.path(), Format::Jsonl).unwrap();
        assert!(reader.next().unwrap().is_ok());
        let msg = reader.next().unwrap().unwrap_err().to_string();
        assert!(
            msg.ends_with(":2: the number 1234567890123456.78 at column 12 has more digits than a 64-bit float holds: it would be sent as 1234567890123456.8; quote it as a string"),
            "{msg}"
        );
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

    /// Files joined with a byte-order mark between them, CR-only line
    /// ends and UTF-16 are said as what they are, with the way out, beside
    /// the file and line.
    #[test]
    fn jsonl_errors_say_what_the_file_is() {
        let cases: [(&str, &[u8], &str); 3] = [
            (
                "joined.jsonl",
                b"{\"n\":1}\n\xEF\xBB\xBF{\"n\":2}\n",
                "byte-order mark",
            ),
            ("mac.jsonl", b"{\"n\":1}\r{\"n\":2}\r", "end with CR alone"),
            (
                "wide.jsonl",
                b"\xFF\xFE{\x00\"\x00n\x00\"\x00}\x00\n\x00",
                "looks like UTF-16",
            ),
        ];
        for (name, bytes, said) in cases {
            let f = TempFile::new(name, bytes);
            let err = read_all(f.path(), Format::Jsonl).unwrap_err();
            assert!(err.to_string().contains(said), "{name}: {err}");
            assert!(err.to_string().contains(name), "{name}: {err}");
        }
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
    }
}
