//! The limits and the pool size the options ask for: the policies
//! (`--limit`, with their shapes), the primary one among them, and how
//! many calls go in flight.

use crate::cli::RunArgs;
use crate::exit::RunError;
use crate::pace::PacerKind;
use crate::rate::policy::{PolicySpec, Shape, TokenWeight, Unit};
use crate::rate::{Limit, Plan};

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
    let limit = all_limits(args)[0].limit;
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
    match (args.concurrency, args.limit.first().map(|p| p.limit)) {
        (None, Some(Limit::Rate(_))) => PoolSize::Grows(GROWN_POOL_START.min(most)),
        _ => PoolSize::Fixed,
    }
}

/// Every policy the options ask for, the primary one first (the plan's
/// sliding window when no `--limit` is given): the slowest policy of calls
/// in calls per second, else the first. Never empty.
pub fn all_limits(args: &RunArgs) -> Vec<PolicySpec> {
    let mut all = args.limit.clone();
    if all.is_empty() {
        // The seed's API keeps its plans as sliding windows: a known shape.
        all.push(PolicySpec::sliding(args.plan().limit()).named());
    }
    let per_second = |p: &PolicySpec| match (p.unit, p.rate()) {
        (Unit::Calls, Some(r)) => r.per_second(),
        _ => f64::INFINITY,
    };
    let slowest = all
        .iter()
        .enumerate()
        .min_by(|a, b| per_second(a.1).total_cmp(&per_second(b.1)))
        .map_or(0, |(i, _)| i);
    all.swap(0, slowest);
    all
}

/// Every policy, the primary first, refused where they cannot be kept:
/// `none` stands alone, and the window pacer is the one that keeps several
/// and every shape (the fleet's keeps every one too).
pub fn checked_limits(args: &RunArgs) -> Result<Vec<PolicySpec>, RunError> {
    let all = all_limits(args);
    let shaped: Vec<String> = all
        .iter()
        .filter(|p| p.shape != Shape::Sliding || p.unit != Unit::Calls)
        .map(ToString::to_string)
        .collect();
    if all.len() > 1 && all.iter().any(|p| p.limit == Limit::Unlimited) {
        return Err(super::usage(
            "--limit none cannot be combined with other --limit values".to_string(),
        ));
    }
    if args.pacer != PacerKind::Window && !shaped.is_empty() {
        return Err(super::usage(format!(
            "--limit {} names a shape or tokens, which the window pacer keeps only: drop --pacer, or give a plain rate such as 30/1s",
            shaped.join(", ")
        )));
    }
    if all.len() > 1 && args.pacer != PacerKind::Window {
        return Err(super::usage(
            "several --limit values are kept by the window pacer only: drop --pacer, or give one --limit".to_string(),
        ));
    }
    Ok(all)
}

/// The least that any policy of tokens among `policies` counting a unit
/// `counts` admits at once, with the policy: a window's quota, a bucket's
/// burst and one. A bucket whose burst is not told sets none (what it
/// admits is not known).
pub(super) fn most_at_once(
    policies: &[PolicySpec],
    counts: impl Fn(Unit) -> bool,
) -> Option<(u64, String)> {
    policies
        .iter()
        .filter(|p| p.unit.is_tokens() && counts(p.unit))
        .filter_map(|p| {
            let rate = p.rate()?;
            let most = match p.shape {
                Shape::Sliding | Shape::Fixed => rate.count,
                Shape::Bucket { burst } => burst?.saturating_add(1),
            };
            Some((most, p.to_string()))
        })
        .min_by_key(|&(most, _)| most)
}

/// The least quota of the policies of each unit of tokens among
/// `policies` (a bucket's burst and one where told, else its count per
/// window), `u64::MAX` for a unit none counts: what each part of a call's
/// estimate without `--cost`, a guess, is held to.
pub(super) fn least_quota(policies: &[PolicySpec]) -> TokenWeight {
    let of = |unit: Unit| {
        let told = most_at_once(policies, |u| u == unit).map(|(m, _)| m);
        let counts = (policies.iter())
            .filter(|p| p.unit == unit)
            .filter_map(|p| p.rate().map(|r| r.count));
        told.into_iter().chain(counts).min().unwrap_or(u64::MAX)
    };
    TokenWeight {
        total: of(Unit::Tokens),
        input: of(Unit::InputTokens),
        output: of(Unit::OutputTokens),
    }
}
