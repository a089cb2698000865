//! Credits: what the account's balance is, which billing alerts are due, and
//! how they reach people.
//!
//! [`snapshot_from_headers`] reads the credit headers off a metered response;
//! [`meter`] tracks them across a run and decides which threshold and
//! burn-rate alerts are due once per billing cycle; [`alert`] words every
//! alert; [`deliver`] sends them to stderr, the summary and a webhook.
//!
//! Everything except delivery is pure: the caller passes the time in, nothing
//! sleeps and nothing does I/O, so it is tested on a fake clock.

use reqwest::header::HeaderMap;
use serde::{Deserialize, Serialize};

use crate::wire;

pub mod alert;
pub mod deliver;
pub mod ledger;
pub mod meter;
pub mod reserve;

pub use alert::{
    describe_renewal, format_line, format_unix_date, format_unix_utc, is_repeat_of, repeat_id,
    Alert, AlertKind, ID_EXHAUSTED, ID_KEY_REJECTED, ID_PROJECTED, ID_RESERVE,
};
pub use deliver::{check_webhook_url, Alerter, WEBHOOK_GRACE, WEBHOOK_TIMEOUT, WEBHOOK_TRIES};
pub use ledger::{Admit, InFlight, Ledger, Observed, ReserveConfig};
pub use meter::{
    parse_thresholds, CreditMeter, MeterConfig, MeterState, Projection, MIN_PROJECTION_SPAN,
};

/// Where the account stood according to one metered response.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CreditSnapshot {
    /// `x-api-remaining-credits`; may be negative if the API lets a call overdraw.
    pub remaining: i64,
    /// `x-api-credits-used`.
    pub used: i64,
    /// `x-api-max-credits`.
    pub max: i64,
    /// `x-api-renewal` in unix seconds, `None` when absent, before 2001 or not a number.
    pub renewal: Option<u64>,
}

impl CreditSnapshot {
    /// Whether `self` is older news than `prev`: responses arrive out of order
    /// with many workers, and within one billing cycle the one that saw less
    /// spending was answered earlier. It must not roll the balance back.
    pub fn is_older_than(&self, prev: Option<CreditSnapshot>) -> bool {
        prev.is_some_and(|p| p.renewal == self.renewal && self.used < p.used)
    }
}

/// A credit header's value, read once: `Some(None)` when it was not sent,
/// `None` when it was sent but cannot be read (no balance to trust, not
/// one left out).
fn credit_field(h: &HeaderMap, name: &reqwest::header::HeaderName) -> Option<Option<i64>> {
    match h.contains_key(name) {
        false => Some(None),
        true => wire::credit_int(h, name).map(Some),
    }
}

/// Whether a `used` of `used` fell back clearly from `from`: below half of
/// it, and by more than `slack` (what the calls in flight could cost, by
/// which an answer they overtook is older). A new billing cycle shows so
/// when the API sends no `x-api-renewal`; the meter and the ledger each
/// measure their own slack.
pub(crate) fn fell_back(used: i64, from: i64, slack: i64) -> bool {
    used.saturating_mul(2) < from && from.saturating_sub(used) > slack
}

/// Reads the credit headers of one response.
///
/// Returns `None` unless `x-api-max-credits`, `x-api-credits-used` and
/// `x-api-remaining-credits` are all present and integers: a response
/// without them was not metered and says nothing about the balance.
/// Surrounding whitespace is fine and "12.0" reads as 12, but "12.5", "abc"
/// or an empty value make the whole snapshot `None`. A missing or malformed
/// `x-api-renewal` only leaves `renewal` unknown. Never panics.
pub fn snapshot_from_headers(h: &HeaderMap) -> Option<CreditSnapshot> {
    // Without x-api-max-credits the response was not metered. With it,
    // either of the other two tells the one left out: an API that leaves
    // one out still states its balance (the reserve was ignored for it).
    let max = wire::credit_int(h, &wire::MAX_CREDITS)?;
    let used = credit_field(h, &wire::CREDITS_USED)?;
    let remaining = credit_field(h, &wire::REMAINING_CREDITS)?;
    let (used, remaining) = match (used, remaining) {
        (Some(u), Some(r)) => (u, r),
        (None, Some(r)) => (max.saturating_sub(r), r),
        (Some(u), None) => (u, max.saturating_sub(u)),
        (None, None) => return None,
    };
    // Zero is what a missing timestamp often serializes to; it is never a real
    // renewal, and treating it as one would start a bogus "new cycle". Nor
    // is any instant before 2001: a server flipping between its renewal and
    // such a value raised every threshold alert again at each flip.
    let renewal = wire::credit_int(h, &wire::RENEWAL)
        .filter(|&r| r > 1_000_000_000)
        .map(|r| r as u64);
    Some(CreditSnapshot {
        remaining,
        used,
        max,
        renewal,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{CREDITS_USED, MAX_CREDITS, REMAINING_CREDITS, RENEWAL};
    use reqwest::header::{HeaderName, HeaderValue};

    /// A snapshot with `used` of `max` spent; shared with the submodules' tests.
    pub(super) fn snap(used: i64, max: i64, renewal: Option<u64>) -> CreditSnapshot {
        CreditSnapshot {
            remaining: max - used,
            used,
            max,
            renewal,
        }
    }

    fn headers(pairs: &[(HeaderName, &[u8])]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(k.clone(), HeaderValue::from_bytes(v).unwrap());
        }
        h
    }

    #[test]
    fn snapshot_reads_all_four_headers() {
        let h = headers(&[
            (MAX_CREDITS, b"10000"),
            (CREDITS_USED, b" 2500 "),
            (REMAINING_CREDITS, b"7500"),
            (RENEWAL, b"1796860800"),
        ]);
        assert_eq!(
            snapshot_from_headers(&h),
            Some(CreditSnapshot {
                remaining: 7500,
                used: 2500,
                max: 10000,
                renewal: Some(1_796_860_800)
            })
        );
    }

    #[test]
    fn snapshot_none_without_the_maximum_or_both_of_the_others() {
        assert_eq!(snapshot_from_headers(&HeaderMap::new()), None);
        // Without x-api-max-credits the response was not metered.
        let h = headers(&[(CREDITS_USED, b"1"), (REMAINING_CREDITS, b"9")]);
        assert_eq!(snapshot_from_headers(&h), None);
        // With it, either of the others tells the one left out.
        let h = headers(&[(MAX_CREDITS, b"10"), (REMAINING_CREDITS, b"9")]);
        assert_eq!(snapshot_from_headers(&h), Some(snap(1, 10, None)));
        let h = headers(&[(MAX_CREDITS, b"10"), (CREDITS_USED, b"1")]);
        assert_eq!(snapshot_from_headers(&h), Some(snap(1, 10, None)));
        let h = headers(&[(MAX_CREDITS, b"10")]);
        assert_eq!(snapshot_from_headers(&h), None);
    }

    #[test]
    fn snapshot_none_when_a_credit_header_is_not_a_number() {
        for bad in [
            &b"abc"[..],
            b"",
            b"  ",
            b"12.5",
            b"NaN",
            b"inf",
            b"1e400",
            b"99999999999999999999999",
            b"1,000",
            b"\xff\xfe",
        ] {
            let h = headers(&[
                (MAX_CREDITS, b"10"),
                (CREDITS_USED, bad),
                (REMAINING_CREDITS, b"9"),
            ]);
            assert_eq!(snapshot_from_headers(&h), None, "used = {bad:?}");
        }
    }

    #[test]
    fn snapshot_accepts_integral_floats_and_negative_remaining() {
        let h = headers(&[
            (MAX_CREDITS, b"10.0"),
            (CREDITS_USED, b"12"),
            (REMAINING_CREDITS, b"-2"),
        ]);
        assert_eq!(snapshot_from_headers(&h), Some(snap(12, 10, None)));
    }

    #[test]
    fn snapshot_renewal_unknown_when_absent_zero_or_garbage() {
        // "1": 1970, a renewal no server means (an alert storm when it flipped).
        for bad in [&b"soon"[..], b"0", b"-5", b"1.5", b"", b"1", b"86400"] {
            let h = headers(&[
                (MAX_CREDITS, b"10"),
                (CREDITS_USED, b"1"),
                (REMAINING_CREDITS, b"9"),
                (RENEWAL, bad),
            ]);
            assert_eq!(snapshot_from_headers(&h).unwrap().renewal, None, "{bad:?}");
        }
    }

    #[test]
    fn an_out_of_order_response_is_older_news_only_within_a_cycle() {
        assert!(!snap(5, 100, Some(1)).is_older_than(None));
        assert!(snap(5, 100, Some(1)).is_older_than(Some(snap(6, 100, Some(1)))));
        assert!(
            !snap(6, 100, Some(1)).is_older_than(Some(snap(6, 100, Some(1)))),
            "a top-up keeps used"
        );
        assert!(
            !snap(7, 100, Some(1)).is_older_than(Some(snap(6, 100, Some(1)))),
            "newer news"
        );
        assert!(
            !snap(0, 100, Some(2)).is_older_than(Some(snap(6, 100, Some(1)))),
            "a new cycle"
        );
        // Without a renewal on either side they count as the same cycle.
        assert!(snap(5, 100, None).is_older_than(Some(snap(6, 100, None))));
    }
}
