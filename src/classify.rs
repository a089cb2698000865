//! What a response means for the run: success, or which kind of failure.
//!
//! The pool branches on [`CallError`]: a rate limit pauses everyone and
//! requeues, exhausted credits halt, transient failures retry, permanent ones
//! are recorded, and a rejected key stops the whole run.

use std::time::{Duration, SystemTime};

use reqwest::header::HeaderMap;
use reqwest::StatusCode;

use crate::rate::retry_after;
use crate::secret::Secret;

/// Why a call did not succeed, in the terms the pool acts on.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CallError {
    /// A 429 for pace (window overrun or cooldown): pause every worker, requeue.
    #[error("rate limited (HTTP 429{})", fmt_after(.retry_after))]
    RateLimited {
        /// The server's `Retry-After`, if it sent a usable one, uncapped:
        /// beyond [`QUOTA_BOUND`](crate::rate::policies::QUOTA_BOUND) it is
        /// a used-up quota's reset, not a pause.
        retry_after: Option<Duration>,
        /// What the server said, for the pause line (short, one line,
        /// without control characters).
        message: Option<String>,
    },
    /// A 429 for the concurrency ceiling: this worker waits, nobody else does.
    #[error("concurrency ceiling reached (HTTP 429, x-concurrency-limit)")]
    Concurrency {
        /// The server's `Retry-After`, if it sent a usable one.
        retry_after: Option<Duration>,
    },
    /// No credits left (429 with a credit header ≤ 0, or 402): halt cleanly.
    #[error("credits exhausted (HTTP {status})")]
    CreditsExhausted {
        /// 429 or 402.
        status: u16,
    },
    /// The API refused the call: 401, 403, or a 402 that does not say the
    /// credits are gone (an add-on this item needs). Whether the key or
    /// only this item is refused depends on whether other calls of the run
    /// got through: [`crate::run`] decides.
    #[error("HTTP {status}: {reason}")]
    Refused {
        /// 401, 402 or 403.
        status: u16,
        /// The server's words (or the status's name).
        reason: String,
    },
    /// Worth retrying: 5xx, 408, a timeout or a dropped connection.
    #[error("{reason}")]
    Transient {
        /// What happened, for the failures file.
        reason: String,
        /// The HTTP status, when there was a response.
        status: Option<u16>,
        /// The server's `Retry-After`, if it sent one.
        retry_after: Option<Duration>,
        /// The call may have run: it went out and no verdict came back (a
        /// timeout, a connection lost after sending, a gateway timeout, the
        /// key still executing). Its retries, and `--retry-failed`, keep its
        /// Idempotency-Key so the server can answer with what it did.
        unknown: bool,
    },
    /// An answer came that cannot be read (see
    /// [`crate::transport::FailureKind::Unreadable`]): the call ran or may
    /// have, and sending it again would bring the same answer.
    #[error("{reason}")]
    Unreadable {
        /// What could not be read.
        reason: String,
    },
    /// Retrying cannot help: any other 4xx.
    #[error("HTTP {status}: {reason}")]
    Permanent {
        /// The status code.
        status: u16,
        /// A short reason (the body's error message when it has one).
        reason: String,
    },
}

fn fmt_after(d: &Option<Duration>) -> String {
    d.map(|d| format!(", retry after {}s", d.as_secs_f64()))
        .unwrap_or_default()
}

fn header_str<'a>(h: &'a HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name).and_then(|v| v.to_str().ok())
}

/// Whether a response is the rate limiter's refusal (what [`classify`]
/// calls [`CallError::RateLimited`]): a 429 that says neither that the
/// credits ran out nor that the concurrency ceiling was reached, or a 403
/// or a 503 that is a rate limit's (see `limited_403`, `limited_503`).
pub fn is_rate_limited(code: u16, headers: &HeaderMap, body: &str) -> bool {
    match code {
        429 => {
            !crate::wire::exhausted_by_headers(headers)
                && !headers.contains_key("x-concurrency-limit")
        }
        403 => {
            let now = SystemTime::now();
            limited_403(headers, body, retry_after_header(headers, now), now).is_some()
        }
        503 => limited_503(body),
        _ => false,
    }
}

/// The response's `Retry-After`, uncapped (beyond the cap it is a used-up
/// quota's reset). An HTTP-date is on the server's clock: measured from
/// the response's `Date` where it has a sane one.
fn retry_after_header(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let unix = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    let server = crate::rate::announce::server_now(headers, unix)
        .map_or(now, |d| SystemTime::UNIX_EPOCH + d);
    header_str(headers, "retry-after").and_then(|v| retry_after::parse_uncapped(v, server))
}

/// How long a 403 that is a rate limit's asks to wait (`said`: its
/// `Retry-After`); `None` for any other 403, which refuses the key or the
/// call. GitHub answers its limits with a 403 as often as a 429, with a
/// `Retry-After` (its secondary limits) or a quota stated used up
/// (`X-RateLimit-Remaining: 0`, its primary one), always beside its
/// `X-RateLimit-*` fields: a 403 asking to wait is a rate limit's only
/// where it states a limit too, or says "rate limit" (a firewall's 403
/// with a `Retry-After` for one item would otherwise be sent again for
/// ever).
fn limited_403(
    headers: &HeaderMap,
    body: &str,
    said: Option<Duration>,
    now: SystemTime,
) -> Option<Duration> {
    let stated = stated(headers, now);
    let wait = (said.or_else(|| retry_after_ms(headers))).or_else(|| used_up_reset(&stated))?;
    (!stated.is_empty() || body.to_ascii_lowercase().contains("rate limit")).then_some(wait)
}

/// Whether a 503 is a rate limiter's refusal, paced as a 429 is. nginx's
/// `limit_req` answers 503 unless told `limit_req_status 429`, with
/// nginx's own page; S3 asks to "slow down"; a server may say "rate limit"
/// or "too many requests". nginx's page is served in an outage too (its
/// `return 503`, an ingress with no backend), which a run then waits out
/// as a spell of 429s (`run::react`) instead of failing items. Any other
/// 503 (the API's own body: overloaded, a deploy) stays a passing failure,
/// retried with backoff; so does one that states a quota used up (an
/// API's overload 503 carries its rate headers too).
fn limited_503(body: &str) -> bool {
    const NGINX_PAGE: &str = "<title>503 Service Temporarily Unavailable</title>";
    const SAYS: [&str; 5] = [
        "rate limit",
        "rate-limit",
        "too many requests",
        "slow down",
        "slowdown",
    ];
    let words = body.to_ascii_lowercase();
    // At a word's start: "separate limit" says no "rate limit".
    let said = |w: &str| {
        words.match_indices(w).any(|(i, _)| {
            !words[..i]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_ascii_alphanumeric())
        })
    };
    body.contains(NGINX_PAGE) || SAYS.iter().any(|w| said(w))
}

/// The policies a response states, in any dialect, read at `now`.
fn stated(headers: &HeaderMap, now: SystemTime) -> Vec<crate::rate::announce::Announced> {
    let unix = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    crate::rate::announce::read(headers, unix)
}

/// OpenAI's `retry-after-ms`.
fn retry_after_ms(headers: &HeaderMap) -> Option<Duration> {
    header_str(headers, "retry-after-ms")
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|ms| ms.is_finite() && *ms >= 0.0)
        .map(|ms| {
            Duration::from_secs_f64((ms / 1000.0).min(retry_after::MAX_QUOTA_RESET.as_secs_f64()))
        })
}

/// The latest reset of the quotas `stated` used up (`remaining` 0, in any
/// dialect: IETF `RateLimit: r=0;t=1`, GitHub's `X-RateLimit-Reset`,
/// OpenAI's and Anthropic's per unit).
fn used_up_reset(stated: &[crate::rate::announce::Announced]) -> Option<Duration> {
    use crate::rate::announce::Unit;
    (stated.iter())
        .filter(|a| a.remaining == Some(0) && a.unit != Unit::Other)
        .filter_map(|a| a.reset_in)
        .max()
}

/// When a 429's quota is back, by its headers: the latest reset of the
/// quotas it states used up; else, where it states no quota at all, the
/// reset it states alone (`X-RateLimit-Reset` and nothing else: the 429 is
/// itself the word that nothing is left).
fn refused_reset(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let stated = stated(headers, now);
    if !stated.is_empty() {
        return used_up_reset(&stated);
    }
    let unix = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    // A reset already past (a skewed clock, `0`) says nothing of when:
    // the default pause, not none.
    crate::rate::announce::reset_alone(headers, unix)
        .filter(|r| !r.is_zero())
        .map(|r| r.min(retry_after::MAX_QUOTA_RESET))
}

/// How long a 429's message asks to wait, where its headers do not say:
/// OpenAI's "... Please try again in 240ms." (its token 429s carry no
/// `Retry-After` when less is left than a call asks, yet not nothing).
fn asked_in_body(body: &str) -> Option<Duration> {
    const ASK: &str = "try again in ";
    let at = body.find(ASK)? + ASK.len();
    let word = body[at..]
        .split(|c: char| c.is_whitespace() || matches!(c, '"' | ',' | ')'))
        .next()?;
    // A unit is part of the word ("240ms", "1.5s", "6m0s"): "in 5
    // minutes" is not five seconds.
    let word = word.trim_end_matches('.');
    let d = (word.ends_with(|c: char| c.is_ascii_alphabetic()))
        .then(|| crate::rate::announce::go_duration(word))??;
    Some(d.min(retry_after::MAX_QUOTA_RESET))
}

/// Classifies a response by status and headers. `body` is used only to give
/// a failure a readable reason, from which `key` is kept out.
pub fn classify(
    status: StatusCode,
    headers: &HeaderMap,
    body: &str,
    now: SystemTime,
    key: Option<&Secret>,
) -> Result<(), CallError> {
    // Read once: a rate-limit 429 keeps it uncapped (beyond the cap it is
    // a used-up quota's reset), everything else as a pause.
    let said = retry_after_header(headers, now);
    let retry_after = said.map(retry_after::capped);
    let code = status.as_u16();
    let limited = (code == 403)
        .then(|| limited_403(headers, body, said, now))
        .flatten();
    match code {
        200..=299 => Ok(()),
        402 if crate::wire::exhausted_by_headers(headers) || says_credits_exhausted(body) => {
            Err(CallError::CreditsExhausted { status: code })
        }
        403 if limited.is_some() => Err(CallError::RateLimited {
            retry_after: limited,
            message: short_reason(body, key, SHORT),
        }),
        401..=403 => Err(CallError::Refused {
            status: code,
            reason: reason_or_name(status, body, key),
        }),
        429 if crate::wire::exhausted_by_headers(headers) || says_credits_exhausted(body) => {
            Err(CallError::CreditsExhausted { status: code })
        }
        429 if headers.contains_key("x-concurrency-limit") => {
            Err(CallError::Concurrency { retry_after })
        }
        429 => Err(CallError::RateLimited {
            retry_after: (said.or_else(|| retry_after_ms(headers)))
                .or_else(|| asked_in_body(body))
                .or_else(|| refused_reset(headers, now)),
            message: short_reason(body, key, SHORT),
        }),
        503 if limited_503(body) => Err(CallError::RateLimited {
            retry_after: (said.or_else(|| retry_after_ms(headers)))
                .or_else(|| refused_reset(headers, now)),
            message: short_reason(body, key, SHORT),
        }),
        408 | 500..=599 => Err(transient(code, body, retry_after, key)),
        // A 409 with Retry-After is the server saying the same
        // Idempotency-Key is still executing: the outcome is coming, so ask
        // again later under the same key. A bare 409 is a real conflict.
        409 if retry_after.is_some() => Err(transient(code, body, retry_after, key)),
        _ => Err(CallError::Permanent {
            status: code,
            reason: reason_or_name(status, body, key),
        }),
    }
}

/// A verdict of [`classify`] read against the run's balance: a 402 that
/// says nothing of credits (no credit header, no credits-spent code, so
/// [`classify`] made it a refusal) is the account's when the run's last
/// word on credits is that they are gone (`spent`, see
/// [`crate::credits::Ledger::spent`]). Many APIs state the balance on
/// their successes down to 0, then answer a bare 402: taken as each
/// item's refusal, it would fail every item left. Any other verdict
/// stands.
pub fn against_balance(
    verdict: Result<(), CallError>,
    headers: &HeaderMap,
    spent: bool,
) -> Result<(), CallError> {
    let states_credits = [
        &crate::wire::REMAINING_CREDITS,
        &crate::wire::CREDITS_USED,
        &crate::wire::MAX_CREDITS,
    ]
    .iter()
    .any(|h| headers.contains_key(*h));
    match verdict {
        Err(CallError::Refused { status: 402, .. }) if spent && !states_credits => {
            Err(CallError::CreditsExhausted { status: 402 })
        }
        v => v,
    }
}

/// The server's words, or the status's name when it said nothing.
fn reason_or_name(status: StatusCode, body: &str, key: Option<&Secret>) -> String {
    short_reason(body, key, SHORT).unwrap_or_else(|| {
        status
            .canonical_reason()
            .unwrap_or("unexpected status")
            .to_string()
    })
}

/// The codes an API's body gives for a balance or billing quota spent, not
/// a rate: the sim's, and OpenAI's 429 `insufficient_quota` (whose calls
/// wait for a top-up, not for a window).
const CREDITS_SPENT: [&str; 4] = [
    "credits_exhausted",
    "insufficient_quota",
    "insufficient_credits",
    "billing_hard_limit_reached",
];

/// The API's own credits-exhausted answer, for APIs that send no credit
/// headers: a JSON body whose `code` or `type`, at its top or in its
/// `error` object, is one of [`CREDITS_SPENT`].
fn says_credits_exhausted(body: &str) -> bool {
    let Ok(v) = serde_json::from_str::<serde_json::Value>(body) else {
        return false;
    };
    let spent = |o: &serde_json::Value| {
        ["code", "type"]
            .iter()
            .filter_map(|k| o.get(k)?.as_str())
            .any(|c| CREDITS_SPENT.contains(&c))
    };
    spent(&v) || v.get("error").is_some_and(spent)
}

fn transient(
    code: u16,
    body: &str,
    retry_after: Option<Duration>,
    key: Option<&Secret>,
) -> CallError {
    let head = format!("HTTP {code}");
    // The whole reason, "HTTP 503: " included, keeps to SHORT.
    let room = SHORT.saturating_sub(head.len() + 2);
    CallError::Transient {
        // A gateway gave up waiting for the API, or the key is still
        // executing: either way the call may have run.
        unknown: matches!(code, 409 | 504),
        status: Some(code),
        reason: match short_reason(body, key, room) {
            Some(r) => format!("{head}: {r}"),
            None => head,
        },
        retry_after,
    }
}

/// A transport failure (timeout, refused, reset) is always worth a retry.
pub fn transport(err: &crate::transport::TransportError) -> CallError {
    use crate::transport::FailureKind;
    if err.kind == FailureKind::Unreadable {
        return CallError::Unreadable {
            reason: err.reason.clone(),
        };
    }
    CallError::Transient {
        reason: err.reason.clone(),
        status: None,
        retry_after: None,
        // Only a call that never reached the server is known not to have run.
        unknown: !matches!(err.kind, FailureKind::Connect | FailureKind::Resources),
    }
}

/// How much of a server's words a failure reason or pause line keeps.
const SHORT: usize = 200;

/// `s` cut to `room` characters.
fn cut(s: String, room: usize) -> String {
    match s.char_indices().nth(room) {
        Some((at, _)) => s[..at].to_string(),
        None => s,
    }
}

/// A server's cleaned words in at most `room` characters, with `key` kept
/// out: redacted where it stands whole (cleaning can join a key the
/// server split with invisible characters), and the whole message withheld
/// where the key is still spelled out with other characters woven in, or
/// its beginning is left where the words are cut.
fn keep_out(s: String, key: Option<&Secret>, room: usize) -> String {
    let Some(key) = key else {
        return cut(s, room);
    };
    let s = match key.found_in(&s) {
        true => key.redact(&s),
        false => s,
    };
    let was_cut = s.chars().nth(room).is_some();
    let s = cut(s, room);
    match key.woven_into(&s) || (was_cut && key.begun_at_end_of(&s)) {
        true => "(the server's message held the API key; not shown)".to_string(),
        false => s,
    }
}

/// Format characters a terminal acts on without showing: soft hyphens,
/// bidirectional marks, overrides and isolates, zero-width marks, line and
/// paragraph separators, interlinear annotations.
fn invisible(c: char) -> bool {
    matches!(
        c,
        '\u{00AD}'
            | '\u{0300}'..='\u{036F}'
            | '\u{061C}'
            | '\u{115F}'..='\u{1160}'
            | '\u{180B}'..='\u{180F}'
            | '\u{200B}'..='\u{200F}'
            | '\u{2028}'..='\u{202E}'
            | '\u{2060}'..='\u{206F}'
            | '\u{3164}'
            | '\u{FE00}'..='\u{FE0F}'
            | '\u{FEFF}'
            | '\u{FFA0}'
            | '\u{FFF9}'..='\u{FFFB}'
            | '\u{1D173}'..='\u{1D17A}'
            | '\u{E0000}'..='\u{E0FFF}'
    )
}

/// `text` without terminal escape sequences (7- and 8-bit: CSI up to its
/// final byte; OSC, DCS, SOS, PM and APC up to their terminator; SS2 and
/// SS3 with the character they shift; any other `ESC x`), control
/// characters and invisible format characters: what is left is what a
/// reader sees.
fn visible(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        // The 7-bit form `ESC x` of each 8-bit introducer.
        let intro = match c {
            '\u{1b}' => match chars.next() {
                Some(x @ '\u{40}'..='\u{5f}') => {
                    char::from_u32(u32::from(x) + 0x40).unwrap_or('\u{80}')
                }
                _ => continue,
            },
            '\u{80}'..='\u{9f}' => c,
            _ => {
                if !c.is_control() && !invisible(c) {
                    out.push(c);
                }
                continue;
            }
        };
        match intro {
            // CSI: parameters and intermediates, then one final byte.
            '\u{9b}' => {
                for c in chars.by_ref() {
                    if ('\u{40}'..='\u{7e}').contains(&c) {
                        break;
                    }
                }
            }
            // DCS, SOS, OSC, PM, APC: a string up to BEL or ST.
            '\u{90}' | '\u{98}' | '\u{9d}' | '\u{9e}' | '\u{9f}' => {
                while let Some(c) = chars.next() {
                    let st = c == '\u{9c}' || (c == '\u{1b}' && chars.next_if_eq(&'\\').is_some());
                    if c == '\u{7}' || st {
                        break;
                    }
                }
            }
            // SS2, SS3: the next character is drawn from another set.
            '\u{8e}' | '\u{8f}' => {
                chars.next();
            }
            _ => {}
        }
    }
    out
}

/// The words of an HTML page (a proxy's or nginx's error page): its title,
/// else its text without the tags (empty: none). Its first line was
/// quoted, `<html>`.
fn html_words(body: &str) -> Option<String> {
    let t = body.trim_start();
    if !t.starts_with('<') {
        return None;
    }
    let lower = t.to_ascii_lowercase();
    let title = lower.find("<title>").and_then(|i| {
        let from = i + "<title>".len();
        let len = lower[from..].find("</title>")?;
        t.get(from..from + len)
    });
    let text = match title.map(str::trim).filter(|s| !s.is_empty()) {
        Some(s) => s.to_string(),
        None => {
            let mut out = String::new();
            let mut in_tag = false;
            for c in t.chars() {
                match c {
                    '<' => in_tag = true,
                    '>' => {
                        in_tag = false;
                        out.push(' ');
                    }
                    c if !in_tag => out.push(c),
                    _ => {}
                }
            }
            out.split_whitespace().collect::<Vec<_>>().join(" ")
        }
    };
    // A page with no words says nothing: not its first line either.
    Some(text)
}

/// The `error` or `message` field of a JSON error body, the words of an
/// HTML one, or the first line of a text body, trimmed to something a
/// failures file can hold.
fn short_reason(body: &str, key: Option<&Secret>, room: usize) -> Option<String> {
    // `{"error": "..."}`, `{"message": "..."}`, or OpenAI's and
    // Anthropic's `{"error": {"message": "...", "type": ...}}`: the words,
    // not the JSON around them.
    let from_json = serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| {
            ["error", "message", "detail"].iter().find_map(|k| {
                let m = v.get(k)?;
                let m = m.get("message").unwrap_or(m);
                m.as_str().map(str::to_string)
            })
        });
    let text = from_json
        .or_else(|| html_words(body))
        .or_else(|| body.lines().next().map(str::to_string))?;
    // A server's words go into logs and terminals: no escape sequences, no
    // line breaks of their own, nothing that reorders what follows.
    // Cut generously here; the key is looked for in what is kept, and only
    // then is it cut to `room`.
    let text: String = visible(text.trim())
        .trim()
        .chars()
        .take(4 * SHORT)
        .collect();
    (!text.is_empty()).then(|| keep_out(text, key, room))
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::{HeaderName, HeaderValue};

    /// An HTML error page (nginx's `limit_req` answers one) is quoted by
    /// its title, else its words: its first line, `<html>`, was quoted.
    #[test]
    fn an_html_page_is_quoted_by_its_words() {
        let nginx = "<html>\r\n<head><title>503 Service Temporarily Unavailable</title></head>\r\n\
                     <body>\r\n<center><h1>503 Service Temporarily Unavailable</h1></center>\r\n\
                     <hr><center>nginx/1.22.1</center>\r\n</body>\r\n</html>\r\n";
        assert_eq!(
            short_reason(nginx, None, SHORT).as_deref(),
            Some("503 Service Temporarily Unavailable")
        );
        assert_eq!(
            short_reason("<p>Too many\n requests</p>", None, SHORT).as_deref(),
            Some("Too many requests")
        );
        assert_eq!(short_reason("<html></html>", None, SHORT), None);
        assert_eq!(
            short_reason("slow down", None, SHORT).as_deref(),
            Some("slow down")
        );
    }

    fn h(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut m = HeaderMap::new();
        for (k, v) in pairs {
            m.insert(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        m
    }

    fn c(code: u16, pairs: &[(&str, &str)], body: &str) -> Result<(), CallError> {
        classify(
            StatusCode::from_u16(code).unwrap(),
            &h(pairs),
            body,
            SystemTime::now(),
            None,
        )
    }

    #[test]
    fn a_bare_402_is_the_accounts_once_the_balance_read_0() {
        let bare = || c(402, &[], r#"{"error":{"code":"payment_required"}}"#);
        assert_eq!(
            against_balance(bare(), &h(&[]), true),
            Err(CallError::CreditsExhausted { status: 402 })
        );
        // Credits were left at the last word: an add-on its item needs.
        assert!(matches!(
            against_balance(bare(), &h(&[]), false),
            Err(CallError::Refused { status: 402, .. })
        ));
        // The 402 states a balance of its own, and it is not spent.
        let told = [
            ("x-api-remaining-credits", "5"),
            ("x-api-max-credits", "10"),
        ];
        assert!(matches!(
            against_balance(c(402, &told, "{}"), &h(&told), true),
            Err(CallError::Refused { status: 402, .. })
        ));
        // A 403 stays a refusal, whatever the balance.
        assert!(matches!(
            against_balance(c(403, &[], "{}"), &h(&[]), true),
            Err(CallError::Refused { status: 403, .. })
        ));
    }

    /// As [`c`], for a run whose key is `key`.
    fn ck(code: u16, body: &str, key: &Secret) -> CallError {
        classify(
            StatusCode::from_u16(code).unwrap(),
            &h(&[]),
            body,
            SystemTime::now(),
            Some(key),
        )
        .unwrap_err()
    }

    #[test]
    fn success() {
        assert_eq!(c(200, &[], ""), Ok(()));
        assert_eq!(c(204, &[], ""), Ok(()));
    }

    /// The pacer is told a call was refused by the rate limiter exactly
    /// when the classifier says so.
    #[test]
    fn is_rate_limited_agrees_with_the_classifier() {
        let cases: [(u16, &[(&str, &str)]); 8] = [
            (
                429,
                &[("retry-after", "7"), ("x-api-remaining-credits", "12")],
            ),
            (403, &[("retry-after", "5")]),
            (
                403,
                &[("x-ratelimit-remaining", "0"), ("x-ratelimit-reset", "60")],
            ),
            (
                403,
                &[("x-ratelimit-remaining", "3"), ("x-ratelimit-reset", "60")],
            ),
            (
                429,
                &[("retry-after", "7"), ("x-api-remaining-credits", "0")],
            ),
            (429, &[("retry-after", "1"), ("x-concurrency-limit", "5")]),
            (429, &[]),
            (503, &[("retry-after", "1")]),
        ];
        for (code, pairs) in cases {
            let limited = matches!(c(code, pairs, ""), Err(CallError::RateLimited { .. }));
            assert_eq!(
                is_rate_limited(code, &h(pairs), ""),
                limited,
                "{code} {pairs:?}"
            );
        }
    }

    /// GitHub's rate limits answer 403 as often as 429: its secondary
    /// limit with a `Retry-After`, its primary one with
    /// `X-RateLimit-Remaining: 0` and the reset in epoch seconds. Each is
    /// a rate limit waited out; a 403 saying neither refuses the key (it
    /// stopped the run as "the API rejected the key", or failed items).
    #[test]
    fn a_403_that_asks_to_wait_or_states_a_quota_used_up_is_a_rate_limit() {
        let limited = |r: Result<(), CallError>| match r {
            Err(CallError::RateLimited { retry_after, .. }) => retry_after,
            other => panic!("{other:?}"),
        };
        let secondary = c(
            403,
            &[("retry-after", "5")],
            r#"{"message": "secondary rate limit"}"#,
        );
        assert_eq!(limited(secondary), Some(Duration::from_secs(5)));
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap();
        let reset = (now.as_secs() + 120).to_string();
        let primary = c(
            403,
            &[
                ("x-ratelimit-limit", "60"),
                ("x-ratelimit-remaining", "0"),
                ("x-ratelimit-used", "60"),
                ("x-ratelimit-reset", &reset),
                ("x-ratelimit-resource", "core"),
            ],
            r#"{"message": "API rate limit exceeded"}"#,
        );
        let wait = limited(primary).expect("the reset");
        assert!(
            wait > Duration::from_secs(110) && wait <= Duration::from_secs(121),
            "{wait:?}"
        );
        for refused in [
            c(403, &[], r#"{"message": "Bad credentials"}"#),
            // A firewall's refusal of one item, asking to wait: no limit
            // stated, none named. Sent again, it would be refused for ever.
            c(403, &[("retry-after", "60")], "Request blocked."),
            c(
                403,
                &[
                    ("x-ratelimit-remaining", "59"),
                    ("x-ratelimit-reset", &reset),
                ],
                "",
            ),
        ] {
            assert!(
                matches!(refused, Err(CallError::Refused { status: 403, .. })),
                "{refused:?}"
            );
        }
    }

    /// nginx's `limit_req` refuses with a 503 and its own page unless told
    /// `limit_req_status 429`: a rate limit, paced as a 429 (before, each
    /// was a passing failure, retried with backoff while the pace went on:
    /// 56 of them in 210 calls behind nginx with no burst). So is a 503
    /// saying "slow down" (S3) or "rate limit"; an API's own 503 is not,
    /// whatever its rate headers say.
    #[test]
    fn a_503_from_a_limiter_is_a_rate_limit_and_an_apis_own_is_not() {
        let nginx = "<html>\r\n<head><title>503 Service Temporarily Unavailable</title></head>\r\n\
                     <body>\r\n<center><h1>503 Service Temporarily Unavailable</h1></center>\r\n\
                     <hr><center>nginx/1.22.1</center>\r\n</body>\r\n</html>\r\n";
        let s3 = "<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>";
        let words = r#"{"error": "Rate limit exceeded, please wait"}"#;
        for (pairs, body) in [
            (&[][..], nginx),
            (&[("retry-after", "2")][..], s3),
            (&[][..], words),
        ] {
            let got = c(503, pairs, body);
            assert!(matches!(got, Err(CallError::RateLimited { .. })), "{got:?}");
            assert!(is_rate_limited(503, &h(pairs), body), "{body}");
        }
        assert!(matches!(
            c(503, &[("retry-after", "2")], s3),
            Err(CallError::RateLimited { retry_after: Some(d), .. }) if d == Duration::from_secs(2)
        ));
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap();
        let reset = (now.as_secs() + 30).to_string();
        let own = r#"{"error": "the service is overloaded, try again later"}"#;
        // An API's overload 503 carries its rate headers too.
        let used_up = [
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", &reset[..]),
        ];
        for (pairs, body) in [
            (&[][..], own),
            (&used_up[..], own),
            (
                &[][..],
                "<html><head><title>503 Service Unavailable</title></head></html>",
            ),
            (&[][..], r#"{"error": "a separate limit on this account"}"#),
        ] {
            let got = c(503, pairs, body);
            assert!(matches!(got, Err(CallError::Transient { .. })), "{got:?}");
            assert!(!is_rate_limited(503, &h(pairs), body));
        }
    }

    /// A 429 stating only when its quota resets (`X-RateLimit-Reset`, epoch
    /// seconds, three hours ahead; no `Remaining`, no `Retry-After`) waits
    /// for that reset, which beyond the cap halts the run saying until when.
    /// Before, it paused a window and asked again for `--max-wait` (an
    /// adversarial run: 33 calls in 30 s, then "nothing but rate limits").
    /// A quota stated with some left is not the one that refused.
    #[test]
    fn a_429_stating_only_its_reset_waits_for_it() {
        let limited = |r: Result<(), CallError>| match r {
            Err(CallError::RateLimited { retry_after, .. }) => retry_after,
            other => panic!("{other:?}"),
        };
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap();
        let reset = (now.as_secs() + 3 * 3600).to_string();
        let wait = limited(c(429, &[("x-ratelimit-reset", &reset)], "")).expect("the reset");
        assert!(
            wait > Duration::from_secs(3 * 3600 - 10) && wait <= Duration::from_secs(3 * 3600 + 1),
            "{wait:?}"
        );
        let some_left = c(
            429,
            &[
                ("x-ratelimit-remaining", "3"),
                ("x-ratelimit-reset", &reset),
            ],
            "",
        );
        assert_eq!(limited(some_left), None);
        assert_eq!(
            limited(c(429, &[("ratelimit-reset", "7")], "")),
            Some(Duration::from_secs(7))
        );
        // Past already: no wait of nothing, the default pause.
        assert_eq!(limited(c(429, &[("x-ratelimit-reset", "0")], "")), None);
    }

    /// A `Retry-After` HTTP-date is on the server's clock: from a server an
    /// hour ahead of this one, a date 5 s after its own `Date` is a pause of
    /// 5 s, not a quota used up for an hour (a run halted on it, exit 75).
    #[test]
    fn a_retry_after_date_is_measured_from_the_responses_date() {
        let now = SystemTime::now();
        let ahead = now + Duration::from_secs(3600);
        let pairs = [
            ("date", httpdate::fmt_http_date(ahead)),
            (
                "retry-after",
                httpdate::fmt_http_date(ahead + Duration::from_secs(5)),
            ),
        ];
        let pairs: Vec<(&str, &str)> = pairs.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let wait = match classify(StatusCode::TOO_MANY_REQUESTS, &h(&pairs), "", now, None) {
            Err(CallError::RateLimited { retry_after, .. }) => retry_after,
            other => panic!("{other:?}"),
        };
        // `Date` is truncated to the second: up to a second long.
        let wait = wait.expect("a pause");
        assert!(
            wait >= Duration::from_secs(5) && wait <= Duration::from_secs(6),
            "{wait:?}"
        );
    }

    /// A 429 with no `Retry-After` waits what else its headers ask:
    /// OpenAI's `retry-after-ms`, else the reset of the quota it states
    /// used up. It paused the default (a window, up to a minute) where
    /// the server asked for 821 ms or a second.
    #[test]
    fn a_429_without_retry_after_waits_what_its_other_headers_ask() {
        let wait = |pairs: &[(&str, &str)]| match c(429, pairs, "") {
            Err(CallError::RateLimited { retry_after, .. }) => retry_after,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            wait(&[("retry-after-ms", "821")]),
            Some(Duration::from_millis(821))
        );
        let ietf = [
            ("ratelimit-policy", r#""p";q=10;w=1"#),
            ("ratelimit", r#""p";r=0;t=1"#),
        ];
        assert_eq!(wait(&ietf), Some(Duration::from_secs(1)));
        let openai = [
            ("x-ratelimit-limit-requests", "1000"),
            ("x-ratelimit-remaining-requests", "990"),
            ("x-ratelimit-reset-requests", "600ms"),
            ("x-ratelimit-limit-tokens", "20000"),
            ("x-ratelimit-remaining-tokens", "0"),
            ("x-ratelimit-reset-tokens", "180ms"),
        ];
        assert_eq!(wait(&openai), Some(Duration::from_millis(180)));
        assert_eq!(
            wait(&[("retry-after", "7"), ("retry-after-ms", "1")]),
            Some(Duration::from_secs(7))
        );
        for nothing in [
            &[][..],
            &[("retry-after-ms", "soon")][..],
            &[("x-ratelimit-remaining", "4"), ("x-ratelimit-reset", "3")][..],
        ] {
            assert_eq!(wait(nothing), None, "{nothing:?}");
        }
    }

    /// OpenAI's token 429 when less is left than the call asks, yet not
    /// nothing: no `Retry-After`, and the wait in its message. It paused
    /// a window (60 s) where 240 ms was asked.
    #[test]
    fn a_429_whose_message_asks_a_wait_waits_it() {
        let wait = |body: &str, pairs: &[(&str, &str)]| match c(429, pairs, body) {
            Err(CallError::RateLimited { retry_after, .. }) => retry_after,
            other => panic!("{other:?}"),
        };
        let openai = |ask: &str| {
            format!(
                r#"{{"error": {{"message": "Rate limit reached for gpt-4o-mini in organization org-x on tokens per min (TPM): Limit 20000, Used 19765, Requested 315. Please try again in {ask} Visit https://platform.openai.com/account/rate-limits to learn more.", "type": "tokens", "code": "rate_limit_exceeded"}}}}"#
            )
        };
        let tokens = [
            ("x-ratelimit-remaining-tokens", "235"),
            ("x-ratelimit-reset-tokens", "59.3s"),
        ];
        assert_eq!(
            wait(&openai("240ms."), &tokens),
            Some(Duration::from_millis(240))
        );
        assert_eq!(
            wait(&openai("1.054s."), &[]),
            Some(Duration::from_millis(1054))
        );
        assert_eq!(wait(&openai("6m0s."), &[]), Some(Duration::from_secs(360)));
        for vague in ["5 minutes.", "a moment.", "1e400s.", ""] {
            assert_eq!(wait(&openai(vague), &[]), None, "{vague}");
        }
        assert_eq!(
            wait(&openai("240ms."), &[("retry-after", "2")]),
            Some(Duration::from_secs(2)),
            "Retry-After first"
        );
    }

    #[test]
    fn rate_limit_vs_credits_vs_concurrency() {
        assert_eq!(
            c(
                429,
                &[("retry-after", "7"), ("x-api-remaining-credits", "12")],
                ""
            ),
            Err(CallError::RateLimited {
                retry_after: Some(Duration::from_secs(7)),
                message: None,
            })
        );
        assert_eq!(
            c(
                429,
                &[("retry-after", "7"), ("x-api-remaining-credits", "0")],
                ""
            ),
            Err(CallError::CreditsExhausted { status: 429 })
        );
        assert_eq!(
            c(429, &[("x-api-remaining-credits", "-3")], ""),
            Err(CallError::CreditsExhausted { status: 429 })
        );
        assert_eq!(
            c(402, &[("x-api-remaining-credits", "0")], ""),
            Err(CallError::CreditsExhausted { status: 402 })
        );
        assert_eq!(
            c(
                402,
                &[],
                r#"{"error":"out of credits","code":"credits_exhausted"}"#
            ),
            Err(CallError::CreditsExhausted { status: 402 })
        );
        // A 402 that does not say the credits are gone is about this call.
        assert_eq!(
            c(
                402,
                &[("x-api-remaining-credits", "40")],
                r#"{"error":"needs the Geo add-on"}"#
            ),
            Err(CallError::Refused {
                status: 402,
                reason: "needs the Geo add-on".into()
            })
        );
        assert_eq!(
            c(
                429,
                &[("retry-after", "1"), ("x-concurrency-limit", "5")],
                ""
            ),
            Err(CallError::Concurrency {
                retry_after: Some(Duration::from_secs(1))
            })
        );
        // No usable Retry-After: the pool falls back to its own default.
        assert_eq!(
            c(429, &[("retry-after", "whenever")], ""),
            Err(CallError::RateLimited {
                retry_after: None,
                message: None,
            })
        );
    }

    #[test]
    fn a_409_for_a_key_in_flight_is_transient_a_bare_one_permanent() {
        assert_eq!(
            c(409, &[("retry-after", "2")], "{\"error\":\"in progress\"}"),
            Err(CallError::Transient {
                reason: "HTTP 409: in progress".into(),
                status: Some(409),
                retry_after: Some(Duration::from_secs(2)),
                unknown: true,
            })
        );
        assert!(matches!(
            c(409, &[], "conflict"),
            Err(CallError::Permanent { status: 409, .. })
        ));
    }

    #[test]
    fn only_calls_that_may_have_run_are_of_unknown_outcome() {
        use crate::transport::{FailureKind, TransportError};
        let unknown = |c: Result<(), CallError>| match c {
            Err(CallError::Transient { unknown, .. }) => unknown,
            other => panic!("not transient: {other:?}"),
        };
        assert!(unknown(c(504, &[], "")), "the gateway gave up waiting");
        assert!(!unknown(c(503, &[], "")), "the server answered: not run");
        assert!(!unknown(c(408, &[], "")));
        for (kind, may_have_run) in [
            (FailureKind::Timeout, true),
            (FailureKind::Body, true),
            (FailureKind::Other, true),
            (FailureKind::Connect, false),
            (FailureKind::Resources, false),
        ] {
            let e = TransportError {
                kind,
                reason: "x".into(),
            };
            assert_eq!(unknown(Err(transport(&e))), may_have_run, "{kind:?}");
        }
    }

    #[test]
    fn a_429_whose_body_says_the_balance_is_spent_halts_on_credits() {
        let openai = r#"{"error": {"message": "You exceeded your current quota, please check your plan and billing details.", "type": "insufficient_quota", "param": null, "code": "insufficient_quota"}}"#;
        for body in [openai, r#"{"code": "credits_exhausted"}"#] {
            assert_eq!(
                c(429, &[], body),
                Err(CallError::CreditsExhausted { status: 429 }),
                "{body}"
            );
        }
        // A rate limit's own words, or a code about the rate, stay a rate limit.
        for body in [
            r#"{"error": {"type": "rate_limit_error", "message": "quota of requests per minute"}}"#,
            r#"{"error": {"code": "rate_limit_exceeded"}}"#,
            "insufficient_quota",
        ] {
            assert!(
                matches!(c(429, &[], body), Err(CallError::RateLimited { .. })),
                "{body}"
            );
        }
    }

    #[test]
    fn a_rate_limit_carries_the_servers_words_cleaned() {
        let said = |body: &str| match c(429, &[], body) {
            Err(CallError::RateLimited { message, .. }) => message,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            said("{\"error\":\"Rate limit exceeded: 600 per minute\"}").as_deref(),
            Some("Rate limit exceeded: 600 per minute")
        );
        assert_eq!(
            said("slow down\x1b[2J\x07 please\nsecond line").as_deref(),
            Some("slow down please")
        );
        assert_eq!(said(""), None);
        // OpenAI's and Anthropic's error objects: their message alone.
        assert_eq!(
            said(r#"{"error": {"message": "Rate limit reached for requests", "type": "requests", "code": "rate_limit_exceeded"}}"#).as_deref(),
            Some("Rate limit reached for requests")
        );
        assert_eq!(
            said(r#"{"type": "error", "error": {"type": "rate_limit_error", "message": "Number of request tokens has exceeded your per-minute rate limit"}}"#).as_deref(),
            Some("Number of request tokens has exceeded your per-minute rate limit")
        );
        assert_eq!(
            said("abc\u{202E}def\u{2066}\u{2028}!").as_deref(),
            Some("abcdef!"),
            "no reordering of the log line"
        );
        assert_eq!(
            said("a\x1b[0;31mb\x1b]0;title\x07c\x1b]8;;x\x1b\\d\u{00AD}e").as_deref(),
            Some("abcde"),
            "whole escape sequences go, not just their ESC"
        );
        assert_eq!(
            said("a\u{9b}31mb\x1bPq#0\x1b\\c\x1bOAd\u{E0061}e\u{FE0F}f\u{0301}g").as_deref(),
            Some("abcdefg"),
            "8-bit CSI, DCS, SS3, tags, variation selectors, combining marks"
        );
    }

    #[test]
    fn a_key_joined_by_cleaning_the_servers_words_is_redacted() {
        let k = Secret::new("sk_abc123");
        // Split by a zero-width space and a bidi override: not the key as
        // sent, but the key once the message is cleaned.
        let body = r#"{"error":"bad key s\u200bk_abc\u202e123"}"#;
        for status in [400, 429, 503] {
            let e = ck(status, body, &k);
            let text = format!("{e:?}");
            assert!(!text.contains("sk_abc123"), "{text}");
            assert!(text.contains("***"), "{text}");
        }
    }

    #[test]
    fn a_key_cut_where_the_words_are_cut_is_withheld() {
        let k = Secret::new("sk_test_SECRET_abcdef123");
        let split: String = "sk_test_SECRET_abcdef123"
            .chars()
            .flat_map(|c| [c, '\u{200B}'])
            .collect();
        // Interleaved with a visible character the cleaning keeps.
        let dotted: String = "sk_test_SECRET_abcdef123"
            .chars()
            .flat_map(|c| [c, '\u{00B7}'])
            .collect();
        // Each straddles the 200th character, where the words are cut: the
        // split one is whole again once cleaned, the dotted one is not.
        for (key, shown) in [(&split, "***"), (&dotted, "not shown")] {
            let body = format!("{{\"error\":\"key {}{key} end\"}}", "x".repeat(170));
            for status in [400, 429, 503] {
                let e = ck(status, &body, &k);
                let text = format!("{e:?}");
                assert!(!text.contains("sk_test_SECRET"), "{text}");
                assert!(text.contains(shown), "{text}");
            }
        }
        // Words merely cut keep their first 200 characters.
        let long = format!("{{\"error\":\"{}\"}}", "y".repeat(500));
        match ck(400, &long, &k) {
            CallError::Permanent { reason, .. } => assert_eq!(reason.chars().count(), 200),
            other => panic!("{other:?}"),
        }
        match c(400, &[], &long).unwrap_err() {
            CallError::Permanent { reason, .. } => assert_eq!(reason.chars().count(), 200),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn auth_transient_permanent() {
        assert_eq!(
            c(401, &[], ""),
            Err(CallError::Refused {
                status: 401,
                reason: "Unauthorized".into()
            })
        );
        assert_eq!(
            c(403, &[], r#"{"error":"not your project"}"#),
            Err(CallError::Refused {
                status: 403,
                reason: "not your project".into()
            })
        );
        assert!(matches!(
            c(503, &[("retry-after", "2")], "busy"),
            Err(CallError::Transient { retry_after: Some(d), .. }) if d == Duration::from_secs(2)
        ));
        assert!(matches!(c(408, &[], ""), Err(CallError::Transient { .. })));
        assert_eq!(
            c(
                422,
                &[],
                r#"{"status":"error","error":"number must be an integer"}"#
            ),
            Err(CallError::Permanent {
                status: 422,
                reason: "number must be an integer".into()
            })
        );
        assert_eq!(
            c(404, &[], ""),
            Err(CallError::Permanent {
                status: 404,
                reason: "Not Found".into()
            })
        );
    }
}
