//! Thin axum glue over [`Model`]: parse the request, read the clock, ask the
//! model under a short lock (never held across an `.await`), render headers.
//!
//! [`conn`] accepts the connections (so a reset fault can kill one),
//! [`metered`] walks a `/v1/*` request through its steps, [`respond`] renders
//! bodies and headers, [`big`] streams `/v1/big`, [`admin`] serves the rest.

mod admin;
mod batch;
mod big;
mod conn;
mod dialect;
mod metered;
mod respond;

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::extract::DefaultBodyLimit;
use axum::http::HeaderMap;
use axum::routing::{get, post};
use axum::Router;
use serde_json::{json, Value};
use tokio::net::TcpListener;

use super::model::{Config, Model};
use conn::{ConnCtl, SimListener};
use respond::Echo;

/// Largest accepted request body; anything bigger is a 413 before parsing.
const MAX_BODY: usize = 1 << 20;

struct App {
    model: Mutex<Model>,
    /// For `/admin/stats`, which also says what is being simulated.
    describe: Value,
    /// `--echo-key`, read once instead of under the lock per request.
    echo_key: bool,
    /// Whether `--latency-in` is set, likewise.
    latency_in: bool,
    /// `--keep-working`, likewise.
    keep_working: bool,
    /// `--refuse`, likewise.
    refuse: Vec<super::model::refusals::Refusal>,
    /// `--dialect`, likewise.
    dialect: super::model::Dialect,
    /// Whether a policy counts tokens (answers then carry `usage`).
    tokens: bool,
    /// `--seed`: how much of `max_tokens` an answer takes.
    seed: u64,
}

impl App {
    fn lock(&self) -> MutexGuard<'_, Model> {
        // Nothing panics while holding the lock, but if something ever did,
        // the counters are still better than a sim that 500s forever.
        self.model.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The key to write into this request's response bodies, if any.
    fn echo(&self, headers: &HeaderMap) -> Echo {
        Echo::from_headers(self.echo_key, headers)
    }
}

type Shared = Arc<App>;

/// Binds a TCP listener.
pub(crate) async fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

fn describe(cfg: &Config) -> Value {
    let ms = |(lo, hi): (std::time::Duration, std::time::Duration)| {
        json!([lo.as_millis() as u64, hi.as_millis() as u64])
    };
    json!({
        "model": cfg.kind,
        "limit": cfg.policies.first().map_or("none".to_string(), ToString::to_string),
        "limits": cfg.policies.iter().map(ToString::to_string).collect::<Vec<_>>(),
        "dialect": cfg.dialect,
        "concurrency": cfg.concurrency,
        "cooldown_ms": cfg.cooldown.as_millis() as u64,
        "seed": cfg.seed,
        "latency_in_ms": cfg.latency_in.map(ms),
        "keep_working": cfg.keep_working,
        "secret_limit": cfg.secret_limit,
        "secret_first": cfg.secret_first,
        "retry_after_date": cfg.retry_after_date,
        "rate_limit_forever": cfg.rate_limit_forever,
        "echo_key": cfg.echo_key,
    })
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
    let date = cfg.retry_after_date;
    let app = Arc::new(App {
        describe: describe(&cfg),
        echo_key: cfg.echo_key,
        latency_in: cfg.latency_in.is_some(),
        keep_working: cfg.keep_working,
        refuse: cfg.refuse.clone(),
        dialect: cfg.dialect,
        seed: cfg.seed,
        tokens: cfg.policies.iter().any(|p| p.unit.is_tokens()),
        model: Mutex::new(Model::new(cfg, Instant::now(), unix_now)),
    });
    let router = Router::new()
        .route(
            "/v1/{*name}",
            get(metered::metered_get)
                .post(metered::metered_post)
                .fallback(admin::method_not_allowed),
        )
        .route("/batch/{*name}", post(batch::batch_post))
        .route("/admin/stats", get(admin::stats))
        .route("/admin/arrivals", get(admin::arrivals))
        .route("/admin/topup", post(admin::topup))
        .route("/admin/renew", post(admin::renew))
        .fallback(admin::not_found)
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(app);
    let router = match date {
        true => router.layer(axum::middleware::map_response(respond::retry_after_as_date)),
        false => router,
    };
    axum::serve(
        SimListener(listener),
        router.into_make_service_with_connect_info::<ConnCtl>(),
    )
    .with_graceful_shutdown(shutdown)
    .await
}
