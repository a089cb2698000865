//! The limits and the pool size the options ask for: the primary limit
//! and the further ones, and how many calls go in flight.

use crate::cli::RunArgs;
use crate::exit::RunError;
use crate::pace::PacerKind;
use crate::rate::{Limit, Plan, Rate};

/// The most calls in flight a pool sized by `--limit` grows to when no plan
/// bounds it: enough for 100 calls a second at a second's latency.
pub const GROWN_POOL_CAP: usize = 100;

/// Calls in flight a pool sized by `--limit` starts with, before any
/// latency is measured.
pub const GROWN_POOL_START: usize = 4;

/// The limit and the most calls in flight the options ask for: the plan's,
/// unless overridden. With several `--limit`, the limit is the primary one:
/// the lowest in calls per second. `--limit` without `-c` sizes the pool to the
/// limit's need ([`pool_size`]): at most the plan's ceiling when a plan is
/// given, else [`GROWN_POOL_CAP`] (never more than a window holds).
pub fn plan_limits(args: &RunArgs) -> (Limit, usize) {
    let limit = all_limits(args)[0];
    let given = (!args.limit.is_empty()).then_some(limit);
    let most = match (args.concurrency, args.plan, given) {
        (Some(c), _, _) => c,
        (None, None, Some(Limit::Rate(r))) => {
            GROWN_POOL_CAP.min(usize::try_from(r.count).unwrap_or(usize::MAX))
        }
        (None, None, Some(Limit::Unlimited)) => GROWN_POOL_START,
        (None, plan, _) => plan.unwrap_or(Plan::Free).concurrency(),
    };
    (limit, most)
}

/// How the pool is sized.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolSize {
    /// `-c`, or the plan's concurrency: this many calls in flight.
    Fixed,
    /// `--limit` without `-c`: start with this many and grow with the
    /// measured latency to what the limit needs, up to the concurrency.
    Grows(usize),
}

/// How `args` size the pool, given the most calls in flight `most`.
pub fn pool_size(args: &RunArgs, most: usize) -> PoolSize {
    match (args.concurrency, args.limit.first()) {
        (None, Some(Limit::Rate(_))) => PoolSize::Grows(GROWN_POOL_START.min(most)),
        _ => PoolSize::Fixed,
    }
}

/// Every limit the options ask for, the primary one first (the plan's
/// when no `--limit` is given). Never empty.
pub fn all_limits(args: &RunArgs) -> Vec<Limit> {
    let mut all = args.limit.clone();
    if all.is_empty() {
        all.push(args.plan().limit());
    }
    let slowest = all
        .iter()
        .enumerate()
        .min_by(|a, b| {
            let per_second = |l: &Limit| l.rate().map_or(f64::INFINITY, |r| r.per_second());
            per_second(a.1).total_cmp(&per_second(b.1))
        })
        .map_or(0, |(i, _)| i);
    all.swap(0, slowest);
    all
}

/// The limits beyond the primary one, refused where they cannot be kept:
/// each must be a rate, the window pacer is the one that keeps several,
/// and a fleet (`--redis`) keeps each in Redis.
pub(super) fn further_limits(args: &RunArgs) -> Result<Vec<Rate>, RunError> {
    let all = all_limits(args);
    if all.len() < 2 {
        return Ok(Vec::new());
    }
    if all.contains(&Limit::Unlimited) {
        return Err(super::usage(
            "--limit none cannot be combined with other --limit values".to_string(),
        ));
    }
    if args.pacer != PacerKind::Window {
        return Err(super::usage(
            "several --limit values are kept by the window pacer only: drop --pacer, or give one --limit".to_string(),
        ));
    }
    Ok(all[1..].iter().filter_map(Limit::rate).collect())
}
