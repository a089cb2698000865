//! Thin axum glue over [`Model`]: parse the request, read the clock, ask the
//! model under a short lock (never held across an `.await`), render headers.
//!
//! Connections are accepted by our own [`Listener`] so that the reset fault can
//! drop one without a response: the handler flips a per-connection switch and
//! the connection's next write fails, closing the socket with an RST.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::connect_info::Connected;
use axum::extract::rejection::BytesRejection;
use axum::extract::{ConnectInfo, DefaultBodyLimit, Query, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::{json, Map, Value};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

use super::model::{Admission, Config, CreditView, Model, RateInfo, Rejection, Ticket};
use crate::wire;

/// Largest accepted request body; anything bigger is a 413 before parsing.
const MAX_BODY: usize = 1 << 20;

struct App {
    model: Mutex<Model>,
    /// For `/admin/stats`, which also says what is being simulated.
    describe: Value,
}

impl App {
    fn lock(&self) -> MutexGuard<'_, Model> {
        // Nothing panics while holding the lock, but if something ever did,
        // the counters are still better than a sim that 500s forever.
        self.model.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

type Shared = Arc<App>;

/// Binds a TCP listener.
pub(crate) async fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// Serves the sim on `listener` until `shutdown` completes.
pub(crate) async fn serve(
    listener: TcpListener,
    cfg: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let unix_now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let describe = json!({
        "model": cfg.kind,
        "limit": cfg.limit.to_string(),
        "concurrency": cfg.concurrency,
        "cooldown_ms": cfg.cooldown.as_millis() as u64,
        "seed": cfg.seed,
    });
    let app = Arc::new(App {
        model: Mutex::new(Model::new(cfg, Instant::now(), unix_now)),
        describe,
    });
    let router = Router::new()
        .route(
            "/v1/{*name}",
            get(metered_get)
                .post(metered_post)
                .fallback(method_not_allowed),
        )
        .route("/admin/stats", get(stats))
        .route("/admin/topup", post(topup))
        .route("/admin/renew", post(renew))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(app);
    axum::serve(
        SimListener(listener),
        router.into_make_service_with_connect_info::<ConnCtl>(),
    )
    .with_graceful_shutdown(shutdown)
    .await
}

// ---------------------------------------------------------------- listener

struct SimListener(TcpListener);

impl axum::serve::Listener for SimListener {
    type Io = SimConn;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            match self.0.accept().await {
                Ok((io, addr)) => {
                    // Small request/response pairs: don't let Nagle hold them.
                    let _ = io.set_nodelay(true);
                    let conn = SimConn {
                        io,
                        kill: Arc::new(AtomicBool::new(false)),
                    };
                    return (conn, addr);
                }
                // A peer that gave up during the handshake: next.
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::ConnectionAborted
                            | io::ErrorKind::ConnectionReset
                            | io::ErrorKind::ConnectionRefused
                    ) => {}
                // Out of file descriptors and the like: back off instead of
                // spinning; connections in flight will free some.
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.0.local_addr()
    }
}

/// A connection whose writes can be made to fail from a handler.
struct SimConn {
    io: TcpStream,
    kill: Arc<AtomicBool>,
}

impl SimConn {
    fn killed(&self) -> Option<io::Error> {
        if !self.kill.load(Ordering::Relaxed) {
            return None;
        }
        // An RST rather than a FIN: the client sees the connection die
        // instead of a clean close it might take for a keep-alive timeout.
        let _ = self.io.set_zero_linger();
        Some(io::Error::new(
            io::ErrorKind::ConnectionReset,
            "injected connection reset",
        ))
    }
}

impl AsyncRead for SimConn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for SimConn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if let Some(e) = self.killed() {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if let Some(e) = self.killed() {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if let Some(e) = self.killed() {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// The handler's handle on its connection's kill switch.
#[derive(Clone)]
struct ConnCtl(Arc<AtomicBool>);

impl Connected<axum::serve::IncomingStream<'_, SimListener>> for ConnCtl {
    fn connect_info(stream: axum::serve::IncomingStream<'_, SimListener>) -> Self {
        ConnCtl(stream.io().kill.clone())
    }
}

// ---------------------------------------------------------------- responses

fn json_response(status: StatusCode, body: &Value) -> Response {
    let bytes = serde_json::to_vec(body).unwrap_or_default();
    bytes_response(status, Bytes::from(bytes))
}

fn bytes_response(status: StatusCode, body: Bytes) -> Response {
    let mut r = Response::new(Body::from(body));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

fn error(status: StatusCode, message: &str) -> Response {
    json_response(status, &json!({"status": "error", "error": message}))
}

fn metered_headers(h: &mut HeaderMap, rate: Option<RateInfo>, c: CreditView) {
    if let Some(r) = rate {
        h.insert(wire::RATE_LIMIT_LIMIT, HeaderValue::from(r.limit));
        h.insert(wire::RATE_LIMIT_REMAINING, HeaderValue::from(r.remaining));
    }
    h.insert(wire::REMAINING_CREDITS, HeaderValue::from(c.remaining));
    h.insert(wire::CREDITS_USED, HeaderValue::from(c.used));
    h.insert(wire::MAX_CREDITS, HeaderValue::from(c.max));
    h.insert(wire::RENEWAL, HeaderValue::from(c.renewal));
}

fn rejected(why: Rejection, rate: Option<RateInfo>, credits: CreditView) -> Response {
    let (status, body, retry_after) = match &why {
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
    };
    let mut r = json_response(status, &body);
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

// ---------------------------------------------------------------- metered

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

async fn metered_get(
    State(app): State<Shared>,
    ConnectInfo(conn): ConnectInfo<ConnCtl>,
    headers: HeaderMap,
    uri: Uri,
) -> Response {
    if api_key(&headers).is_none() {
        return unauthorized(&app);
    }
    let data = match Query::<Vec<(String, String)>>::try_from_uri(&uri) {
        Ok(Query(pairs)) => Value::Object(
            pairs
                .into_iter()
                .map(|(k, v)| (k, Value::String(v)))
                .collect::<Map<_, _>>(),
        ),
        Err(e) => return bad_request(&app, StatusCode::BAD_REQUEST, &format!("bad query: {e}")),
    };
    metered(app, conn, &headers, endpoint(&uri), data).await
}

async fn metered_post(
    State(app): State<Shared>,
    ConnectInfo(conn): ConnectInfo<ConnCtl>,
    headers: HeaderMap,
    uri: Uri,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    if api_key(&headers).is_none() {
        return unauthorized(&app);
    }
    let body = match body {
        Ok(b) => b,
        Err(e) => {
            let status = e.status();
            return bad_request(&app, status, &format!("cannot read the body: {e}"));
        }
    };
    let data = if body.iter().all(u8::is_ascii_whitespace) {
        Value::Object(Map::new())
    } else {
        match serde_json::from_slice::<Value>(&body) {
            Ok(v) => v,
            Err(e) => {
                return bad_request(
                    &app,
                    StatusCode::BAD_REQUEST,
                    &format!("bad JSON body: {e}"),
                )
            }
        }
    };
    metered(app, conn, &headers, endpoint(&uri), data).await
}

fn unauthorized(app: &App) -> Response {
    app.lock().note_unauthorized();
    error(StatusCode::UNAUTHORIZED, "missing x-api-key header")
}

fn bad_request(app: &App, status: StatusCode, message: &str) -> Response {
    app.lock().note_bad_request();
    error(status, message)
}

async fn metered(
    app: Shared,
    conn: ConnCtl,
    headers: &HeaderMap,
    endpoint: &str,
    data: Value,
) -> Response {
    let Some(key) = api_key(headers) else {
        return unauthorized(&app);
    };
    let idem = match headers.get(wire::IDEMPOTENCY_KEY).map(|v| v.to_str()) {
        None => None,
        Some(Ok(k)) if !k.trim().is_empty() => Some(k.trim()),
        Some(_) => {
            return bad_request(
                &app,
                StatusCode::BAD_REQUEST,
                "the Idempotency-Key header must be non-empty visible ASCII",
            )
        }
    };

    let admission = {
        let mut m = app.lock();
        m.admit(key, endpoint, idem, Instant::now())
    };
    let (ticket, rate, faults) = match admission {
        Admission::Rejected { why, rate, credits } => return rejected(why, rate, credits),
        Admission::Replay {
            body,
            rate,
            credits,
        } => {
            let mut r = bytes_response(StatusCode::OK, body);
            metered_headers(r.headers_mut(), rate, credits);
            r.headers_mut()
                .insert(wire::IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
            return r;
        }
        Admission::Admitted {
            ticket,
            rate,
            faults,
        } => (ticket, rate, faults),
    };
    let mut guard = InFlight {
        app,
        ticket: Some(ticket),
    };

    if !faults.latency.is_zero() {
        tokio::time::sleep(faults.latency).await;
    }

    let Some(ticket) = guard.ticket.take() else {
        return error(StatusCode::INTERNAL_SERVER_ERROR, "ticket already used");
    };
    if let Some(retry_after) = faults.fail {
        let credits = {
            let mut m = guard.app.lock();
            m.fail(ticket, Instant::now())
        };
        let mut r = error(
            StatusCode::SERVICE_UNAVAILABLE,
            "service unavailable (injected fault)",
        );
        metered_headers(r.headers_mut(), rate, credits);
        if let Some(s) = retry_after {
            r.headers_mut()
                .insert(wire::RETRY_AFTER, HeaderValue::from(s));
        }
        return r;
    }

    let body = Bytes::from(
        serde_json::to_vec(&json!({"status": "ok", "endpoint": endpoint, "data": data}))
            .unwrap_or_default(),
    );
    let credits = {
        let mut m = guard.app.lock();
        let c = m.complete(ticket, body.clone(), Instant::now());
        if faults.reset {
            m.note_reset();
        }
        c
    };
    if faults.reset {
        // Executed and charged, but the client never hears about it: the
        // case idempotency keys exist for.
        conn.0.store(true, Ordering::Relaxed);
    }
    let mut r = bytes_response(StatusCode::OK, body);
    metered_headers(r.headers_mut(), rate, credits);
    r
}

// ---------------------------------------------------------------- admin

#[derive(serde::Deserialize)]
struct StatsQuery {
    key: Option<String>,
}

async fn stats(State(app): State<Shared>, uri: Uri) -> Response {
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

#[derive(serde::Deserialize)]
struct TopupQuery {
    credits: u64,
}

async fn topup(State(app): State<Shared>, uri: Uri) -> Response {
    let n = match Query::<TopupQuery>::try_from_uri(&uri) {
        Ok(Query(q)) => q.credits,
        Err(_) => {
            return error(
                StatusCode::BAD_REQUEST,
                "expected ?credits=N with N a whole number",
            )
        }
    };
    let c = app.lock().topup(n, Instant::now());
    credit_summary(c)
}

async fn renew(State(app): State<Shared>) -> Response {
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

async fn not_found(State(app): State<Shared>, uri: Uri) -> Response {
    app.lock().note_not_found();
    json_response(
        StatusCode::NOT_FOUND,
        &json!({"status": "error", "error": "not found", "path": uri.path()}),
    )
}

async fn method_not_allowed() -> impl IntoResponse {
    error(
        StatusCode::METHOD_NOT_ALLOWED,
        "metered endpoints take GET with a query or POST with a JSON body",
    )
}
