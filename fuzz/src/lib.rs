//! Shared checks for the fuzz targets in `fuzz_targets/`.
//!
//! The promise under test: batchrun never panics on an input file, a
//! template or a server's headers. Beyond "no panic", the input targets also
//! check that what the parsers report does not depend on how the bytes
//! arrive, since a pipe, a file and the spool all hand them over in
//! different-sized reads.

use std::io::{self, Read};

use batchrun::input::{items_from_reader, Format, InputError};
use serde_json::Value;

/// A reader over `data` that hands out short reads of pseudo-random sizes
/// (1 to 64 bytes), seeded by the fuzzer.
pub struct Chunked<'a> {
    data: &'a [u8],
    state: u32,
}

impl<'a> Chunked<'a> {
    /// Reads `data` in chunks drawn from `seed`.
    pub fn new(data: &'a [u8], seed: u8) -> Self {
        Chunked {
            data,
            state: u32::from(seed) | 0x100,
        }
    }
}

impl Read for Chunked<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        // xorshift32: cheap, deterministic, never zero from a non-zero state.
        self.state ^= self.state << 13;
        self.state ^= self.state >> 17;
        self.state ^= self.state << 5;
        let want = (self.state % 64) as usize + 1;
        let n = want.min(buf.len()).min(self.data.len());
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }
}

/// What a user sees of one item or error: its line and value, or the message.
type Seen = Result<(u64, Value), String>;

fn collect(items: impl Iterator<Item = Result<batchrun::input::Item, InputError>>) -> Vec<Seen> {
    items
        .map(|r| match r {
            Ok(item) => Ok((item.line, item.value)),
            Err(e) => {
                // An in-memory reader cannot fail, so every error is about the
                // content and must point at a line.
                assert!(matches!(e, InputError::Content { .. }), "{e:?}");
                Err(e.to_string())
            }
        })
        .collect()
}

/// Parses `data` as `format` whole and in short reads; checks both agree and
/// that lines only go forward and stay within the input.
pub fn check_input(data: &[u8], format: Format, max_line: usize, seed: u8) {
    let whole = collect(items_from_reader(data, format, max_line));
    let chunked = collect(items_from_reader(
        Chunked::new(data, seed),
        format,
        max_line,
    ));
    assert_eq!(whole, chunked, "the read sizes changed what was parsed");

    let physical_lines = data.iter().filter(|&&b| b == b'\n').count() as u64 + 1;
    let mut last = 0u64;
    for (i, seen) in whole.iter().enumerate() {
        match seen {
            Ok((line, value)) => {
                assert!(*line > last, "line {line} after line {last}");
                assert!(*line <= physical_lines, "line {line} of {physical_lines}");
                last = *line;
                if format == Format::Csv {
                    let row = value.as_object().expect("a CSV item is an object");
                    assert!(row.values().all(Value::is_string), "{value}");
                }
            }
            Err(_) => assert_eq!(i + 1, whole.len(), "items after an error"),
        }
    }
}
