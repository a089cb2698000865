//! The vocabulary of a limit's *shape*: one policy a server keeps, as
//! `--limit` (and the sim's `--limit`) spells it.
//!
//! `RATE[,SHAPE][,burst=N][,UNIT]`, where `RATE` is a [`Limit`] (`30/1s`,
//! `60/1m`, `30ps`, `none`), `SHAPE` is `sliding` (the default), `fixed` or
//! `bucket`, `burst=N` sizes a bucket (and implies `bucket`), and `UNIT` is
//! `calls` (the default), `tokens` (cost units, such as an LLM's tokens),
//! or `input-tokens` / `output-tokens` (a prompt's tokens or an answer's
//! alone, as Anthropic limits them apart).
//!
//! ```
//! use batchrun::rate::policy::{PolicySpec, Shape, Unit};
//!
//! let p: PolicySpec = "30/1s,burst=5".parse().unwrap();
//! assert_eq!(p.shape, Shape::Bucket { burst: Some(5) });
//! assert_eq!(p.unit, Unit::Calls);
//! let t: PolicySpec = "90000/1m,tokens".parse().unwrap();
//! assert_eq!((t.shape, t.unit), (Shape::Sliding, Unit::Tokens));
//! assert_eq!(t.to_string(), "90000/1m,tokens");
//! assert!("30/1s,fixed,bucket".parse::<PolicySpec>().is_err());
//! ```

use std::fmt;
use std::str::FromStr;

use super::{Limit, LimitParseError, Rate};

/// How a server counts calls against a rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Shape {
    /// At most N in any span of W (APIVerve, flask-limiter's moving window).
    #[default]
    Sliding,
    /// At most N per clock-aligned window of W, reset at each boundary
    /// (express-rate-limit, rate-limiter-flexible, most daily quotas).
    Fixed,
    /// A bucket (GCRA / leaky bucket) refilling at N per W with room for
    /// `burst` calls beyond the one the rate allows now (nginx
    /// `limit_req ... burst=`, SpikeArrest). `None`: the burst is not known.
    Bucket {
        /// The burst, when known.
        burst: Option<u64>,
    },
}

/// What a policy's quota counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Unit {
    /// Requests.
    #[default]
    Calls,
    /// Cost units (an LLM's tokens, an API's credits per minute): each call
    /// weighs what its item costs.
    Tokens,
    /// A prompt's tokens alone (Anthropic's input tokens per minute).
    InputTokens,
    /// An answer's tokens alone (Anthropic's output tokens per minute).
    OutputTokens,
}

impl Unit {
    /// Whether it counts tokens of any kind (each call weighs its item's).
    pub fn is_tokens(self) -> bool {
        self != Unit::Calls
    }

    /// Every unit, calls first.
    pub const ALL: [Unit; 4] = [
        Unit::Calls,
        Unit::Tokens,
        Unit::InputTokens,
        Unit::OutputTokens,
    ];

    /// The unit `--limit` names `word` (`requests` is calls too).
    pub fn named(word: &str) -> Option<Unit> {
        match word {
            "requests" => Some(Unit::Calls),
            w => Unit::ALL.into_iter().find(|u| u.name() == w),
        }
    }

    /// Its name, as `--limit` spells it after the rate and the fleet's
    /// keys name it.
    pub fn name(self) -> &'static str {
        match self {
            Unit::Calls => "calls",
            Unit::Tokens => "tokens",
            Unit::InputTokens => "input-tokens",
            Unit::OutputTokens => "output-tokens",
        }
    }
}

/// What a call weighs in tokens as each unit of tokens counts it: all of
/// its tokens, its prompt's (input) and its answer's (output). A weight
/// that is not split (a `--cost` expression) counts whole in each, which
/// never under-counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TokenWeight {
    /// Every token of the call.
    pub total: u64,
    /// Its prompt's tokens.
    pub input: u64,
    /// Its answer's tokens.
    pub output: u64,
}

/// What an answer says a call used, by part: a part it does not say
/// (no such field, or a `--usage` other than the default, a total) leaves
/// the call's estimate standing for that unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Used {
    /// All of its tokens.
    pub total: Option<u64>,
    /// Its prompt's.
    pub input: Option<u64>,
    /// Its answer's.
    pub output: Option<u64>,
}

impl From<TokenWeight> for Used {
    /// Every part said.
    fn from(w: TokenWeight) -> Used {
        Used {
            total: Some(w.total),
            input: Some(w.input),
            output: Some(w.output),
        }
    }
}

impl Used {
    /// `n` tokens said for every part alike.
    pub const fn whole(n: u64) -> Used {
        Used {
            total: Some(n),
            input: Some(n),
            output: Some(n),
        }
    }

    /// A total, its parts not said.
    pub const fn total(n: u64) -> Used {
        Used {
            total: Some(n),
            input: None,
            output: None,
        }
    }

    /// What it says a policy counting `unit` counts (`None`: not said; a
    /// total not said is its parts' sum when both are).
    pub fn of(self, unit: Unit) -> Option<u64> {
        match unit {
            Unit::Calls => None,
            Unit::Tokens => self
                .total
                .or_else(|| Some(self.input?.saturating_add(self.output?))),
            Unit::InputTokens => self.input,
            Unit::OutputTokens => self.output,
        }
    }

    /// `estimate` corrected by what it says.
    pub fn or(self, estimate: TokenWeight) -> TokenWeight {
        TokenWeight {
            total: self.of(Unit::Tokens).unwrap_or(estimate.total),
            input: self.input.unwrap_or(estimate.input),
            output: self.output.unwrap_or(estimate.output),
        }
    }
}

impl TokenWeight {
    /// `n` tokens not split: counted whole by every unit of tokens.
    pub const fn whole(n: u64) -> TokenWeight {
        TokenWeight {
            total: n,
            input: n,
            output: n,
        }
    }

    /// `input` tokens of prompt and `output` of answer.
    pub const fn split(input: u64, output: u64) -> TokenWeight {
        TokenWeight {
            total: input.saturating_add(output),
            input,
            output,
        }
    }

    /// What a policy counting `unit` counts of it (0 for calls).
    pub fn of(self, unit: Unit) -> u64 {
        match unit {
            Unit::Calls => 0,
            Unit::Tokens => self.total,
            Unit::InputTokens => self.input,
            Unit::OutputTokens => self.output,
        }
    }

    /// Both together (a batch's items).
    pub fn saturating_add(self, o: TokenWeight) -> TokenWeight {
        TokenWeight {
            total: self.total.saturating_add(o.total),
            input: self.input.saturating_add(o.input),
            output: self.output.saturating_add(o.output),
        }
    }

    /// Each part the lesser of the two.
    pub fn min(self, o: TokenWeight) -> TokenWeight {
        TokenWeight {
            total: self.total.min(o.total),
            input: self.input.min(o.input),
            output: self.output.min(o.output),
        }
    }
}

/// One policy: a rate, its shape and what it counts. Two are equal when
/// they are the same policy, whether or not the shape was named.
#[derive(Debug, Clone, Copy)]
pub struct PolicySpec {
    /// The rate (or `none`).
    pub limit: Limit,
    /// How the server counts against it.
    pub shape: Shape,
    /// What it counts.
    pub unit: Unit,
    /// Whether the shape was named (`30/1s,sliding`, a plan's window), not
    /// taken for a bare rate's default: only an unnamed one is learnt from
    /// the start (see [`START_AHEAD`](super::learn::START_AHEAD)).
    pub named: bool,
}

impl PolicySpec {
    /// A sliding window of calls at `limit`: what a bare `--limit 60/1m` means.
    pub fn sliding(limit: Limit) -> PolicySpec {
        PolicySpec {
            limit,
            shape: Shape::Sliding,
            unit: Unit::Calls,
            named: false,
        }
    }

    /// The same policy, its shape named.
    pub fn named(self) -> PolicySpec {
        PolicySpec {
            named: true,
            ..self
        }
    }

    /// The rate, if there is one.
    pub fn rate(&self) -> Option<Rate> {
        self.limit.rate()
    }
}

impl PartialEq for PolicySpec {
    fn eq(&self, other: &PolicySpec) -> bool {
        (self.limit, self.shape, self.unit) == (other.limit, other.shape, other.unit)
    }
}

impl Eq for PolicySpec {}

impl From<Limit> for PolicySpec {
    fn from(limit: Limit) -> PolicySpec {
        PolicySpec::sliding(limit)
    }
}

impl fmt::Display for PolicySpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.limit.fmt(f)?;
        match self.shape {
            Shape::Sliding => {}
            Shape::Fixed => f.write_str(",fixed")?,
            Shape::Bucket { burst: None } => f.write_str(",bucket")?,
            Shape::Bucket { burst: Some(b) } => write!(f, ",burst={b}")?,
        }
        if self.unit.is_tokens() {
            write!(f, ",{}", self.unit.name())?;
        }
        Ok(())
    }
}

/// Why a `--limit` value with a shape was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyParseError {
    /// The rate itself.
    #[error(transparent)]
    Rate(#[from] LimitParseError),
    /// A modifier after the rate.
    #[error("invalid limit {input:?}: {reason} (expected RATE[,sliding|fixed|bucket][,burst=N][,tokens|input-tokens|output-tokens], such as 30/1s,burst=5 or 90000/1m,tokens)")]
    Modifier {
        /// The whole value.
        input: String,
        /// What is wrong with it.
        reason: String,
    },
}

impl FromStr for PolicySpec {
    type Err = PolicyParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut parts = s.split(',');
        let limit: Limit = parts.next().unwrap_or_default().parse()?;
        let err = |reason: String| PolicyParseError::Modifier {
            input: s.to_string(),
            reason,
        };
        let (mut shape, mut burst, mut unit) = (None::<Shape>, None::<u64>, None::<Unit>);
        for m in parts.map(str::trim) {
            let word = match m.to_ascii_lowercase().as_str() {
                "sliding" | "window" => Some(Shape::Sliding),
                "fixed" => Some(Shape::Fixed),
                "bucket" | "gcra" => Some(Shape::Bucket { burst: None }),
                w if Unit::named(w).is_some() => {
                    if unit.is_some() {
                        return Err(err("two units given".into()));
                    }
                    unit = Unit::named(w);
                    None
                }
                b if b.starts_with("burst=") && burst.is_none() => {
                    let n = b["burst=".len()..]
                        .parse()
                        .map_err(|_| err(format!("{m:?}: the burst is not a whole number")))?;
                    burst = Some(n);
                    None
                }
                "" => return Err(err("an empty modifier".into())),
                other => return Err(err(format!("unknown or repeated modifier {other:?}"))),
            };
            if let Some(w) = word {
                if shape.is_some() {
                    return Err(err("two shapes given".into()));
                }
                shape = Some(w);
            }
        }
        let shape = match (shape, burst) {
            (None | Some(Shape::Bucket { .. }), Some(b)) => Some(Shape::Bucket { burst: Some(b) }),
            (Some(_), Some(_)) => {
                return Err(err("two shapes given (a burst is a bucket's)".into()))
            }
            (s, None) => s,
        };
        if limit == Limit::Unlimited && (shape.is_some() || unit.is_some()) {
            return Err(err("`none` takes no shape or unit".into()));
        }
        Ok(PolicySpec {
            limit,
            named: shape.is_some(),
            shape: shape.unwrap_or_default(),
            unit: unit.unwrap_or_default(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn spec(s: &str) -> PolicySpec {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn a_bare_rate_is_a_sliding_window_of_calls() {
        let p = spec("30/1s");
        assert_eq!(p, PolicySpec::sliding(p.limit));
        assert_eq!(p.rate().unwrap().period, Duration::from_secs(1));
        assert_eq!(p.to_string(), "30ps");
    }

    #[test]
    fn shapes_bursts_and_units_read_and_print_back() {
        for (given, shape, unit, shown) in [
            ("30/1s,fixed", Shape::Fixed, Unit::Calls, "30ps,fixed"),
            (
                "30/1s,bucket",
                Shape::Bucket { burst: None },
                Unit::Calls,
                "30ps,bucket",
            ),
            (
                "30/1s,burst=0",
                Shape::Bucket { burst: Some(0) },
                Unit::Calls,
                "30ps,burst=0",
            ),
            (
                "30/1s, bucket, burst=5",
                Shape::Bucket { burst: Some(5) },
                Unit::Calls,
                "30ps,burst=5",
            ),
            (
                "30/1s,burst=5,bucket",
                Shape::Bucket { burst: Some(5) },
                Unit::Calls,
                "30ps,burst=5",
            ),
            (
                "1000/1d,fixed,tokens",
                Shape::Fixed,
                Unit::Tokens,
                "1000/1day,fixed,tokens",
            ),
            ("60/1m,sliding,calls", Shape::Sliding, Unit::Calls, "60/1m"),
            (
                "40000/1m,burst=40000,input-tokens",
                Shape::Bucket { burst: Some(40000) },
                Unit::InputTokens,
                "40000/1m,burst=40000,input-tokens",
            ),
            (
                "8000/1m,output-tokens",
                Shape::Sliding,
                Unit::OutputTokens,
                "8000/1m,output-tokens",
            ),
        ] {
            let p = spec(given);
            assert_eq!((p.shape, p.unit), (shape, unit), "{given}");
            assert_eq!(p.to_string(), shown, "{given}");
            assert_eq!(spec(shown), p, "{shown} reads back");
        }
    }

    #[test]
    fn nonsense_is_refused_with_the_reason() {
        for (bad, why) in [
            ("30/1s,fixed,bucket", "two shapes"),
            ("30/1s,fixed,burst=3", "two shapes"),
            ("30/1s,tokens,calls", "two units"),
            ("30/1s,input-tokens,tokens", "two units"),
            ("30/1s,burst=x", "not a whole number"),
            ("30/1s,,fixed", "empty modifier"),
            ("30/1s,leaky", "unknown or repeated modifier"),
            ("30/1s,burst=1,burst=2", "repeated modifier"),
            ("none,fixed", "takes no shape"),
            ("thirty/1s,fixed", "not a whole number"),
        ] {
            let e = bad.parse::<PolicySpec>().unwrap_err().to_string();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }
}
