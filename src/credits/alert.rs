//! What a billing alert says: its kind, its dedupe id, and the wording of
//! every line a person reads about credits (dates, balances, spans, rates).

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::CreditSnapshot;

/// Dedupe id of the burn-rate projection alert.
pub const ID_PROJECTED: &str = "projected";
/// Dedupe id of the exhaustion alert.
pub const ID_EXHAUSTED: &str = "exhausted";
/// Dedupe id of the reserve alert.
pub const ID_RESERVE: &str = "reserve";
/// Id of the alert of a run stopped because the API rejected the key.
pub const ID_KEY_REJECTED: &str = "key-rejected";

/// What an alert is about.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AlertKind {
    /// A share of the allowance was used (`--alert-at`).
    Threshold,
    /// At the current burn rate credits run out before renewal.
    Projection,
    /// Credits ran out; the run halted.
    Exhausted,
    /// The run halted to keep the `--reserve` for production.
    Reserve,
    /// `--reserve` (and `--require-full`) cannot be kept: the API's
    /// answers state no balance. The run goes on; a receiver must not take
    /// this for a halt.
    Unmetered,
    /// The run is waiting for credits to come back (`--wait-for-credits`).
    Waiting,
    /// Credits came back and the run resumed.
    Resumed,
    /// The API rejected the key before any call got through; the run
    /// stopped. Not a billing event, but a nightly job stuck on it must
    /// page whoever owns it, every night.
    KeyRejected,
}

impl AlertKind {
    /// The snake_case name, the same string the JSON uses.
    pub fn as_str(&self) -> &'static str {
        match self {
            AlertKind::Threshold => "threshold",
            AlertKind::Projection => "projection",
            AlertKind::Exhausted => "exhausted",
            AlertKind::Reserve => "reserve",
            AlertKind::Unmetered => "unmetered",
            AlertKind::Waiting => "waiting",
            AlertKind::Resumed => "resumed",
            AlertKind::KeyRejected => "key_rejected",
        }
    }
}

impl fmt::Display for AlertKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One billing alert, as printed, posted to the webhook and listed in the
/// `--json` summary.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Alert {
    /// What the alert is about.
    pub kind: AlertKind,
    /// Stable dedupe id ("pct-0.8", "projected", "exhausted", "reserve"): each
    /// id fires at most once per billing cycle.
    pub id: String,
    /// One human-readable line.
    pub message: String,
    /// Credits remaining when the alert was raised, if known.
    pub remaining: Option<i64>,
    /// The cycle's allowance, if known.
    pub max: Option<i64>,
    /// Renewal time in unix seconds, if known.
    pub renewal: Option<u64>,
}

impl Alert {
    /// An alert carrying the numbers of `snapshot` (all `None` without one).
    /// The lead uses this for the `Waiting`/`Resumed` alerts.
    pub fn new(
        kind: AlertKind,
        id: impl Into<String>,
        message: impl Into<String>,
        snapshot: Option<CreditSnapshot>,
    ) -> Alert {
        Alert {
            kind,
            id: id.into(),
            message: message.into(),
            remaining: snapshot.map(|s| s.remaining),
            max: snapshot.map(|s| s.max),
            renewal: snapshot.and_then(|s| s.renewal),
        }
    }

    /// The billing alert for a halt on exhausted credits, the `nth` halt in
    /// a row with no item done in between. It names the renewal date
    /// because that is how long the outage lasts if nobody tops up. Each
    /// such halt alerts (a nightly job that stays stuck must say so every
    /// night), under its own id ([`repeat_id`]); a done item ends the run of
    /// them.
    pub fn exhausted(snapshot: Option<CreditSnapshot>, nth: usize) -> Alert {
        let balance = match snapshot {
            Some(s) => format!(" ({} of {} remaining)", group(s.remaining), group(s.max)),
            None => String::new(),
        };
        let again = match nth {
            0 | 1 => String::new(),
            n => format!(
                ", the {} run in a row halted on them with no item done",
                ordinal(n)
            ),
        };
        let message = format!(
            "credits exhausted{balance}{again}; {}; top up or upgrade to continue sooner, \
             then resume the run",
            describe_renewal(snapshot.and_then(|s| s.renewal)),
        );
        Alert::new(
            AlertKind::Exhausted,
            repeat_id(ID_EXHAUSTED, nth),
            message,
            snapshot,
        )
    }

    /// The billing alert for a halt that keeps `reserve` credits for
    /// production traffic, the `nth` such halt of this billing cycle. Each
    /// one alerts: a nightly job stuck at its reserve must say so every
    /// night, not only the first, so each has its own id
    /// ([`repeat_id`]).
    pub fn reserve(reserve: i64, snapshot: Option<CreditSnapshot>, nth: usize) -> Alert {
        let balance = match snapshot {
            Some(s) => format!(" ({} of {} remaining)", group(s.remaining), group(s.max)),
            None => String::new(),
        };
        let again = match nth {
            0 | 1 => String::new(),
            n => format!(", the {} time this billing cycle", ordinal(n)),
        };
        let message = format!(
            "halted to keep the reserve of {} credits for production{again}{balance}; {}",
            group(reserve),
            describe_renewal(snapshot.and_then(|s| s.renewal)),
        );
        Alert::new(
            AlertKind::Reserve,
            repeat_id(ID_RESERVE, nth),
            message,
            snapshot,
        )
    }
}

/// The id of the `nth` alert of one kind in a cycle: `base` for the first,
/// then `base-2`, `base-3`, ... (each fires once per cycle, like any id).
pub fn repeat_id(base: &str, nth: usize) -> String {
    match nth {
        0 | 1 => base.to_string(),
        n => format!("{base}-{n}"),
    }
}

/// Whether `id` is `base` or one of its repeats ([`repeat_id`]).
pub fn is_repeat_of(id: &str, base: &str) -> bool {
    match id.strip_prefix(base) {
        Some("") => true,
        Some(rest) => rest
            .strip_prefix('-')
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())),
        None => false,
    }
}

/// "2nd", "3rd", "11th", "21st".
fn ordinal(n: usize) -> String {
    let suffix = match (n % 10, n % 100) {
        (_, 11..=13) => "th",
        (1, _) => "st",
        (2, _) => "nd",
        (3, _) => "rd",
        _ => "th",
    };
    format!("{n}{suffix}")
}

/// Formats a unix time as "2026-12-10 00:00 UTC".
///
/// Falls back to the raw number past year 9999, where humantime's formatter
/// errors out (and `to_string` would panic).
pub fn format_unix_utc(secs: u64) -> String {
    match crate::util::rfc3339(secs) {
        Some(s) => format!("{} {} UTC", &s[..10], &s[11..16]),
        None => format!("unix time {secs}"),
    }
}

/// Formats a unix time as the date alone, "2026-12-10" (UTC).
pub fn format_unix_date(secs: u64) -> String {
    match crate::util::rfc3339(secs) {
        Some(s) => s[..10].to_string(),
        None => format!("unix time {secs}"),
    }
}

/// "credits renew 2026-12-10 00:00 UTC", or "renewal date unknown".
pub fn describe_renewal(renewal: Option<u64>) -> String {
    match renewal {
        Some(r) => format!("credits renew {}", format_unix_utc(r)),
        None => "renewal date unknown".to_string(),
    }
}

/// Thousands separators: credit balances are read by people at a glance.
pub(super) fn group(n: i64) -> String {
    let digits = n.unsigned_abs().to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3 + 1);
    if n < 0 {
        out.push('-');
    }
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// "6.7 days", "5.5 hours", "12 minutes".
pub(super) fn span(d: Duration) -> String {
    let secs = d.as_secs_f64();
    if secs >= 2.0 * 86_400.0 {
        format!("{:.1} days", secs / 86_400.0)
    } else if secs >= 3_600.0 {
        format!("{:.1} hours", secs / 3_600.0)
    } else {
        let m = (secs / 60.0).round() as u64;
        format!("{m} minute{}", if m == 1 { "" } else { "s" })
    }
}

/// Enough precision to be meaningful for both fast and trickling burns.
pub(super) fn rate(per_hour: f64) -> String {
    if per_hour >= 10.0 {
        format!("{per_hour:.0}")
    } else if per_hour >= 1.0 {
        format!("{per_hour:.1}")
    } else {
        format!("{per_hour:.2}")
    }
}

/// "80", "95.5": threshold as a percentage without float noise (0.95 * 100
/// is 94.99999999999999).
pub(super) fn pct(th: f64) -> String {
    let tenths = (th * 1000.0).round() / 10.0;
    format!("{tenths}")
}

/// The stderr line for an alert: `batchrun: ALERT [kind] message`.
pub fn format_line(alert: &Alert) -> String {
    format!("batchrun: ALERT [{}] {}", alert.kind, alert.message)
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: u64 = 3600;

    #[test]
    fn exhausted_and_reserve_alerts_name_the_renewal() {
        let s = CreditSnapshot {
            remaining: 0,
            used: 10_000,
            max: 10_000,
            renewal: Some(1_796_860_800),
        };
        let a = Alert::exhausted(Some(s), 1);
        assert_eq!(a.kind, AlertKind::Exhausted);
        assert_eq!(a.id, ID_EXHAUSTED);
        assert!(a.message.contains("2026-12-10 00:00 UTC"), "{}", a.message);
        assert!(a.message.contains("0 of 10,000 remaining"), "{}", a.message);
        assert_eq!(
            (a.remaining, a.max, a.renewal),
            (Some(0), Some(10_000), Some(1_796_860_800))
        );

        let a = Alert::exhausted(None, 1);
        assert!(a.message.contains("renewal date unknown"), "{}", a.message);
        assert_eq!((a.remaining, a.max, a.renewal), (None, None, None));

        let a = Alert::reserve(
            2_000,
            Some(CreditSnapshot {
                remaining: 2_050,
                ..s
            }),
            1,
        );
        assert_eq!(a.kind, AlertKind::Reserve);
        assert_eq!(a.id, ID_RESERVE);
        assert!(
            a.message.contains("reserve of 2,000 credits"),
            "{}",
            a.message
        );
        assert!(a.message.contains("2026-12-10 00:00 UTC"), "{}", a.message);
        let a = Alert::reserve(5, Some(CreditSnapshot { renewal: None, ..s }), 1);
        assert!(a.message.contains("renewal date unknown"), "{}", a.message);
    }

    #[test]
    fn a_reserve_halt_that_repeats_alerts_again_and_counts() {
        let a = Alert::reserve(80, None, 3);
        assert_eq!(a.id, "reserve-3");
        assert!(
            a.message
                .starts_with("halted to keep the reserve of 80 credits for production, the 3rd time this billing cycle"),
            "{}",
            a.message
        );
        assert!(!Alert::reserve(80, None, 1).message.contains("time this"));
        let a = Alert::exhausted(None, 2);
        assert_eq!(a.id, "exhausted-2");
        assert!(
            a.message.starts_with(
                "credits exhausted, the 2nd run in a row halted on them with no item done;"
            ),
            "{}",
            a.message
        );
        for (n, o) in [
            (2, "2nd"),
            (11, "11th"),
            (21, "21st"),
            (112, "112th"),
            (23, "23rd"),
        ] {
            assert_eq!(ordinal(n), o);
        }
        assert!(is_repeat_of("reserve", ID_RESERVE));
        assert!(is_repeat_of("reserve-12", ID_RESERVE));
        for not in [
            "reserve-unmetered",
            "reserve-",
            "reserves",
            "exhausted",
            "reserve-2x",
        ] {
            assert!(!is_repeat_of(not, ID_RESERVE), "{not}");
        }
    }

    #[test]
    fn dates_far_out_do_not_panic() {
        assert_eq!(format_unix_utc(u64::MAX), format!("unix time {}", u64::MAX));
        assert_eq!(format_unix_date(253_402_300_799), "9999-12-31");
        assert_eq!(format_unix_utc(0), "1970-01-01 00:00 UTC");
    }

    #[test]
    fn alert_json_shape() {
        let a = Alert::exhausted(None, 1);
        let v = serde_json::to_value(&a).unwrap();
        assert_eq!(v["kind"], "exhausted");
        assert_eq!(AlertKind::Projection.to_string(), "projection");
        let back: Alert = serde_json::from_value(v).unwrap();
        assert_eq!(back, a);
    }

    #[test]
    fn percent_labels_have_no_float_noise() {
        assert_eq!(pct(0.95), "95");
        assert_eq!(pct(0.955), "95.5");
        assert_eq!(pct(0.07), "7");
    }

    #[test]
    fn formatting_helpers() {
        assert_eq!(group(0), "0");
        assert_eq!(group(999), "999");
        assert_eq!(group(1_000), "1,000");
        assert_eq!(group(-1_234_567), "-1,234,567");
        assert_eq!(span(Duration::from_secs(45 * 60)), "45 minutes");
        assert_eq!(span(Duration::from_secs(90 * 60)), "1.5 hours");
        assert_eq!(span(Duration::from_secs(60)), "1 minute");
        assert_eq!(span(Duration::from_secs(30 * HOUR)), "30.0 hours");
        assert_eq!(rate(0.5), "0.50");
        assert_eq!(rate(2.26), "2.3");
        assert_eq!(rate(250.0), "250");
    }

    #[test]
    fn line_format() {
        let a = Alert::new(AlertKind::Threshold, "pct-0.8", "80% of credits used", None);
        assert_eq!(
            format_line(&a),
            "batchrun: ALERT [threshold] 80% of credits used"
        );
    }
}
