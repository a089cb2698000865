//! What is sent for each item: [`RequestSpec`] renders an item into a
//! [`Request`], which a [`crate::transport::Transport`] sends.

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};

use crate::input::Item;
use crate::secret::Secret;
use crate::template::{Escape, Template};
use crate::transport::Request;

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
            let mut v = HeaderValue::from_str(&v)
                .map_err(|_| format!("--header {name}: value is not a valid header value"))?;
            v.set_sensitive(
                *name == reqwest::header::AUTHORIZATION
                    || *name == reqwest::header::PROXY_AUTHORIZATION,
            );
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
}
