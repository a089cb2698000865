//! One scenario harness for each pacing rule's two stores: the in-process
//! rule and the fleet's script in Redis (`fleet/lua/*.lua`). The exact
//! window rule's in-process store is [`InProcess`] ([`ExactWindow`]); the
//! drip rules' (the SpikeArrest mirror, the token bucket) are in [`drip`]. A [`Scenario`] is a timed sequence of what the two
//! have in common (takes, completions, cancellations, 429s, reported limits,
//! `remaining: 0`, a fixed window's reset), on a clock in whole milliseconds from its start; each
//! store answers every step, and [`compare`] fails at the first step where
//! they disagree.
//!
//! What both stores are asked is only the window rule: the concurrency
//! ceiling, leases, headroom and putting calls back after Redis lost its
//! data are the fleet's alone and not compared. The in-process pacer also
//! runs the learning clock on every response it reads, the fleet only at
//! its takes and 429s; the scenario reads it at those points only.
//!
//! The Redis store lives with the fleet tests (it needs a `redis-server`);
//! this module has the scenarios, the runner and the in-process store.

use std::fmt;

use super::policy::{TokenWeight, Unit, Used};

pub mod design;
pub mod drip;
mod in_process;

pub use in_process::{bucket, fixed, token_bucket, tokens, InProcess};

/// One thing that happens, as a scenario says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// A worker asks for a place.
    Take,
    /// A call still out (the `pick`-th, oldest first, modulo how many)
    /// was answered `ago` ms before now; never earlier than 2 ms before its
    /// send, so that a response stamped before its send is covered too.
    Settle {
        /// Which call still out.
        pick: usize,
        /// How long ago its response arrived.
        ago: u64,
    },
    /// A worker asks for a place for a call estimated at `tokens` tokens
    /// (against the scenario's token windows and buckets, each taking the
    /// part it counts).
    TakeTokens {
        /// The estimate.
        tokens: TokenWeight,
    },
    /// As [`Op::Settle`], the response saying what the call used (a part
    /// it does not say stays at the estimate).
    SettleUsed {
        /// Which call still out.
        pick: usize,
        /// How long ago its response arrived.
        ago: u64,
        /// The tokens it used.
        used: Used,
    },
    /// A call still out (as for [`Op::Settle`]) was never sent.
    Cancel {
        /// Which call still out.
        pick: usize,
    },
    /// A rate-limit 429 (its call already settled): the limit may be learnt,
    /// and no call starts for `pause` ms.
    RateLimited {
        /// The pause, in ms.
        pause: u64,
    },
    /// A response reported `x-rate-limit-limit: limit`.
    InForce {
        /// The limit reported.
        limit: u64,
    },
    /// A response said `x-rate-limit-remaining: 0`.
    Full,
    /// A response stated a policy the store was not told of, in a window
    /// none of its policies keeps: `quota` calls (or tokens) per `window`
    /// ms, of which `used` are used already (less than the quota).
    Stated {
        /// Its quota.
        quota: u64,
        /// Its window, in ms.
        window: u64,
        /// How much of it the server says is used.
        used: u64,
        /// What it counts.
        unit: Unit,
    },
    /// A response said the policy of calls a bucket of the scenario keeps
    /// (the `bucket`-th, modulo how many; stated for its window) has
    /// nothing left, resetting in `reset` ms (to the millisecond:
    /// `exact`).
    Emptied {
        /// Which bucket.
        bucket: usize,
        /// Its reset, in ms.
        reset: u64,
        /// Whether stated to the millisecond.
        exact: bool,
    },
    /// The server's statements show the stated token window (the first
    /// [`Op::Stated`] of tokens) to refill continuously, in full over
    /// `period` ms, with `used` of it used: it is kept as a bucket of its
    /// quota over `period` with room for all of it from then on, and
    /// stated again, it is read against that bucket. Found already, the
    /// bucket is retimed to the new period, its level kept.
    Refill {
        /// The period it refills over, in ms.
        period: u64,
        /// How much of it the server says is used.
        used: u64,
    },
    /// A response said the policy a fixed window of the scenario keeps
    /// (the `fixed`-th, modulo how many) resets in `reset` ms, the
    /// true reset up to `early` ms before that and `late` ms after: the
    /// window is aligned to it, if not yet and if that is certain to a
    /// tenth of its window.
    Aligned {
        /// Which fixed window.
        fixed: usize,
        /// Its reset, in ms.
        reset: u64,
        /// How much earlier the true reset may lie, in ms.
        early: u64,
        /// How much later, in ms.
        late: u64,
    },
    /// A response said the policy a fixed window of the scenario keeps
    /// (the `fixed`-th, modulo how many; stated with its quota and window)
    /// has `used` of its quota used: what it says beyond what the window
    /// counts was spent elsewhere (another client on the key) and counts
    /// as answered now.
    Spent {
        /// Which fixed window.
        fixed: usize,
        /// How much of it the server says is used.
        used: u64,
    },
}

/// An [`Op`] at `at` ms from the scenario's start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    /// When, in ms from the start; never before the step before.
    pub at: u64,
    /// What.
    pub op: Op,
}

/// A window rule and what happens to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scenario {
    /// The configured limit (L).
    pub limit: u64,
    /// The window (W), in ms.
    pub window: u64,
    /// Further limits every call must keep as well (`--limit` given more
    /// than once), as (L, W ms): the window rule only, and only the first
    /// limit learns.
    pub further: Vec<(u64, u64)>,
    /// GCRA buckets every call must keep as well (`--limit N/W,burst=B`),
    /// as (N, W ms, B): kept as [`Kept`] policies in-process, as the
    /// script's `gcra` keys in Redis.
    pub buckets: Vec<(u64, u64, u64)>,
    /// Fixed windows every call must keep as well (`--limit N/W,fixed`,
    /// `--limit Q/W,fixed,tokens` and the like), as (N, W ms, what it
    /// counts): kept as [`Kept`] policies in-process and as the script's
    /// fixed windows (of calls, or of tokens), each a sliding one until an
    /// [`Op::Aligned`] aligns it.
    pub fixed: Vec<(u64, u64, Unit)>,
    /// Token windows every call must keep as well (`--limit Q/W,tokens`,
    /// `,input-tokens`, `,output-tokens`), as (Q, W ms, what it counts):
    /// kept as [`Kept`] policies (a weighted tally) in-process, as the
    /// script's token window keys in Redis.
    pub tokens: Vec<(u64, u64, Unit)>,
    /// Token buckets every call must keep as well
    /// (`--limit Q/W,burst=B,tokens` and the like), as (Q, W ms, B, what
    /// it counts): kept as [`Kept`] policies in-process, as the script's
    /// `gcra` keys of tokens in Redis.
    pub token_buckets: Vec<(u64, u64, u64, Unit)>,
    /// What happens, in time order.
    pub steps: Vec<Step>,
}

impl Scenario {
    /// `limit` calls per `window` ms and nothing else: no further policy
    /// and no step yet.
    pub fn of(limit: u64, window: u64) -> Scenario {
        Scenario {
            limit,
            window,
            further: Vec::new(),
            buckets: Vec::new(),
            fixed: Vec::new(),
            tokens: Vec::new(),
            token_buckets: Vec::new(),
            steps: Vec::new(),
        }
    }
}

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} per {} ms", self.limit, self.window)?;
        for (l, w) in &self.further {
            write!(f, ", {l} per {w} ms")?;
        }
        for (n, w, b) in &self.buckets {
            write!(f, ", a bucket of {n} per {w} ms with burst {b}")?;
        }
        for (n, w, u) in &self.fixed {
            write!(f, ", a fixed window of {n} {} per {w} ms", u.name())?;
        }
        for (q, w, u) in &self.tokens {
            write!(f, ", {q} {} per {w} ms", u.name())?;
        }
        for (q, w, b, u) in &self.token_buckets {
            write!(
                f,
                ", a bucket of {q} {} per {w} ms with burst {b}",
                u.name()
            )?;
        }
        writeln!(f, ":")?;
        // Runs of one step at one instant (a burst of takes) take one line.
        let mut i = 0;
        while i < self.steps.len() {
            let s = self.steps[i];
            let n = self.steps[i..].iter().take_while(|&&t| t == s).count();
            let times = if n > 1 {
                format!(" x{n}")
            } else {
                String::new()
            };
            writeln!(f, "  #{i} at {} ms: {:?}{times}", s.at, s.op)?;
            i += n;
        }
        Ok(())
    }
}

/// What a store is asked: an [`Op`] with the call it is about resolved.
/// Call ids are 0, 1, 2… in the order takes are asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    /// A take for call `id`, estimated at this many tokens.
    Take(u64, TokenWeight),
    /// Call `id` was answered `ago` ms before now, having used this many
    /// tokens when the response said.
    Settle(u64, u64, Option<Used>),
    /// Call `id` was never sent.
    Cancel(u64),
    /// A 429, then a pause of this many ms.
    RateLimited(u64),
    /// A reported limit.
    InForce(u64),
    /// `remaining: 0`.
    Full,
    /// A stated policy: quota, window (ms), used, what it counts.
    Stated(u64, u64, u64, Unit),
    /// The stated token window refills: period (ms), used.
    Refill(u64, u64),
    /// A bucket's policy is used up: which bucket, reset (ms), exact.
    Emptied(usize, u64, bool),
    /// A fixed window's reset: which fixed window (modulo how many),
    /// reset, early, late (ms).
    Aligned(usize, u64, u64, u64),
    /// What a fixed window's policy has used: which fixed window (modulo
    /// how many), used.
    Spent(usize, u64),
}

/// What a store answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// The take was granted.
    Granted {
        /// The limit in force.
        limit: u64,
        /// Calls occupying the window, this one included.
        occupancy: u64,
        /// The learnt limit (0: none).
        learnt: u64,
        /// Whether the learnt limit has settled (false without one).
        settled: bool,
    },
    /// The take was refused: look again in `ms`.
    Wait {
        /// How long until the answer may change by time alone.
        ms: u64,
        /// Whether a pause is why.
        paused: bool,
    },
    /// A settle or cancel: nothing to say.
    Noted,
    /// A refill: whether the stated window became a bucket (or the bucket
    /// it became was retimed).
    Refilled(bool),
    /// A fixed window's reset: whether it aligned the window now.
    Aligned(bool),
    /// A 429: calls are paused for `ms` and it taught `learnt` (0: nothing).
    Paused {
        /// The pause in force, from now.
        ms: u64,
        /// The limit it taught (0: none).
        learnt: u64,
    },
    /// A reported limit; whether it lowered the limit below the configured
    /// one and every earlier report.
    InForce {
        /// Worth telling the operator.
        lowered: bool,
    },
    /// `remaining: 0`: new calls are held for `ms`.
    Held {
        /// How long this response holds new calls.
        ms: u64,
    },
}

/// A store of the window rule, on the scenario's clock.
pub trait Store {
    /// What a report of a disagreement calls it.
    fn name(&self) -> &'static str;
    /// Answers `call` at `now` ms from the scenario's start.
    fn apply(&mut self, now: u64, call: Call) -> Answer;
}

/// Runs `s` against both stores, step by step. Returns every answer, or at
/// the first disagreement a report of the scenario, the answers so far and
/// the two that differ.
pub fn compare(s: &Scenario, a: &mut dyn Store, b: &mut dyn Store) -> Result<Vec<Answer>, String> {
    drive(s, &mut [a, b])
}

/// Runs `s` against one store: its answers, in order.
pub fn run(s: &Scenario, store: &mut dyn Store) -> Vec<Answer> {
    drive(s, &mut [store]).unwrap_or_default()
}

/// How many of the answers before a disagreement its report shows.
const HISTORY: usize = 30;

fn drive(s: &Scenario, stores: &mut [&mut dyn Store]) -> Result<Vec<Answer>, String> {
    let mut out: Vec<(u64, Call, Answer)> = Vec::new();
    let mut calls = Calls::default();
    for (i, step) in s.steps.iter().enumerate() {
        let Some(call) = calls.resolve(step) else {
            continue;
        };
        let answers: Vec<Answer> = stores
            .iter_mut()
            .map(|st| st.apply(step.at, call))
            .collect();
        let first = answers[0];
        if let Some(j) = answers.iter().position(|&x| x != first) {
            let mut m = format!("the stores disagree at step #{i}\n{s}answers before it:\n");
            let skip = out.len().saturating_sub(HISTORY);
            if skip > 0 {
                m += &format!("  ({skip} earlier)\n");
            }
            for (at, c, ans) in &out[skip..] {
                m += &format!("  at {at} ms: {c:?} -> {ans:?}\n");
            }
            m += &format!("at {} ms: {call:?}\n", step.at);
            m += &format!("  {}: {first:?}\n", stores[0].name());
            m += &format!("  {}: {:?}", stores[j].name(), answers[j]);
            return Err(m);
        }
        if let (Call::Take(id, _), Answer::Granted { .. }) = (call, first) {
            calls.out.push((id, step.at));
        }
        out.push((step.at, call, first));
    }
    Ok(out.into_iter().map(|(_, _, a)| a).collect())
}

/// The calls a scenario has under way: ids granted and not yet settled or
/// cancelled, oldest first, with when they were granted.
#[derive(Default)]
struct Calls {
    next: u64,
    out: Vec<(u64, u64)>,
}

impl Calls {
    /// The call `step` asks of the stores; `None` for a settle or cancel
    /// with no call out.
    fn resolve(&mut self, step: &Step) -> Option<Call> {
        Some(match step.op {
            Op::Take | Op::TakeTokens { .. } => {
                self.next += 1;
                let tokens = match step.op {
                    Op::TakeTokens { tokens } => tokens,
                    _ => TokenWeight::default(),
                };
                Call::Take(self.next - 1, tokens)
            }
            Op::Settle { pick, ago } | Op::SettleUsed { pick, ago, .. } => {
                let (id, sent) = self.pick(pick)?;
                let ago = ago.min(step.at - sent + 2).min(step.at);
                let used = match step.op {
                    Op::SettleUsed { used, .. } => Some(used),
                    _ => None,
                };
                Call::Settle(id, ago, used)
            }
            Op::Cancel { pick } => Call::Cancel(self.pick(pick)?.0),
            Op::RateLimited { pause } => Call::RateLimited(pause),
            Op::InForce { limit } => Call::InForce(limit),
            Op::Full => Call::Full,
            Op::Stated {
                quota,
                window,
                used,
                unit,
            } => Call::Stated(quota, window, used, unit),
            Op::Refill { period, used } => Call::Refill(period, used),
            Op::Emptied {
                bucket,
                reset,
                exact,
            } => Call::Emptied(bucket, reset, exact),
            Op::Aligned {
                fixed,
                reset,
                early,
                late,
            } => Call::Aligned(fixed, reset, early, late),
            Op::Spent { fixed, used } => Call::Spent(fixed, used),
        })
    }

    fn pick(&mut self, pick: usize) -> Option<(u64, u64)> {
        if self.out.is_empty() {
            return None;
        }
        Some(self.out.remove(pick % self.out.len()))
    }
}

#[cfg(test)]
mod tests;
