//! `POST /batch/<name>`: many items in one call. The body is a JSON array
//! of the items' data, or `{"requests": [...]}`. The call is admitted as
//! one (cooldown, concurrency, rate, the injected faults), then each item
//! is settled on its own ([`Model::settle_batch`](super::super::model::Model)):
//! its own side effect and charge, its own replay under the batch's
//! Idempotency-Key and its position, its own `402` past the balance, its
//! own refusal under `--refuse`. The answer is `{"results": [...]}`, one
//! element per item in order, with the credit headers as they stand after
//! the whole batch.

use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{ConnectInfo, Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use serde_json::{json, Value};

use super::super::model::usage::Usage;
use super::super::model::{refusals, Admission, CreditView, RateInfo, Settled, Ticket};
use super::conn::ConnCtl;
use super::metered::idempotency_key;
use super::respond::{metered_headers, refused_in, Echo};
use super::{dialect, App, Shared};
use crate::wire;

/// Gives the ticket back if the client goes away during the latency.
struct Held {
    app: Shared,
    ticket: Option<Ticket>,
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(t) = self.ticket.take() {
            self.app.lock().abandon(t);
        }
    }
}

/// The items of a batch body, or why it is not one.
fn items(body: &Bytes) -> Result<Vec<Value>, String> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Array(a)) => Ok(a),
        Ok(Value::Object(mut o)) => match o.remove("requests") {
            Some(Value::Array(a)) => Ok(a),
            _ => Err("a batch body is a JSON array or {\"requests\": [...]}".into()),
        },
        Ok(_) => Err("a batch body is a JSON array or {\"requests\": [...]}".into()),
        Err(e) => Err(format!("bad JSON body: {e}")),
    }
}

/// The caller's key and the batch's items, or the answer refusing them
/// (no key, a body that is not a batch, a batch too large).
fn read_batch(
    app: &Shared,
    echo: &Echo,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<(String, Vec<Value>), Box<Response>> {
    let Some(key) = headers
        .get(wire::API_KEY)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|k| !k.is_empty())
    else {
        app.lock().note_unauthorized();
        let r = echo.error(StatusCode::UNAUTHORIZED, "missing x-api-key header");
        return Err(Box::new(r));
    };
    let parsed = body.map_err(|e| e.to_string()).and_then(|b| items(&b));
    let batch = match parsed {
        Ok(b) => b,
        Err(e) => {
            app.lock().note_bad_request();
            return Err(Box::new(echo.error(StatusCode::BAD_REQUEST, &e)));
        }
    };
    let max = app.lock().config().max_batch;
    if batch.len() > max {
        app.lock().note_bad_request();
        let message = format!("batch too large: {} items, at most {max}", batch.len());
        return Err(Box::new(
            echo.error(StatusCode::PAYLOAD_TOO_LARGE, &message),
        ));
    }
    Ok((key.to_string(), batch))
}

/// `POST /batch/<name>`; see the module docs.
pub(super) async fn batch_post(
    State(app): State<Shared>,
    ConnectInfo(conn): ConnectInfo<ConnCtl>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let echo = app.echo(&headers);
    let (key, batch) = match read_batch(&app, &echo, &headers, body) {
        Ok(read) => read,
        Err(refused) => return *refused,
    };
    let key = key.as_str();
    // A malformed key is no key here (the single-call endpoint answers it
    // 400): the batch endpoint has always read it so.
    let idem = idempotency_key(&headers).ok().flatten();
    // With token policies a batch needs and is charged its items' sum, as
    // an embeddings call with many inputs is.
    let usage = app.tokens.then(|| total_usage(&batch, app.seed));
    let (admission, view, cost) = {
        let mut m = app.lock();
        let now = Instant::now();
        let tokens = usage.map(|u| u.tokens()).unwrap_or_default();
        let a = m.admit_tokens(key, &name, None, tokens, now);
        (a, m.policies(key, now), m.cost_of(&name))
    };
    let (ticket, rate, faults) = match admission {
        Admission::Admitted {
            ticket,
            rate,
            faults,
        } => (ticket, rate, faults),
        Admission::Rejected { why, rate, credits } => {
            return refused_in(why, (rate, credits), &echo, app.dialect, &view);
        }
        Admission::Replay { .. } => {
            // Never: the batch is admitted without a key of its own.
            let status = StatusCode::INTERNAL_SERVER_ERROR;
            return echo.error(status, "a batch is never replayed whole");
        }
    };
    let run = BatchRun {
        idem: idem.map(str::to_string),
        name,
        batch,
        cost,
        usage,
        rate,
        view,
        faults,
        echo,
        conn,
    };
    let echo = app.echo(&headers);
    super::metered::detached_if_kept(&app, echo, run.finish(app.clone(), ticket)).await
}

/// An admitted batch, from its latency to its answer.
struct BatchRun {
    idem: Option<String>,
    name: String,
    batch: Vec<Value>,
    cost: u64,
    usage: Option<Usage>,
    rate: Option<RateInfo>,
    view: Vec<super::super::model::PolicyView>,
    faults: super::super::model::Faults,
    echo: Echo,
    conn: ConnCtl,
}

impl BatchRun {
    /// Latency, then an injected 503 or each item settled (and maybe a
    /// reset).
    async fn finish(self, app: Shared, ticket: Ticket) -> Response {
        let (faults, echo, rate) = (self.faults, &self.echo, self.rate);
        let mut held = Held {
            app: app.clone(),
            ticket: Some(ticket),
        };
        if !faults.latency.is_zero() {
            tokio::time::sleep(faults.latency).await;
        }
        let Some(ticket) = held.ticket.take() else {
            return echo.error(StatusCode::INTERNAL_SERVER_ERROR, "ticket already used");
        };
        if let Some(retry_after) = faults.fail {
            let credits = app.lock().fail(ticket, Instant::now());
            return injected_503(echo, rate, credits, retry_after);
        }
        let idem = self.idem.as_deref();
        let (results, credits, executed) =
            settle(&app, ticket, idem, &self.name, self.batch, self.cost);
        // A batch of replays only executed nothing: like a replayed single
        // call, it is not subject to the fault, or under --reset-rate 1 a
        // batch could never complete.
        if faults.reset && executed {
            // Every item settled, and the client never hears of it.
            app.lock().note_reset();
            self.conn.kill();
        }
        let mut answer = json!({"status": "ok", "results": results});
        if let Some(u) = self.usage {
            answer["usage"] = u.to_json(app.dialect == crate::sim::model::Dialect::Anthropic);
        }
        let mut r = echo.json(StatusCode::OK, answer);
        metered_headers(r.headers_mut(), rate, credits);
        dialect::write(r.headers_mut(), app.dialect, &self.view);
        r
    }
}

/// The injected 503 of `--fail-rate`, with a Retry-After when it has one.
fn injected_503(
    echo: &Echo,
    rate: Option<RateInfo>,
    credits: CreditView,
    retry_after: Option<u64>,
) -> Response {
    let mut r = echo.error(
        StatusCode::SERVICE_UNAVAILABLE,
        "service unavailable (injected fault)",
    );
    metered_headers(r.headers_mut(), rate, credits);
    if let Some(s) = retry_after {
        r.headers_mut()
            .insert(wire::RETRY_AFTER, HeaderValue::from(s));
    }
    r
}

/// The tokens of a batch: the sum of its items' own.
fn total_usage(batch: &[Value], seed: u64) -> Usage {
    batch.iter().fold(Usage::default(), |sum, data| {
        let u = Usage::of(data, seed);
        Usage {
            prompt: sum.prompt.saturating_add(u.prompt),
            max_tokens: sum.max_tokens.saturating_add(u.max_tokens),
            completion: sum.completion.saturating_add(u.completion),
        }
    })
}

/// Each item's element: refused by `--refuse`, or settled by the model;
/// and whether any item executed now (rather than replayed or refused).
fn settle(
    app: &App,
    ticket: Ticket,
    idem: Option<&str>,
    name: &str,
    batch: Vec<Value>,
    cost: u64,
) -> (Vec<Value>, super::super::model::CreditView, bool) {
    let mut results: Vec<Option<Value>> = vec![None; batch.len()];
    let mut run = Vec::new();
    for (pos, data) in batch.into_iter().enumerate() {
        match refusals::find(&app.refuse, &data) {
            Some(r) => {
                results[pos] = Some(json!({"status": r.status, "error": r.message()}));
            }
            None => {
                let element = json!({"status": 200, "endpoint": name, "data": data});
                run.push((pos, Bytes::from(element.to_string())));
            }
        }
    }
    let positions: Vec<usize> = run.iter().map(|(p, _)| *p).collect();
    let (settled, credits) = app
        .lock()
        .settle_batch(ticket, idem, run, cost, Instant::now());
    let executed = settled.iter().any(|s| matches!(s, Settled::Executed(_)));
    for (pos, s) in positions.into_iter().zip(settled) {
        results[pos] = Some(match s {
            Settled::Executed(b) | Settled::Replayed(b) => {
                serde_json::from_slice(&b).unwrap_or(Value::Null)
            }
            Settled::Unpaid => json!({"status": 402, "error": "credits exhausted",
                                      "code": "credits_exhausted", "cost": cost}),
        });
    }
    let results = results
        .into_iter()
        .map(|r| r.unwrap_or(Value::Null))
        .collect();
    (results, credits, executed)
}
