//! One item of the input, and the fingerprint of its content.

use std::io;

use serde_json::Value;

/// One item of the input.
#[derive(Debug, Clone, PartialEq)]
pub struct Item {
    /// 1-based physical line of the file where the item starts. It is the
    /// item's identity in the checkpoint and what `{index}` expands to.
    pub line: u64,
    /// The item: any JSON value for JSONL; for CSV an object mapping each
    /// header to that row's field, always as a string.
    pub value: Value,
    /// Whether the order of its fields is part of its content, as its job
    /// fingerprints items ([`Item::digest`]).
    pub field_order: FieldOrder,
}

/// Whether the order of an item's fields (a JSON object's keys, a CSV
/// file's columns) is part of its content: what [`Item::digest`]
/// fingerprints. A job keeps one for its life, as it was made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum FieldOrder {
    /// Not part of it: a regenerated input whose columns or keys come in
    /// another order holds the same items (JSON objects are unordered).
    /// Jobs made since 2026-12-06.
    #[default]
    Ignored,
    /// Part of it: the fields in file order (jobs made before).
    Kept,
}

impl Item {
    /// An item of `value` at `line`, fingerprinted as new jobs do.
    pub fn new(line: u64, value: Value) -> Item {
        Item {
            line,
            value,
            field_order: FieldOrder::default(),
        }
    }

    /// A fingerprint of the item's content (its JSON, with every object's
    /// fields sorted unless [`FieldOrder::Kept`]): recorded with each
    /// result, so the outputs can tell whether the line they pair a result
    /// with is still the item that was sent, and a regenerated input's
    /// items are found by it.
    pub fn digest(&self) -> u64 {
        use sha2::{Digest, Sha256};
        struct Feed(Sha256);
        impl io::Write for Feed {
            fn write(&mut self, b: &[u8]) -> io::Result<usize> {
                self.0.update(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let mut feed = Feed(Sha256::new());
        // Writing a Value to a sink that cannot fail cannot fail.
        let _ = match self.field_order {
            FieldOrder::Kept => {
                serde_json::to_writer(&mut feed, &self.value).map_err(io::Error::from)
            }
            FieldOrder::Ignored => write_sorted(&mut feed, &self.value),
        };
        let h = feed.0.finalize();
        // Never 0: the results log reads 0 as "not recorded".
        u64::from_le_bytes([h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7]]).max(1)
    }
}

/// `v` as JSON with every object's fields sorted by name: the same bytes
/// for the same content, whatever order a file gave its fields in.
pub fn sorted_json(v: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    // Writing to a Vec cannot fail.
    let _ = write_sorted(&mut out, v);
    out
}

/// Writes `v` as JSON with every object's fields sorted by name. Nesting is
/// bounded by the parser's (128 levels), and so is this recursion.
fn write_sorted(w: &mut dyn io::Write, v: &Value) -> io::Result<()> {
    match v {
        Value::Object(fields) => {
            let mut fields: Vec<_> = fields.iter().collect();
            fields.sort_unstable_by(|a, b| a.0.cmp(b.0));
            w.write_all(b"{")?;
            for (i, (name, v)) in fields.into_iter().enumerate() {
                if i > 0 {
                    w.write_all(b",")?;
                }
                serde_json::to_writer(&mut *w, name)?;
                w.write_all(b":")?;
                write_sorted(w, v)?;
            }
            w.write_all(b"}")
        }
        Value::Array(values) => {
            w.write_all(b"[")?;
            for (i, v) in values.iter().enumerate() {
                if i > 0 {
                    w.write_all(b",")?;
                }
                write_sorted(w, v)?;
            }
            w.write_all(b"]")
        }
        scalar => serde_json::to_writer(w, scalar).map_err(io::Error::from),
    }
}

impl Item {
    /// The item, fingerprinted as a job of `order` does.
    pub(super) fn in_order(self, field_order: FieldOrder) -> Item {
        Item {
            field_order,
            ..self
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_order_is_no_part_of_an_items_content_unless_its_job_kept_it() {
        let item = |v: &str, order| Item::new(1, serde_json::from_str(v).unwrap()).in_order(order);
        let a = r#"{"n": 1, "tags": {"x": [1, {"p": 1, "q": 2}], "y": null}}"#;
        let b = r#"{"tags": {"y": null, "x": [1, {"q": 2, "p": 1}]}, "n": 1}"#;
        let ignored = |v| item(v, FieldOrder::Ignored).digest();
        let kept = |v| item(v, FieldOrder::Kept).digest();
        assert_eq!(ignored(a), ignored(b));
        assert_ne!(kept(a), kept(b), "a job made before keeps its digests");
        // Order within an array is content; so is every value.
        assert_ne!(ignored(r#"{"x": [1, 2]}"#), ignored(r#"{"x": [2, 1]}"#));
        assert_ne!(ignored(r#"{"x": 1}"#), ignored(r#"{"x": "1"}"#));
        assert_ne!(
            ignored(r#"{"x": 1, "y": 2}"#),
            ignored(r#"{"x": 2, "y": 1}"#)
        );
        // Without objects there is no order to leave out: the two agree.
        assert_eq!(ignored("[1, \"a\", null]"), kept("[1, \"a\", null]"));
    }
}
