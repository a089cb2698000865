//! Pure rate logic: limits and plans, the client pacers (token bucket, exact
//! sliding window, fixed window, GCRA bucket, the set of policies of every
//! shape, spike-arrest mirror), backoff and Retry-After parsing.
//!
//! Nothing in here sleeps or reads a clock: every function that depends on time
//! takes `now` as an argument, so it is tested on a fake clock with no runtime.

pub mod announce;
pub mod backoff;
pub mod bucket;
pub mod exact;
pub mod fixed;
pub mod gcra;
pub mod kept;
pub mod learn;
pub mod policies;
pub mod policy;
pub mod refill;
pub mod retry_after;
pub mod scenario;
pub mod spike_pace;
pub mod tally;
#[cfg(test)]
pub(crate) mod testing;

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// A request rate: at most `count` requests per `period`.
///
/// The same pair means "L per sliding window W" to the window model and
/// "messagesPerPeriod per period" to the spike-arrest model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    /// Requests allowed per period (L, or Apigee's messagesPerPeriod).
    pub count: u64,
    /// The window (W) or Apigee period.
    pub period: Duration,
}

impl Rate {
    /// Requests per second on average.
    pub fn per_second(&self) -> f64 {
        self.count as f64 / self.period.as_secs_f64()
    }

    /// The client bucket capacity docs/design.md recommends: a tenth of the limit, at least 1.
    pub fn default_burst(&self) -> u64 {
        (self.count / 10).max(1)
    }

    /// The rate as `--limit` takes it, with no space to quote (`30/1s`,
    /// `5/1500ms`), for a message that tells what to pass; the display
    /// (`30ps`, `30/1m 30s`) is for reading.
    pub fn spec(&self) -> String {
        match self.period.subsec_nanos() {
            0 => format!("{}/{}s", self.count, self.period.as_secs()),
            _ => format!("{}/{}ms", self.count, self.period.as_millis()),
        }
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.period {
            p if p == Duration::from_secs(1) => write!(f, "{}ps", self.count),
            p if p == Duration::from_secs(60) => write!(f, "{}/1m", self.count),
            p => write!(f, "{}/{}", self.count, humantime::format_duration(p)),
        }
    }
}

/// A `--limit` value: a rate, or `none` (no per-period limit, as on Mega).
///
/// ```
/// use std::time::Duration;
/// use batchrun::rate::{Limit, Rate};
///
/// let starter: Limit = "60/1m".parse().unwrap();
/// assert_eq!(starter, Limit::Rate(Rate { count: 60, period: Duration::from_secs(60) }));
/// // Apigee's units: the same 30 per second, with very different bursts.
/// assert_eq!("30ps".parse::<Limit>().unwrap().rate().unwrap().per_second(), 30.0);
/// assert_eq!("1800pm".parse::<Limit>().unwrap().rate().unwrap().per_second(), 30.0);
/// assert_eq!("none".parse::<Limit>().unwrap(), Limit::Unlimited);
/// assert!("sixty a minute".parse::<Limit>().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// At most this many requests per period.
    Rate(Rate),
    /// No per-period limit; the concurrency ceiling and credits still apply.
    Unlimited,
}

impl Limit {
    /// The rate, if there is one.
    pub fn rate(&self) -> Option<Rate> {
        match self {
            Limit::Rate(r) => Some(*r),
            Limit::Unlimited => None,
        }
    }
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Limit::Rate(r) => r.fmt(f),
            Limit::Unlimited => f.write_str("none"),
        }
    }
}

/// What the name of a policy the server stated ends in, where it is shown
/// ([`Occupancy::policy`]): told apart from those configured.
pub const STATED: &str = " (stated)";

/// How full one policy is at a moment: what the run's timeline, its
/// metrics and `batchrun report` show against every limit in force.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Occupancy {
    /// The policy as `--limit` spells it (`30ps`, `1000/1h,fixed`,
    /// `30ps,burst=5`, `90000/1m,tokens`); one the server stated ends in
    /// [`STATED`].
    pub policy: String,
    /// What it allows: calls (or tokens) per window in force (a learnt
    /// limit when one was learnt), or a bucket's capacity, its burst and one.
    pub limit: u64,
    /// What occupies it: the units in its window, or the calls' worth a
    /// bucket holds.
    pub used: u64,
}

/// Why a `--limit` value was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid limit {input:?}: {reason} (expected N/DURATION such as 60/1m or 600/6s, Nps, Npm, or none)")]
pub struct LimitParseError {
    input: String,
    reason: String,
}

impl FromStr for Limit {
    type Err = LimitParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = |reason: &str| LimitParseError {
            input: s.to_string(),
            reason: reason.to_string(),
        };
        let t = s.trim();
        if t.eq_ignore_ascii_case("none") {
            return Ok(Limit::Unlimited);
        }
        let (count, period) = if let Some((n, d)) = t.split_once('/') {
            let period = humantime::parse_duration(d.trim())
                .or_else(|_| humantime::parse_duration(&format!("1{}", d.trim())))
                .map_err(|e| err(&format!("bad duration {d:?}: {e}")))?;
            (n.trim(), period)
        } else if let Some(n) = t.strip_suffix("ps") {
            (n, Duration::from_secs(1))
        } else if let Some(n) = t.strip_suffix("pm") {
            (n, Duration::from_secs(60))
        } else {
            return Err(err("no period"));
        };
        let count: u64 = count
            .parse()
            .map_err(|_| err(&format!("{count:?} is not a whole number")))?;
        if count == 0 {
            return Err(err("the count must be at least 1"));
        }
        if period.is_zero() {
            return Err(err("the period must be longer than zero"));
        }
        Ok(Limit::Rate(Rate { count, period }))
    }
}

/// A published plan: the published table of per-minute limits and concurrency ceilings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Plan {
    /// 5 requests per minute, 1 concurrent call.
    Free,
    /// 60 requests per minute, 5 concurrent calls.
    Starter,
    /// 180 requests per minute, 20 concurrent calls.
    Pro,
    /// No per-minute limit, 50 concurrent calls.
    Mega,
}

impl Plan {
    /// Every plan, cheapest first.
    pub const ALL: [Plan; 4] = [Plan::Free, Plan::Starter, Plan::Pro, Plan::Mega];

    /// The plan's per-minute limit over a sliding 60-second window.
    pub fn limit(self) -> Limit {
        let per_minute = |count| {
            Limit::Rate(Rate {
                count,
                period: Duration::from_secs(60),
            })
        };
        match self {
            Plan::Free => per_minute(5),
            Plan::Starter => per_minute(60),
            Plan::Pro => per_minute(180),
            Plan::Mega => Limit::Unlimited,
        }
    }

    /// The plan's published concurrency ceiling.
    pub fn concurrency(self) -> usize {
        match self {
            Plan::Free => 1,
            Plan::Starter => 5,
            Plan::Pro => 20,
            Plan::Mega => 50,
        }
    }

    /// The lowercase name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Plan::Free => "free",
            Plan::Starter => "starter",
            Plan::Pro => "pro",
            Plan::Mega => "mega",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rate_written_for_limit_reads_back_as_itself() {
        for ms in [1000, 1500, 90_000, 2_000] {
            let rate = Rate {
                count: 7,
                period: Duration::from_millis(ms),
            };
            assert!(!rate.spec().contains(' '), "{}", rate.spec());
            assert_eq!(rate.spec().parse::<Limit>().unwrap(), Limit::Rate(rate));
        }
    }

    #[test]
    fn parses_every_documented_form() {
        let r = |count, secs| {
            Limit::Rate(Rate {
                count,
                period: Duration::from_secs(secs),
            })
        };
        assert_eq!("60/1m".parse::<Limit>().unwrap(), r(60, 60));
        assert_eq!("600/6s".parse::<Limit>().unwrap(), r(600, 6));
        assert_eq!("10/2s".parse::<Limit>().unwrap(), r(10, 2));
        assert_eq!("60/1s".parse::<Limit>().unwrap(), r(60, 1));
        assert_eq!("60/m".parse::<Limit>().unwrap(), r(60, 60));
        assert_eq!("30ps".parse::<Limit>().unwrap(), r(30, 1));
        assert_eq!("1800pm".parse::<Limit>().unwrap(), r(1800, 60));
        assert_eq!("none".parse::<Limit>().unwrap(), Limit::Unlimited);
        assert_eq!(
            "5/500ms".parse::<Limit>().unwrap(),
            Limit::Rate(Rate {
                count: 5,
                period: Duration::from_millis(500)
            })
        );
    }

    #[test]
    fn refuses_nonsense_with_the_input_in_the_message() {
        for bad in [
            "",
            "60",
            "x/1m",
            "0/1m",
            "60/0s",
            "60/fortnight",
            "-5ps",
            "1.5pm",
        ] {
            let e = bad.parse::<Limit>().unwrap_err().to_string();
            assert!(e.contains(&format!("{bad:?}")), "{e}");
        }
    }

    #[test]
    fn plans_follow_the_seed_table() {
        let per_min: Vec<_> = Plan::ALL
            .iter()
            .map(|p| p.limit().rate().map(|r| r.count))
            .collect();
        assert_eq!(per_min, [Some(5), Some(60), Some(180), None]);
        let conc: Vec<_> = Plan::ALL.iter().map(|p| p.concurrency()).collect();
        assert_eq!(conc, [1, 5, 20, 50]);
    }

    #[test]
    fn default_burst_is_a_tenth_at_least_one() {
        let b = |c| {
            Rate {
                count: c,
                period: Duration::from_secs(60),
            }
            .default_burst()
        };
        assert_eq!((b(5), b(60), b(180), b(1800)), (1, 6, 18, 180));
    }
}
