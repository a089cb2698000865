//! The API's wire contract: header names and how their values are read.
//!
//! The client and the built-in sim both speak it, so both take the names from
//! here; a header spelled differently on each side would be a silent bug.

use reqwest::header::{HeaderMap, HeaderName};

/// The default header that carries the API key.
pub const API_KEY: HeaderName = HeaderName::from_static("x-api-key");
/// Makes a retried call safe: the server runs each key at most once.
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
/// Set by the server when it answers from its idempotency store.
pub const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");
/// The per-window request limit actually in force for this key.
pub const RATE_LIMIT_LIMIT: HeaderName = HeaderName::from_static("x-rate-limit-limit");
/// What is left of that limit in the current window.
pub const RATE_LIMIT_REMAINING: HeaderName = HeaderName::from_static("x-rate-limit-remaining");
/// Present on a 429 caused by the concurrency ceiling, not by the window.
pub const CONCURRENCY_LIMIT: HeaderName = HeaderName::from_static("x-concurrency-limit");
/// Credits left this billing cycle.
pub const REMAINING_CREDITS: HeaderName = HeaderName::from_static("x-api-remaining-credits");
/// Credits spent this billing cycle.
pub const CREDITS_USED: HeaderName = HeaderName::from_static("x-api-credits-used");
/// The cycle's allowance; its presence is what marks a response as metered.
pub const MAX_CREDITS: HeaderName = HeaderName::from_static("x-api-max-credits");
/// Unix time (seconds) at which the allowance resets.
pub const RENEWAL: HeaderName = HeaderName::from_static("x-api-renewal");
/// Seconds (or an HTTP date) until a retry may succeed.
pub const RETRY_AFTER: HeaderName = reqwest::header::RETRY_AFTER;

/// A header's value as trimmed text, when it is valid visible ASCII.
pub fn text<'a>(h: &'a HeaderMap, name: &HeaderName) -> Option<&'a str> {
    h.get(name).and_then(|v| v.to_str().ok()).map(str::trim)
}

/// A header as a whole number, when it is one: the least of its lines
/// when it came more than once (a proxy's and the API's), the tighter.
pub fn whole(h: &HeaderMap, name: &HeaderName) -> Option<u64> {
    h.get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok()?.trim().parse().ok())
        .min()
}

/// Parses a credit header as an integer.
///
/// A decimal with no fractional part ("12.0") is accepted because some
/// gateways serialize every number as a float; a real fraction ("12.5") is
/// refused, since credits are whole and rounding would misstate the balance.
/// Anything else (empty, text, NaN, out of range) is `None`.
pub fn credit_int(h: &HeaderMap, name: &HeaderName) -> Option<i64> {
    let s = text(h, name)?;
    if let Ok(v) = s.parse::<i64>() {
        return Some(v);
    }
    let f = s.parse::<f64>().ok()?;
    // The bounds keep the cast exact; i64::MAX itself is not representable.
    if f.fract() == 0.0 && (-9.0e18..=9.0e18).contains(&f) {
        Some(f as i64)
    } else {
        None
    }
}

/// `x-rate-limit-limit`, when present and a positive whole number.
pub fn limit_in_force(h: &HeaderMap) -> Option<u64> {
    whole(h, &RATE_LIMIT_LIMIT).filter(|&l| l > 0)
}

/// True when `x-api-remaining-credits` is present and reads zero or less.
///
/// The classifier uses this to tell a credit-exhaustion 429 from a rate-limit
/// 429. Unlike `credits::snapshot_from_headers` it accepts any finite number, even a
/// fractional one: "-0.5" left is still nothing left.
pub fn exhausted_by_headers(h: &HeaderMap) -> bool {
    text(h, &REMAINING_CREDITS)
        .and_then(|s| s.parse::<f64>().ok())
        .is_some_and(|v| v.is_finite() && v <= 0.0)
}

/// Whether `headers` say the answer is the API's replay of an earlier
/// call under the same Idempotency-Key (`Idempotent-Replayed: true`, as
/// Stripe and the sim say it).
pub fn replayed(headers: &HeaderMap) -> bool {
    headers
        .get(IDEMPOTENT_REPLAYED)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    fn map(pairs: &[(&HeaderName, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (n, v) in pairs {
            h.insert((*n).clone(), HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn credit_values_accept_whole_floats_only() {
        let h = map(&[
            (&REMAINING_CREDITS, " 12.0 "),
            (&CREDITS_USED, "12.5"),
            (&MAX_CREDITS, "abc"),
        ]);
        assert_eq!(credit_int(&h, &REMAINING_CREDITS), Some(12));
        assert_eq!(credit_int(&h, &CREDITS_USED), None);
        assert_eq!(credit_int(&h, &MAX_CREDITS), None);
        assert_eq!(credit_int(&h, &RENEWAL), None);
    }

    #[test]
    fn a_zero_or_garbled_limit_is_no_limit() {
        assert_eq!(limit_in_force(&map(&[(&RATE_LIMIT_LIMIT, "0")])), None);
        assert_eq!(limit_in_force(&map(&[(&RATE_LIMIT_LIMIT, "x")])), None);
        assert_eq!(limit_in_force(&map(&[(&RATE_LIMIT_LIMIT, " 7")])), Some(7));
    }

    fn bytes(pairs: &[(HeaderName, &[u8])]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (n, v) in pairs {
            h.insert(n.clone(), HeaderValue::from_bytes(v).unwrap());
        }
        h
    }

    #[test]
    fn exhausted_by_headers_cases() {
        assert!(exhausted_by_headers(&bytes(&[(REMAINING_CREDITS, b"0")])));
        assert!(exhausted_by_headers(&bytes(&[(
            REMAINING_CREDITS,
            b" -3 "
        )])));
        assert!(exhausted_by_headers(&bytes(&[(REMAINING_CREDITS, b"0.0")])));
        assert!(exhausted_by_headers(&bytes(&[(
            REMAINING_CREDITS,
            b"-0.5"
        )])));
        assert!(!exhausted_by_headers(&bytes(&[(REMAINING_CREDITS, b"1")])));
        assert!(!exhausted_by_headers(&bytes(&[(
            REMAINING_CREDITS,
            b"0.5"
        )])));
        assert!(!exhausted_by_headers(&bytes(&[(
            REMAINING_CREDITS,
            b"none"
        )])));
        assert!(!exhausted_by_headers(&bytes(&[(
            REMAINING_CREDITS,
            b"-inf"
        )])));
        assert!(!exhausted_by_headers(&bytes(&[(
            REMAINING_CREDITS,
            b"\xff"
        )])));
        assert!(!exhausted_by_headers(&HeaderMap::new()));
        // Other credit headers alone do not mean exhaustion.
        assert!(!exhausted_by_headers(&bytes(&[(MAX_CREDITS, b"0")])));
    }
}
