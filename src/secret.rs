//! The API key, and every credential a run sends: kept out of everything
//! batchrun prints or writes, however a server writes it back.

/// Credentials shorter than this after an auth scheme (`Bearer x`) are
/// taken whole: a short token alone would match ordinary text.
const LEAST_TOKEN: usize = 8;

/// The API key, and the credentials of `Authorization` headers given with
/// `--header`. Its `Debug` never shows them, and they only ever leave the
/// process as sensitive header values.
#[derive(Clone)]
pub struct Secret {
    /// The key as its header carries it (`Bearer sk-…` included).
    sent: String,
    /// What is kept out of every output: each credential without its auth
    /// scheme (a server's error names the token alone: `Incorrect API key
    /// provided: sk-…`), the key's first.
    tokens: Vec<String>,
}

/// The credential in a header value: the token after an auth scheme
/// (`Bearer sk-…`, `Token …`, `Basic …`), else the whole value.
fn credential(value: &str) -> &str {
    let value = value.trim();
    match value.rsplit_once(char::is_whitespace) {
        Some((_, token)) if token.len() >= LEAST_TOKEN => token,
        _ => value,
    }
}

impl Secret {
    /// Wraps a key (`Bearer sk-…` when its header wants a scheme).
    pub fn new(key: impl Into<String>) -> Secret {
        let sent = key.into();
        let tokens = vec![credential(&sent).to_string()];
        Secret { sent, tokens }
    }

    /// Keeps the credential in the header value `value` (a literal
    /// `Authorization: Bearer …` given with `--header`) out of every output
    /// too.
    pub fn also(&mut self, value: &str) {
        let token = credential(value);
        if !token.is_empty() && !self.tokens.iter().any(|t| t == token) {
            self.tokens.push(token.to_string());
        }
    }

    /// The key itself, for the one header that carries it.
    pub fn expose(&self) -> &str {
        &self.sent
    }

    /// The credentials kept out, the empty one left aside.
    fn tokens(&self) -> impl Iterator<Item = &str> {
        self.tokens
            .iter()
            .map(String::as_str)
            .filter(|t| !t.is_empty())
    }

    /// Whether `text` holds any credential whole.
    pub fn found_in(&self, text: &str) -> bool {
        self.tokens().any(|t| text.contains(t))
    }

    /// `text` with every occurrence of each credential replaced by `***`,
    /// as is or percent-encoded: for a URL the key was templated into
    /// (whose query encodes a key's `/`, `+` or `=`), or a body a server
    /// echoed it in.
    pub fn redact(&self, text: &str) -> String {
        self.tokens()
            .fold(text.to_string(), |s, t| redact_one(t, &s).unwrap_or(s))
    }

    /// Whether `text` spells out a credential with other characters woven
    /// between its own (`s.k._t...`): its characters, in order, with
    /// nothing but characters foreign to it in between. Credentials
    /// shorter than 12 characters are left to plain redaction, which this
    /// would only second-guess on ordinary text.
    pub fn woven_into(&self, text: &str) -> bool {
        self.tokens()
            .any(|t| t.chars().count() >= 12 && skeleton(t, text).contains(t))
    }

    /// Whether `text` ends with a credential's first four characters or
    /// more, with characters foreign to it woven in or not: what is left
    /// of a key where the text was cut.
    pub fn begun_at_end_of(&self, text: &str) -> bool {
        self.tokens().any(|t| {
            let skeleton = skeleton(t, text);
            (4..t.len())
                .filter(|&n| t.is_char_boundary(n))
                .any(|n| skeleton.ends_with(&t[..n]))
        })
    }

    /// A response body with every credential taken out however the server
    /// wrote it back: as is, inside JSON strings in escaped form
    /// (`\u0073k...`), or, for a body cut at `--max-body`, as a
    /// credential's beginning at the very end. None when there was nothing
    /// to take out, so the common case costs a search or two and no copy.
    pub fn scrub(&self, body: &str, cut: bool) -> Option<String> {
        let mut out: Option<String> = None;
        for token in self.tokens() {
            let text = out.as_deref().unwrap_or(body);
            if let Some(clean) = scrub_one(token, text, cut) {
                out = Some(clean);
            }
        }
        out
    }
}

/// [`Secret::scrub`] for one credential, `key`.
fn scrub_one(key: &str, body: &str, cut: bool) -> Option<String> {
    let mut out = redact_one(key, body);
    let text = out.as_deref().unwrap_or(body);
    if escapes_a_key_char(key, text) {
        if let Ok(mut v) = serde_json::from_str::<serde_json::Value>(text) {
            if scrub_strings(&mut v, key) {
                out = Some(v.to_string());
            }
        }
    }
    if cut {
        let text = out.as_deref().unwrap_or(body);
        if let Some(n) = cut_tail(key, text) {
            out = Some(format!("{}***", &text[..text.len() - n]));
        }
    }
    out
}

/// `text` with `key` taken out, as is and percent-encoded ([`unpercent`]);
/// None when it holds neither.
fn redact_one(key: &str, text: &str) -> Option<String> {
    let plain = text.contains(key).then(|| text.replace(key, "***"));
    match unpercent(key, plain.as_deref().unwrap_or(text)) {
        Some(clean) => Some(clean),
        None => plain,
    }
}

/// `text` with every percent-encoded writing of `key` taken out (a server
/// echoing the key in a URL: `sk-proj%2Fab%2B` for `sk-proj/ab+`, any of
/// its bytes encoded or not, in either case of hex); None when there is
/// none (a key of unreserved characters only is never written otherwise).
fn unpercent(key: &str, text: &str) -> Option<String> {
    if !text.contains('%') || key.is_empty() {
        return None;
    }
    let (t, k) = (text.as_bytes(), key.as_bytes());
    // The length of a writing of `key` at `at` with at least one byte
    // encoded, if there is one.
    let at = |mut i: usize| -> Option<usize> {
        let (start, mut encoded) = (i, false);
        for &want in k {
            if t.get(i) == Some(&want) {
                i += 1;
            } else if t.get(i) == Some(&b'%')
                && t.get(i + 1..i + 3)
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    == Some(want)
            {
                (i, encoded) = (i + 3, true);
            } else {
                return None;
            }
        }
        encoded.then_some(i - start)
    };
    let (mut out, mut from, mut i, mut found) = (String::new(), 0, 0, false);
    while i < t.len() {
        match at(i) {
            Some(n) => {
                // Both ends fall on char boundaries: the writing is ASCII.
                out.push_str(&text[from..i]);
                out.push_str("***");
                (i, from, found) = (i + n, i + n, true);
            }
            None => i += 1,
        }
    }
    found.then(|| out + &text[from..])
}

/// How much of the end of `text`, a body cut by the size cap, goes: the
/// key's first characters, as is or JSON-escaped. Fewer than four
/// characters (or one escape) would match ordinary text too often to mean
/// it.
fn cut_tail(key: &str, text: &str) -> Option<usize> {
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
    // A key escaped only in part and cut could hide anywhere in the last
    // few characters' worth of escapes: with an escape there, that whole
    // stretch goes (the body is cut anyway).
    let stretch = escaped(false).len();
    let from = text.len().saturating_sub(stretch);
    let from = (from..=text.len())
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(text.len());
    match tail {
        None if text[from..].contains('\\') => Some(text.len() - from),
        t => t,
    }
}

/// The characters of `text` that occur in `key`, in order: the key itself,
/// where other characters were woven into it.
fn skeleton(key: &str, text: &str) -> String {
    text.chars().filter(|&c| key.contains(c)).collect()
}

/// Whether `text` holds a JSON escape standing for one of `key`'s
/// characters: only then can the key be in it escaped, and only then is a
/// body worth parsing to look (most bodies with escapes have none of the
/// key's).
fn escapes_a_key_char(key: &str, text: &str) -> bool {
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

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderMap;

    #[test]
    fn a_key_percent_encoded_is_scrubbed_and_redacted() {
        let k = Secret::new("sk-proj/SECRETKEY+abc==");
        let echoed = r#"{"next":"https://x/?api_key=sk-proj%2FSECRETKEY%2Babc%3D%3D&p=2","k":"sk-proj/SECRETKEY%2babc%3d="}"#;
        let clean = k.scrub(echoed, false).unwrap();
        assert!(!clean.contains("SECRETKEY"), "{clean}");
        assert!(clean.contains("api_key=***&p=2"), "{clean}");
        assert_eq!(
            k.redact("GET /v1?key=sk-proj%2FSECRETKEY%2Babc%3D%3D"),
            "GET /v1?key=***"
        );
        // Nothing encoded, or the key's own text: left to plain redaction.
        assert_eq!(
            unpercent("sk-proj/SECRETKEY+abc==", "100% sk-proj/SECRET"),
            None
        );
        assert_eq!(unpercent("plain", "a%20plain"), None);
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
        assert!(!escapes_a_key_char(
            "sk_test_SECRET_abc123",
            r#"{"name":"caf\u00e9 \"q\" \n"}"#
        ));
        assert!(escapes_a_key_char(
            "sk_test_SECRET_abc123",
            r#"{"k":"\u0053ECRET"}"#
        ));
        assert!(escapes_a_key_char(
            "sk_test_SECRET_abc123",
            r#"{"k":"sk\u005Ftest"}"#
        ));
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

    #[test]
    fn a_key_after_an_auth_scheme_is_kept_out_as_its_token_alone() {
        // `Authorization: Bearer sk-…`: a server's error names the token.
        let k = Secret::new("Bearer sk-LEAKCHECK-123456");
        assert_eq!(k.expose(), "Bearer sk-LEAKCHECK-123456");
        let said = "Incorrect API key provided: sk-LEAKCHECK-123456.";
        assert_eq!(k.redact(said), "Incorrect API key provided: ***.");
        assert!(k.found_in(said));
        assert_eq!(
            k.scrub(&format!("{{\"error\":\"{said}\"}}"), false)
                .as_deref(),
            Some("{\"error\":\"Incorrect API key provided: ***.\"}")
        );
        assert!(k.begun_at_end_of("provided: sk-LEAK"));
        // A token too short to stand alone is taken with its scheme.
        let short = Secret::new("Bearer abc");
        assert_eq!(short.redact("Bearer abc, abc"), "***, abc");
    }

    #[test]
    fn a_credential_header_is_kept_out_beside_the_key() {
        let mut k = Secret::new("sk_test_SECRET_abc123");
        k.also("Bearer gw-TOKEN-987654321");
        k.also("Bearer gw-TOKEN-987654321");
        assert_eq!(k.tokens().count(), 2);
        let both = "key sk_test_SECRET_abc123, gateway gw-TOKEN-987654321";
        assert_eq!(k.redact(both), "key ***, gateway ***");
        assert_eq!(
            k.scrub(both, false).as_deref(),
            Some("key ***, gateway ***")
        );
        assert_eq!(
            k.scrub("gateway gw-TOKEN-98", true).as_deref(),
            Some("gateway ***")
        );
        assert_eq!(k.expose(), "sk_test_SECRET_abc123");
    }
}
