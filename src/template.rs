//! Request templates: `--url`, `--header` and `--body` turned into text for
//! one item.
//!
//! Syntax:
//!
//! * `{name}` is replaced by the item's field `name`.
//! * `{a.b.c}` walks nested objects; a numeric segment indexes an array
//!   (`{tags.0}`). If the item has a top-level field whose name is the whole
//!   dotted text (a CSV column called `user.id`, say), that field wins.
//! * `{index}` is always the item's line number in the input file, even when
//!   the item has its own `index` field: it is the one name that means the same
//!   thing for every item, and the checkpoint keys items by it.
//! * `{{` and `}}` are a literal `{` and `}`, so a JSON body template reads
//!   `{{"name": "{name}"}}`.
//! * Whitespace just inside the braces is ignored: `{ name }` is `{name}`.
//!
//! A placeholder name may not contain `{`, `"` or control characters; that
//! turns the common slip of an unescaped JSON brace into a parse error rather
//! than a field that no item has.

use std::fmt;

use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use serde_json::Value;

use crate::input::Item;

/// Everything but RFC 3986's unreserved characters, so a value is inert in a
/// path segment and in a query key or value alike.
const URL_COMPONENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// The placeholder that means the item's line number.
const INDEX: &str = "index";

/// A parsed template.
#[derive(Debug, Clone)]
pub struct Template {
    source: String,
    parts: Vec<Part>,
    /// See [`Template::fixed_http_origin`]; worked out once, at parse time.
    http_origin: Option<usize>,
}

#[derive(Debug, Clone)]
enum Part {
    Literal(String),
    Field {
        /// The name as written (trimmed), for messages and exact-key lookup.
        name: String,
        /// `name` split on dots.
        path: Vec<String>,
    },
}

/// How substituted values are written into the output. Literal text of the
/// template is never altered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Escape {
    /// Percent-encode everything but `A-Za-z0-9-._~`, for URLs.
    Url,
    /// Insert values as they are.
    Raw,
    /// As [`Escape::Raw`], but refuse values with control characters (CR, LF,
    /// NUL and the like, tab excepted) that an HTTP header cannot carry and
    /// that could otherwise smuggle in extra headers.
    Header,
    /// For JSON bodies: a string value is JSON-escaped without its quotes (so
    /// write `"{name}"` in the template); any other value is its JSON text.
    Json,
}

/// A template that cannot be parsed, or cannot be rendered for an item.
/// Positions count characters from 1.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    /// A `{` with no `}` after it.
    #[error("unclosed '{{' at position {pos} (write '{{{{' for a literal brace)")]
    Unclosed {
        /// Position of the `{`.
        pos: usize,
    },
    /// `{}` or `{ }`.
    #[error("empty placeholder at position {pos} (write '{{{{' for a literal brace)")]
    Empty {
        /// Position of the `{`.
        pos: usize,
    },
    /// A `}` that closes nothing.
    #[error("unmatched '}}' at position {pos} (write '}}}}' for a literal brace)")]
    Stray {
        /// Position of the `}`.
        pos: usize,
    },
    /// A character that cannot be part of a placeholder name.
    #[error(
        "invalid character {ch:?} in the placeholder opened at position {pos} \
         (write '{{{{' for a literal brace)"
    )]
    BadChar {
        /// Position of the placeholder's `{`.
        pos: usize,
        /// The offending character.
        ch: char,
    },
    /// A dotted name with an empty segment, like `{a..b}` or `{.a}`.
    #[error("placeholder {name:?} at position {pos} has an empty path segment")]
    EmptySegment {
        /// The name as written.
        name: String,
        /// Position of the placeholder's `{`.
        pos: usize,
    },
    /// The item lacks a field the template names.
    #[error("item has no field {name:?}")]
    MissingField {
        /// The placeholder's name.
        name: String,
    },
    /// [`Escape::Header`] met a value it must not put in a header.
    #[error(
        "field {name:?} contains a line break or control character, which a header cannot carry"
    )]
    BadHeaderValue {
        /// The placeholder's name.
        name: String,
    },
}

impl Template {
    /// Parses `s`.
    ///
    /// # Errors
    ///
    /// A [`TemplateError`] naming the problem and its position.
    pub fn parse(s: &str) -> Result<Template, TemplateError> {
        let mut parts = Vec::new();
        let mut literal = String::new();
        let mut chars = s.chars().enumerate().map(|(i, c)| (i + 1, c)).peekable();
        while let Some((pos, c)) = chars.next() {
            match c {
                '{' if chars.peek().map(|&(_, c)| c) == Some('{') => {
                    chars.next();
                    literal.push('{');
                }
                '}' if chars.peek().map(|&(_, c)| c) == Some('}') => {
                    chars.next();
                    literal.push('}');
                }
                '}' => return Err(TemplateError::Stray { pos }),
                '{' => {
                    let mut name = String::new();
                    let mut closed = false;
                    for (_, c) in chars.by_ref() {
                        match c {
                            '}' => {
                                closed = true;
                                break;
                            }
                            '{' | '"' => return Err(TemplateError::BadChar { pos, ch: c }),
                            c if c.is_control() => {
                                return Err(TemplateError::BadChar { pos, ch: c })
                            }
                            c => name.push(c),
                        }
                    }
                    if !closed {
                        return Err(TemplateError::Unclosed { pos });
                    }
                    let name = name.trim();
                    if name.is_empty() {
                        return Err(TemplateError::Empty { pos });
                    }
                    let path: Vec<String> = name.split('.').map(str::to_owned).collect();
                    if path.iter().any(String::is_empty) {
                        return Err(TemplateError::EmptySegment {
                            name: name.to_owned(),
                            pos,
                        });
                    }
                    if !literal.is_empty() {
                        parts.push(Part::Literal(std::mem::take(&mut literal)));
                    }
                    parts.push(Part::Field {
                        name: name.to_owned(),
                        path,
                    });
                }
                c => literal.push(c),
            }
        }
        if !literal.is_empty() {
            parts.push(Part::Literal(literal));
        }
        let http_origin = match parts.first() {
            Some(Part::Literal(text)) => http_origin_len(text),
            _ => None,
        };
        Ok(Template {
            source: s.to_owned(),
            parts,
            http_origin,
        })
    }

    /// When the template starts with literal text that spells a valid http or
    /// https URL up to and including the character that ends its authority
    /// (`https://host:port/`, `http://host?`), the length of that text.
    ///
    /// Every rendering then starts with that same text, and a URL parser
    /// never fails on what follows an authority (path, query and fragment are
    /// percent-encoded as needed, never refused), so each rendered URL is
    /// valid without being parsed again. None when a placeholder comes first
    /// or the prefix is not such a URL: then each rendering must be checked.
    pub fn fixed_http_origin(&self) -> Option<usize> {
        self.http_origin
    }

    /// The text the template was parsed from.
    pub fn as_str(&self) -> &str {
        &self.source
    }

    /// The placeholder names, in order of appearance (repeats included).
    pub fn fields(&self) -> impl Iterator<Item = &str> {
        self.parts.iter().filter_map(|p| match p {
            Part::Field { name, .. } => Some(name.as_str()),
            Part::Literal(_) => None,
        })
    }

    /// True when the template has no placeholders, so it renders the same
    /// for every item.
    pub fn is_static(&self) -> bool {
        self.fields().next().is_none()
    }

    /// Fills the template from `item`, writing values as `mode` says.
    ///
    /// # Errors
    ///
    /// [`TemplateError::MissingField`] when the item lacks a named field, and
    /// [`TemplateError::BadHeaderValue`] for an unfit value under
    /// [`Escape::Header`].
    pub fn render(&self, item: &Item, mode: Escape) -> Result<String, TemplateError> {
        let mut out = String::with_capacity(self.source.len());
        for part in &self.parts {
            match part {
                Part::Literal(text) => out.push_str(text),
                Part::Field { name, path } => {
                    let index;
                    let value = if name == INDEX {
                        index = Value::from(item.line);
                        &index
                    } else {
                        lookup(&item.value, name, path)
                            .ok_or_else(|| TemplateError::MissingField { name: name.clone() })?
                    };
                    write_value(&mut out, name, value, mode)?;
                }
            }
        }
        Ok(out)
    }
}

impl fmt::Display for Template {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

impl std::str::FromStr for Template {
    type Err = TemplateError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Template::parse(s)
    }
}

/// The length of `text`'s beginning up to the character that ends the
/// authority after `://`, if that beginning parses as an http(s) URL.
fn http_origin_len(text: &str) -> Option<usize> {
    let after_slashes = text.find("://")? + 3;
    // For http(s), a backslash ends the authority as a slash does.
    let end = after_slashes + text[after_slashes..].find(['/', '\\', '?', '#'])?;
    let prefix = &text[..=end];
    let url = reqwest::Url::parse(prefix).ok()?;
    matches!(url.scheme(), "http" | "https").then_some(prefix.len())
}

fn lookup<'v>(root: &'v Value, name: &str, path: &[String]) -> Option<&'v Value> {
    if let Some(v) = root.as_object().and_then(|o| o.get(name)) {
        return Some(v);
    }
    path.iter().try_fold(root, |v, seg| match v {
        Value::Object(o) => o.get(seg),
        Value::Array(a) => seg.parse::<usize>().ok().and_then(|i| a.get(i)),
        _ => None,
    })
}

/// The text a value stands for outside JSON: strings bare, `null` as nothing
/// (an absent optional value should not become the word "null" in a URL),
/// everything else as compact JSON.
fn plain_text(value: &Value) -> std::borrow::Cow<'_, str> {
    match value {
        Value::String(s) => s.as_str().into(),
        Value::Null => "".into(),
        other => other.to_string().into(),
    }
}

fn write_value(
    out: &mut String,
    name: &str,
    value: &Value,
    mode: Escape,
) -> Result<(), TemplateError> {
    match mode {
        Escape::Url => out.extend(utf8_percent_encode(&plain_text(value), URL_COMPONENT)),
        Escape::Raw => out.push_str(&plain_text(value)),
        Escape::Header => {
            let text = plain_text(value);
            if text.chars().any(|c| c.is_control() && c != '\t') {
                return Err(TemplateError::BadHeaderValue {
                    name: name.to_owned(),
                });
            }
            out.push_str(&text);
        }
        Escape::Json => match value {
            Value::String(s) => {
                let quoted = Value::String(s.clone()).to_string();
                // `to_string` of a JSON string always starts and ends with a quote.
                out.push_str(
                    quoted
                        .strip_prefix('"')
                        .and_then(|q| q.strip_suffix('"'))
                        .unwrap_or(&quoted),
                );
            }
            other => out.push_str(&other.to_string()),
        },
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn item(value: Value) -> Item {
        Item::new(7, value)
    }

    fn render(t: &str, value: Value, mode: Escape) -> Result<String, TemplateError> {
        Template::parse(t).unwrap().render(&item(value), mode)
    }

    #[test]
    fn url_mode_encodes_values_not_literals() {
        let v = json!({"q": "a b/c?d&e=f#g", "u": "café ☕", "safe": "A-z_0.9~"});
        assert_eq!(
            render("https://x.test/s/{q}?q={q}&u={u}", v.clone(), Escape::Url).unwrap(),
            "https://x.test/s/a%20b%2Fc%3Fd%26e%3Df%23g?q=a%20b%2Fc%3Fd%26e%3Df%23g&u=caf%C3%A9%20%E2%98%95"
        );
        assert_eq!(render("/{safe}", v, Escape::Url).unwrap(), "/A-z_0.9~");
    }

    #[test]
    fn non_string_values_become_text() {
        let v = json!({"n": 42, "f": 1.5, "b": true, "z": null, "o": {"k": [1, "x y"]}});
        assert_eq!(
            render("{n}|{f}|{b}|{z}|{o}", v.clone(), Escape::Raw).unwrap(),
            "42|1.5|true||{\"k\":[1,\"x y\"]}"
        );
        assert_eq!(
            render("{o}", v, Escape::Url).unwrap(),
            "%7B%22k%22%3A%5B1%2C%22x%20y%22%5D%7D"
        );
    }

    #[test]
    fn index_is_the_line_number_even_if_the_item_has_one() {
        assert_eq!(
            render("/items/{index}", json!({}), Escape::Url).unwrap(),
            "/items/7"
        );
        assert_eq!(
            render("{index}", json!({"index": "mine"}), Escape::Raw).unwrap(),
            "7"
        );
        assert_eq!(render("{index}", json!([1, 2]), Escape::Json).unwrap(), "7");
    }

    #[test]
    fn dotted_paths_and_array_indexes() {
        let v = json!({
            "user": {"id": 5, "tags": ["a", {"deep": "d"}]},
            "list": [10, 20],
            "map": {"0": "zero"},
            "user.id": "flat wins",
        });
        assert_eq!(
            render("{user.tags.0}", v.clone(), Escape::Raw).unwrap(),
            "a"
        );
        assert_eq!(
            render("{user.tags.1.deep}", v.clone(), Escape::Raw).unwrap(),
            "d"
        );
        assert_eq!(render("{list.1}", v.clone(), Escape::Raw).unwrap(), "20");
        assert_eq!(render("{map.0}", v.clone(), Escape::Raw).unwrap(), "zero");
        assert_eq!(
            render("{ user.id }", v.clone(), Escape::Raw).unwrap(),
            "flat wins"
        );
        assert_eq!(render("{0}", json!(["top"]), Escape::Raw).unwrap(), "top");
        for missing in ["list.2", "list.x", "user.tags.0.x", "user.nope", "nope"] {
            assert_eq!(
                render(&format!("{{{missing}}}"), v.clone(), Escape::Raw),
                Err(TemplateError::MissingField {
                    name: missing.to_owned()
                })
            );
        }
    }

    #[test]
    fn missing_field_message_names_it() {
        let err = render("/u/{user.id}", json!({"user": {}}), Escape::Url).unwrap_err();
        assert_eq!(err.to_string(), "item has no field \"user.id\"");
        let err = render("{a}", json!("not an object"), Escape::Raw).unwrap_err();
        assert_eq!(err.to_string(), "item has no field \"a\"");
    }

    #[test]
    fn doubled_braces_are_literal() {
        assert_eq!(
            render("{{\"id\": {id}}} }}{{", json!({"id": 3}), Escape::Json).unwrap(),
            "{\"id\": 3} }{"
        );
        let t = Template::parse("{{literal}}").unwrap();
        assert!(t.is_static());
        assert_eq!(
            t.render(&item(json!(null)), Escape::Raw).unwrap(),
            "{literal}"
        );
    }

    #[test]
    fn parse_errors_say_what_and_where() {
        let err = |s: &str| Template::parse(s).unwrap_err();
        assert_eq!(err("/a/{id"), TemplateError::Unclosed { pos: 4 });
        assert_eq!(err("/a/{}"), TemplateError::Empty { pos: 4 });
        assert_eq!(err("x{  }"), TemplateError::Empty { pos: 2 });
        assert_eq!(err("a}b"), TemplateError::Stray { pos: 2 });
        assert_eq!(err("é}"), TemplateError::Stray { pos: 2 });
        assert_eq!(err("{a{b}}"), TemplateError::BadChar { pos: 1, ch: '{' });
        assert_eq!(
            err("{\"name\": \"{name}\"}"),
            TemplateError::BadChar { pos: 1, ch: '"' }
        );
        assert_eq!(err("{a\nb}"), TemplateError::BadChar { pos: 1, ch: '\n' });
        assert_eq!(
            err("ab{a..b}"),
            TemplateError::EmptySegment {
                name: "a..b".into(),
                pos: 3
            }
        );
        assert!(matches!(err("{.a}"), TemplateError::EmptySegment { .. }));
        assert!(matches!(err("{a.}"), TemplateError::EmptySegment { .. }));
        assert_eq!(
            err("/a/{id").to_string(),
            "unclosed '{' at position 4 (write '{{' for a literal brace)"
        );
        assert_eq!(
            err("a}").to_string(),
            "unmatched '}' at position 2 (write '}}' for a literal brace)"
        );
        assert!(err("{\"a\":1}")
            .to_string()
            .contains("invalid character '\"'"));
    }

    #[test]
    fn fixed_http_origin_only_for_a_literal_valid_http_origin() {
        let origin = |t: &str| Template::parse(t).unwrap().fixed_http_origin();
        assert_eq!(origin("http://127.0.0.1:8080/v1/echo?n={n}"), Some(22));
        assert_eq!(origin("https://api.example.com?q={q}"), Some(24));
        assert_eq!(
            origin("https://api.example.com"),
            None,
            "no end of authority"
        );
        assert_eq!(origin("https://{host}/v1"), None, "placeholder in the host");
        assert_eq!(
            origin("http://127.0.0.1:{port}/v1"),
            None,
            "placeholder in the port"
        );
        assert_eq!(origin("{base}/v1/echo"), None);
        assert_eq!(origin("ftp://example.com/{f}"), None, "not http");
        assert_eq!(origin("http://exa mple.com/{n}"), None, "invalid host");
        assert_eq!(origin("http://example.com:99999/{n}"), None, "invalid port");
        assert_eq!(origin("http:///{n}"), None, "empty host");
        assert_eq!(origin("/v1/{n}"), None);
    }

    #[test]
    fn fields_and_is_static() {
        let t = Template::parse("/u/{user.id}/{ index }?x={x}&y={x}").unwrap();
        assert_eq!(
            t.fields().collect::<Vec<_>>(),
            vec!["user.id", "index", "x", "x"]
        );
        assert!(!t.is_static());
        assert_eq!(t.as_str(), "/u/{user.id}/{ index }?x={x}&y={x}");
        assert_eq!(t.to_string(), t.as_str());
        assert!(Template::parse("").unwrap().is_static());
        assert_eq!(
            Template::parse("")
                .unwrap()
                .render(&item(json!(1)), Escape::Url)
                .unwrap(),
            ""
        );
        assert!("{a}".parse::<Template>().is_ok());
    }

    #[test]
    fn raw_and_header_modes() {
        let v = json!({"tok": "a b\tc", "evil": "x\r\nX-Admin: 1", "nul": "a\u{0}b", "lf": "a\nb"});
        assert_eq!(
            render("Bearer {tok}", v.clone(), Escape::Raw).unwrap(),
            "Bearer a b\tc"
        );
        assert_eq!(
            render("Bearer {tok}", v.clone(), Escape::Header).unwrap(),
            "Bearer a b\tc"
        );
        assert_eq!(
            render("{evil}", v.clone(), Escape::Raw).unwrap(),
            "x\r\nX-Admin: 1"
        );
        for name in ["evil", "nul", "lf"] {
            let err = render(&format!("v={{{name}}}"), v.clone(), Escape::Header).unwrap_err();
            assert_eq!(err, TemplateError::BadHeaderValue { name: name.into() });
            assert!(err.to_string().contains(name));
        }
    }

    #[test]
    fn json_mode_keeps_json_valid() {
        let v = json!({
            "name": "say \"hi\"\\ now\nnext\u{1}",
            "n": 3,
            "b": false,
            "z": null,
            "o": {"k": "v\""},
            "a": [1, "two"],
        });
        let t = "{{\"name\": \"{name}\", \"n\": {n}, \"b\": {b}, \"z\": {z}, \"o\": {o}, \"a\": {a}, \"i\": {index}}}";
        let out = render(t, v.clone(), Escape::Json).unwrap();
        let parsed: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(
            parsed,
            json!({"name": v["name"], "n": 3, "b": false, "z": null, "o": {"k": "v\""}, "a": [1, "two"], "i": 7})
        );
        // Numbers inside quotes are fine too.
        assert_eq!(render("\"{n}\"", v, Escape::Json).unwrap(), "\"3\"");
    }
}
