//! The transport on hyper's client directly, with rustls for https.
//!
//! reqwest would parse each URL three times (ours, its redirect layer's and
//! its response's), each with a host parse and IDNA; here it is parsed once
//! per hop, and the request goes to hyper as built.

use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use reqwest::header::{self, HeaderMap, HeaderValue};
use reqwest::{Method, StatusCode, Url};

use super::{failure, timed_out, Capped, FailureKind, Response, TransportError, USER_AGENT};
use crate::request::Request;

/// Redirects followed per call, at most (within the request's origin).
pub(super) const MAX_REDIRECTS: usize = 10;

type Connector = hyper_rustls::HttpsConnector<HttpConnector>;

pub(super) struct Direct {
    client: Client<Connector, Full<Bytes>>,
    timeout: Duration,
    max_body: usize,
}

impl Direct {
    pub(super) fn new(timeout: Duration, idle: usize, max_body: usize) -> Direct {
        let mut http = HttpConnector::new();
        // Requests are small: none should wait for Nagle's algorithm.
        http.set_nodelay(true);
        http.enforce_http(false);
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_webpki_roots()
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let client = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(idle)
            .build(https);
        Direct {
            client,
            timeout,
            max_body,
        }
    }

    /// Sends `req`, following redirects, and reads the answer, all within
    /// the timeout.
    pub(super) async fn send(&self, req: &Request) -> Result<Response, TransportError> {
        match tokio::time::timeout(self.timeout, self.follow(req)).await {
            Ok(r) => r,
            Err(_) => Err(timed_out(self.timeout)),
        }
    }

    async fn follow(&self, req: &Request) -> Result<Response, TransportError> {
        let mut url = Url::parse(&req.url).map_err(|e| TransportError {
            kind: FailureKind::Other,
            reason: format!("invalid URL: {e}"),
        })?;
        let mut method = req.method.clone();
        // Copied once; a hop that resends it shares the same bytes.
        let mut body = req.body.as_ref().map(|b| Bytes::copy_from_slice(b));
        let mut hops = 0;
        loop {
            let mut r = hyper::Request::new(Full::new(body.clone().unwrap_or_default()));
            *r.method_mut() = method.clone();
            *r.uri_mut() = uri(&url)?;
            *r.headers_mut() = headers(req, body.is_some());
            let resp = self.client.request(r).await.map_err(|e| {
                if e.is_connect() {
                    failure(FailureKind::Connect, "could not connect", &e)
                } else {
                    failure(FailureKind::Other, "connection failed", &e)
                }
            })?;
            match redirect(&resp, &url, hops) {
                Some(next) => {
                    // What reqwest does, and browsers: 301, 302 and 303
                    // turn into a GET without a body; 307 and 308 resend.
                    if matches!(resp.status().as_u16(), 301..=303) {
                        body = None;
                        if method != Method::HEAD {
                            method = Method::GET;
                        }
                    }
                    url = next;
                    hops += 1;
                }
                None => return read(resp, self.max_body).await,
            }
        }
    }
}

/// The request's headers, with a user agent and `accept: */*` unless it
/// sets its own (what reqwest sent), and without the body's headers once a
/// redirect dropped the body.
fn headers(req: &Request, with_body: bool) -> HeaderMap {
    let mut h = req.headers.clone();
    if !h.contains_key(header::USER_AGENT) {
        h.insert(header::USER_AGENT, HeaderValue::from_static(USER_AGENT));
    }
    if !h.contains_key(header::ACCEPT) {
        h.insert(header::ACCEPT, HeaderValue::from_static("*/*"));
    }
    if !with_body && req.body.is_some() {
        for name in [
            header::CONTENT_TYPE,
            header::CONTENT_LENGTH,
            header::CONTENT_ENCODING,
            header::TRANSFER_ENCODING,
        ] {
            h.remove(name);
        }
    }
    h
}

/// `url` as the request target hyper takes (the fragment is never sent).
fn uri(url: &Url) -> Result<hyper::Uri, TransportError> {
    let sent = &url[..url::Position::AfterQuery];
    sent.parse().map_err(|e| TransportError {
        kind: FailureKind::Other,
        reason: format!("invalid URL: {e}"),
    })
}

/// Where a redirect leads, if it is to be followed: within the request's
/// origin (the key travels in a header that must not reach another host),
/// and at most [`MAX_REDIRECTS`] times. Anything else is the answer.
fn redirect(resp: &hyper::Response<Incoming>, url: &Url, hops: usize) -> Option<Url> {
    let redirects = [
        StatusCode::MOVED_PERMANENTLY,
        StatusCode::FOUND,
        StatusCode::SEE_OTHER,
        StatusCode::TEMPORARY_REDIRECT,
        StatusCode::PERMANENT_REDIRECT,
    ];
    if hops >= MAX_REDIRECTS || !redirects.contains(&resp.status()) {
        return None;
    }
    let location = resp.headers().get(header::LOCATION)?.to_str().ok()?;
    let next = url.join(location).ok()?;
    (next.origin() == url.origin()).then_some(next)
}

/// Reads the status, the headers and at most `max_body` bytes of the body.
async fn read(
    resp: hyper::Response<Incoming>,
    max_body: usize,
) -> Result<Response, TransportError> {
    let (parts, mut incoming) = resp.into_parts();
    let mut body = Capped::new(max_body);
    while let Some(frame) = incoming.frame().await {
        let frame = frame.map_err(|e| {
            failure(
                FailureKind::Body,
                "connection dropped while reading the response",
                &e,
            )
        })?;
        if let Ok(data) = frame.into_data() {
            if !body.push(&data) {
                break;
            }
        }
    }
    Ok(body.response(parts.status.as_u16(), parts.headers))
}
