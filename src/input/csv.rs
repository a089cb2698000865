//! CSV with a header row: each record becomes an object of strings, located
//! at the physical line where it starts.

use std::io::Read;

use serde_json::{Map, Value};

use super::bytes::{io_reason, RecentBytes, SkipBom, Stray, StrayQuotes};
use super::{InputError, Item};

/// csv's read buffer size, fixed here because [`RecentBytes`] must remember
/// at least that much.
const CSV_BUFFER: usize = 8 * 1024;

pub(super) struct CsvItems<R: Read> {
    reader: ::csv::Reader<RecentBytes<StrayQuotes<SkipBom<R>>>>,
    path: String,
    /// Column names; `None` until the header row has been read.
    headers: Option<Vec<String>>,
    /// Reused for every row so memory stays at one record.
    record: ::csv::ByteRecord,
    /// Line of the last record read, the header included; 0 before any.
    last_line: u64,
    pub(super) done: bool,
    /// Go on past a bad row ([`super::Reader::past_bad_rows`]) instead of
    /// ending at it.
    pub(super) go_on: bool,
    /// The error just returned is about one row only: the next row can
    /// still be read.
    row_error: bool,
}

impl<R: Read> CsvItems<R> {
    pub(super) fn new(inner: R, path: String) -> Self {
        let reader = ::csv::ReaderBuilder::new()
            // The header row and ragged rows are handled here rather than by
            // csv, so that their errors carry the right line.
            .has_headers(false)
            .flexible(true)
            .buffer_capacity(CSV_BUFFER)
            .from_reader(RecentBytes::new(
                StrayQuotes::new(SkipBom::new(inner)),
                CSV_BUFFER + 1,
            ));
        CsvItems {
            reader,
            path,
            headers: None,
            record: ::csv::ByteRecord::new(),
            last_line: 0,
            done: false,
            go_on: false,
            row_error: false,
        }
    }

    pub(super) fn into_inner(self) -> R {
        self.reader
            .into_inner()
            .into_inner()
            .into_inner()
            .into_inner()
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
        let inside = self.newlines_inside();
        let terminator = match end.byte().checked_sub(1) {
            Some(last) => match self.reader.get_ref().byte_at(last) {
                Some(b) => u64::from(b == b'\n'),
                // Cannot happen while the window covers csv's buffer; fall
                // back to csv's own, possibly early, idea of the line.
                None => return self.record.position().map_or(1, ::csv::Position::line),
            },
            None => 0,
        };
        end.line().saturating_sub(inside + terminator).max(1)
    }

    /// The line breaks inside the fields of the record just read (quoted).
    fn newlines_inside(&self) -> u64 {
        self.record
            .iter()
            .map(|f| f.iter().filter(|&&b| b == b'\n').count() as u64)
            .sum()
    }

    /// The line where the record just read starts, when it ran into the
    /// end of the file inside a quoted field: csv then takes the rest of
    /// the file as that field, lines and all. Such a record ends where the
    /// file does (the end read), its last field holds a line break, and the
    /// file does not end with that field's closing quote (before one line
    /// ending).
    fn unclosed_quote(&self) -> Option<u64> {
        let last = self.record.iter().next_back()?;
        let src = self.reader.get_ref();
        let end = self.reader.position().byte();
        if !src.is_end(end) || !last.contains(&b'\n') {
            return None;
        }
        let mut at = end.checked_sub(1)?;
        if src.byte_at(at)? == b'\n' {
            at = at.checked_sub(1)?;
            if src.byte_at(at)? == b'\r' {
                at = at.checked_sub(1)?;
            }
        }
        if src.byte_at(at)? == b'"' {
            return None;
        }
        let inside = self.newlines_inside();
        Some(self.reader.position().line().saturating_sub(inside).max(1))
    }

    /// Reads the next raw record; `Some(line)` where it starts, `None` at end.
    ///
    /// csv ends a record at a lone '\r' too, which starts no new line; two
    /// records on one line would then share the line that identifies an item
    /// in the checkpoint, and one of them would be skipped as done.
    fn read_raw(&mut self) -> Result<Option<u64>, InputError> {
        match self.reader.read_byte_record(&mut self.record) {
            Ok(true) => {
                if let Some(line) = self.unclosed_quote() {
                    return Err(self.content_error(
                        line,
                        "a quoted field opens on this line and is never closed, so the rest \
                         of the file would be one field; close it (a quote inside a quoted \
                         field is written twice, \"\")"
                            .to_owned(),
                    ));
                }
                let line = self.record_line();
                let end = self.reader.position().byte();
                if let Some(stray) = self.reader.get_mut().get_mut().take_before(end) {
                    // Only a stray within one line spoils no other row.
                    self.row_error = self.headers.is_some() && stray.opened == stray.closed;
                    self.last_line = line.max(stray.closed);
                    return Err(self.content_error(line, stray_reason(line, stray)));
                }
                if line <= self.last_line {
                    return Err(self.content_error(
                        line,
                        "a second record starts on this line after a lone carriage return \
                         (\\r); items are numbered by line, so save the file with \\n or \\r\\n \
                         line endings"
                            .to_owned(),
                    ));
                }
                self.last_line = line;
                Ok(Some(line))
            }
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
        let fields = self.fields(line)?;
        // `--format csv` on a JSONL file would send each line's fragments
        // as items; a header that opens like JSON is that mistake.
        if fields
            .first()
            .is_some_and(|f| f.trim_start().starts_with(['{', '[']))
        {
            return Err(self.content_error(
                line,
                "the header row looks like JSON, not CSV column names; use --format jsonl".into(),
            ));
        }
        for name in fields {
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
        // The record is read whole: a bad one spoils only itself.
        self.row_error = true;
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
        self.row_error = false;
        Ok(Some(Item::new(line, Value::Object(object))))
    }
}

impl<R: Read> Iterator for CsvItems<R> {
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

/// Why a record with a stray byte after a closing quote is refused, for the
/// record that starts on `line`.
fn stray_reason(line: u64, stray: Stray) -> String {
    let what = match stray.byte {
        b' ' => "a space".to_owned(),
        b if b.is_ascii_graphic() => format!("'{}'", char::from(b)),
        b => format!("the byte 0x{b:02X}"),
    };
    let fix = "a quote inside a quoted field is written twice (\"\")";
    if stray.closed > line {
        format!(
            "a quoted field opens on line {} and its closing quote on line {} is followed by \
             {what}, so lines {line}-{} would be read as one row; {fix}",
            stray.opened, stray.closed, stray.closed
        )
    } else {
        format!("a quoted field's closing quote is followed by {what}; {fix}")
    }
}

fn csv_error(path: &str, err: &::csv::Error) -> InputError {
    match err.kind() {
        ::csv::ErrorKind::Io(e) => InputError::Io {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::input::test_support::{lines, read_all, TempFile, Trickle};
    use crate::input::{Format, Reader};
    use std::io::Cursor;

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
    fn a_jsonl_file_read_as_csv_is_refused() {
        let f = TempFile::new(
            "items.jsonl",
            b"{\"n\": 1, \"m\": 2}\n{\"n\": 2, \"m\": 3}\n",
        );
        let err = read_all(f.path(), Format::Csv).unwrap_err();
        assert_eq!(err.line(), Some(1));
        assert!(err.to_string().contains("looks like JSON"), "{err}");
    }

    /// A quote opened and never closed is named with its line, whether the
    /// file ends with a line break or not; a quoted field that holds line
    /// breaks and closes at the end of the file is content.
    #[test]
    fn an_unclosed_quote_is_named_on_its_line() {
        for tail in ["\n", ""] {
            let text = format!("id,name\n1,x\n2,y\n3,\"oops\n4,z\n5,w{tail}");
            let f = TempFile::new("q.csv", text.as_bytes());
            let err = read_all(f.path(), Format::Csv).unwrap_err();
            assert_eq!(err.line(), Some(4), "{err}");
            assert!(err.to_string().contains("never closed"), "{err}");
        }
        for tail in ["\n", "\r\n", ""] {
            let text = format!("id,name\n1,\"two\nlines\"{tail}");
            let f = TempFile::new("ok.csv", text.as_bytes());
            let items = read_all(f.path(), Format::Csv).unwrap();
            assert_eq!(items.len(), 1);
            assert_eq!(items[0].value["name"], "two\nlines");
        }
    }

    /// A stray quote "closed" by another on a later line would make every
    /// row between them one field, and those items would never run: the
    /// record is refused, naming the lines, and nothing after it is read.
    /// A stray byte after a quote that closes on its own line spoils only
    /// that row.
    #[test]
    fn a_quote_closed_lines_later_by_a_stray_quote_is_refused() {
        for eol in ["\n", "\r\n"] {
            let text = format!("id,name{eol}1,x{eol}3,\"oops{eol}4,bob{eol}5,\"w{eol}6,z{eol}");
            let f = TempFile::new("stray.csv", text.as_bytes());
            let err = read_all(f.path(), Format::Csv).unwrap_err();
            assert_eq!(err.line(), Some(3), "{err}");
            assert!(
                err.to_string().ends_with(
                    ":3: a quoted field opens on line 3 and its closing quote on line 5 is \
                     followed by 'w', so lines 3-5 would be read as one row; a quote inside a \
                     quoted field is written twice (\"\")"
                ),
                "{err}"
            );
            let mut reader = Reader::open(f.path(), Format::Csv).unwrap().past_bad_rows();
            assert_eq!(reader.next().unwrap().unwrap().line, 2);
            assert!(reader.next().unwrap().is_err());
            assert!(reader.next().is_none(), "rows after a merge are not read");
        }

        let f = TempFile::new("one.csv", b"id,name\n1,\"He said \"hi\" there\"\n2,ok\n");
        let mut reader = Reader::open(f.path(), Format::Csv).unwrap().past_bad_rows();
        let err = reader.next().unwrap().unwrap_err();
        assert_eq!(err.line(), Some(2), "{err}");
        assert!(
            err.to_string().ends_with(
                ":2: a quoted field's closing quote is followed by 'h'; a quote inside a \
                 quoted field is written twice (\"\")"
            ),
            "{err}"
        );
        let next = reader.next().unwrap().unwrap();
        assert_eq!((next.line, next.value["name"].as_str()), (3, Some("ok")));
        assert!(reader.next().is_none());

        // Quotes as CSV writes them, and quotes inside an unquoted field,
        // are content.
        let f = TempFile::new(
            "fine.csv",
            b"\"id\",\"name\"\n1,\"a \"\"b\"\"\"\n2,5\" disk\n3,\"\"\n4,\"x\ny\"\r\n",
        );
        let items = read_all(f.path(), Format::Csv).unwrap();
        assert_eq!(lines(&items), vec![2, 3, 4, 5]);
        assert_eq!(items[0].value["name"], "a \"b\"");
        assert_eq!(items[1].value["name"], "5\" disk");
    }

    proptest::proptest! {
        /// Whatever the fields hold, CSV as the csv crate writes it reads
        /// back whole: the stray-quote check never refuses a well-formed file.
        #[test]
        fn written_csv_reads_back_whole(
            rows in proptest::collection::vec(
                ("[a\",\r\n ]{0,6}", "[b\",\r\n ]{0,6}"),
                0..20,
            ),
        ) {
            let mut w = ::csv::WriterBuilder::new().from_writer(Vec::new());
            w.write_record(["a", "b"]).unwrap();
            for (a, b) in &rows {
                w.write_record([a, b]).unwrap();
            }
            let bytes = w.into_inner().unwrap();
            let got: Vec<(String, String)> = CsvItems::new(Trickle(Cursor::new(&bytes)), "t".into())
                .map(|r| {
                    let v = r.unwrap().value;
                    (v["a"].as_str().unwrap().to_owned(), v["b"].as_str().unwrap().to_owned())
                })
                .collect();
            proptest::prop_assert_eq!(got, rows);
        }
    }

    #[test]
    fn csv_two_records_on_one_line_are_refused() {
        // A lone '\r' ends a record without starting a line: "3,4" would
        // share line 3 with "1,2", and so its checkpoint entry.
        let f = TempFile::new("cr.csv", b"a,b\n\n1,2\r3,4\n5,6\n");
        let mut reader = Reader::open(f.path(), Format::Csv).unwrap();
        assert_eq!(reader.next().unwrap().unwrap().line, 3);
        let err = reader.next().unwrap().unwrap_err();
        assert!(matches!(err, InputError::Content { line: 3, .. }), "{err}");
        assert!(
            err.to_string()
                .ends_with(":3: a second record starts on this line after a lone carriage return (\\r); items are numbered by line, so save the file with \\n or \\r\\n line endings"),
            "{err}"
        );
        assert!(reader.next().is_none());

        // A file with only '\r' line endings fails at its first row.
        let f = TempFile::new("mac.csv", b"a,b\r1,2\r3,4\r");
        let err = read_all(f.path(), Format::Csv).unwrap_err();
        assert_eq!(err.line(), Some(1));
        // A '\r' inside quotes is content, and '\r\n' one line ending.
        let f = TempFile::new("ok.csv", b"a,b\r\n\"x\ry\",2\r\n");
        let items = read_all(f.path(), Format::Csv).unwrap();
        assert_eq!(lines(&items), vec![2]);
        assert_eq!(items[0].value, serde_json::json!({"a": "x\ry", "b": "2"}));
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
}
