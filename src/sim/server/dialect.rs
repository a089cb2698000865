//! The rate headers of `--dialect`: the key's limits stated the way a
//! known API states them, so the client's reader of every dialect
//! (`rate::announce`) is rehearsed against each.

use std::time::{Duration, SystemTime};

use axum::http::{HeaderMap, HeaderName, HeaderValue};

use crate::sim::model::sliding_window::ceil_secs;
use crate::sim::model::{Dialect, PolicyView};
use crate::wire;

/// Whole seconds, rounded up, zero only for zero.
fn secs_up(d: Duration) -> u64 {
    if d.is_zero() {
        0
    } else {
        ceil_secs(d)
    }
}

/// The policy a window-less dialect reports: the one with the least left,
/// the longest wait among those.
fn tightest(view: &[PolicyView]) -> Option<&PolicyView> {
    view.iter()
        .min_by_key(|p| (p.remaining, std::cmp::Reverse(p.reset)))
}

fn put(h: &mut HeaderMap, name: &'static str, value: String) {
    if let Ok(v) = HeaderValue::from_str(&value) {
        h.insert(HeaderName::from_static(name), v);
    }
}

/// A Go-style duration as OpenAI sends it (`1s`, `20ms`, `6m0s`).
fn go(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        format!("{ms}ms")
    } else if ms < 60_000 {
        format!("{}s", ms.div_ceil(1000))
    } else {
        let s = ms.div_ceil(1000);
        format!("{}m{}s", s / 60, s % 60)
    }
}

/// Replaces the default rate headers with `dialect`'s, for the key's
/// limits in `view` (nothing when it has none, or the limit is secret).
pub(super) fn write(h: &mut HeaderMap, dialect: Dialect, view: &[PolicyView]) {
    if dialect == Dialect::Batchrun {
        return;
    }
    h.remove(wire::RATE_LIMIT_LIMIT);
    h.remove(wire::RATE_LIMIT_REMAINING);
    let Some(t) = tightest(view) else { return };
    let name = |i: usize| {
        if i == 0 {
            "default".to_string()
        } else {
            format!("p{}", i + 1)
        }
    };
    match dialect {
        Dialect::Batchrun => {}
        Dialect::Ietf => {
            let policy = view
                .iter()
                .enumerate()
                .map(|(i, p)| format!("\"{}\";q={};w={}", name(i), p.limit, ceil_secs(p.window)));
            put(h, "ratelimit-policy", policy.collect::<Vec<_>>().join(", "));
            let state = view
                .iter()
                .enumerate()
                .map(|(i, p)| format!("\"{}\";r={};t={}", name(i), p.remaining, secs_up(p.reset)));
            put(h, "ratelimit", state.collect::<Vec<_>>().join(", "));
        }
        Dialect::IetfOld => {
            put(h, "ratelimit-limit", t.limit.to_string());
            put(h, "ratelimit-remaining", t.remaining.to_string());
            put(h, "ratelimit-reset", secs_up(t.reset).to_string());
            let policy = view
                .iter()
                .map(|p| format!("{};w={}", p.limit, ceil_secs(p.window)));
            put(h, "ratelimit-policy", policy.collect::<Vec<_>>().join(", "));
        }
        Dialect::XRatelimit | Dialect::Github => {
            put(h, "x-ratelimit-limit", t.limit.to_string());
            put(h, "x-ratelimit-remaining", t.remaining.to_string());
            let reset = if dialect == Dialect::Github {
                let now = SystemTime::now()
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .unwrap_or_default();
                put(
                    h,
                    "x-ratelimit-used",
                    (t.limit - t.remaining.min(t.limit)).to_string(),
                );
                put(h, "x-ratelimit-resource", "core".to_string());
                // Rounded up, so a client never goes before the reset.
                secs_up(now + t.reset)
            } else {
                secs_up(t.reset)
            };
            put(h, "x-ratelimit-reset", reset.to_string());
        }
        Dialect::Openai => {
            put(h, "x-ratelimit-limit-requests", t.limit.to_string());
            put(h, "x-ratelimit-remaining-requests", t.remaining.to_string());
            put(h, "x-ratelimit-reset-requests", go(t.reset));
        }
        Dialect::Anthropic => {
            put(h, "anthropic-ratelimit-requests-limit", t.limit.to_string());
            put(
                h,
                "anthropic-ratelimit-requests-remaining",
                t.remaining.to_string(),
            );
            // Whole seconds, rounded up: the format carries no fraction here.
            let at = SystemTime::now() + Duration::from_secs(secs_up(t.reset) + 1);
            put(
                h,
                "anthropic-ratelimit-requests-reset",
                humantime::format_rfc3339_seconds(at).to_string(),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rate::announce::{read, Unit};

    fn view() -> Vec<PolicyView> {
        vec![
            PolicyView {
                limit: 20,
                window: Duration::from_secs(1),
                remaining: 5,
                reset: Duration::from_millis(300),
            },
            PolicyView {
                limit: 50,
                window: Duration::from_secs(10),
                remaining: 0,
                reset: Duration::from_millis(4200),
            },
        ]
    }

    fn unix_now() -> Duration {
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
    }

    #[test]
    fn every_dialect_is_read_back_as_the_tightest_limit_at_least() {
        use clap::ValueEnum;
        for d in Dialect::value_variants() {
            let mut h = HeaderMap::new();
            h.insert(wire::RATE_LIMIT_LIMIT, HeaderValue::from(20));
            h.insert(wire::RATE_LIMIT_REMAINING, HeaderValue::from(0));
            write(&mut h, *d, &view());
            let got = read(&h, unix_now());
            let used_up = got
                .iter()
                .find(|a| a.remaining == Some(0))
                .unwrap_or_else(|| panic!("{d:?}: {got:?}"));
            assert_eq!(used_up.unit, Unit::Calls);
            if *d == Dialect::Batchrun {
                continue;
            }
            assert_eq!(used_up.quota, Some(50), "{d:?}");
            let reset = used_up.reset_in.unwrap_or_default();
            assert!(reset >= Duration::from_millis(4200), "{d:?}: {reset:?}");
            assert!(reset <= Duration::from_secs(7), "{d:?}: {reset:?}");
            assert!(h.get(wire::RATE_LIMIT_LIMIT).is_none(), "{d:?}");
        }
    }

    #[test]
    fn ietf_states_every_policy_with_its_window() {
        let mut h = HeaderMap::new();
        write(&mut h, Dialect::Ietf, &view());
        let got = read(&h, unix_now());
        let stated: Vec<_> = got
            .iter()
            .map(|a| (a.quota, a.window, a.remaining))
            .collect();
        assert_eq!(
            stated,
            [
                (Some(20), Some(Duration::from_secs(1)), Some(5)),
                (Some(50), Some(Duration::from_secs(10)), Some(0)),
            ]
        );
        assert_eq!(go(Duration::from_millis(20)), "20ms");
        assert_eq!(go(Duration::from_secs(360)), "6m0s");
    }
}
