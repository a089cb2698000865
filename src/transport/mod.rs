//! The seam through which a rendered [`Request`] is sent: the [`Transport`]
//! trait, what it returns, and the real one, [`HttpTransport`] (reqwest,
//! the one HTTP client). The pool's unit tests use a scripted fake
//! (`fake`), so the per-call logic is tested without a server.

#[cfg(test)]
pub mod fake;
mod http;

use std::sync::Arc;

use reqwest::header::{HeaderMap, HeaderValue};

use crate::util::BoxFuture;
pub use http::HttpTransport;

/// One rendered call, ready for a [`Transport`].
#[derive(Debug, Clone)]
pub struct Request {
    /// The method.
    pub method: reqwest::Method,
    /// The rendered URL.
    pub url: String,
    /// Every header, the key (marked sensitive) and the Idempotency-Key included.
    pub headers: HeaderMap,
    /// The body bytes, if any.
    pub body: Option<Vec<u8>>,
}

impl Request {
    /// This request carrying `key` as its Idempotency-Key.
    pub fn with_idempotency_key(mut self, key: &str) -> Request {
        if let Ok(v) = HeaderValue::from_str(key) {
            self.headers.insert(crate::wire::IDEMPOTENCY_KEY, v);
        }
        self
    }
}

/// A response as the pool reads it.
#[derive(Debug, Clone)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// The headers.
    pub headers: HeaderMap,
    /// The body as text (lossy for non-UTF-8), at most `--max-body` of it.
    pub body: String,
    /// Whether the body was cut at `--max-body` (the rest was never read).
    pub truncated: bool,
    /// Why the body ended before its end, when the connection dropped (or
    /// the time ran out) after the status and headers came: the server
    /// answered, so the call ran and is not sent again; what came of the
    /// body is kept, marked as cut.
    pub cut: Option<String>,
}

/// What kind of transport failure happened; the pool retries all of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// No answer within the timeout: the server may have run the call.
    Timeout,
    /// No connection was made: the server never saw the call.
    Connect,
    /// The connection dropped while the response was read.
    Body,
    /// This process ran out of file handles (EMFILE, ENFILE): the call
    /// never left, and it is nobody's fault but the machine's.
    Resources,
    /// An answer came that is not HTTP this client can read (a head of
    /// more than 100 headers, a bad header or status line): the server
    /// answered, so the call ran or may have, and the same answer would
    /// come again.
    Unreadable,
    /// Anything else.
    Other,
}

impl FailureKind {
    /// Whether the server may have run the call: it left this client
    /// (every kind but a connection never made and handles run out).
    pub fn may_have_run(self) -> bool {
        !matches!(self, FailureKind::Connect | FailureKind::Resources)
    }
}

/// A call that got no response.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{reason}")]
pub struct TransportError {
    /// What happened.
    pub kind: FailureKind,
    /// A short reason for the failures file (never the key).
    pub reason: String,
}

/// Sends one request. Implemented by [`HttpTransport`] and by test fakes.
pub trait Transport: Send + Sync {
    /// Sends `req` and reads the whole response.
    fn send<'a>(&'a self, req: &'a Request) -> BoxFuture<'a, Result<Response, TransportError>>;
}

/// A shareable transport.
pub type SharedTransport = Arc<dyn Transport>;
