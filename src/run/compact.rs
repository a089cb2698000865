//! Whether a response body can go into `--out` as it is.
//!
//! `--out` holds each body as JSON written compactly after parsing it (a
//! body that does not parse is written as a string). Most APIs already
//! answer in that form, and parsing a million bodies into values only to
//! write the same bytes back was about 6% of a 200k-item run's time. A
//! body is copied as it is only when writing it back is sure to give the
//! same bytes; anything else takes the parse, as before.

use serde::de::IgnoredAny;

/// Keys an object may have before the duplicate check gives up (it is
/// quadratic): larger objects take the parse.
const MAX_KEYS: usize = 32;

/// Open containers the copy allows: parsing into a `Value` refuses 128
/// (the body is then written as a string), and the validity check below
/// has no such limit, so deeper bodies take the parse.
const MAX_DEPTH: usize = 100;

/// Integer digits that always fit an `i64` or a `u64`: longer ones may be
/// read as floats and written back otherwise.
const MAX_DIGITS: usize = 18;

/// One open container, while scanning.
enum Open<'a> {
    /// An object, with the keys seen so far.
    Object(Vec<&'a [u8]>),
    Array,
}

/// True when `body` is JSON that parsing into a `serde_json::Value` (field
/// order kept) and writing back compactly gives byte for byte: nothing
/// outside strings but tokens (no whitespace), no escapes and no control
/// bytes in strings, integers only (at most [`MAX_DIGITS`] digits, and no
/// `-0`, which comes back as `-0.0`), no key twice in one object (the
/// last value would win), and at most [`MAX_DEPTH`] containers deep. False
/// means "not sure": the caller parses.
pub fn written_back_unchanged(body: &[u8]) -> bool {
    // The scan checks the form and reads any bytes without panicking;
    // whether they are JSON at all (UTF-8 included) is checked last, so a
    // body the scan turns down (pretty-printed, say) is parsed once, by the
    // caller, not twice. Ignoring a value has no nesting limit: the scan
    // checks the depth.
    let mut open: Vec<Open<'_>> = Vec::new();
    // The last token outside strings: a string is a key when it follows
    // `{` or `,` inside an object.
    let mut prev = 0u8;
    let mut i = 0;
    while i < body.len() {
        let b = body[i];
        match b {
            b'"' => {
                let start = i + 1;
                let Some(len) = body[start..].iter().position(|&c| c == b'"') else {
                    return false;
                };
                let s = &body[start..start + len];
                if s.iter().any(|&c| c == b'\\' || c < 0x20) {
                    return false;
                }
                if let (Some(Open::Object(keys)), b'{' | b',') = (open.last_mut(), prev) {
                    if keys.len() >= MAX_KEYS || keys.contains(&s) {
                        return false;
                    }
                    keys.push(s);
                }
                prev = b'"';
                i = start + len + 1;
            }
            b'{' | b'[' if open.len() == MAX_DEPTH => return false,
            b'{' => {
                open.push(Open::Object(Vec::new()));
                prev = b;
                i += 1;
            }
            b'[' => {
                open.push(Open::Array);
                prev = b;
                i += 1;
            }
            b'}' | b']' => {
                open.pop();
                prev = b;
                i += 1;
            }
            b',' | b':' => {
                prev = b;
                i += 1;
            }
            b'-' | b'0'..=b'9' => {
                let digits_at = i + usize::from(b == b'-');
                let digits = body[digits_at..]
                    .iter()
                    .take_while(|c| c.is_ascii_digit())
                    .count();
                let end = digits_at + digits;
                let negative_zero = b == b'-' && &body[digits_at..end] == b"0";
                let fraction = matches!(body.get(end), Some(b'.' | b'e' | b'E'));
                if digits > MAX_DIGITS || negative_zero || fraction {
                    return false;
                }
                prev = b'0';
                i = end;
            }
            b't' | b'n' => {
                prev = b'l';
                i += 4;
            }
            b'f' => {
                prev = b'l';
                i += 5;
            }
            _ => return false,
        }
    }
    serde_json::from_slice::<IgnoredAny>(body).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn written_back(body: &[u8]) -> Option<Vec<u8>> {
        let v = serde_json::from_slice::<serde_json::Value>(body).ok()?;
        serde_json::to_vec(&v).ok()
    }

    #[test]
    fn compact_bodies_go_as_they_are_and_the_rest_takes_the_parse() {
        for body in [
            r#"{"id":7,"data":{"n":"12","ok":true,"tags":["a","b"],"x":null},"neg":-5}"#,
            r#"[]"#,
            r#""text é ✓""#,
            r#"123456789012345678"#,
            r#"{"a":{"a":1},"b":[{"a":2},{"a":3}]}"#,
        ] {
            assert!(written_back_unchanged(body.as_bytes()), "{body}");
            assert_eq!(written_back(body.as_bytes()).unwrap(), body.as_bytes());
        }
        for body in [
            r#"{"a": 1}"#,
            r#"{"a":1,"a":2}"#,
            r#"{"a":1.0}"#,
            r#"{"a":1e3}"#,
            r#"-0"#,
            r#"12345678901234567890"#,
            r#""caf\u00e9""#,
            r#""a\/b""#,
            "{\"a\":1}\n",
            r#"not json"#,
            r#"{"a":1"#,
            "\"\u{7f}\\n\"",
        ] {
            assert!(!written_back_unchanged(body.as_bytes()), "{body}");
        }
        // Nesting: the parse refuses 128 levels and writes a string.
        for depth in [MAX_DEPTH - 1, MAX_DEPTH, MAX_DEPTH + 1, 127, 128, 129, 1000] {
            let body = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
            if written_back_unchanged(body.as_bytes()) {
                assert!(depth <= MAX_DEPTH);
                assert_eq!(written_back(body.as_bytes()).unwrap(), body.as_bytes());
            } else {
                assert!(depth > MAX_DEPTH, "{depth}");
            }
        }
    }

    /// JSON-ish text from pieces that each trip one rule: whitespace,
    /// escapes, fractions, exponents, `-0`, long integers, repeated keys.
    fn json_text() -> impl Strategy<Value = String> {
        let key = prop::sample::select(&["a", "b", "é", "a\\u0062", ""][..]);
        const FIXED: [&str; 11] = [
            "null",
            "true",
            "false",
            "-0",
            "0",
            "1.5",
            "2e3",
            "-12",
            "\"x\\ny\"",
            "\"\\/\"",
            "\"\u{7f}\"",
        ];
        let leaf = prop_oneof![
            prop::sample::select(&FIXED[..]).prop_map(String::from),
            "[0-9]{1,21}",
            "\"[a-z ]{0,3}\"",
        ];
        let space = prop_oneof![Just(""), Just(""), Just(" "), Just("\n")];
        leaf.prop_recursive(4, 24, 4, move |inner| {
            prop_oneof![
                (prop::collection::vec(inner.clone(), 0..4), space.clone())
                    .prop_map(|(items, sp)| format!("[{}]", items.join(&format!(",{sp}")))),
                (
                    prop::collection::vec((key.clone(), inner), 0..4),
                    space.clone()
                )
                    .prop_map(|(fields, sp)| {
                        let fields: Vec<String> = fields
                            .into_iter()
                            .map(|(k, v)| format!("\"{k}\":{sp}{v}"))
                            .collect();
                        format!("{{{}}}", fields.join(","))
                    }),
            ]
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// Never a body copied that parsing and writing back would change.
        #[test]
        fn a_body_copied_as_it_is_is_what_the_parse_would_write(text in json_text()) {
            if written_back_unchanged(text.as_bytes()) {
                prop_assert_eq!(written_back(text.as_bytes()), Some(text.into_bytes()));
            }
        }

        /// Deep nesting, around the parse's limit of 128.
        #[test]
        fn a_deep_body_is_copied_only_when_the_parse_agrees(
            depth in 90usize..140,
            inner in prop_oneof![Just(""), Just("1"), Just("{}"), Just("\"x\"")],
            objects in any::<bool>(),
        ) {
            let (open, close) = if objects { ("{\"a\":", "}") } else { ("[", "]") };
            // A field needs a value.
            let inner = if objects && inner.is_empty() { "1" } else { inner };
            let text = format!("{}{inner}{}", open.repeat(depth), close.repeat(depth));
            if written_back_unchanged(text.as_bytes()) {
                prop_assert_eq!(written_back(text.as_bytes()), Some(text.into_bytes()));
            }
        }

        /// Arbitrary bytes: the same, and no panic.
        #[test]
        fn arbitrary_bytes_are_copied_only_when_the_parse_agrees(
            bytes in prop::collection::vec(any::<u8>(), 0..64)
        ) {
            if written_back_unchanged(&bytes) {
                prop_assert_eq!(written_back(&bytes), Some(bytes));
            }
        }
    }
}
