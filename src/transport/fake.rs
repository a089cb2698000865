//! A scripted transport for the pool's unit tests.
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};

use super::{FailureKind, Request, Response, Transport, TransportError};
use crate::util::BoxFuture;
use std::sync::Mutex;
use std::time::Duration;

/// What the fake answers for one call.
pub type Script = Box<dyn Fn(&Request, u64) -> Step + Send + Sync>;

/// One scripted answer: a response or a failure, after a delay.
pub struct Step {
    /// How long the call takes (on tokio's clock).
    pub after: Duration,
    /// What it returns.
    pub result: Result<Response, TransportError>,
}

impl Step {
    /// A 200 with `body` at once.
    pub fn ok(body: &str) -> Step {
        Step::status(200, &[], body)
    }

    /// A response with `status`, `headers` and `body` at once.
    pub fn status(status: u16, headers: &[(&str, &str)], body: &str) -> Step {
        let mut h = HeaderMap::new();
        for (n, v) in headers {
            h.insert(
                HeaderName::from_bytes(n.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        Step {
            after: Duration::ZERO,
            result: Ok(Response {
                status,
                headers: h,
                body: body.to_string(),
                truncated: false,
                cut: None,
            }),
        }
    }

    /// A transport failure at once.
    pub fn fail(kind: FailureKind) -> Step {
        Step {
            after: Duration::ZERO,
            result: Err(TransportError {
                kind,
                reason: "scripted failure".into(),
            }),
        }
    }

    /// The same answer after `d`.
    pub fn after(mut self, d: Duration) -> Step {
        self.after = d;
        self
    }
}

/// Answers each call from a script; records what was sent, and when.
pub struct FakeTransport {
    script: Script,
    /// Every call: (tokio time since creation, URL, Idempotency-Key).
    pub sent: Mutex<Vec<(Duration, String, String)>>,
    start: tokio::time::Instant,
}

impl FakeTransport {
    /// A transport answering call number `n` (from 0) with `script(req, n)`.
    pub fn new(script: impl Fn(&Request, u64) -> Step + Send + Sync + 'static) -> Self {
        FakeTransport {
            script: Box::new(script),
            sent: Mutex::new(Vec::new()),
            start: tokio::time::Instant::now(),
        }
    }

    /// Calls made so far.
    pub fn calls(&self) -> Vec<(Duration, String, String)> {
        self.sent.lock().unwrap().clone()
    }
}

impl Transport for FakeTransport {
    fn send<'a>(&'a self, req: &'a Request) -> BoxFuture<'a, Result<Response, TransportError>> {
        let n = {
            let mut s = self.sent.lock().unwrap();
            let idem = req
                .headers
                .get(crate::wire::IDEMPOTENCY_KEY)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string();
            s.push((self.start.elapsed(), req.url.clone(), idem));
            s.len() as u64 - 1
        };
        let step = (self.script)(req, n);
        Box::pin(async move {
            tokio::time::sleep(step.after).await;
            step.result
        })
    }
}
