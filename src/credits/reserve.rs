//! The production reserve: what a call is expected to cost, and whether the
//! rest of the job fits above the reserve. Pure: no I/O, no clock.

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
/// and why `--require-full` refuses it when it would take `balance` below
/// the reserve. `what` names the balance ("balance", or "last known
/// balance" when it comes from the checkpoint). `require_full`: the run
/// will not spend down to the reserve, so the line does not say it will.
pub fn project(
    cost: f64,
    left: u64,
    (balance, floor): (i64, i64),
    what: &str,
    require_full: bool,
) -> (String, Option<String>) {
    let projected = (cost * left as f64).ceil() as i64;
    let room = balance.saturating_sub(floor);
    // Without --require-full the run spends down to the reserve: say how
    // far that goes.
    let until = match (room < projected, cost > 0.0 && !require_full) {
        (true, true) => format!(
            "; it runs until the reserve (about {} of them), then halts with the way on",
            (room.max(0) as f64 / cost).floor() as u64
        ),
        _ => String::new(),
    };
    let line = format!(
        "batchrun: projected cost of the {left} remaining item(s): ~{projected} credits at ~{cost:.1}/item; {what} {balance}, reserve {floor}{until}"
    );
    let crosses = (room < projected).then(|| {
        format!(
            "--require-full: the remaining {left} item(s) would cost ~{projected} credits and take the {what} of {balance} below the reserve of {floor}: top up ~{} credits, or drop --require-full to spend down to the reserve",
            projected.saturating_sub(room)
        )
    });
    (line, crosses)
}

/// What a run says before its first call about the reserve, from the last
/// balance and cost per item the checkpoint knows (in this billing cycle):
/// the projection, or, when that balance is at the reserve, that one call
/// learns it afresh. It never refuses: the checkpoint's balance may be
/// stale by a top-up or the renewal, and the first call (which the ledger
/// sends alone) tells the truth for the price of one call.
pub fn precheck(
    (floor, require_full): (Option<i64>, bool),
    last: Option<CreditSnapshot>,
    cost: Option<f64>,
    pending: u64,
    now_unix: u64,
) -> Option<String> {
    let (Some(floor), Some(last)) = (floor, last) else {
        return None;
    };
    if pending == 0 || last.renewal.is_some_and(|r| r <= now_unix) {
        // Nothing to check, or that cycle is over and the balance renewed.
        return None;
    }
    let cost = cost.unwrap_or(1.0).max(0.0);
    if last.remaining.saturating_sub(cost.ceil() as i64) < floor {
        return Some(format!(
            "batchrun: the last known balance ({} credits) is at the reserve of {floor}: one call learns it afresh",
            last.remaining
        ));
    }
    let balance = (last.remaining, floor);
    Some(project(cost, pending, balance, "last known balance", require_full).0)
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
    fn the_projection_crosses_the_reserve_only_past_the_room_above_it() {
        let (line, crosses) = project(2.0, 10, (100, 80), "balance", false);
        assert!(line.contains("~20 credits"), "{line}");
        assert!(!line.contains("runs until the reserve"), "{line}");
        assert_eq!(crosses, None, "100 - 20 = 80 keeps the reserve");
        let (line, crosses) = project(2.0, 11, (100, 80), "last known balance", false);
        assert!(
            line.contains("runs until the reserve (about 10 of them)"),
            "{line}"
        );
        let (line, _) = project(2.0, 11, (100, 80), "last known balance", true);
        assert!(
            !line.contains("runs until"),
            "--require-full does not: {line}"
        );
        let why = crosses.unwrap();
        assert!(why.contains("last known balance of 100"), "{why}");
        assert!(why.contains("top up ~2 credits"), "{why}");
    }

    #[test]
    fn the_precheck_never_refuses_and_says_when_one_call_learns_the_balance() {
        let last = CreditSnapshot {
            remaining: 85,
            used: 15,
            max: 100,
            renewal: Some(2_000),
        };
        let line = precheck((Some(80), false), Some(last), Some(1.0), 10, 1_000).unwrap();
        assert!(line.contains("~10 credits"), "{line}");
        assert!(
            line.contains("runs until the reserve (about 5 of them)"),
            "{line}"
        );
        let line = precheck((Some(85), false), Some(last), Some(1.0), 10, 1_000).unwrap();
        assert!(
            line.contains("(85 credits) is at the reserve of 85"),
            "{line}"
        );
        assert!(line.contains("one call learns it afresh"), "{line}");
        assert_eq!(
            precheck((Some(85), false), Some(last), Some(1.0), 10, 2_000),
            None,
            "that cycle is over"
        );
        assert_eq!(
            precheck((None, false), Some(last), Some(1.0), 10, 1_000),
            None
        );
        assert_eq!(
            precheck((Some(85), false), Some(last), Some(1.0), 0, 1_000),
            None
        );
    }
}
