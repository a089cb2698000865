//! Server headers: `Retry-After` and the credit and rate-limit headers, with
//! arbitrary values.
//!
//! Layout of the input: four bytes choosing the clock, then one value per
//! line, given in turn to the headers below (a value a header cannot carry is
//! left out, as the HTTP client would never hand it over).
#![no_main]

use std::time::{Duration, SystemTime};

use batchrun::credits::snapshot_from_headers;
use batchrun::rate::retry_after::{self, MAX_RETRY_AFTER};
use batchrun::wire;
use libfuzzer_sys::fuzz_target;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};

const NAMES: [HeaderName; 7] = [
    wire::RETRY_AFTER,
    wire::MAX_CREDITS,
    wire::CREDITS_USED,
    wire::REMAINING_CREDITS,
    wire::RENEWAL,
    wire::RATE_LIMIT_LIMIT,
    wire::RATE_LIMIT_REMAINING,
];

fuzz_target!(|data: &[u8]| {
    let [a, b, c, d, rest @ ..] = data else {
        return;
    };
    // Up to about the year 2514, and one day before the epoch.
    let secs = u64::from(u32::from_le_bytes([*a, *b, *c, *d])) * 4;
    let clocks = [
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs),
        SystemTime::UNIX_EPOCH - Duration::from_secs(86_400),
    ];

    let mut h = HeaderMap::new();
    for (name, value) in NAMES.iter().zip(rest.split(|&b| b == b'\n')) {
        for now in clocks {
            let parsed = retry_after::parse(&String::from_utf8_lossy(value), now);
            assert!(parsed.is_none_or(|d| d <= MAX_RETRY_AFTER), "{parsed:?}");
        }
        if let Ok(v) = HeaderValue::from_bytes(value) {
            h.insert(name.clone(), v);
        }
    }
    check_headers(&h);
});

fn check_headers(h: &HeaderMap) {
    for name in &NAMES {
        let text = wire::text(h, name);
        let int = wire::credit_int(h, name);
        if let Some(exact) = text.and_then(|s| s.parse::<i64>().ok()) {
            assert_eq!(int, Some(exact));
        }
        if let Some(v) = int {
            let f: f64 = text.expect("a value came from the header").parse().unwrap();
            assert_eq!(f.fract(), 0.0, "{text:?} -> {v}");
        }
        let _ = wire::whole(h, name);
    }
    assert!(wire::limit_in_force(h).is_none_or(|l| l > 0));
    let _ = wire::limit_remaining(h);
    if wire::exhausted_by_headers(h) {
        let text = wire::text(h, &wire::REMAINING_CREDITS).unwrap();
        assert!(text.parse::<f64>().unwrap() <= 0.0, "{text:?}");
    }

    let snapshot = snapshot_from_headers(h);
    let credits = (
        wire::credit_int(h, &wire::REMAINING_CREDITS),
        wire::credit_int(h, &wire::CREDITS_USED),
        wire::credit_int(h, &wire::MAX_CREDITS),
    );
    match (snapshot, credits) {
        (Some(s), (Some(remaining), Some(used), Some(max))) => {
            assert_eq!((s.remaining, s.used, s.max), (remaining, used, max));
            if let Some(r) = s.renewal {
                assert!(r > 0);
                assert_eq!(wire::credit_int(h, &wire::RENEWAL), i64::try_from(r).ok());
            }
        }
        (None, (Some(_), Some(_), Some(_))) => panic!("all three credit headers but no snapshot"),
        (Some(s), _) => panic!("a snapshot {s:?} without all three credit headers"),
        (None, _) => {}
    }
}
