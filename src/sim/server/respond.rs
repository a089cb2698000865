//! Rendering: JSON bodies, the metered headers, and the refusals.
//!
//! With `--echo-key` every body goes through [`Echo`], which writes the
//! request's API key into it: a hostile server for testing that a client
//! never lets a key it gets back reach its logs or files.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use serde_json::{json, Value};

use super::super::model::{CreditView, Dialect, PolicyView, RateInfo, Rejection};
use crate::wire;

/// The API key to write into response bodies, if `--echo-key` is on and the
/// request had one.
#[derive(Debug, Clone, Default)]
pub(super) struct Echo(Option<String>);

/// Stands for the escaped key until the body is rendered.
const ESCAPED: &str = "\u{e000}batchrun-sim-escaped-key\u{e000}";

impl Echo {
    /// The raw `x-api-key` of `headers` when `on`, byte for byte (invalid
    /// UTF-8 replaced).
    pub(super) fn from_headers(on: bool, headers: &HeaderMap) -> Echo {
        if !on {
            return Echo(None);
        }
        let key = headers
            .get(wire::API_KEY)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
        Echo(key)
    }

    /// The key to echo, if any.
    pub(super) fn key(&self) -> Option<&str> {
        self.0.as_deref()
    }

    /// Adds the key to a JSON object body: as `key`, as `key_escaped` (the
    /// same, written with `\uXXXX` escapes, as some servers do), and
    /// appended to its `error` message.
    fn stamp(&self, body: &mut Value) {
        let (Some(key), Value::Object(o)) = (&self.0, body) else {
            return;
        };
        if let Some(Value::String(e)) = o.get_mut("error") {
            e.push_str(" for key ");
            e.push_str(key);
        }
        o.insert("key".into(), Value::String(key.clone()));
        o.insert("key_escaped".into(), Value::String(ESCAPED.into()));
    }

    /// `body` stamped with the key and rendered.
    fn render(&self, mut body: Value) -> String {
        self.stamp(&mut body);
        let text = serde_json::to_string(&body).unwrap_or_default();
        let Some(key) = &self.0 else {
            return text;
        };
        // serde_json never escapes plain ASCII: the escaped copy is put in
        // by hand, in place of a marker.
        let escaped: String = key.encode_utf16().map(|u| format!("\\u{u:04x}")).collect();
        text.replace(ESCAPED, &escaped)
    }

    /// A JSON response, stamped with the key.
    pub(super) fn json(&self, status: StatusCode, body: Value) -> Response {
        body_response(status, Body::from(self.render(body)))
    }

    /// A `{"status":"error","error":message}` response, stamped with the key.
    pub(super) fn error(&self, status: StatusCode, message: &str) -> Response {
        self.json(status, json!({"status": "error", "error": message}))
    }

    /// The body of a successful echo call, stamped with the key.
    pub(super) fn ok_body(&self, endpoint: &str, data: Value) -> Bytes {
        let body = json!({"status": "ok", "endpoint": endpoint, "data": data});
        Bytes::from(self.render(body))
    }

    /// [`Echo::ok_body`] with the call's token `usage`.
    pub(super) fn ok_body_with(&self, endpoint: &str, data: Value, usage: Value) -> Bytes {
        let body = json!({"status": "ok", "endpoint": endpoint, "data": data, "usage": usage});
        Bytes::from(self.render(body))
    }
}

/// A JSON response.
pub(super) fn json_response(status: StatusCode, body: &Value) -> Response {
    let bytes = serde_json::to_vec(body).unwrap_or_default();
    body_response(status, Body::from(bytes))
}

/// A response with a JSON body already rendered (or streamed).
pub(super) fn body_response(status: StatusCode, body: Body) -> Response {
    let mut r = Response::new(body);
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

/// The rate headers (when the key has a limit and it is not secret) and the
/// four credit headers.
pub(super) fn metered_headers(h: &mut HeaderMap, rate: Option<RateInfo>, c: CreditView) {
    if let Some(r) = rate {
        h.insert(wire::RATE_LIMIT_LIMIT, HeaderValue::from(r.limit));
        h.insert(wire::RATE_LIMIT_REMAINING, HeaderValue::from(r.remaining));
    }
    h.insert(wire::REMAINING_CREDITS, HeaderValue::from(c.remaining));
    h.insert(wire::CREDITS_USED, HeaderValue::from(c.used));
    h.insert(wire::MAX_CREDITS, HeaderValue::from(c.max));
    h.insert(wire::RENEWAL, HeaderValue::from(c.renewal));
}

/// A refusal's status, body and `retry-after`.
fn refusal(why: &Rejection, credits: CreditView) -> (StatusCode, Value, Option<u64>) {
    match why {
        Rejection::Cooldown { retry_after } => (
            StatusCode::TOO_MANY_REQUESTS,
            json!({"status": "error", "error": "rate limit exceeded: key is cooling down",
                   "retry_after": retry_after}),
            Some(*retry_after),
        ),
        Rejection::Rate { retry_after } => (
            StatusCode::TOO_MANY_REQUESTS,
            json!({"status": "error", "error": "rate limit exceeded", "retry_after": retry_after}),
            Some(*retry_after),
        ),
        Rejection::Concurrency { limit } => (
            StatusCode::TOO_MANY_REQUESTS,
            json!({"status": "error", "error": "too many concurrent requests",
                   "concurrency_limit": limit, "retry_after": 1}),
            Some(1),
        ),
        Rejection::Conflict => (
            StatusCode::CONFLICT,
            json!({"status": "error",
                   "error": "a request with this idempotency key is still in progress",
                   "retry_after": 1}),
            Some(1),
        ),
        Rejection::Credits { cost, balance } => (
            StatusCode::TOO_MANY_REQUESTS,
            json!({"status": "error", "error": "credits exhausted", "code": "credits_exhausted",
                   "cost": cost, "credits_remaining": balance, "renewal": credits.renewal}),
            None,
        ),
    }
}

/// The response to a refused metered request.
fn rejected(why: Rejection, rate: Option<RateInfo>, credits: CreditView, echo: &Echo) -> Response {
    let (status, body, retry_after) = refusal(&why, credits);
    let mut r = echo.json(status, body);
    let h = r.headers_mut();
    metered_headers(h, rate, credits);
    if let Some(s) = retry_after {
        h.insert(wire::RETRY_AFTER, HeaderValue::from(s));
    }
    if let Rejection::Concurrency { limit } = why {
        h.insert(wire::CONCURRENCY_LIMIT, HeaderValue::from(limit));
    }
    r
}

/// The response to a refused metered request in `dialect`, stating the
/// key's policies `view` in it. GitHub answers its rate limits with a 403
/// (as it documents, a 429 as often): with no `Retry-After` once the
/// quota it states is used up (its primary limit: the reset says when),
/// with one otherwise (its secondary limits, as the cooldown after an
/// overrun is, whatever the quota says meanwhile).
pub(super) fn refused_in(
    why: Rejection,
    (rate, credits): (Option<RateInfo>, CreditView),
    echo: &Echo,
    dialect: Dialect,
    view: &[PolicyView],
) -> Response {
    let cooling = matches!(why, Rejection::Cooldown { .. });
    let for_rate = cooling || matches!(why, Rejection::Rate { .. });
    if dialect == Dialect::Nginx && for_rate {
        return nginx_refusal();
    }
    let mut r = rejected(why, rate, credits, echo);
    super::dialect::write(r.headers_mut(), dialect, view);
    if dialect == Dialect::Github && for_rate {
        *r.status_mut() = StatusCode::FORBIDDEN;
        let h = r.headers_mut();
        if !cooling && h.get("x-ratelimit-remaining").is_some_and(|v| v == "0") {
            h.remove(wire::RETRY_AFTER);
        }
    }
    r
}

/// nginx's `limit_req` refusal as installed (`limit_req_status` left at
/// 503): its own page, as nginx 1.22 serves it with `server_tokens off`
/// (on, it names its version), and nothing of the API behind it.
fn nginx_refusal() -> Response {
    const PAGE: &str =
        "<html>\r\n<head><title>503 Service Temporarily Unavailable</title></head>\r\n\
        <body>\r\n<center><h1>503 Service Temporarily Unavailable</h1></center>\r\n\
        <hr><center>nginx</center>\r\n</body>\r\n</html>\r\n";
    let mut r = Response::new(Body::from(PAGE));
    *r.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("text/html"));
    r
}

/// `--retry-after-date`: a response's `Retry-After` in delay seconds said
/// instead as the HTTP-date it ends at, rounded up to a whole second (the
/// form keeps no fraction), so a client waiting until then waits no less.
pub(super) async fn retry_after_as_date(mut r: Response) -> Response {
    let secs = r
        .headers()
        .get(wire::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if let Some(s) = secs {
        let at = SystemTime::now() + Duration::from_secs(s);
        let since = at.duration_since(UNIX_EPOCH).unwrap_or_default();
        let whole = since.as_secs() + u64::from(since.subsec_nanos() > 0);
        let date = httpdate::fmt_http_date(UNIX_EPOCH + Duration::from_secs(whole));
        if let Ok(v) = HeaderValue::from_str(&date) {
            r.headers_mut().insert(wire::RETRY_AFTER, v);
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    const CREDITS: CreditView = CreditView {
        remaining: 7,
        used: 3,
        max: 10,
        renewal: 1_800_000_000,
    };

    fn key(k: &str) -> Echo {
        let mut h = HeaderMap::new();
        h.insert(wire::API_KEY, HeaderValue::from_str(k).unwrap());
        Echo::from_headers(true, &h)
    }

    async fn body(r: Response) -> Value {
        let bytes = axum::body::to_bytes(r.into_body(), usize::MAX)
            .await
            .unwrap();
        serde_json::from_slice(&bytes).unwrap()
    }

    /// GitHub's primary limit used up: a 403 whose reset says when, no
    /// `Retry-After`; its secondary limit (the cooldown): a 403 with one,
    /// though the quota it states is used up as well.
    #[tokio::test]
    async fn github_drops_retry_after_for_its_primary_limit_only() {
        let used_up = [PolicyView {
            limit: 10,
            window: Duration::from_secs(60),
            remaining: 0,
            reset: Duration::from_secs(30),
            idle: Duration::from_secs(30),
            unit: crate::rate::policy::Unit::Calls,
        }];
        let refuse = |why| {
            let r = refused_in(
                why,
                (None, CREDITS),
                &Echo::default(),
                Dialect::Github,
                &used_up,
            );
            (r.status(), r.headers().get(wire::RETRY_AFTER).cloned())
        };
        let primary = refuse(Rejection::Rate { retry_after: 30 });
        assert_eq!(primary, (StatusCode::FORBIDDEN, None));
        let secondary = refuse(Rejection::Cooldown { retry_after: 50 });
        assert_eq!(
            secondary,
            (StatusCode::FORBIDDEN, Some(HeaderValue::from(50u64)))
        );
    }

    #[tokio::test]
    async fn a_conflict_asks_for_a_retry_in_a_second() {
        let r = rejected(Rejection::Conflict, None, CREDITS, &Echo::default());
        assert_eq!(r.status(), StatusCode::CONFLICT);
        assert_eq!(r.headers()[wire::RETRY_AFTER], "1");
        assert_eq!(r.headers()[wire::REMAINING_CREDITS], "7");
    }

    #[tokio::test]
    async fn echo_key_stamps_errors_and_successes() {
        let echo = key("sk_live_ABC");
        let why = Rejection::Rate { retry_after: 1 };
        let r = rejected(why, None, CREDITS, &echo);
        let b = body(r).await;
        assert_eq!(b["error"], "rate limit exceeded for key sk_live_ABC");
        assert_eq!(b["key"], "sk_live_ABC");
        assert_eq!(b["key_escaped"], "sk_live_ABC");

        let raw = echo.ok_body("echo", json!({"n": 1}));
        let text = String::from_utf8_lossy(&raw);
        assert!(text.contains(r#""key_escaped":"\u0073\u006b"#), "{text}");
        let ok: Value = serde_json::from_slice(&raw).unwrap();
        assert_eq!(
            ok,
            json!({"status": "ok", "endpoint": "echo", "data": {"n": 1},
                              "key": "sk_live_ABC", "key_escaped": "sk_live_ABC"})
        );
    }

    #[tokio::test]
    async fn without_echo_key_no_body_carries_the_key() {
        let mut h = HeaderMap::new();
        h.insert(wire::API_KEY, HeaderValue::from_static("sk_live_ABC"));
        let echo = Echo::from_headers(false, &h);
        let b = body(echo.error(StatusCode::BAD_REQUEST, "bad query")).await;
        assert_eq!(b, json!({"status": "error", "error": "bad query"}));
        assert!(!String::from_utf8_lossy(&echo.ok_body("e", Value::Null)).contains("ABC"));
    }
}
