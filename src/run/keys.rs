//! Idempotency-Keys: the same key for the same call, whatever is lost.
//!
//! A key is derived only from what identifies the call: the job (its
//! input's name and request templates, never a path: a moved input sends
//! the same keys; with `--keep-done`, the request it was carried over to),
//! the job's epoch (which only `--fresh` advances),
//! the item's line and retry generation (which only `--retry-failed`
//! advances), and the request as rendered: method, URL, body (a JSON
//! body by its content, its fields in any order, for jobs made since), and the
//! headers whose templates take values from the item (for jobs made since
//! those were included; a job without such headers gets the same keys
//! either way). A checkpoint that is lost or
//! rebuilt therefore sends the same keys again, and the API replays the
//! calls it already ran instead of running them twice.
//!
//! Jobs made since keys follow content take the item's content and how
//! many earlier lines hold the same ([`At::repeat`]) in place of its line:
//! a regenerated input with a row inserted above moves lines, and a call
//! that may have run (killed in flight, or of unknown outcome) must keep
//! its key wherever its item went. Older jobs keep their lines' keys.

use sha2::{Digest, Sha256};

use crate::transport::Request;

/// How a job's keys are made: derived from the job, the epoch, the item
/// and the request alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyScheme {
    /// The job id.
    pub job: String,
    /// Advanced by `--fresh` only.
    pub epoch: u32,
    /// Headers whose values come from the item: part of the key, so that
    /// an item that differs only there is another call.
    pub varying: Vec<reqwest::header::HeaderName>,
    /// Keys follow the item's content, not its line (jobs made since).
    pub by_content: bool,
    /// A JSON body counts by its content, not the order of its fields
    /// (jobs made since): the item sent as the body (`--json-body`) of a
    /// file regenerated with its fields in another order is the same call,
    /// under the same key.
    pub sorted_body: bool,
}

/// Which item a key is for: its line, and for keys that follow content,
/// its content's digest and how many earlier lines hold the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct At {
    /// The item's line.
    pub line: u64,
    /// [`crate::input::Item::digest`] of its content.
    pub digest: u64,
    /// Earlier lines of the input with the same content.
    pub repeat: u32,
}

impl At {
    /// Where `item` is, with `repeat` earlier lines of the same content.
    pub fn of(item: &crate::input::Item, repeat: u32) -> At {
        At {
            line: item.line,
            digest: item.digest(),
            repeat,
        }
    }
}

impl KeyScheme {
    /// The Idempotency-Key of `req`, the call for the item `at` in its
    /// `generation`.
    pub fn key(&self, at: At, generation: u32, req: &Request) -> String {
        let KeyScheme {
            job,
            epoch,
            varying,
            by_content,
            sorted_body,
        } = self;
        let mut h = Sha256::new();
        // The line's place, as first written; content keys are marked so
        // that no content ever makes a line's key.
        let mut place = at.line.to_le_bytes().to_vec();
        if *by_content {
            place = [
                &b"content"[..],
                &at.digest.to_le_bytes(),
                &at.repeat.to_le_bytes(),
            ]
            .concat();
        }
        let body = req.body.as_deref().unwrap_or_default();
        let sorted = match sorted_body {
            true => serde_json::from_slice(body)
                .ok()
                .map(|v| crate::input::sorted_json(&v)),
            false => None,
        };
        for part in [
            job.as_bytes(),
            &epoch.to_le_bytes(),
            &place,
            &generation.to_le_bytes(),
            req.method.as_str().as_bytes(),
            req.url.as_bytes(),
            sorted.as_deref().unwrap_or(body),
        ] {
            h.update((part.len() as u64).to_le_bytes());
            h.update(part);
        }
        for name in varying {
            // Every value of a header given more than once, in order.
            for value in req.headers.get_all(name) {
                for part in [name.as_str().as_bytes(), value.as_bytes()] {
                    h.update((part.len() as u64).to_le_bytes());
                    h.update(part);
                }
            }
        }
        // One small allocation per call, not one per byte.
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut key = String::with_capacity(9 + 32);
        key.push_str("batchrun-");
        for b in &h.finalize()[..16] {
            key.push(char::from(HEX[usize::from(b >> 4)]));
            key.push(char::from(HEX[usize::from(b & 0xf)]));
        }
        key
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A line's place, for line keys (content plays no part).
    fn at(line: u64) -> At {
        At {
            line,
            digest: 0,
            repeat: 0,
        }
    }

    fn req(url: &str) -> Request {
        Request {
            method: reqwest::Method::GET,
            url: url.into(),
            headers: Default::default(),
            body: None,
        }
    }

    #[test]
    fn derived_keys_depend_only_on_what_identifies_the_call() {
        let k = KeyScheme {
            job: "j1".into(),
            epoch: 0,
            varying: Vec::new(),
            by_content: false,
            sorted_body: false,
        };
        let a = k.key(at(7), 0, &req("http://x/?n=7"));
        assert_eq!(
            a,
            k.key(at(7), 0, &req("http://x/?n=7")),
            "stable across runs"
        );
        assert!(a.starts_with("batchrun-") && a.len() == 9 + 32);
        assert_ne!(a, k.key(at(8), 0, &req("http://x/?n=7")), "another line");
        assert_ne!(a, k.key(at(7), 1, &req("http://x/?n=7")), "--retry-failed");
        assert_ne!(a, k.key(at(7), 0, &req("http://x/?n=8")), "another item");
        let fresh = KeyScheme {
            job: "j1".into(),
            epoch: 1,
            varying: Vec::new(),
            by_content: false,
            sorted_body: false,
        };
        assert_ne!(a, fresh.key(at(7), 0, &req("http://x/?n=7")), "--fresh");
    }

    #[test]
    fn derived_keys_are_those_earlier_versions_made() {
        // The formula as it was first written: a job resumed by a newer
        // version must send the keys the older one sent.
        let reference = |job: &str, epoch: u32, line: u64, generation: u32, r: &Request| {
            let mut h = Sha256::new();
            for part in [
                job.as_bytes(),
                &epoch.to_le_bytes(),
                &line.to_le_bytes(),
                &generation.to_le_bytes(),
                r.method.as_str().as_bytes(),
                r.url.as_bytes(),
                r.body.as_deref().unwrap_or_default(),
            ] {
                h.update((part.len() as u64).to_le_bytes());
                h.update(part);
            }
            let hex: String = h.finalize()[..16]
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            format!("batchrun-{hex}")
        };
        let k = KeyScheme {
            job: "0123abcd".into(),
            epoch: 2,
            varying: Vec::new(),
            by_content: false,
            sorted_body: false,
        };
        for (line, url) in [(1, "http://x/?n=1"), (77, "https://api/v1/a b"), (9, "")] {
            let r = req(url);
            assert_eq!(
                k.key(at(line), 3, &r),
                reference("0123abcd", 2, line, 3, &r)
            );
        }
    }

    #[test]
    fn a_header_taken_from_the_item_is_part_of_the_key() {
        use reqwest::header::{HeaderName, HeaderValue};
        let tenant = HeaderName::from_static("x-tenant");
        let with = |t: &'static str| {
            let mut r = req("http://x/?n=1");
            r.headers
                .insert(tenant.clone(), HeaderValue::from_static(t));
            r
        };
        let k = KeyScheme {
            job: "j".into(),
            epoch: 0,
            varying: vec![tenant.clone()],
            by_content: false,
            sorted_body: false,
        };
        assert_ne!(k.key(at(1), 0, &with("a")), k.key(at(1), 0, &with("b")));
        // Given twice: both values count.
        let twice = |second: &'static str| {
            let mut r = with("a");
            r.headers
                .append(tenant.clone(), HeaderValue::from_static(second));
            r
        };
        assert_ne!(k.key(at(1), 0, &twice("b")), k.key(at(1), 0, &twice("c")));
        assert_eq!(k.key(at(1), 0, &with("a")), k.key(at(1), 0, &with("a")));
        // A header that is not among them changes nothing.
        let fixed = KeyScheme {
            job: "j".into(),
            epoch: 0,
            varying: Vec::new(),
            by_content: false,
            sorted_body: false,
        };
        assert_eq!(
            fixed.key(at(1), 0, &with("a")),
            fixed.key(at(1), 0, &with("b"))
        );
    }

    /// Keys that follow content stay with the item wherever its line goes,
    /// tell apart lines of the same content by how many came before, and
    /// are never a line's key.
    #[test]
    fn content_keys_follow_the_item_not_its_line() {
        let k = KeyScheme {
            job: "j".into(),
            epoch: 0,
            varying: Vec::new(),
            by_content: true,
            sorted_body: false,
        };
        let r = req("http://x/?n=7");
        let at = |line, digest, repeat| At {
            line,
            digest,
            repeat,
        };
        let a = k.key(at(7, 42, 0), 0, &r);
        assert_eq!(a, k.key(at(8, 42, 0), 0, &r), "moved a line down");
        assert_ne!(a, k.key(at(9, 42, 1), 0, &r), "the second of the same");
        assert_ne!(a, k.key(at(7, 43, 0), 0, &r), "other content");
        assert_ne!(a, k.key(at(7, 42, 0), 1, &r), "--retry-failed");
        let lines = KeyScheme {
            by_content: false,
            sorted_body: false,
            ..k.clone()
        };
        assert_ne!(a, lines.key(at(7, 42, 0), 0, &r));
    }

    /// A JSON body's fields in another order (a file regenerated by a
    /// serializer that orders them otherwise, a CSV's columns swapped) are
    /// the same call under the same key, for jobs made since: the keys of
    /// the bodies as sent ran each such call twice on `--retry-failed`.
    #[test]
    fn a_json_body_counts_by_content_not_field_order() {
        let k = KeyScheme {
            job: "j".into(),
            epoch: 0,
            varying: Vec::new(),
            by_content: true,
            sorted_body: true,
        };
        let with = |body: &str| Request {
            body: Some(body.as_bytes().to_vec()),
            ..req("http://x/")
        };
        let at = At {
            line: 1,
            digest: 42,
            repeat: 0,
        };
        let a = k.key(at, 0, &with(r#"{"a":1,"b":{"c":2,"d":[3]}}"#));
        assert_eq!(a, k.key(at, 0, &with(r#"{"b":{"d":[3],"c":2},"a":1}"#)));
        assert_ne!(a, k.key(at, 0, &with(r#"{"a":1,"b":{"c":2,"d":[4]}}"#)));
        assert_ne!(
            k.key(at, 0, &with("a=1&b=2")),
            k.key(at, 0, &with("b=2&a=1"))
        );
        let as_sent = KeyScheme {
            sorted_body: false,
            ..k.clone()
        };
        assert_ne!(
            as_sent.key(at, 0, &with(r#"{"a":1,"b":2}"#)),
            as_sent.key(at, 0, &with(r#"{"b":2,"a":1}"#)),
            "older jobs keep their keys"
        );
    }
}
