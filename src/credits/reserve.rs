//! The production reserve: what a call is expected to cost, and whether the
//! rest of the job fits above the reserve. Pure: no I/O, no clock.

use std::time::Duration;

use super::CreditSnapshot;

/// Credits per successful call, from the movement of `x-api-credits-used`.
/// Other traffic on the account can only make it higher, which errs on the
/// side of keeping the reserve.
#[derive(Debug, Default, Clone, Copy)]
pub struct CostEstimate {
    base_used: Option<i64>,
    base_renewal: Option<u64>,
    max_used: i64,
    successes: u64,
    /// Measured in this run.
    pub per_item: Option<f64>,
    /// Carried over from the checkpoint.
    pub prior: Option<f64>,
}

impl CostEstimate {
    /// An estimate starting from a cost carried over from an earlier run.
    pub fn with_prior(prior: Option<f64>) -> CostEstimate {
        CostEstimate {
            prior,
            ..CostEstimate::default()
        }
    }

    /// Feeds every metered response, in any order. The first one sets the
    /// base; each later success adds one charge; the highest `used` seen
    /// since the base, over those successes, is the cost per item.
    pub fn observe(&mut self, snap: &CreditSnapshot, success: bool) {
        self.observe_items(snap, u64::from(success));
    }

    /// [`CostEstimate::observe`] for a response that settled `done` items
    /// (a batch call): each is one charge.
    pub fn observe_items(&mut self, snap: &CreditSnapshot, done: u64) {
        let new_cycle = self.base_renewal != snap.renewal && self.base_used.is_some();
        match self.base_used {
            Some(b) if !new_cycle => {
                // A response older than the base says nothing new.
                if snap.used < b {
                    return;
                }
                self.max_used = self.max_used.max(snap.used);
                self.successes += done;
                if self.successes > 0 {
                    self.per_item =
                        Some(self.max_used.saturating_sub(b) as f64 / self.successes as f64);
                }
            }
            _ => {
                self.base_used = Some(snap.used);
                self.base_renewal = snap.renewal;
                self.max_used = snap.used;
                self.successes = 0;
            }
        }
    }

    /// Whether any cost is known (measured in this run or carried over).
    pub fn known(&self) -> bool {
        self.per_item.is_some() || self.prior.is_some()
    }

    /// The cost to plan with: measured, else carried over, else one credit.
    pub fn current(&self) -> f64 {
        self.per_item.or(self.prior).unwrap_or(1.0).max(0.0)
    }
}

/// The projected cost of `left` items at `cost` each, as the line to print,
/// and why it is refused when it would take `balance` below the reserve.
/// `what` names the balance ("balance", or "last known balance" when it
/// comes from the checkpoint).
pub fn project(
    cost: f64,
    left: u64,
    balance: i64,
    floor: i64,
    what: &str,
) -> (String, Option<String>) {
    let projected = (cost * left as f64).ceil() as i64;
    let line = format!(
        "batchrun: projected cost of the {left} remaining item(s): ~{projected} credits at ~{cost:.1}/item; {what} {balance}, reserve {floor}"
    );
    let room = balance.saturating_sub(floor);
    let crosses = (room < projected).then(|| {
        format!(
            "the remaining {left} item(s) would cost ~{projected} credits and take the {what} of {balance} below the reserve of {floor}: add --allow-partial to spend down to the reserve, or top up ~{} credits",
            projected.saturating_sub(room)
        )
    });
    (line, crosses)
}

/// What the reserve check before any call found.
#[derive(Debug, Default, PartialEq)]
pub struct Precheck {
    /// The projection line to print, if one was made.
    pub line: Option<String>,
    /// Why nothing may be sent, if so.
    pub refusal: Option<String>,
}

/// Whether a run trusts the checkpoint's last balance or learns it afresh.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Recheck {
    /// `--recheck-credits` or `--wait-for-credits`: learn it with one call.
    Asked,
    /// The balance was last seen `ago`; it is trusted for `after`, then
    /// learnt afresh with one call, so a nightly rerun sees a top-up by
    /// itself while a rerun right after a halt spends nothing.
    Aged {
        /// How long ago the job's last call saw it.
        ago: Duration,
        /// How long it is trusted (`--recheck-after`).
        after: Duration,
    },
}

/// The reserve check a run can make before sending anything, from the last
/// balance and cost per item the checkpoint knows (in this billing cycle).
/// A stale balance can only be off by a top-up or other traffic: a
/// [`Recheck`] learns it afresh with one call instead.
pub fn precheck(
    floor: Option<i64>,
    allow_partial: bool,
    recheck: Recheck,
    last: Option<CreditSnapshot>,
    cost: Option<f64>,
    pending: u64,
    now_unix: u64,
) -> Precheck {
    let (Some(floor), Some(last), Recheck::Aged { ago, after }) = (floor, last, recheck) else {
        return Precheck::default();
    };
    if pending == 0 || last.renewal.is_some_and(|r| r <= now_unix) {
        // Nothing to check, or that cycle is over and the balance renewed.
        return Precheck::default();
    }
    let cost = cost.unwrap_or(1.0).max(0.0);
    let (line, crosses) = project(cost, pending, last.remaining, floor, "last known balance");
    let at_reserve = last.remaining.saturating_sub(cost.ceil() as i64) < floor;
    let refusal = if at_reserve {
        Some(format!(
            "reserve reached: the last known balance is {} and a call costs ~{cost:.0}, the reserve is {floor}; nothing was sent. \
             The balance was seen {} ago: a run {} from now on checks it again by itself with one call; \
             after a top-up, --recheck-credits checks it now",
            last.remaining,
            age(ago),
            age(after.saturating_sub(ago)),
        ))
    } else {
        crosses
            .filter(|_| !allow_partial)
            .map(|why| format!("{why}; nothing was sent"))
    };
    match refusal {
        // Stale: a top-up or a renewal may have changed it since.
        Some(_) if ago >= after => Precheck {
            line: Some(format!(
                "batchrun: the last known balance ({} credits) is {} old: one call learns it afresh",
                last.remaining,
                age(ago)
            )),
            refusal: None,
        },
        refusal => Precheck {
            line: Some(line),
            refusal,
        },
    }
}

/// "3m", "9h": how old a balance is, to the minute (seconds under one).
fn age(d: Duration) -> String {
    let d = if d >= Duration::from_secs(60) {
        Duration::from_secs(d.as_secs() / 60 * 60)
    } else {
        Duration::from_secs(d.as_secs())
    };
    humantime::format_duration(d).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cost_estimate_follows_credits_used() {
        let snap = |used, renewal| CreditSnapshot {
            remaining: 1000 - used,
            used,
            max: 1000,
            renewal: Some(renewal),
        };
        let mut c = CostEstimate::default();
        assert!(!c.known());
        assert_eq!(c.current(), 1.0, "unknown: one credit per item");
        c.observe(&snap(20, 7), true);
        assert!(!c.known(), "one response is only the base");
        c.observe(&snap(40, 7), true);
        assert_eq!(c.current(), 20.0);
        // Responses arriving out of order still count their charge.
        c.observe(&snap(80, 7), true);
        c.observe(&snap(60, 7), true);
        assert_eq!(c.current(), 20.0);
        // Older than the base: ignored.
        c.observe(&snap(0, 7), true);
        assert_eq!(c.current(), 20.0);
        // A new cycle (renewal moved, used back to 0): measure from there.
        c.observe(&snap(0, 8), false);
        c.observe(&snap(3, 8), true);
        assert_eq!(c.current(), 3.0);
    }

    #[test]
    fn the_projection_refuses_only_when_it_crosses_the_reserve() {
        let (line, crosses) = project(2.0, 10, 100, 80, "balance");
        assert!(line.contains("~20 credits"), "{line}");
        assert_eq!(crosses, None, "100 - 20 = 80 keeps the reserve");
        let (_, crosses) = project(2.0, 11, 100, 80, "last known balance");
        assert!(crosses.unwrap().contains("last known balance of 100"));
    }

    #[test]
    fn the_precheck_refuses_from_a_recent_balance_unless_asked_to_recheck() {
        let last = CreditSnapshot {
            remaining: 85,
            used: 15,
            max: 100,
            renewal: Some(2_000),
        };
        let recent = Recheck::Aged {
            ago: Duration::from_secs(60),
            after: Duration::from_secs(3600),
        };
        let p = precheck(Some(80), false, recent, Some(last), Some(1.0), 10, 1_000);
        assert!(p.line.unwrap().contains("~10 credits"));
        let why = p.refusal.unwrap();
        assert!(why.contains("--allow-partial"), "{why}");
        assert!(why.contains("top up ~5 credits"), "{why}");
        let p = precheck(Some(80), true, recent, Some(last), Some(1.0), 10, 1_000);
        assert_eq!(p.refusal, None, "--allow-partial runs until the reserve");
        let p = precheck(Some(85), true, recent, Some(last), Some(1.0), 10, 1_000);
        let why = p.refusal.unwrap();
        assert!(why.contains("nothing was sent"), "{why}");
        assert!(why.contains("--recheck-credits"), "{why}");
        assert!(why.contains("seen 1m ago"), "{why}");
        assert!(why.contains("a run 59m from now on"), "{why}");
        let p = precheck(
            Some(85),
            false,
            Recheck::Asked,
            Some(last),
            Some(1.0),
            10,
            1_000,
        );
        assert_eq!(p, Precheck::default(), "a recheck spends one call instead");
        let p = precheck(Some(85), false, recent, Some(last), Some(1.0), 10, 2_000);
        assert_eq!(p, Precheck::default(), "that cycle is over");
    }

    #[test]
    fn a_stale_balance_is_learnt_afresh_instead_of_refusing() {
        let last = CreditSnapshot {
            remaining: 80,
            used: 20,
            max: 100,
            renewal: Some(200_000),
        };
        let stale = Recheck::Aged {
            ago: Duration::from_secs(9 * 3600 + 59),
            after: Duration::from_secs(3600),
        };
        for allow_partial in [false, true] {
            let p = precheck(
                Some(80),
                allow_partial,
                stale,
                Some(last),
                Some(1.0),
                10,
                1_000,
            );
            assert_eq!(p.refusal, None);
            let line = p.line.unwrap();
            assert!(line.contains("(80 credits) is 9h old"), "{line}");
            assert!(line.contains("one call learns it afresh"), "{line}");
        }
        // Room enough: the projection as usual, stale or not.
        let p = precheck(Some(10), false, stale, Some(last), Some(1.0), 10, 1_000);
        assert_eq!(p.refusal, None);
        assert!(p.line.unwrap().contains("projected cost"));
    }
}
