//! What is sent for each item: [`RequestSpec`] renders an item into a
//! [`Request`], which a [`crate::transport::Transport`] sends.

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};

use crate::input::Item;
use crate::template::{Escape, Template};
use crate::transport::Request;

/// The API key. Its `Debug` never shows it, and it only ever leaves the
/// process as a sensitive header value.
#[derive(Clone)]
pub struct Secret(String);

impl Secret {
    /// Wraps a key.
    pub fn new(key: impl Into<String>) -> Secret {
        Secret(key.into())
    }

    /// The key itself, for the one header that carries it (and redaction).
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// `text` with every occurrence of the key replaced by `***`: for a URL
    /// the key was templated into, or a body a server echoed it in.
    pub fn redact(&self, text: &str) -> String {
        if self.0.is_empty() {
            return text.to_string();
        }
        text.replace(&self.0, "***")
    }

    /// Whether `text` spells out the key with other characters woven between
    /// its own (`s.k._t...`): the key's characters, in order, with nothing
    /// but characters foreign to the key in between. Keys shorter than 12
    /// characters are left to plain redaction, which this would only
    /// second-guess on ordinary text.
    pub fn woven_into(&self, text: &str) -> bool {
        let key = self.0.as_str();
        key.chars().count() >= 12 && self.skeleton(text).contains(key)
    }

    /// The characters of `text` that occur in the key, in order: the key
    /// itself, where other characters were woven into it.
    fn skeleton(&self, text: &str) -> String {
        text.chars().filter(|&c| self.0.contains(c)).collect()
    }

    /// Whether `text` holds a JSON escape standing for one of the key's
    /// characters: only then can the key be in it escaped, and only then is
    /// a body worth parsing to look (most bodies with escapes have none of
    /// the key's).
    fn escapes_a_key_char(&self, text: &str) -> bool {
        let key = self.0.as_str();
        text.match_indices('\\').any(|(at, _)| {
            let rest = &text.as_bytes()[at + 1..];
            match rest.first() {
                Some(b'u') => std::str::from_utf8(rest.get(1..5).unwrap_or_default())
                    .ok()
                    .and_then(|hex| u32::from_str_radix(hex, 16).ok())
                    .and_then(char::from_u32)
                    .is_some_and(|c| key.contains(c)),
                Some(&b) => matches!(b, b'"' | b'\\' | b'/') && key.contains(char::from(b)),
                None => false,
            }
        })
    }

    /// Whether `text` ends with the key's first four characters or more,
    /// with characters foreign to the key woven in or not: what is left of
    /// a key where the text was cut.
    pub fn begun_at_end_of(&self, text: &str) -> bool {
        let key = self.0.as_str();
        let skeleton = self.skeleton(text);
        (4..key.len())
            .filter(|&n| key.is_char_boundary(n))
            .any(|n| skeleton.ends_with(&key[..n]))
    }

    /// A response body with the key taken out however the server wrote it
    /// back: as is, inside JSON strings in escaped form (`\u0073k...`), or,
    /// for a body cut at `--max-body`, as the key's beginning at the very
    /// end. None when there was nothing to take out, so the common case
    /// costs a search or two and no copy.
    pub fn scrub(&self, body: &str, cut: bool) -> Option<String> {
        let key = self.0.as_str();
        if key.is_empty() {
            return None;
        }
        let mut out: Option<String> = None;
        if body.contains(key) {
            out = Some(self.redact(body));
        }
        let text = out.as_deref().unwrap_or(body);
        if self.escapes_a_key_char(text) {
            if let Ok(mut v) = serde_json::from_str::<serde_json::Value>(text) {
                if scrub_strings(&mut v, key) {
                    out = Some(v.to_string());
                }
            }
        }
        if cut {
            let text = out.as_deref().unwrap_or(body);
            // The key's first characters, as is or JSON-escaped, cut off
            // by the size cap. Fewer than four characters (or one escape)
            // would match ordinary text too often to mean it.
            let escaped = |upper: bool| -> String {
                key.encode_utf16()
                    .map(|u| match upper {
                        true => format!("\\u{u:04X}"),
                        false => format!("\\u{u:04x}"),
                    })
                    .collect()
            };
            let forms = [
                (key.to_string(), 4),
                (escaped(false), 6),
                (escaped(true), 6),
            ];
            let tail = forms.iter().find_map(|(form, least)| {
                (*least.min(&form.len())..form.len())
                    .rev()
                    .filter(|&n| form.is_char_boundary(n))
                    .find(|&n| text.ends_with(&form[..n]))
            });
            // A key escaped only in part and cut could hide anywhere in the
            // last few characters' worth of escapes: with an escape there,
            // that whole stretch goes (the body is cut anyway).
            let stretch = escaped(false).len();
            let from = text.len().saturating_sub(stretch);
            let from = (from..=text.len())
                .find(|&i| text.is_char_boundary(i))
                .unwrap_or(text.len());
            let tail = match tail {
                None if text[from..].contains('\\') => Some(text.len() - from),
                t => t,
            };
            if let Some(n) = tail {
                out = Some(format!("{}***", &text[..text.len() - n]));
            }
        }
        out
    }
}

/// Replaces the key in every string (and object key) of a JSON value; true
/// when it found one.
fn scrub_strings(v: &mut serde_json::Value, key: &str) -> bool {
    use serde_json::Value;
    match v {
        Value::String(s) if s.contains(key) => {
            *s = s.replace(key, "***");
            true
        }
        Value::Array(a) => a.iter_mut().fold(false, |f, x| scrub_strings(x, key) | f),
        Value::Object(o) => {
            let mut found = false;
            if o.keys().any(|k| k.contains(key)) {
                let old = std::mem::take(o);
                for (k, x) in old {
                    found = true;
                    o.insert(k.replace(key, "***"), x);
                }
            }
            o.values_mut().fold(found, |f, x| scrub_strings(x, key) | f)
        }
        _ => false,
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// Where the body of each request comes from.
#[derive(Debug)]
pub enum Body {
    /// No body.
    None,
    /// The item itself, as JSON.
    Item,
    /// A template rendered with the item's fields, JSON-escaped.
    Template(Template),
}

/// What to send for each item.
#[derive(Debug)]
pub struct RequestSpec {
    /// The HTTP method.
    pub method: reqwest::Method,
    /// The URL template.
    pub url: Template,
    /// Extra headers, each a template.
    pub headers: Vec<(HeaderName, Template)>,
    /// The body.
    pub body: Body,
    /// The header the key travels in.
    pub key_header: HeaderName,
    /// The key.
    pub key: Option<Secret>,
}

impl RequestSpec {
    /// Renders `item` into a request, or says which part could not be rendered.
    pub fn render(&self, item: &Item) -> Result<Request, String> {
        let url = self
            .url
            .render(item, Escape::Url)
            .map_err(|e| format!("--url: {e}"))?;
        // A template whose literal start is a valid http(s) origin needs no
        // parse per item (see `Template::fixed_http_origin`); the length
        // bound is the parser's own limit.
        let valid_by_template =
            self.url.fixed_http_origin().is_some() && url.len() < u32::MAX as usize;
        if !valid_by_template {
            check_url(&url)?;
        }
        let mut headers = HeaderMap::new();
        for (name, t) in &self.headers {
            let v = t
                .render(item, Escape::Header)
                .map_err(|e| format!("--header {name}: {e}"))?;
            let v = HeaderValue::from_str(&v)
                .map_err(|_| format!("--header {name}: value is not a valid header value"))?;
            headers.append(name.clone(), v);
        }
        let body = match &self.body {
            Body::None => None,
            Body::Item => Some((
                serde_json::to_vec(&item.value).map_err(|e| e.to_string())?,
                true,
            )),
            Body::Template(t) => {
                let b = t
                    .render(item, Escape::Json)
                    .map_err(|e| format!("--body: {e}"))?;
                let is_json = serde_json::from_str::<serde_json::Value>(&b).is_ok();
                Some((b.into_bytes(), is_json))
            }
        };
        if let Some((_, true)) = &body {
            if !headers.contains_key(reqwest::header::CONTENT_TYPE) {
                headers.insert(
                    reqwest::header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                );
            }
        }
        if let Some(k) = &self.key {
            if let Ok(mut v) = HeaderValue::from_str(k.expose()) {
                v.set_sensitive(true);
                headers.insert(self.key_header.clone(), v);
            }
        }
        Ok(Request {
            method: self.method.clone(),
            url,
            headers,
            body: body.map(|(b, _)| b),
        })
    }
}

/// How pending items go many to a call (`--batch N`): the call's body is
/// the array of their own bodies, and its answer holds one element per item.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchSpec {
    /// Items per call at most (`--batch`).
    pub size: usize,
    /// The body around the array (`--batch-body`); the array itself without.
    pub body: Option<BatchBody>,
    /// Where the answer's array is (`--batch-results`, a JSON pointer),
    /// when the answer is not the array itself.
    pub results: String,
    /// Where an element's status is (`--batch-status`, a JSON pointer), in
    /// place of its `status` or `code` field.
    pub status: Option<String>,
    /// What one call counts as against the limits (`--batch-weight`).
    pub weight: BatchWeight,
}

/// What a batch call counts as against the limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum BatchWeight {
    /// One call, whatever it carries.
    #[default]
    Calls,
    /// As many calls as it carries items (an API that counts each item).
    Items,
}

/// `--batch-body TEMPLATE`: literal text around one `{items}`, with `{{`
/// and `}}` standing for literal braces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchBody {
    before: String,
    after: String,
}

impl BatchBody {
    /// Parses the template; it must hold `{items}` exactly once.
    pub fn parse(template: &str) -> Result<BatchBody, String> {
        let mut parts = vec![String::new()];
        let mut rest = template;
        while let Some(c) = rest.chars().next() {
            let last = parts.len() - 1;
            if let Some(r) = rest.strip_prefix("{items}") {
                parts.push(String::new());
                rest = r;
            } else if let Some(r) = rest.strip_prefix("{{").or_else(|| rest.strip_prefix("}}")) {
                parts[last].push(c);
                rest = r;
            } else if c == '{' || c == '}' {
                return Err(format!(
                    "--batch-body: a lone {c:?} (write {{{{ or }}}} for a literal brace; {{items}} is the array)"
                ));
            } else {
                parts[last].push(c);
                rest = &rest[c.len_utf8()..];
            }
        }
        match <[String; 2]>::try_from(parts) {
            Ok([before, after]) => Ok(BatchBody { before, after }),
            Err(p) if p.len() == 1 => {
                Err("--batch-body must hold {items}, the array of the items' bodies".into())
            }
            Err(_) => Err("--batch-body holds {items} more than once".into()),
        }
    }

    /// The body with `array` in place of `{items}`.
    pub fn render(&self, array: &str) -> String {
        format!("{}{array}{}", self.before, self.after)
    }
}

/// A rendered URL that the template could not vouch for: it must parse,
/// as http or https.
fn check_url(url: &str) -> Result<(), String> {
    match reqwest::Url::parse(url) {
        Ok(u) if matches!(u.scheme(), "http" | "https") => Ok(()),
        Ok(u) => Err(format!(
            "--url: {url:?} is not http or https (scheme {:?})",
            u.scheme()
        )),
        Err(e) => Err(format!("--url: {url:?} is not a valid URL: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(url: &str) -> RequestSpec {
        RequestSpec {
            method: reqwest::Method::GET,
            url: Template::parse(url).unwrap(),
            headers: Vec::new(),
            body: Body::None,
            key_header: HeaderName::from_static("x-api-key"),
            key: Some(Secret::new("k")),
        }
    }

    fn render(url: &str, value: serde_json::Value) -> Result<Request, String> {
        spec(url).render(&Item::new(3, value))
    }

    #[test]
    fn a_batch_body_puts_the_array_in_place_of_items() {
        let b = BatchBody::parse(r#"{{"requests": {items}}}"#).unwrap();
        assert_eq!(b.render("[1,2]"), r#"{"requests": [1,2]}"#);
        assert!(BatchBody::parse("{\"a\": 1}").is_err(), "a lone brace");
        assert!(BatchBody::parse("[]")
            .unwrap_err()
            .contains("must hold {items}"));
        assert!(BatchBody::parse("{items}{items}").is_err());
    }

    #[test]
    fn a_fixed_origin_takes_any_value_after_it() {
        // No parse per item here: every value lands after the authority,
        // percent-encoded, where no URL is invalid.
        for v in ["a b", "../x", "@evil.com", "#frag", "ü/?#[]", "\\host"] {
            let r = render("http://127.0.0.1:9/v1/{n}?x={n}", json!({ "n": v })).unwrap();
            let parsed = reqwest::Url::parse(&r.url).unwrap();
            assert_eq!(parsed.host_str(), Some("127.0.0.1"), "{v}");
            assert_eq!(parsed.port(), Some(9), "{v}");
        }
    }

    #[test]
    fn a_url_the_template_cannot_vouch_for_is_checked_per_item() {
        let err = render("{base}/v1", json!({ "base": "https://api.example.com" })).unwrap_err();
        assert!(err.contains("is not a valid URL"), "{err}");
        let err = render("http://127.0.0.1:{port}/v1", json!({ "port": "x" })).unwrap_err();
        assert!(err.contains("is not a valid URL"), "{err}");
        let err = render("ftp://example.com/{n}", json!({ "n": 1 })).unwrap_err();
        assert!(err.contains("is not http or https"), "{err}");
        let err = render("http://exa mple.com/{n}", json!({ "n": 1 })).unwrap_err();
        assert!(err.contains("is not a valid URL"), "{err}");
    }

    #[test]
    fn the_idempotency_key_is_added_and_the_key_stays_sensitive() {
        let r = render("http://h/{n}", json!({ "n": 1 }))
            .unwrap()
            .with_idempotency_key("batchrun-abc");
        assert_eq!(r.headers[crate::wire::IDEMPOTENCY_KEY], "batchrun-abc");
        assert!(r.headers["x-api-key"].is_sensitive());
    }

    #[test]
    fn the_key_is_scrubbed_however_a_server_writes_it_back() {
        let k = Secret::new("sk_test_SECRET_abc123");
        assert_eq!(k.scrub("{\"ok\":true}", false), None, "no copy when clean");
        assert_eq!(
            k.scrub("bad key sk_test_SECRET_abc123!", false).as_deref(),
            Some("bad key ***!")
        );
        // JSON-escaped, in a value and in an object key.
        let escaped = r#"{"error":"k=\u0073k_test_SECRET_abc123","\u0073k_test_SECRET_abc123":1}"#;
        let clean = k.scrub(escaped, false).unwrap();
        assert!(!clean.contains("SECRET"), "{clean}");
        let v: serde_json::Value = serde_json::from_str(&clean).unwrap();
        assert_eq!(v["error"], "k=***");
        assert_eq!(v["***"], 1);
        // Other escapes alone change nothing, and are not even parsed for.
        assert_eq!(k.scrub(r#"{"name":"caf\u00e9"}"#, false), None);
        assert!(!k.escapes_a_key_char(r#"{"name":"caf\u00e9 \"q\" \n"}"#));
        assert!(k.escapes_a_key_char(r#"{"k":"\u0053ECRET"}"#));
        assert!(k.escapes_a_key_char(r#"{"k":"sk\u005Ftest"}"#));
        // Cut by the size cap in the middle of the key.
        assert_eq!(
            k.scrub("not found for key sk_test_SECRET_ab", true)
                .as_deref(),
            Some("not found for key ***")
        );
        assert_eq!(k.scrub("ends with sk", true), None, "too short to mean it");
        // Cut in the middle of the escaped key, even inside one escape.
        let cut = r#"{"head":"x","key":"\u0073\u006b\u005f\u0074\u0"#;
        let clean = k.scrub(cut, true).unwrap();
        assert!(clean.ends_with(r#""key":"***"#), "{clean}");
        // Escaped in part, then cut.
        let cut = r#"{"head":"x","key":"sk\u005ftest\u005fSECRET\u005fabc1"#;
        let clean = k.scrub(cut, true).unwrap();
        assert!(!clean.contains("SECRET"), "{clean}");
        assert!(clean.ends_with("***"), "{clean}");
    }

    #[test]
    fn a_key_with_other_characters_woven_in_is_still_the_key() {
        let k = Secret::new("sk_test_SECRET_abcdef123");
        let woven: String = "sk_test_SECRET_abcdef123"
            .chars()
            .flat_map(|c| [c, '\u{00B7}'])
            .collect();
        assert!(k.woven_into(&format!("bad key {woven}!")));
        assert!(!k.woven_into("the secret key is kept safe: rate limit exceeded"));
        assert!(
            !Secret::new("short").woven_into("s-h-o-r-t"),
            "short keys: no"
        );
        let body = serde_json::json!({ "error": format!("bad key {woven}") }).to_string();
        let e = crate::classify::classify(
            reqwest::StatusCode::BAD_REQUEST,
            &HeaderMap::new(),
            &body,
            std::time::SystemTime::now(),
            Some(&k),
        )
        .unwrap_err();
        assert!(
            format!("{e}").ends_with("held the API key; not shown)"),
            "{e}"
        );
    }
}
