//! Templates: parse arbitrary text, then render it in every escape mode
//! against an arbitrary JSON item.
//!
//! Layout of the input: one byte choosing the item's line, the template, a
//! NUL, then the item as JSON (a string of the raw bytes when it is not JSON).
#![no_main]

use batchrun::input::Item;
use batchrun::template::{Escape, Template, TemplateError};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

const MODES: [Escape; 4] = [Escape::Url, Escape::Raw, Escape::Header, Escape::Json];

fuzz_target!(|data: &[u8]| {
    let [line, rest @ ..] = data else {
        return;
    };
    let (text, json) = match rest.iter().position(|&b| b == 0) {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, &[][..]),
    };
    let text = String::from_utf8_lossy(text);
    let value = serde_json::from_slice(json)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(json).into_owned()));
    let line = match line {
        255 => u64::MAX,
        n => u64::from(*n),
    };
    let item = Item::new(line, value);

    let template = match Template::parse(&text) {
        Ok(t) => t,
        Err(e) => {
            check_parse_error(&e, text.chars().count());
            return;
        }
    };
    assert_eq!(template.as_str(), text);
    assert_eq!(template.to_string(), text);
    assert_eq!(template.is_static(), template.fields().next().is_none());
    for name in template.fields() {
        assert!(!name.is_empty() && name == name.trim(), "{name:?}");
        assert!(!name.split('.').any(str::is_empty), "{name:?}");
        assert!(
            !name
                .chars()
                .any(|c| matches!(c, '{' | '}' | '"') || c.is_control()),
            "{name:?}"
        );
    }

    let rendered = MODES.map(|mode| template.render(&item, mode));
    check_modes_agree(&template, &rendered);
    if let Ok(header) = &rendered[2] {
        // Control characters in a header can only come from the template's
        // own text, never from an item.
        if !text.chars().any(|c| c.is_control() && c != '\t') {
            assert!(!header.chars().any(|c| c.is_control() && c != '\t'));
        }
    }
    if json.iter().filter(|&&b| b == b'[' || b == b'{').count() < 100 {
        for name in template.fields() {
            check_json_value(name, &item);
        }
    }
});

fn check_parse_error(e: &TemplateError, chars: usize) {
    let pos = match e {
        TemplateError::Unclosed { pos }
        | TemplateError::Empty { pos }
        | TemplateError::Stray { pos }
        | TemplateError::BadChar { pos, .. }
        | TemplateError::EmptySegment { pos, .. } => *pos,
        other => panic!("parse cannot fail with {other:?}"),
    };
    assert!((1..=chars).contains(&pos), "{e:?} in {chars} chars");
}

/// Every mode looks the same fields up, so they find or miss the same ones;
/// only Header may also refuse a value.
fn check_modes_agree(template: &Template, rendered: &[Result<String, TemplateError>; 4]) {
    let [url, raw, header, json] = rendered;
    match raw {
        Ok(_) => {
            assert!(url.is_ok() && json.is_ok(), "{url:?} {json:?}");
            assert!(
                matches!(header, Ok(_) | Err(TemplateError::BadHeaderValue { .. })),
                "{header:?}"
            );
        }
        Err(TemplateError::MissingField { .. }) => {
            assert_eq!(url, raw);
            assert_eq!(json, raw);
            assert!(header.is_err());
        }
        Err(other) => panic!("render cannot fail with {other:?}"),
    }
    if template.is_static() {
        for r in rendered {
            assert_eq!(r, raw);
        }
    }
}

/// A field rendered for a JSON body reads back as JSON: a string between
/// quotes, anything else bare.
fn check_json_value(name: &str, item: &Item) {
    let render = |t: String| {
        Template::parse(&t)
            .expect("a name that parsed once parses again")
            .render(item, Escape::Json)
    };
    let (Ok(quoted), Ok(bare)) = (
        render(format!("[\"{{{name}}}\"]")),
        render(format!("[{{{name}}}]")),
    ) else {
        return;
    };
    let quoted: Option<Vec<Value>> = serde_json::from_str(&quoted).ok();
    let bare: Option<Vec<Value>> = serde_json::from_str(&bare).ok();
    let string = matches!(quoted.as_deref(), Some([Value::String(_)]));
    let other = matches!(bare.as_deref(), Some([v]) if !v.is_string());
    assert!(
        string || other,
        "{{{name}}} renders as neither a JSON string's contents nor a JSON value: {quoted:?} {bare:?}"
    );
}
