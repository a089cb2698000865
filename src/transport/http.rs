//! The real transport, through reqwest: it follows redirects only within
//! the request's origin, times out the whole call, reads at most
//! `--max-body` of a body and classes its failures for the pool. reqwest
//! honours `HTTP_PROXY`, `HTTPS_PROXY`, `ALL_PROXY` and `NO_PROXY`.

use std::time::Duration;

use reqwest::header::HeaderMap;

use super::{FailureKind, Request, Response, Transport, TransportError};
use crate::util::BoxFuture;

/// Redirects followed per call, at most (within the request's origin).
const MAX_REDIRECTS: usize = 10;

/// How long the body of a 429 is read once its status came: the status and
/// `Retry-After` are the answer, and a body that trickles in must not hold
/// a worker, and the pause every worker waits for, until `--timeout`.
const REFUSAL_BODY: Duration = Duration::from_secs(2);

/// How long a keep-alive connection may sit idle before a call takes a
/// new one instead. Node's and Apache's servers close theirs after 5 s: a
/// call written into a connection the server is closing gets no answer and
/// may have run (reqwest's 90 s would race them on a job paced a call per
/// 5 s a worker). A slower pace pays a handshake per call, which is
/// nothing at that pace.
const POOL_IDLE: Duration = Duration::from_secs(4);

/// The real transport, built once per run and shared by every worker.
pub struct HttpTransport {
    client: reqwest::Client,
    max_body: usize,
    timeout: Duration,
}

impl HttpTransport {
    /// A client with `timeout` per call (connecting, sending and reading
    /// the whole body), keeping up to `idle` keep-alive connections (one
    /// per worker), that follows up to 10 redirects within the request's
    /// origin and reads at most `max_body` bytes of a body.
    pub fn new(timeout: Duration, idle: usize, max_body: usize) -> anyhow::Result<HttpTransport> {
        Self::with_pool_idle(timeout, idle, max_body, POOL_IDLE)
    }

    /// [`HttpTransport::new`] whose idle connections are given up after
    /// `pool_idle`.
    fn with_pool_idle(
        timeout: Duration,
        idle: usize,
        max_body: usize,
        pool_idle: Duration,
    ) -> anyhow::Result<HttpTransport> {
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .pool_max_idle_per_host(idle)
            .pool_idle_timeout(pool_idle)
            // Requests are small: none should wait for Nagle's algorithm.
            .tcp_nodelay(true)
            // The pool retries under the Idempotency-Key itself; reqwest's
            // own retry policy would only copy every request.
            .retry(reqwest::retry::never().max_retries_per_request(0))
            .user_agent(USER_AGENT)
            // The key travels in a custom header that reqwest would carry
            // across a redirect to another host.
            .redirect(reqwest::redirect::Policy::custom(|attempt| {
                let same_origin = attempt
                    .previous()
                    .first()
                    .is_some_and(|first| first.origin() == attempt.url().origin());
                if same_origin && attempt.previous().len() <= MAX_REDIRECTS {
                    attempt.follow()
                } else {
                    attempt.stop()
                }
            }))
            .build()?;
        Ok(HttpTransport {
            client,
            max_body,
            timeout,
        })
    }

    async fn call(&self, req: &Request) -> Result<Response, TransportError> {
        let url = reqwest::Url::parse(&req.url).map_err(|e| TransportError {
            kind: FailureKind::Other,
            reason: format!("invalid URL: {e}"),
        })?;
        let mut r = reqwest::Request::new(req.method.clone(), url);
        *r.headers_mut() = req.headers.clone();
        if let Some(bytes) = &req.body {
            *r.body_mut() = Some(bytes.clone().into());
        }
        let mut resp = self
            .client
            .execute(r)
            .await
            .map_err(|e| classify(&e, self.timeout))?;
        let status = resp.status().as_u16();
        let headers = std::mem::take(resp.headers_mut());
        let mut body = Capped::new(self.max_body);
        let refusal = (status == 429).then(|| tokio::time::Instant::now() + REFUSAL_BODY);
        loop {
            let chunk = match refusal {
                None => resp.chunk().await,
                Some(by) => match tokio::time::timeout_at(by, resp.chunk()).await {
                    Ok(chunk) => chunk,
                    Err(_) => {
                        body.cut = Some(format!(
                            "the rest of a 429's body did not come within {}s",
                            REFUSAL_BODY.as_secs()
                        ));
                        break;
                    }
                },
            };
            match chunk {
                Ok(Some(chunk)) if body.push(&chunk) => {}
                Ok(_) => break,
                // The status came: the server answered, and a call sent
                // again would run again. What came of the body is kept.
                Err(e) => {
                    body.cut = Some(classify(&e, self.timeout).reason);
                    break;
                }
            }
        }
        Ok(body.response(status, headers))
    }
}

impl Transport for HttpTransport {
    fn send<'a>(&'a self, req: &'a Request) -> BoxFuture<'a, Result<Response, TransportError>> {
        Box::pin(self.call(req))
    }
}

/// A reqwest error as a [`TransportError`] (reqwest's own Display includes
/// the URL).
fn classify(err: &reqwest::Error, timeout: Duration) -> TransportError {
    if err.is_timeout() {
        return timed_out(timeout);
    }
    let (kind, what) = if err.is_connect() {
        (FailureKind::Connect, "could not connect")
    } else if unreadable(err) {
        (
            FailureKind::Unreadable,
            "the server's answer could not be read",
        )
    } else if err.is_body() || err.is_decode() {
        (
            FailureKind::Body,
            "connection dropped while reading the response",
        )
    } else {
        (FailureKind::Other, "connection failed")
    };
    failure(kind, what, err)
}

/// Whether `err` is a response that came but does not parse as HTTP.
fn unreadable(err: &reqwest::Error) -> bool {
    let first: &(dyn std::error::Error + 'static) = err;
    std::iter::successors(Some(first), |e| e.source()).any(|e| {
        e.downcast_ref::<hyper::Error>()
            .is_some_and(hyper::Error::is_parse)
    })
}

/// What the user agent header says unless the request sets its own.
const USER_AGENT: &str = concat!("batchrun/", env!("CARGO_PKG_VERSION"));

/// A body read chunk by chunk up to a cap, never held whole: a hostile or
/// broken server cannot fill the memory or the checkpoint.
struct Capped {
    bytes: Vec<u8>,
    room: usize,
    truncated: bool,
    cut: Option<String>,
}

impl Capped {
    fn new(max: usize) -> Capped {
        Capped {
            bytes: Vec::new(),
            room: max,
            truncated: false,
            cut: None,
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
            cut: self.cut,
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

    /// A server answering every request on a kept-alive connection; the
    /// count is of the connections it accepted.
    async fn counting_server() -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/", listener.local_addr().unwrap());
        let accepted = std::sync::Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            while let Ok((mut sock, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    // Each request here is a bodiless GET in one read.
                    while matches!(sock.read(&mut buf).await, Ok(n) if n > 0) {
                        let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                        if sock.write_all(ok).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        (url, accepted)
    }

    /// Two calls `gap` apart through a transport giving idle connections up
    /// after `pool_idle`: how many connections the server saw.
    async fn connections_for(pool_idle: Duration, gap: Duration) -> usize {
        let (url, accepted) = counting_server().await;
        let t = HttpTransport::with_pool_idle(Duration::from_secs(5), 2, 1024, pool_idle).unwrap();
        let req = Request {
            url,
            method: reqwest::Method::GET,
            headers: HeaderMap::new(),
            body: None,
        };
        for _ in 0..2 {
            let r = t.call(&req).await.unwrap();
            assert_eq!((r.status, r.body.as_str()), (200, "ok"));
            tokio::time::sleep(gap).await;
        }
        accepted.load(std::sync::atomic::Ordering::SeqCst)
    }

    #[tokio::test]
    async fn a_connection_idle_past_the_pool_limit_is_not_reused() {
        // The same gap once past the pool's limit and once within it: the
        // late call opens a new connection where the early one reuses.
        let gap = Duration::from_millis(300);
        assert_eq!(connections_for(Duration::from_millis(50), gap).await, 2);
        assert_eq!(connections_for(POOL_IDLE, gap).await, 1);
    }

    /// A 429 whose body trickles in is the answer once its status came:
    /// read for at most [`REFUSAL_BODY`], what came kept and marked cut,
    /// where it held the call until the transport's timeout, as no answer.
    #[tokio::test]
    async fn a_429_whose_body_never_ends_is_answered_at_once() {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/", listener.local_addr().unwrap());
        tokio::spawn(async move {
            let (mut sock, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 4096];
            let _ = sock.read(&mut buf).await;
            let head =
                "HTTP/1.1 429 Too Many Requests\r\nretry-after: 1\r\ncontent-length: 100\r\n\r\n";
            sock.write_all(head.as_bytes()).await.unwrap();
            sock.write_all(b"{\"error\":").await.unwrap();
            // The rest never comes; the connection stays open.
            tokio::time::sleep(Duration::from_secs(60)).await;
        });
        let t = HttpTransport::new(REFUSAL_BODY * 3, 1, 1024).unwrap();
        let req = Request {
            url,
            method: reqwest::Method::GET,
            headers: HeaderMap::new(),
            body: None,
        };
        let r = t.call(&req).await.expect("the 429 is the answer");
        assert_eq!((r.status, r.body.as_str()), (429, "{\"error\":"));
        assert_eq!(r.headers["retry-after"], "1");
        assert!(r.cut.is_some_and(|c| c.contains("429's body")));
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
