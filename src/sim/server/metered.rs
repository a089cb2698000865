//! The metered endpoints, `GET`/`POST /v1/<name>`, as the steps a request
//! goes through: auth, parse, transit-in, admission (cooldown, concurrency,
//! rate, replay, credits: the model's), latency, injected 503, execute,
//! reset.

use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::{ConnectInfo, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri};
use axum::response::Response;
use serde_json::{Map, Value};

use super::super::model::usage::Usage;
use super::super::model::{Admission, Faults, PolicyView, RateInfo, Ticket};
use super::conn::ConnCtl;
use super::respond::{body_response, metered_headers, refused_in, Echo};
use super::{big, dialect, App, Shared};
use crate::wire;

/// What a metered request asks for, once parsed.
enum Payload {
    /// Echo this data back.
    Echo(Value),
    /// Answer a body of this many bytes.
    Big(u64),
}

/// Hands the ticket back if the handler is dropped before it executes (the
/// client went away during the injected latency).
struct InFlight {
    app: Shared,
    ticket: Option<Ticket>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some(t) = self.ticket.take() {
            self.app.lock().abandon(t);
        }
    }
}

/// Counts a request in `in_transit` while it waits out `--latency-in`, and
/// stops counting it even if its client goes away meanwhile.
struct InTransit<'a>(&'a App);

impl Drop for InTransit<'_> {
    fn drop(&mut self) {
        self.0.lock().transit_end();
    }
}

fn api_key(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(wire::API_KEY)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|k| !k.is_empty())
}

fn endpoint(uri: &Uri) -> &str {
    uri.path().strip_prefix("/v1/").unwrap_or_default()
}

fn unauthorized(app: &App, echo: &Echo) -> Response {
    app.lock().note_unauthorized();
    echo.error(StatusCode::UNAUTHORIZED, "missing x-api-key header")
}

fn bad_request(app: &App, echo: &Echo, status: StatusCode, message: &str) -> Response {
    app.lock().note_bad_request();
    echo.error(status, message)
}

/// The payload of a `GET`: the query as the echoed data, or the size asked
/// of `/v1/big`.
fn query_payload(uri: &Uri) -> Result<Payload, String> {
    if endpoint(uri) == big::ENDPOINT {
        return big::requested_bytes(uri).map(Payload::Big);
    }
    match Query::<Vec<(String, String)>>::try_from_uri(uri) {
        Ok(Query(pairs)) => Ok(Payload::Echo(Value::Object(
            pairs
                .into_iter()
                .map(|(k, v)| (k, Value::String(v)))
                .collect::<Map<_, _>>(),
        ))),
        Err(e) => Err(format!("bad query: {e}")),
    }
}

/// The payload of a `POST`: the JSON body (empty counts as `{}`), or for
/// `/v1/big` the size in its query.
fn body_payload(uri: &Uri, body: &Bytes) -> Result<Payload, String> {
    let data = if body.iter().all(u8::is_ascii_whitespace) {
        Value::Object(Map::new())
    } else {
        serde_json::from_slice::<Value>(body).map_err(|e| format!("bad JSON body: {e}"))?
    };
    if endpoint(uri) == big::ENDPOINT {
        return big::requested_bytes(uri).map(Payload::Big);
    }
    Ok(Payload::Echo(data))
}

/// `GET /v1/<name>?<query>`.
pub(super) async fn metered_get(
    State(app): State<Shared>,
    ConnectInfo(conn): ConnectInfo<ConnCtl>,
    headers: HeaderMap,
    uri: Uri,
) -> Response {
    let echo = app.echo(&headers);
    if api_key(&headers).is_none() {
        return unauthorized(&app, &echo);
    }
    match query_payload(&uri) {
        Ok(p) => metered(app, conn, &headers, endpoint(&uri), p, echo).await,
        Err(e) => bad_request(&app, &echo, StatusCode::BAD_REQUEST, &e),
    }
}

/// `POST /v1/<name>` with a JSON body.
pub(super) async fn metered_post(
    State(app): State<Shared>,
    ConnectInfo(conn): ConnectInfo<ConnCtl>,
    headers: HeaderMap,
    uri: Uri,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let echo = app.echo(&headers);
    if api_key(&headers).is_none() {
        return unauthorized(&app, &echo);
    }
    let body = match body {
        Ok(b) => b,
        Err(e) => {
            let message = format!("cannot read the body: {e}");
            return bad_request(&app, &echo, e.status(), &message);
        }
    };
    match body_payload(&uri, &body) {
        Ok(p) => metered(app, conn, &headers, endpoint(&uri), p, echo).await,
        Err(e) => bad_request(&app, &echo, StatusCode::BAD_REQUEST, &e),
    }
}

/// A parsed, authenticated metered request, from its arrival on.
async fn metered(
    app: Shared,
    conn: ConnCtl,
    headers: &HeaderMap,
    endpoint: &str,
    payload: Payload,
    echo: Echo,
) -> Response {
    let Some(key) = api_key(headers) else {
        return unauthorized(&app, &echo);
    };
    let idem = match idempotency_key(headers) {
        Ok(idem) => idem,
        Err(message) => return bad_request(&app, &echo, StatusCode::BAD_REQUEST, message),
    };
    if let Some(r) = refused_by_rule(&app, &payload, &echo) {
        return r;
    }
    let usage = match &payload {
        Payload::Echo(data) if app.tokens => Some(Usage::of(data, app.seed)),
        _ => None,
    };
    arrive(&app).await;
    let (admission, view) = {
        let mut m = app.lock();
        let now = Instant::now();
        let tokens = usage.map(|u| u.tokens()).unwrap_or_default();
        let admission = m.admit_tokens(key, endpoint, idem, tokens, now);
        (admission, m.policies(key, now))
    };
    let (ticket, rate, faults) = match admission {
        Admission::Rejected { why, rate, credits } => {
            return refused_in(why, (rate, credits), &echo, app.dialect, &view);
        }
        Admission::Replay {
            body,
            rate,
            credits,
        } => {
            let mut r = replay(body, &echo);
            metered_headers(r.headers_mut(), rate, credits);
            dialect::write(r.headers_mut(), app.dialect, &view);
            return r;
        }
        Admission::Admitted {
            ticket,
            rate,
            faults,
        } => (ticket, rate, faults),
    };
    let run = Run {
        endpoint: endpoint.to_string(),
        payload,
        usage,
        rate,
        view,
        faults,
        echo,
        conn,
    };
    let echo = Echo::from_headers(false, headers);
    detached_if_kept(&app, echo, run.finish(app.clone(), ticket)).await
}

/// `work`, the rest of an admitted call; with `--keep-working` detached
/// from the connection, so that the client leaving no longer drops it.
pub(super) async fn detached_if_kept(
    app: &Shared,
    echo: Echo,
    work: impl std::future::Future<Output = Response> + Send + 'static,
) -> Response {
    if !app.keep_working {
        return work.await;
    }
    match tokio::spawn(work).await {
        Ok(r) => r,
        Err(_) => echo.error(StatusCode::INTERNAL_SERVER_ERROR, "the call's task failed"),
    }
}

/// The request's `Idempotency-Key`, if any; an empty or non-ASCII one is
/// the client's error.
pub(super) fn idempotency_key(headers: &HeaderMap) -> Result<Option<&str>, &'static str> {
    match headers.get(wire::IDEMPOTENCY_KEY).map(|v| v.to_str()) {
        None => Ok(None),
        Some(Ok(k)) if !k.trim().is_empty() => Ok(Some(k.trim())),
        Some(_) => Err("the Idempotency-Key header must be non-empty visible ASCII"),
    }
}

/// The answer of a `--refuse` rule the item matches (a permanent error
/// the model gives before metering), if one does.
fn refused_by_rule(app: &Shared, payload: &Payload, echo: &Echo) -> Option<Response> {
    let Payload::Echo(data) = payload else {
        return None;
    };
    let r = super::super::model::refusals::find(&app.refuse, data)?;
    app.lock().note_refused();
    let status = StatusCode::from_u16(r.status).unwrap_or(StatusCode::FORBIDDEN);
    Some(echo.error(status, r.message()))
}

/// Transit-in: with `--latency-in`, the request reaches the model only
/// after its delay.
async fn arrive(app: &App) {
    if !app.latency_in {
        return;
    }
    let delay = app.lock().transit_begin();
    let _counted = InTransit(app);
    tokio::time::sleep(delay).await;
}

/// The stored response of an idempotency key, marked as a replay.
fn replay(stored: Bytes, echo: &Echo) -> Response {
    let body = match big::from_marker(&stored) {
        Some(n) => big::body(n, echo.key()),
        None => Body::from(stored),
    };
    let mut r = body_response(StatusCode::OK, body);
    r.headers_mut()
        .insert(wire::IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    r
}

/// An admitted request on its way to an answer.
struct Run {
    endpoint: String,
    payload: Payload,
    /// The request's tokens, when a policy counts them.
    usage: Option<Usage>,
    rate: Option<RateInfo>,
    /// The key's limits at admission, for `--dialect`.
    view: Vec<PolicyView>,
    faults: Faults,
    echo: Echo,
    conn: ConnCtl,
}

impl Run {
    /// Latency, then an injected 503 or the execution (and maybe a reset).
    async fn finish(self, app: Shared, ticket: Ticket) -> Response {
        let mut guard = InFlight {
            app,
            ticket: Some(ticket),
        };
        if !self.faults.latency.is_zero() {
            tokio::time::sleep(self.faults.latency).await;
        }
        let Some(ticket) = guard.ticket.take() else {
            let status = StatusCode::INTERNAL_SERVER_ERROR;
            return self.echo.error(status, "ticket already used");
        };
        match self.faults.fail {
            Some(retry_after) => self.fail(&guard.app, ticket, retry_after),
            None => self.execute(&guard.app, ticket),
        }
    }

    /// An injected 503: nothing executed, nothing charged.
    fn fail(self, app: &App, ticket: Ticket, retry_after: Option<u64>) -> Response {
        let credits = app.lock().fail(ticket, Instant::now());
        let message = "service unavailable (injected fault)";
        let mut r = self.echo.error(StatusCode::SERVICE_UNAVAILABLE, message);
        metered_headers(r.headers_mut(), self.rate, credits);
        dialect::write(r.headers_mut(), app.dialect, &self.view);
        if let Some(s) = retry_after {
            r.headers_mut()
                .insert(wire::RETRY_AFTER, HeaderValue::from(s));
        }
        r
    }

    /// Executes, charges and stores the answer; with a reset fault the
    /// connection then dies instead of carrying it.
    fn execute(self, app: &App, ticket: Ticket) -> Response {
        let (stored, body) = match self.payload {
            Payload::Echo(data) => {
                let b = match self.usage {
                    Some(u) => {
                        let anthropic = app.dialect == crate::sim::model::Dialect::Anthropic;
                        let usage = u.to_json(anthropic);
                        self.echo.ok_body_with(&self.endpoint, data, usage)
                    }
                    None => self.echo.ok_body(&self.endpoint, data),
                };
                (b.clone(), Body::from(b))
            }
            Payload::Big(n) => (big::marker(n), big::body(n, self.echo.key())),
        };
        let reset = self.faults.reset;
        let credits = {
            let mut m = app.lock();
            let c = m.complete(ticket, stored, Instant::now());
            if reset {
                m.note_reset();
            }
            c
        };
        if reset {
            // Executed and charged, but the client never hears about it: the
            // case idempotency keys exist for.
            self.conn.kill();
        }
        let mut r = body_response(StatusCode::OK, body);
        metered_headers(r.headers_mut(), self.rate, credits);
        dialect::write(r.headers_mut(), app.dialect, &self.view);
        r
    }
}
