//! `--out` as CSV (`--out results.csv`, or `--out-format csv`): a header,
//! then one row per done item: `line`, `status`, the input's own columns,
//! and `body`, the response as JSON text. Quoting is the csv crate's, so a
//! comma, a quote or a newline in a field reads back as it was.
//!
//! The columns are known before the first row: for a CSV input they are
//! its header; for JSONL, every key any item has, in the order first met.
//! That takes one more read of the input, which only a CSV output pays.

use std::fs::File;
use std::io::BufWriter;

use serde_json::Value;

use crate::checkpoint::Entry;
use crate::input::{self, InputError, Item};
use crate::settings::Settings;

/// The column an item that is not a JSON object goes to, whole.
const WHOLE: &str = "input";

/// The input's own columns.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Columns {
    /// Every key of the items that are objects, in the order first met.
    keys: Vec<String>,
    /// Some item is not an object: it goes whole to an `input` column.
    whole: bool,
}

/// Reads the input once for its columns.
pub fn columns(settings: &Settings) -> Result<Columns, InputError> {
    let mut reader = input::Reader::open(&settings.input, settings.format)?;
    if settings.skip_invalid {
        reader = reader.past_bad_rows();
    }
    let mut c = Columns::default();
    let mut seen = std::collections::HashSet::new();
    for item in reader {
        // A bad row is refused (or skipped) by the pass that writes.
        let Ok(item) = item else { continue };
        c.see(&item.value, &mut seen);
    }
    Ok(c)
}

impl Columns {
    fn see(&mut self, v: &Value, seen: &mut std::collections::HashSet<String>) {
        match v {
            Value::Object(m) => {
                for k in m.keys() {
                    if seen.insert(k.clone()) {
                        self.keys.push(k.clone());
                    }
                }
            }
            _ => self.whole = true,
        }
    }

    /// The header: an input column named as one of batchrun's own
    /// (`line`, `status`, `body`, `input`) is `input.NAME`, so that no
    /// name stands for two columns (a reader by name took the input's for
    /// the result's).
    fn header(&self) -> Vec<String> {
        let mut taken: std::collections::HashSet<String> = self.keys.iter().cloned().collect();
        let ours = ["line", "status", "body", WHOLE];
        let mut h: Vec<String> = vec!["line".into(), "status".into()];
        for k in &self.keys {
            let mut name = k.clone();
            while ours.contains(&name.as_str()) || (name != *k && taken.contains(&name)) {
                name = format!("input.{name}");
            }
            taken.insert(name.clone());
            h.push(name);
        }
        if self.whole {
            h.push(WHOLE.into());
        }
        h.push("body".into());
        h
    }
}

/// The results file being written as CSV.
pub struct CsvOut {
    w: csv::Writer<BufWriter<File>>,
    columns: Columns,
}

impl CsvOut {
    /// Writes the header.
    pub fn new(w: BufWriter<File>, columns: Columns) -> anyhow::Result<CsvOut> {
        let mut w = csv::WriterBuilder::new().from_writer(w);
        w.write_record(columns.header())?;
        Ok(CsvOut { w, columns })
    }

    /// One done item's row.
    pub fn row(&mut self, item: &Item, e: &Entry<'_>) -> anyhow::Result<()> {
        let mut row = vec![
            item.line.to_string(),
            e.status.map(|s| s.to_string()).unwrap_or_default(),
        ];
        let obj = item.value.as_object();
        for k in &self.columns.keys {
            row.push(obj.and_then(|m| m.get(k)).map(cell).unwrap_or_default());
        }
        if self.columns.whole {
            row.push(match obj {
                Some(_) => String::new(),
                None => item.value.to_string(),
            });
        }
        row.push(body_json(e.payload));
        self.w.write_record(&row)?;
        Ok(())
    }

    /// The file, everything written to it.
    pub fn into_inner(self) -> anyhow::Result<BufWriter<File>> {
        self.w
            .into_inner()
            .map_err(|e| anyhow::anyhow!("{}", e.error()))
    }
}

/// A field: a string as it is, null as nothing, anything else as JSON.
fn cell(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        v => v.to_string(),
    }
}

/// The body as JSON text: the response's JSON when it parses (compact, as
/// the server wrote it), else its text as a JSON string, as `--out` JSONL
/// has it.
fn body_json(payload: &[u8]) -> String {
    crate::util::compact_json(payload)
        .unwrap_or_else(|| Value::String(String::from_utf8_lossy(payload).into_owned()).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_are_every_key_in_the_order_first_met() {
        let mut c = Columns::default();
        let mut seen = Default::default();
        for v in [
            serde_json::json!({"b": 1, "a": 2}),
            serde_json::json!({"a": 3, "c": [1]}),
            serde_json::json!(7),
        ] {
            c.see(&v, &mut seen);
        }
        assert_eq!(
            c.header(),
            ["line", "status", "b", "a", "c", "input", "body"]
        );
    }

    #[test]
    fn an_input_column_named_as_one_of_ours_is_renamed() {
        let mut c = Columns::default();
        let mut seen = Default::default();
        let row =
            serde_json::json!({"line": 1, "status": "x", "id": 2, "body": "b", "input.line": 3});
        c.see(&row, &mut seen);
        assert_eq!(
            c.header(),
            [
                "line",
                "status",
                "input.input.line",
                "input.status",
                "id",
                "input.body",
                "input.line",
                "body"
            ]
        );
    }

    #[test]
    fn fields_are_text_and_bodies_json() {
        assert_eq!(cell(&serde_json::json!("x,\"y\"")), "x,\"y\"");
        assert_eq!(cell(&serde_json::json!(null)), "");
        assert_eq!(cell(&serde_json::json!({"k": 1})), "{\"k\":1}");
        assert_eq!(body_json(b"{ \"ok\": true }"), "{\"ok\":true}");
        assert_eq!(body_json(b"plain \"text\""), "\"plain \\\"text\\\"\"");
    }
}
