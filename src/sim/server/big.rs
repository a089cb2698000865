//! `/v1/big?bytes=N`: a metered call whose answer is a JSON body of N bytes,
//! generated while it is written so the sim never holds it whole.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::Query;
use axum::http::Uri;
use http_body::{Frame, SizeHint};

/// The endpoint's name under `/v1/`.
pub(super) const ENDPOINT: &str = "big";

/// The largest body a request may ask for: 1 GiB.
pub(super) const MAX_BYTES: u64 = 1 << 30;

/// The padding is sent in slices of this static run of `x`s: nothing is
/// allocated per chunk.
const CHUNK: usize = 64 * 1024;
static PAD: [u8; CHUNK] = [b'x'; CHUNK];

/// What the idempotency store keeps for a big response: not the body but
/// how to make it again. Echo bodies are JSON, which never starts with NUL.
const MARKER: &str = "\0big:";

#[derive(serde::Deserialize)]
struct BigQuery {
    bytes: Option<String>,
}

/// The `bytes` parameter of `uri`, or what is wrong with it.
pub(super) fn requested_bytes(uri: &Uri) -> Result<u64, String> {
    let q = Query::<BigQuery>::try_from_uri(uri).map_err(|e| format!("bad query: {e}"))?;
    let raw = q.0.bytes.ok_or("expected ?bytes=N")?;
    match raw.trim().parse::<u64>() {
        Ok(n) if n <= MAX_BYTES => Ok(n),
        Ok(_) => Err(format!("bytes must be at most {MAX_BYTES} (1 GiB)")),
        Err(_) => Err(format!("bytes={raw:?} is not a whole number")),
    }
}

/// What to store for the idempotency replay of a big response of `n` bytes.
pub(super) fn marker(n: u64) -> Bytes {
    Bytes::from(format!("{MARKER}{n}"))
}

/// The size of the big response a stored body stands for, if it is one.
pub(super) fn from_marker(stored: &Bytes) -> Option<u64> {
    std::str::from_utf8(stored)
        .ok()?
        .strip_prefix(MARKER)?
        .parse()
        .ok()
}

/// `{"status":"ok","endpoint":"big",["key":K,]"pad":"xxx…"}`, exactly `n`
/// bytes long unless `n` is shorter than the bare envelope.
pub(super) fn body(n: u64, key: Option<&str>) -> Body {
    let mut head = format!(r#"{{"status":"ok","endpoint":"{ENDPOINT}","#);
    if let Some(k) = key {
        let k = serde_json::to_string(k).unwrap_or_default();
        head.push_str(&format!(r#""key":{k},"#));
    }
    head.push_str(r#""pad":""#);
    let tail = Bytes::from_static(b"\"}");
    let pad = n.saturating_sub((head.len() + tail.len()) as u64);
    Body::new(BigBody {
        head: Some(Bytes::from(head)),
        pad,
        tail: Some(tail),
    })
}

struct BigBody {
    head: Option<Bytes>,
    /// Padding bytes still to send.
    pad: u64,
    tail: Option<Bytes>,
}

impl BigBody {
    fn left(&self) -> u64 {
        let len = |b: &Option<Bytes>| b.as_ref().map_or(0, |b| b.len() as u64);
        len(&self.head) + self.pad + len(&self.tail)
    }
}

impl HttpBody for BigBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        // hyper polls for the next frame only once the last one is written,
        // so at most a chunk or so is buffered per response.
        let this = self.get_mut();
        let next = if let Some(head) = this.head.take() {
            head
        } else if this.pad > 0 {
            let n = this.pad.min(CHUNK as u64) as usize;
            this.pad -= n as u64;
            Bytes::from_static(&PAD[..n])
        } else if let Some(tail) = this.tail.take() {
            tail
        } else {
            return Poll::Ready(None);
        };
        Poll::Ready(Some(Ok(Frame::data(next))))
    }

    fn is_end_stream(&self) -> bool {
        self.left() == 0
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.left())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uri(s: &str) -> Uri {
        s.parse().unwrap()
    }

    async fn collect(b: Body) -> Vec<u8> {
        axum::body::to_bytes(b, usize::MAX).await.unwrap().to_vec()
    }

    #[tokio::test]
    async fn the_body_is_json_of_exactly_the_asked_size() {
        for n in [0, 10, 40, 41, 200_000] {
            let bytes = collect(body(n, None)).await;
            let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
            assert_eq!(v["status"], "ok");
            assert!(v["pad"].as_str().unwrap().bytes().all(|b| b == b'x'));
            let envelope = br#"{"status":"ok","endpoint":"big","pad":""}"#.len() as u64;
            assert_eq!(bytes.len() as u64, n.max(envelope), "n = {n}");
        }
        let bytes = collect(body(1000, Some("k\"1"))).await;
        let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!((v["key"].as_str(), bytes.len()), (Some("k\"1"), 1000));
    }

    #[test]
    fn the_size_is_a_whole_number_up_to_a_gibibyte() {
        assert_eq!(requested_bytes(&uri("/v1/big?bytes=12")), Ok(12));
        assert_eq!(
            requested_bytes(&uri("/v1/big?bytes=1073741824")),
            Ok(MAX_BYTES)
        );
        for bad in [
            "/v1/big",
            "/v1/big?bytes=",
            "/v1/big?bytes=-1",
            "/v1/big?bytes=1e3",
        ] {
            assert!(requested_bytes(&uri(bad)).is_err(), "{bad}");
        }
        let e = requested_bytes(&uri("/v1/big?bytes=1073741825")).unwrap_err();
        assert!(e.contains("at most"), "{e}");
    }

    #[test]
    fn a_stored_big_response_is_its_recipe() {
        assert_eq!(from_marker(&marker(123)), Some(123));
        assert_eq!(from_marker(&Bytes::from_static(b"{\"big\":1}")), None);
    }
}
