//! The unmetered endpoints: `/admin/*` and the fallbacks for unknown paths
//! and methods.

use std::time::Instant;

use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::Response;
use serde_json::{json, Value};

use super::super::model::CreditView;
use super::respond::{json_response, metered_headers};
use super::Shared;

#[derive(serde::Deserialize)]
struct StatsQuery {
    key: Option<String>,
}

/// `GET /admin/stats[?key=K]`: the counters, the configuration, and with
/// `key` that key's current window count.
pub(super) async fn stats(State(app): State<Shared>, uri: Uri) -> Response {
    let key = Query::<StatsQuery>::try_from_uri(&uri)
        .ok()
        .and_then(|q| q.0.key);
    let (stats, in_window) = {
        let mut m = app.lock();
        let now = Instant::now();
        let in_window = key.as_deref().map(|k| m.in_window(k, now));
        (m.stats(now), in_window)
    };
    let mut v = serde_json::to_value(&stats).unwrap_or_else(|_| json!({}));
    if let Value::Object(o) = &mut v {
        o.insert("config".into(), app.describe.clone());
        if let (Some(k), Some(n)) = (key, in_window) {
            o.insert("key".into(), json!({"key": k, "in_window": n}));
        }
    }
    json_response(StatusCode::OK, &v)
}

/// `GET /admin/arrivals`: when each request that counted in a window
/// arrived, in milliseconds since the sim started, oldest first.
pub(super) async fn arrivals(State(app): State<Shared>) -> Response {
    // Copied out under the lock, serialized outside it.
    let log = app.lock().arrivals();
    json_response(StatusCode::OK, &json!(log))
}

#[derive(serde::Deserialize)]
struct TopupQuery {
    credits: u64,
}

/// `POST /admin/topup?credits=N`.
pub(super) async fn topup(State(app): State<Shared>, uri: Uri) -> Response {
    let n = match Query::<TopupQuery>::try_from_uri(&uri) {
        Ok(Query(q)) => q.credits,
        Err(_) => {
            return json_response(
                StatusCode::BAD_REQUEST,
                &json!({"status": "error", "error": "expected ?credits=N with N a whole number"}),
            )
        }
    };
    let c = app.lock().topup(n, Instant::now());
    credit_summary(c)
}

/// `POST /admin/renew`.
pub(super) async fn renew(State(app): State<Shared>) -> Response {
    let c = app.lock().renew(Instant::now());
    credit_summary(c)
}

fn credit_summary(c: CreditView) -> Response {
    let mut r = json_response(
        StatusCode::OK,
        &json!({"status": "ok", "credits_remaining": c.remaining, "credits_used": c.used,
                "max_credits": c.max, "renewal": c.renewal}),
    );
    metered_headers(r.headers_mut(), None, c);
    r
}

/// Any other path: a JSON 404, not metered.
pub(super) async fn not_found(State(app): State<Shared>, headers: HeaderMap, uri: Uri) -> Response {
    app.lock().note_not_found();
    let body = json!({"status": "error", "error": "not found", "path": uri.path()});
    app.echo(&headers).json(StatusCode::NOT_FOUND, body)
}

/// `/v1/*` with a method other than `GET` or `POST`.
pub(super) async fn method_not_allowed(State(app): State<Shared>, headers: HeaderMap) -> Response {
    app.echo(&headers).error(
        StatusCode::METHOD_NOT_ALLOWED,
        "metered endpoints take GET with a query or POST with a JSON body",
    )
}
