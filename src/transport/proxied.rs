//! The transport through reqwest, used when the environment names a proxy:
//! reqwest honours `HTTP_PROXY`, `HTTPS_PROXY`, `ALL_PROXY` and `NO_PROXY`.

use std::time::Duration;

use super::{failure, timed_out, Capped, FailureKind, Response, TransportError, USER_AGENT};
use crate::request::Request;

pub(super) struct Proxied {
    client: reqwest::Client,
    max_body: usize,
    timeout: Duration,
}

impl Proxied {
    pub(super) fn new(timeout: Duration, idle: usize, max_body: usize) -> anyhow::Result<Proxied> {
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .pool_max_idle_per_host(idle)
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
                if same_origin && attempt.previous().len() <= super::direct::MAX_REDIRECTS {
                    attempt.follow()
                } else {
                    attempt.stop()
                }
            }))
            .build()?;
        Ok(Proxied {
            client,
            max_body,
            timeout,
        })
    }

    pub(super) async fn send(&self, req: &Request) -> Result<Response, TransportError> {
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
        while let Some(chunk) = resp.chunk().await.map_err(|e| classify(&e, self.timeout))? {
            if !body.push(&chunk) {
                break;
            }
        }
        Ok(body.response(status, headers))
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
