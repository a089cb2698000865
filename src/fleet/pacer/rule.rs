//! Which rule a fleet keeps in Redis, and what each rule's ops are called
//! and take: the exact window (`lua/window.lua`), or one of the drip rules
//! (`lua/drip.lua`): the SpikeArrest mirror and the token bucket.

use std::time::Duration;

use crate::pace::PacerKind;
use crate::rate::bucket::{skew_allowance, SizingError, TokenBucket};
use crate::rate::kept::{envelope, is_sliding_calls};
use crate::rate::policy::{PolicySpec, Shape, Unit};
use crate::rate::{Limit, Rate};

/// What a fleet asks of its pacer, as `--pacer` and `--burst` say it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FleetRule {
    /// The exact sliding window (`--pacer window`, the default).
    #[default]
    Window,
    /// The SpikeArrest mirror (`--pacer spike`).
    Spike,
    /// The token bucket (`--pacer bucket`), with its `--burst`.
    Bucket {
        /// The bucket's capacity; a tenth of the limit when `None`.
        burst: Option<u64>,
    },
}

impl FleetRule {
    /// The rule for `--pacer kind` with `--burst burst`.
    pub fn of(kind: PacerKind, burst: Option<u64>) -> FleetRule {
        match kind {
            PacerKind::Window => FleetRule::Window,
            PacerKind::Spike => FleetRule::Spike,
            PacerKind::Bucket => FleetRule::Bucket { burst },
        }
    }
}

/// A rule sized for the fleet's limit, as the script is told it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum ScriptRule {
    Window,
    /// messagesPerPeriod (the period is the script's W).
    Spike {
        count: u64,
    },
    /// The bucket as `TokenBucket::for_limit` sizes it.
    Bucket {
        capacity: u64,
        rate: f64,
    },
}

impl ScriptRule {
    /// `rule` for `count` calls per `period` (after the headroom). `None`
    /// for no limit: every rule is then only the concurrency ceiling, which
    /// the window op keeps with no window limit.
    pub(super) fn new(rule: FleetRule, rate: Option<Rate>) -> Result<ScriptRule, SizingError> {
        let Some(r) = rate else {
            return Ok(ScriptRule::Window);
        };
        Ok(match rule {
            FleetRule::Window => ScriptRule::Window,
            FleetRule::Spike => ScriptRule::Spike { count: r.count },
            FleetRule::Bucket { burst } => {
                let b = TokenBucket::for_limit(r, burst, false, std::time::Instant::now())?;
                ScriptRule::Bucket {
                    capacity: b.capacity(),
                    rate: b.rate_per_sec(),
                }
            }
        })
    }

    /// The script's name for `verb` (take, settle, pause, inforce) of
    /// this rule.
    pub(super) fn op(&self, verb: Verb) -> &'static str {
        match (self, verb) {
            (ScriptRule::Window, Verb::Take) => "take",
            (ScriptRule::Window, Verb::Settle) => "settle",
            (ScriptRule::Window, Verb::Pause) => "pause",
            (ScriptRule::Window, Verb::InForce) => "inforce",
            (ScriptRule::Spike { .. }, Verb::Take) => "spike_take",
            (ScriptRule::Spike { .. }, Verb::Settle) => "spike_settle",
            (ScriptRule::Spike { .. }, Verb::Pause) => "spike_pause",
            (ScriptRule::Spike { .. }, Verb::InForce) => "spike_inforce",
            (ScriptRule::Bucket { .. }, Verb::Take) => "bucket_take",
            (ScriptRule::Bucket { .. }, Verb::Settle) => "bucket_settle",
            (ScriptRule::Bucket { .. }, Verb::Pause) => "bucket_pause",
            (ScriptRule::Bucket { .. }, Verb::InForce) => "bucket_inforce",
        }
    }

    /// Whether the rule keeps a window of occupancies (else only leases).
    pub(super) fn windowed(&self) -> bool {
        matches!(self, ScriptRule::Window)
    }

    /// The two arguments that describe a drip rule to the script (the
    /// window rule's take passes its cap and headroom there instead).
    pub(super) fn params(&self) -> (String, String) {
        match *self {
            ScriptRule::Window => ("0".into(), "0".into()),
            ScriptRule::Spike { count } => (count.to_string(), "0".into()),
            // `{}` of an f64 is the shortest text that reads back to it.
            ScriptRule::Bucket { capacity, rate } => (capacity.to_string(), rate.to_string()),
        }
    }

    /// The arguments of an inforce op past the rule's own, for a reported
    /// `count` per `period`: a bucket sized for it and the span a shrink
    /// counts the opening burst in (µs). `None` when a bucket cannot be
    /// sized for it (it is then not followed, as in-process).
    pub(super) fn shrunk(&self, count: u64, period: Duration) -> Option<Vec<String>> {
        match self {
            ScriptRule::Bucket { .. } => {
                let r = Rate { count, period };
                let b = TokenBucket::for_limit(r, None, false, std::time::Instant::now()).ok()?;
                let span = (period + skew_allowance(period)).as_micros();
                Some(vec![
                    b.capacity().to_string(),
                    b.rate_per_sec().to_string(),
                    span.to_string(),
                ])
            }
            _ => Some(Vec::new()),
        }
    }

    /// The bucket's steady pace, in calls a minute.
    pub(super) fn steady_per_min(&self) -> Option<f64> {
        match self {
            ScriptRule::Bucket { rate, .. } => Some(rate * 60.0),
            _ => None,
        }
    }
}

/// The primary limit and every further policy the fleet keeps for
/// `policies` (every `--limit`, the primary first), as in-process: the
/// primary window is the primary policy's envelope when it is of another
/// shape (see [`envelope`]), and that policy is kept as well, first of
/// the rest, in `--limit` order as in-process (a policy a server states
/// for the window of several buckets is the first one's).
pub fn fleet_policies(limit: Limit, policies: &[PolicySpec]) -> (Limit, Vec<PolicySpec>) {
    let Some(first) = policies.first() else {
        return (limit, Vec::new());
    };
    let primary = match envelope(first) {
        Some((count, period)) => Limit::Rate(Rate { count, period }),
        None => limit,
    };
    let skip = usize::from(is_sliding_calls(first));
    (primary, policies[skip..].to_vec())
}

/// The windows of calls among `policies`, with their shapes. A fixed
/// window is kept as a sliding one until a stated reset aligns it, as
/// in-process (`lua/fixed.lua`).
pub(super) fn windows_of(policies: &[PolicySpec]) -> Vec<(Rate, Shape)> {
    policies
        .iter()
        .filter(|p| p.unit == Unit::Calls && matches!(p.shape, Shape::Sliding | Shape::Fixed))
        .filter_map(|p| Some((p.rate()?, p.shape)))
        .collect()
}

/// The windows of tokens among `policies`, with what each counts and its
/// shape, each kept as the in-process token window (`rate/tally.rs`); a
/// fixed one as a sliding one until a stated reset aligns it, as the
/// windows of calls.
pub(super) fn tokens_of(policies: &[PolicySpec]) -> Vec<(Rate, Unit, Shape)> {
    policies
        .iter()
        .filter(|p| p.unit.is_tokens() && matches!(p.shape, Shape::Sliding | Shape::Fixed))
        .filter_map(|p| Some((p.rate()?, p.unit, p.shape)))
        .collect()
}

/// The GCRA buckets among `policies`, of calls or of tokens, as (rate,
/// burst, what they count).
pub(super) fn buckets_of(policies: &[PolicySpec]) -> Vec<(Rate, u64, Unit)> {
    policies
        .iter()
        .filter_map(|p| match (p.shape, p.rate()) {
            (Shape::Bucket { burst }, Some(r)) => Some((r, burst.unwrap_or(0), p.unit)),
            _ => None,
        })
        .collect()
}

/// What a script op does, whichever rule it is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Verb {
    Take,
    Settle,
    Pause,
    InForce,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn per_second(count: u64) -> Option<Rate> {
        Some(Rate {
            count,
            period: Duration::from_secs(1),
        })
    }

    fn specs(all: &[&str]) -> Vec<PolicySpec> {
        all.iter().map(|s| s.parse().unwrap()).collect()
    }

    #[test]
    fn a_bucket_or_a_fixed_window_first_stands_as_its_envelope_and_is_kept_as_well() {
        let given = Limit::Rate(per_second(30).unwrap());
        let (primary, rest) = fleet_policies(given, &specs(&["30/1s,burst=5"]));
        assert_eq!(primary, Limit::Rate(per_second(36).unwrap()));
        assert_eq!(
            buckets_of(&rest),
            [(per_second(30).unwrap(), 5, Unit::Calls)]
        );
        assert!(windows_of(&rest).is_empty());
        let (primary, rest) = fleet_policies(given, &specs(&["20/1s,fixed", "100/1m"]));
        assert_eq!(primary, Limit::Rate(per_second(40).unwrap()));
        let w = windows_of(&rest);
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(
            w.contains(&(per_second(20).unwrap(), Shape::Fixed)),
            "{w:?}"
        );
        // Two buckets of one window stay in `--limit` order: a statement of
        // that window is the first one's, as in-process.
        let (_, rest) = fleet_policies(given, &specs(&["10/1s,burst=5", "20/1s,burst=1"]));
        let b = buckets_of(&rest);
        assert_eq!(b[0], (per_second(10).unwrap(), 5, Unit::Calls), "{b:?}");
        // A sliding window first is the primary as given, and tokens are
        // never a window of calls; a bucket of tokens is a bucket of them.
        let (primary, rest) = fleet_policies(given, &specs(&["30/1s", "900/1m,tokens"]));
        assert_eq!(primary, given);
        assert!(windows_of(&rest).is_empty() && buckets_of(&rest).is_empty());
        let (_, rest) = fleet_policies(given, &specs(&["30/1s", "900/1m,burst=100,tokens"]));
        assert!(windows_of(&rest).is_empty() && tokens_of(&rest).is_empty());
        let minute = Rate {
            count: 900,
            period: Duration::from_secs(60),
        };
        assert_eq!(buckets_of(&rest), [(minute, 100, Unit::Tokens)]);
    }

    #[test]
    fn each_rule_has_its_ops_and_a_bucket_is_sized_as_in_process() {
        let w = ScriptRule::new(FleetRule::Window, per_second(10)).unwrap();
        assert_eq!(w.op(Verb::Take), "take");
        let s = ScriptRule::new(FleetRule::Spike, per_second(10)).unwrap();
        assert_eq!(s.op(Verb::Pause), "spike_pause");
        assert_eq!(s.params().0, "10");
        let b = ScriptRule::new(FleetRule::Bucket { burst: Some(3) }, per_second(30)).unwrap();
        assert_eq!(b.op(Verb::InForce), "bucket_inforce");
        let ScriptRule::Bucket { capacity, rate } = b else {
            panic!("{b:?}")
        };
        assert_eq!(capacity, 3);
        assert_eq!(b.params().1.parse::<f64>().unwrap(), rate);
        assert!(ScriptRule::new(FleetRule::Bucket { burst: Some(30) }, per_second(30)).is_err());
        // No limit: the concurrency ceiling alone, whatever the pacer.
        assert_eq!(
            ScriptRule::new(FleetRule::Spike, None).unwrap(),
            ScriptRule::Window
        );
    }
}
