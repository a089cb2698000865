//! The rate headers of `--dialect`: the key's limits stated the way a
//! known API states them, so the client's reader of every dialect
//! (`rate::announce`) is rehearsed against each.

use std::time::{Duration, SystemTime};

use axum::http::{HeaderMap, HeaderName, HeaderValue};

use crate::rate::policy::Unit;
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

/// The policy of `unit` a window-less dialect reports: the one with the
/// least left, the longest wait among those.
fn tightest(view: &[PolicyView], unit: Unit) -> Option<&PolicyView> {
    view.iter()
        .filter(|p| p.unit == unit)
        .min_by_key(|p| (p.remaining, std::cmp::Reverse(p.reset)))
}

fn put(h: &mut HeaderMap, name: &str, value: String) {
    if let (Ok(n), Ok(v)) = (
        HeaderName::from_bytes(name.as_bytes()),
        HeaderValue::from_str(&value),
    ) {
        h.insert(n, v);
    }
}

/// A Go-style duration as OpenAI sends it (`20ms`, `1.5s`, `6m0s`,
/// `2m52.8s`, `24h0m0s`), rounded up to the millisecond.
fn go(d: Duration) -> String {
    let ms = d.as_nanos().div_ceil(1_000_000);
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let (h, m, s, frac) = (ms / 3_600_000, ms / 60_000 % 60, ms / 1000 % 60, ms % 1000);
    let secs = match frac {
        0 => format!("{s}s"),
        f => format!("{s}.{}s", format!("{f:03}").trim_end_matches('0')),
    };
    match (h, m) {
        (0, 0) => secs,
        (0, m) => format!("{m}m{secs}"),
        (h, m) => format!("{h}h{m}m{secs}"),
    }
}

/// What a token limit's reset is in OpenAI's and Anthropic's headers: when
/// it is full again (their token buckets refill continuously); a limit of
/// calls states when the next call fits.
fn reset_of(t: &PolicyView) -> Duration {
    match t.unit {
        Unit::Calls => t.reset,
        _ => t.idle,
    }
}

fn unix_now() -> Duration {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
}

/// Replaces the default rate headers with `dialect`'s, for the key's
/// policies in `view` (nothing when it has none, or the limit is secret).
/// The IETF form lists every policy, tokens too; OpenAI and Anthropic state
/// the tightest of the calls and the tightest of the tokens; the others
/// state only the tightest of the calls.
pub(super) fn write(h: &mut HeaderMap, dialect: Dialect, view: &[PolicyView]) {
    if dialect == Dialect::Batchrun {
        return;
    }
    h.remove(wire::RATE_LIMIT_LIMIT);
    h.remove(wire::RATE_LIMIT_REMAINING);
    let calls = tightest(view, Unit::Calls);
    let tokens = tightest(view, Unit::Tokens);
    match dialect {
        Dialect::Batchrun | Dialect::None | Dialect::Nginx => {}
        Dialect::Ietf => ietf(h, view),
        Dialect::IetfOld => {
            let Some(t) = calls else { return };
            put(h, "ratelimit-limit", t.limit.to_string());
            put(h, "ratelimit-remaining", t.remaining.to_string());
            put(h, "ratelimit-reset", secs_up(t.reset).to_string());
            let policy = view
                .iter()
                .filter(|p| p.unit == Unit::Calls && whole(p.window))
                .map(|p| format!("{};w={}", p.limit, ceil_secs(p.window)));
            put_policies(h, policy);
        }
        Dialect::XRatelimit | Dialect::Github => {
            let Some(t) = calls else { return };
            x_ratelimit(h, t, dialect == Dialect::Github);
        }
        Dialect::Openai => {
            for (p, unit) in [(calls, "requests"), (tokens, "tokens")] {
                let Some(t) = p else { continue };
                put(h, &format!("x-ratelimit-limit-{unit}"), t.limit.to_string());
                put(
                    h,
                    &format!("x-ratelimit-remaining-{unit}"),
                    t.remaining.to_string(),
                );
                put(h, &format!("x-ratelimit-reset-{unit}"), go(reset_of(t)));
            }
        }
        Dialect::Anthropic => {
            // As Anthropic: `tokens` is the most restrictive of the limits
            // of tokens, the input and output ones stated apart too.
            let (input, output) = (
                tightest(view, Unit::InputTokens),
                tightest(view, Unit::OutputTokens),
            );
            let most = [tokens, input, output].into_iter().flatten();
            let tokens = most.min_by_key(|p| (p.remaining, std::cmp::Reverse(p.reset)));
            for (p, unit) in [
                (calls, "requests"),
                (tokens, "tokens"),
                (input, "input-tokens"),
                (output, "output-tokens"),
            ] {
                let Some(t) = p else { continue };
                let name = |f: &str| format!("anthropic-ratelimit-{unit}-{f}");
                put(h, &name("limit"), t.limit.to_string());
                put(h, &name("remaining"), t.remaining.to_string());
                // Whole seconds, rounded up, and one more: the format
                // carries no fraction here, and truncating must not make
                // the instant early.
                let at = SystemTime::now() + Duration::from_secs(secs_up(reset_of(t)) + 1);
                let at = humantime::format_rfc3339_seconds(at).to_string();
                put(h, &name("reset"), at);
            }
        }
    }
}

/// `RateLimit-Policy` (every policy, named, tokens marked `qu="tokens"`)
/// and `RateLimit` (each one's remaining and reset).
fn ietf(h: &mut HeaderMap, view: &[PolicyView]) {
    if view.is_empty() {
        return;
    }
    let name = |i: usize| {
        if i == 0 {
            "default".to_string()
        } else {
            format!("p{}", i + 1)
        }
    };
    // `w` is whole seconds: a window of 100 ms cannot be stated (rounded
    // up, it stated a limit ten times stricter than the one kept), so its
    // policy is left out and its `RateLimit` state alone says what is left.
    let policy = view
        .iter()
        .enumerate()
        .filter(|(_, p)| whole(p.window))
        .map(|(i, p)| {
            let qu = match p.unit {
                Unit::Calls => "",
                Unit::Tokens => ";qu=\"tokens\"",
                Unit::InputTokens => ";qu=\"input-tokens\"",
                Unit::OutputTokens => ";qu=\"output-tokens\"",
            };
            format!(
                "\"{}\";q={};w={}{qu}",
                name(i),
                p.limit,
                ceil_secs(p.window)
            )
        });
    put_policies(h, policy);
    let state = view
        .iter()
        .enumerate()
        .map(|(i, p)| format!("\"{}\";r={};t={}", name(i), p.remaining, secs_up(p.reset)));
    put(h, "ratelimit", state.collect::<Vec<_>>().join(", "));
}

/// `RateLimit-Policy` listing `policies`, unless none can be stated (every
/// window under a second): an empty field would state nothing.
fn put_policies(h: &mut HeaderMap, policies: impl Iterator<Item = String>) {
    let policies: Vec<String> = policies.collect();
    if !policies.is_empty() {
        put(h, "ratelimit-policy", policies.join(", "));
    }
}

/// Whether `w` is whole seconds, as the IETF fields' `w` must be.
fn whole(w: Duration) -> bool {
    w.subsec_nanos() == 0
}

/// `X-RateLimit-*` of one policy; as GitHub, the reset in epoch seconds
/// with `-Used` and `-Resource`, else in delta seconds.
fn x_ratelimit(h: &mut HeaderMap, t: &PolicyView, github: bool) {
    put(h, "x-ratelimit-limit", t.limit.to_string());
    put(h, "x-ratelimit-remaining", t.remaining.to_string());
    let reset = if github {
        let used = t.limit - t.remaining.min(t.limit);
        put(h, "x-ratelimit-used", used.to_string());
        put(h, "x-ratelimit-resource", "core".to_string());
        // Rounded up, so a client never goes before the reset.
        secs_up(unix_now() + t.reset)
    } else {
        secs_up(t.reset)
    };
    put(h, "x-ratelimit-reset", reset.to_string());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rate::announce::{read, Unit as Said};

    fn view() -> Vec<PolicyView> {
        vec![
            PolicyView {
                limit: 20,
                window: Duration::from_secs(1),
                remaining: 5,
                reset: Duration::from_millis(300),
                idle: Duration::from_millis(300),
                unit: Unit::Calls,
            },
            PolicyView {
                limit: 50,
                window: Duration::from_secs(10),
                remaining: 0,
                reset: Duration::from_millis(4200),
                idle: Duration::from_millis(4200),
                unit: Unit::Calls,
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
            if matches!(d, Dialect::None | Dialect::Nginx) {
                continue;
            }
            let mut h = HeaderMap::new();
            h.insert(wire::RATE_LIMIT_LIMIT, HeaderValue::from(20));
            h.insert(wire::RATE_LIMIT_REMAINING, HeaderValue::from(0));
            write(&mut h, *d, &view());
            let got = read(&h, unix_now());
            let used_up = got
                .iter()
                .find(|a| a.remaining == Some(0))
                .unwrap_or_else(|| panic!("{d:?}: {got:?}"));
            assert_eq!(used_up.unit, Said::Calls);
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
        // A window of 100 ms cannot be stated in whole seconds: its
        // policy is left out (rounded up, it stated 5 a second for 5 per
        // 100 ms), what is left of it still said.
        let short = [PolicyView {
            window: Duration::from_millis(100),
            ..view()[0]
        }];
        for d in [Dialect::Ietf, Dialect::IetfOld] {
            let mut h = HeaderMap::new();
            write(&mut h, d, &short);
            assert!(h.get("ratelimit-policy").is_none(), "{d:?}");
            let got = read(&h, unix_now());
            assert!(got.iter().all(|a| a.window.is_none()), "{d:?}: {got:?}");
            assert!(got.iter().any(|a| a.remaining == Some(5)), "{d:?}: {got:?}");
        }
        assert_eq!(go(Duration::from_millis(20)), "20ms");
        assert_eq!(go(Duration::from_secs(360)), "6m0s");
        assert_eq!(go(Duration::from_micros(1_500_001)), "1.501s");
        assert_eq!(go(Duration::from_millis(172_800)), "2m52.8s");
        assert_eq!(go(Duration::from_secs(86_400)), "24h0m0s");
        for ms in [1, 999, 1000, 1001, 59_999, 61_250, 3_600_001] {
            let d = Duration::from_millis(ms);
            assert_eq!(crate::rate::announce::go_duration(&go(d)), Some(d), "{ms}");
        }
    }
}
