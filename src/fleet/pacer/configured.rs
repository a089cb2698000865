//! The policies a fleet process was told beside its primary window, with
//! the keys the fleet keeps them under: its fixed windows (of calls or of
//! tokens, aligned to a stated reset, [`super::fixed`]), its policies of
//! tokens and its buckets of calls.

use std::time::Duration;

use super::scaled;
use crate::fleet::script::millis;
use crate::fleet::Fleet;
use crate::rate::policy::{Shape, Unit};
use crate::rate::Rate;

/// A configured fixed window, of calls or of tokens: aligned to a reset a
/// response states for what it counts over its window ([`super::fixed`]).
pub(super) struct FixedKept {
    /// What it counts.
    pub(super) unit: Unit,
    pub(super) window: Duration,
    /// Its quota after `--headroom`.
    pub(super) quota: u64,
    pub(super) key: String,
}

/// A configured policy of tokens, as its key keeps it.
pub(super) struct ToldTokens {
    /// What it counts.
    pub(super) unit: Unit,
    pub(super) window: Duration,
    /// Its quota after `--headroom`.
    pub(super) quota: u64,
    /// A bucket's burst (units beyond one; not scaled by `--headroom`).
    pub(super) burst: Option<u64>,
    /// A fixed window (kept as a sliding one until a reset aligns it).
    pub(super) fixed: bool,
    pub(super) key: String,
}

/// The configured fixed windows among `windows` of calls (W, quota, key,
/// whether fixed) and `tokens`.
pub(super) fn fixed_kept(
    windows: &[(Duration, u64, String, bool)],
    tokens: &[ToldTokens],
) -> Vec<FixedKept> {
    let calls = (windows.iter().filter(|w| w.3)).map(|(window, quota, key, _)| FixedKept {
        unit: Unit::Calls,
        window: *window,
        quota: *quota,
        key: key.clone(),
    });
    let tokens = (tokens.iter().filter(|t| t.fixed)).map(|t| FixedKept {
        unit: t.unit,
        window: t.window,
        quota: t.quota,
        key: t.key.clone(),
    });
    calls.chain(tokens).collect()
}

/// The configured policies of tokens among `buckets` and `tokens`, with
/// the keys the fleet keeps them under.
pub(super) fn told_tokens(
    fleet: &Fleet,
    buckets: &[(Rate, u64, Unit)],
    tokens: &[(Rate, Unit, Shape)],
    headroom: f64,
) -> Vec<ToldTokens> {
    let windows = tokens.iter().map(|&(r, unit, shape)| {
        let quota = scaled(r.count, headroom);
        let fixed = shape == Shape::Fixed;
        let key = match fixed {
            true => fleet.keys().fixed_tokens(unit, quota, millis(r.period)),
            false => fleet.keys().tokens(unit, quota, millis(r.period)),
        };
        ToldTokens {
            unit,
            window: r.period,
            quota,
            burst: None,
            fixed,
            key,
        }
    });
    let buckets = buckets
        .iter()
        .filter(|b| b.2.is_tokens())
        .map(|&(r, burst, unit)| {
            let quota = scaled(r.count, headroom);
            ToldTokens {
                unit,
                window: r.period,
                quota,
                burst: Some(burst),
                fixed: false,
                key: fleet.keys().bucket(Rate { count: quota, ..r }, burst, unit),
            }
        });
    windows.chain(buckets).collect()
}

/// The configured buckets of calls among `buckets`, after `--headroom`,
/// with the keys the fleet keeps them under.
pub(super) fn call_buckets(
    fleet: &Fleet,
    buckets: &[(Rate, u64, Unit)],
    headroom: f64,
) -> Vec<(Rate, String)> {
    let calls = buckets.iter().filter(|b| !b.2.is_tokens());
    calls
        .map(|&(r, burst, unit)| {
            let rate = Rate {
                count: scaled(r.count, headroom),
                ..r
            };
            (rate, fleet.keys().bucket(rate, burst, unit))
        })
        .collect()
}
