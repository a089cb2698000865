//! How a rendered [`Request`] is sent: the [`Transport`] seam, and the real
//! one, [`HttpTransport`].
//!
//! [`HttpTransport`] calls hyper directly ([`direct`]): reqwest parses every
//! URL three times over (host, IDNA and all), which was the largest single
//! cost per call left in a million-item run. When the environment names a
//! proxy, the run goes through reqwest instead ([`proxied`]), which honours
//! `HTTP_PROXY`, `HTTPS_PROXY`, `ALL_PROXY` and `NO_PROXY` as before. Both
//! follow redirects only within the request's origin, time out the whole
//! call, read at most `--max-body` of a body, and class their failures the
//! same way.

mod direct;
mod proxied;

use std::sync::Arc;
use std::time::Duration;

use reqwest::header::HeaderMap;

use crate::pace::BoxFuture;
use crate::request::Request;

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
    /// Anything else.
    Other,
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

/// The real transport, built once per run and shared by every worker.
pub struct HttpTransport {
    backend: Backend,
}

enum Backend {
    Direct(direct::Direct),
    Proxied(proxied::Proxied),
}

/// The environment variables through which reqwest finds a proxy.
const PROXY_VARS: [&str; 6] = [
    "HTTP_PROXY",
    "http_proxy",
    "HTTPS_PROXY",
    "https_proxy",
    "ALL_PROXY",
    "all_proxy",
];

/// Whether the environment names a proxy.
fn proxy_in_env() -> bool {
    PROXY_VARS
        .iter()
        .any(|v| std::env::var_os(v).is_some_and(|s| !s.is_empty()))
}

impl HttpTransport {
    /// A client with `timeout` per call (connecting, sending and reading
    /// the whole body), keeping up to `idle` keep-alive connections (one
    /// per worker), that follows up to 10 redirects within the request's
    /// origin and reads at most `max_body` bytes of a body.
    pub fn new(timeout: Duration, idle: usize, max_body: usize) -> anyhow::Result<HttpTransport> {
        let backend = if proxy_in_env() {
            Backend::Proxied(proxied::Proxied::new(timeout, idle, max_body)?)
        } else {
            Backend::Direct(direct::Direct::new(timeout, idle, max_body))
        };
        Ok(HttpTransport { backend })
    }
}

impl Transport for HttpTransport {
    fn send<'a>(&'a self, req: &'a Request) -> BoxFuture<'a, Result<Response, TransportError>> {
        match &self.backend {
            Backend::Direct(d) => Box::pin(d.send(req)),
            Backend::Proxied(p) => Box::pin(p.send(req)),
        }
    }
}

/// What the user agent header says unless the request sets its own.
const USER_AGENT: &str = concat!("batchrun/", env!("CARGO_PKG_VERSION"));

/// A body read chunk by chunk up to a cap, never held whole: a hostile or
/// broken server cannot fill the memory or the checkpoint.
struct Capped {
    bytes: Vec<u8>,
    room: usize,
    truncated: bool,
}

impl Capped {
    fn new(max: usize) -> Capped {
        Capped {
            bytes: Vec::new(),
            room: max,
            truncated: false,
        }
    }

    /// Takes `chunk`; false once the cap is reached (read no further).
    fn push(&mut self, chunk: &[u8]) -> bool {
        if chunk.len() > self.room {
            self.bytes.extend_from_slice(&chunk[..self.room]);
            self.room = 0;
            self.truncated = true;
            return false;
        }
        self.room -= chunk.len();
        self.bytes.extend_from_slice(chunk);
        true
    }

    /// The response with this body: valid UTF-8 (the usual case) becomes
    /// the `String` without a copy.
    fn response(self, status: u16, headers: HeaderMap) -> Response {
        let body = String::from_utf8(self.bytes)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned());
        Response {
            status,
            headers,
            body,
            truncated: self.truncated,
        }
    }
}

/// A failure of `kind`, described as `what` and the innermost cause of
/// `err`. The outer errors' Display may include the URL, which can carry
/// item data; the innermost cause is the socket's or the parser's word.
fn failure(
    kind: FailureKind,
    what: &str,
    err: &(dyn std::error::Error + 'static),
) -> TransportError {
    let kind = if out_of_handles(err) {
        FailureKind::Resources
    } else {
        kind
    };
    let what = if kind == FailureKind::Resources {
        "out of file handles"
    } else {
        what
    };
    let innermost = std::iter::successors(err.source(), |c| c.source()).last();
    let reason = match innermost {
        Some(c) => format!("{what}: {c}"),
        None => what.to_string(),
    };
    TransportError { kind, reason }
}

/// The failure of a call with no answer within `timeout`.
fn timed_out(timeout: Duration) -> TransportError {
    TransportError {
        kind: FailureKind::Timeout,
        reason: format!(
            "timed out: no complete answer within {}",
            humantime::format_duration(timeout)
        ),
    }
}

/// Whether an error, or one of its causes, is the process or the system
/// running out of file handles.
fn out_of_handles(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(err);
    while let Some(e) = cur {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            if matches!(io.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) {
                return true;
            }
        }
        cur = e.source();
    }
    false
}

/// A shareable transport.
pub type SharedTransport = Arc<dyn Transport>;

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Wrapped(std::io::Error);

    impl std::fmt::Display for Wrapped {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("tcp connect error")
        }
    }

    impl std::error::Error for Wrapped {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn running_out_of_file_handles_is_found_among_the_causes() {
        let emfile = Wrapped(std::io::Error::from_raw_os_error(libc::EMFILE));
        assert!(out_of_handles(&emfile));
        let enfile = std::io::Error::from_raw_os_error(libc::ENFILE);
        assert!(out_of_handles(&enfile));
        let refused = Wrapped(std::io::Error::from_raw_os_error(libc::ECONNREFUSED));
        assert!(!out_of_handles(&refused));
    }

    #[test]
    fn a_body_past_the_cap_is_cut_and_marked() {
        let mut c = Capped::new(5);
        assert!(c.push(b"abc"));
        assert!(!c.push(b"defg"));
        let r = c.response(200, HeaderMap::new());
        assert_eq!((r.body.as_str(), r.truncated), ("abcde", true));
        let mut c = Capped::new(3);
        assert!(c.push(b"abc"));
        let r = c.response(200, HeaderMap::new());
        assert_eq!((r.body.as_str(), r.truncated), ("abc", false));
    }

    #[test]
    fn a_reason_is_the_innermost_cause_and_file_handles_win() {
        let refused = Wrapped(std::io::Error::from_raw_os_error(libc::ECONNREFUSED));
        let f = failure(FailureKind::Connect, "could not connect", &refused);
        assert_eq!(f.kind, FailureKind::Connect);
        assert!(
            f.reason
                .starts_with("could not connect: Connection refused"),
            "{}",
            f.reason
        );
        let emfile = Wrapped(std::io::Error::from_raw_os_error(libc::EMFILE));
        let f = failure(FailureKind::Other, "connection failed", &emfile);
        assert_eq!(f.kind, FailureKind::Resources);
        assert!(
            f.reason.starts_with("out of file handles: "),
            "{}",
            f.reason
        );
    }
}
