//! `Retry-After`: delay-seconds or an HTTP-date (RFC 9110 §10.2.3).

use std::time::{Duration, SystemTime};

/// The longest pause batchrun takes from one `Retry-After`: a header asking
/// for hours is more likely a bug than a plan, and the run can be resumed.
/// (A 429's asking for longer is a quota used up: see [`parse_uncapped`].)
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(15 * 60);

/// The most [`parse_uncapped`] gives: a year and a day, so that a reset
/// time computed from it never overflows the clock.
pub const MAX_QUOTA_RESET: Duration = Duration::from_secs(366 * 86_400);

/// Parses a `Retry-After` value against the wall clock `now`.
///
/// Returns `None` when the value is neither form, so the caller falls back
/// to a safe default. A date in the past means "now" (zero). Values are
/// capped at [`MAX_RETRY_AFTER`].
pub fn parse(value: &str, now: SystemTime) -> Option<Duration> {
    parse_uncapped(value, now).map(capped)
}

/// A `Retry-After` read by [`parse_uncapped`], taken as a pause: at most
/// [`MAX_RETRY_AFTER`].
pub fn capped(d: Duration) -> Duration {
    d.min(MAX_RETRY_AFTER)
}

/// [`parse`] without its cap (but at most [`MAX_QUOTA_RESET`]): a 429 that
/// asks for longer than a pause is worth says when a used-up quota resets.
pub fn parse_uncapped(value: &str, now: SystemTime) -> Option<Duration> {
    let v = value.trim();
    if v.is_empty() {
        return None;
    }
    let d = if v.bytes().all(|b| b.is_ascii_digit()) {
        Duration::from_secs(v.parse::<u64>().unwrap_or(u64::MAX))
    } else if let Ok(secs) = v.parse::<f64>() {
        // Not RFC form, but some servers send "1.5"; honour it rather than
        // fall back to a longer default.
        if !secs.is_finite() || secs < 0.0 {
            return None;
        }
        Duration::from_secs_f64(secs.min(MAX_QUOTA_RESET.as_secs_f64()))
    } else {
        let at = httpdate::parse_http_date(v).ok()?;
        at.duration_since(now).unwrap_or(Duration::ZERO)
    };
    Some(d.min(MAX_QUOTA_RESET))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delay_seconds() {
        let now = SystemTime::now();
        assert_eq!(parse("59", now), Some(Duration::from_secs(59)));
        assert_eq!(parse(" 0 ", now), Some(Duration::ZERO));
        assert_eq!(parse("1.5", now), Some(Duration::from_millis(1500)));
    }

    #[test]
    fn http_date_in_the_future_and_past() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_445_412_480);
        // Wed, 21 Oct 2015 07:28:00 GMT
        let later = httpdate::fmt_http_date(now + Duration::from_secs(120));
        assert_eq!(parse(&later, now), Some(Duration::from_secs(120)));
        let earlier = httpdate::fmt_http_date(now - Duration::from_secs(120));
        assert_eq!(parse(&earlier, now), Some(Duration::ZERO));
        assert_eq!(
            parse("Wed, 21 Oct 2015 07:30:00 GMT", now),
            Some(Duration::from_secs(120))
        );
    }

    #[test]
    fn garbage_is_none_and_huge_is_capped() {
        let now = SystemTime::now();
        for bad in ["", "soon", "-5", "NaN", "inf", "12s"] {
            assert_eq!(parse(bad, now), None, "{bad}");
        }
        assert_eq!(
            parse("999999999999999999999999", now),
            Some(MAX_RETRY_AFTER)
        );
        assert_eq!(parse("86400", now), Some(MAX_RETRY_AFTER));
    }

    #[test]
    fn uncapped_keeps_a_days_reset_and_stops_at_a_year() {
        let now = SystemTime::now();
        assert_eq!(
            parse_uncapped("86400", now),
            Some(Duration::from_secs(86_400))
        );
        assert_eq!(parse_uncapped("1e30", now), Some(MAX_QUOTA_RESET));
        assert_eq!(
            parse_uncapped("999999999999999999999999", now),
            Some(MAX_QUOTA_RESET)
        );
        assert_eq!(parse_uncapped("soon", now), None);
    }
}
