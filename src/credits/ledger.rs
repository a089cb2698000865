//! The one owner of the account's balance as this run knows it, and the
//! reserve guard that reads it.
//!
//! Admission must read the balance and the count of calls in flight under
//! one lock (a call is "in flight" until its charge shows in a response), so
//! both live here, behind one mutex.

use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::watch;

use super::reserve::{project, CostEstimate};
use super::{Alert, AlertKind, CreditSnapshot};

/// What `--reserve` asked for.
#[derive(Debug, Clone, Copy)]
pub struct ReserveConfig {
    /// Credits kept for production.
    pub floor: i64,
    /// Halt once the balance is known if the projection crosses the
    /// reserve (`--require-full`), instead of running until the reserve.
    pub require_full: bool,
    /// Items pending when the run started, for the projection.
    pub pending_at_start: u64,
    /// Items a call carries (`--batch`; 1 without): a call costs theirs.
    pub per_call: u64,
    /// One item alone may learn the balance ([`Ledger::first_alone`]): it
    /// goes under a key of its own, so not after a run killed with calls
    /// in flight, whose batch would then run a second time.
    pub alone: bool,
}

#[derive(Default)]
struct State {
    last: Option<CreditSnapshot>,
    /// Whether `last` came from a response of this run. The reserve admits
    /// calls only on a fresh balance: one from the checkpoint may be stale
    /// by a top-up or other traffic.
    fresh: bool,
    in_flight: u64,
    unmetered_responses: u32,
    disabled: bool,
    cost: CostEstimate,
    projected_checked: bool,
    done_in_run: u64,
    /// The last run halted for credits (exhausted): one call at a time
    /// until a response of this run says how things stand.
    solo: bool,
    /// An answer of this run said the credits are exhausted: no call but
    /// a probe goes out after it, while the run halts (or waits).
    exhausted: bool,
    /// A response of this run came (whatever it said of the credits).
    answered: bool,
}

/// The balance, and the reserve guard when `--reserve` is set: a call may
/// start only if the last known balance, less the projected cost of every
/// call in flight and this one, stays at or above the reserve.
pub struct Ledger {
    state: Mutex<State>,
    reserve: Option<ReserveConfig>,
    changed: watch::Sender<u64>,
}

/// The reserve's answer to "may this call start?".
pub enum Admit {
    /// Yes; the call counts as in flight until the guard is dropped.
    Go(InFlight),
    /// Not until a call in flight settles.
    WaitForBalance,
    /// No: the reserve is reached.
    Refused(String),
}

/// Counts a call (of this many items) as in flight for the reserve until
/// dropped.
pub struct InFlight(Option<Arc<Ledger>>, u64);

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some(l) = self.0.take() {
            let mut s = l.lock();
            s.in_flight = s.in_flight.saturating_sub(self.1);
            drop(s);
            // Whatever became of the call (even a panic), a worker waiting
            // for its turn must get to look again.
            l.changed.send_modify(|n| *n += 1);
        }
    }
}

/// What one response told the ledger.
#[derive(Debug, Default)]
pub struct Observed {
    /// The snapshot, when it is newer than what was known.
    pub newer: Option<CreditSnapshot>,
    /// A line for the operator (the projection, once the cost is known).
    pub note: Option<String>,
    /// An alert to raise (the reserve cannot work on this API).
    pub alert: Option<Alert>,
    /// Why the run must stop for the reserve, if it must.
    pub refusal: Option<String>,
}

impl Ledger {
    /// A ledger starting from the checkpoint's `last` balance and cost.
    /// `after_halt`: the job's last run halted on exhausted credits, so
    /// this one learns the balance with one call before the pool opens
    /// (with a reserve, every run does).
    pub fn new(
        last: Option<CreditSnapshot>,
        reserve: Option<ReserveConfig>,
        prior_cost: Option<f64>,
        after_halt: bool,
    ) -> Arc<Ledger> {
        Arc::new(Ledger {
            state: Mutex::new(State {
                last,
                cost: CostEstimate::with_prior(prior_cost),
                solo: after_halt,
                ..State::default()
            }),
            reserve,
            changed: watch::channel(0).0,
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The latest balance known (from this run or the checkpoint).
    pub fn last(&self) -> Option<CreditSnapshot> {
        self.lock().last
    }

    /// Whether the credits are gone as far as the run can tell, asked while
    /// one call's answer is read: an answer of this run said they are
    /// exhausted and nothing got through since, or the last balance known,
    /// less what the other calls in flight may have spent, is 0 or less.
    /// A 402 that says nothing of credits is then the account's, not its
    /// item's: APIs that state the balance on their successes often answer
    /// a bare 402 once it is spent, and with calls in flight that 402 may
    /// be read before the success that took the balance to 0.
    pub fn spent(&self) -> bool {
        let s = self.lock();
        // The call being read is still counted in flight.
        let others = s.in_flight.saturating_sub(1) as f64;
        s.exhausted
            || s.last
                .is_some_and(|l| l.remaining as f64 <= s.cost.current() * others)
    }

    /// The cost per item measured in this run, if any.
    pub fn measured_cost(&self) -> Option<f64> {
        self.lock().cost.per_item
    }

    /// Wakes when a call settles; subscribe before asking [`Ledger::admit`],
    /// so a call that ends in between still wakes the waiter.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// Whether the run sends one call alone first, to learn how things
    /// stand after its job's last run halted on exhausted credits.
    pub fn learning_first(&self) -> bool {
        self.lock().solo
    }

    /// Whether the run's first call carries one item, not a batch: with a
    /// reserve, before any response of this run, when the last known
    /// balance (the checkpoint's, maybe stale) is unknown or less than a
    /// batch's cost above the reserve. A top-up may have come, and one
    /// item learns that for the price of one item where a batch would
    /// spend the reserve by a batch's cost on every rerun while nobody
    /// tops up.
    pub fn first_alone(&self) -> bool {
        let Some(r) = &self.reserve else { return false };
        let s = self.lock();
        if r.per_call <= 1 || !r.alone || s.disabled || s.answered {
            return false;
        }
        let batch = (s.cost.current() * r.per_call as f64).ceil() as i64;
        s.last
            .map_or(true, |last| last.remaining.saturating_sub(batch) < r.floor)
    }

    /// Whether one more call fits above the reserve (always, without one).
    pub fn has_room(&self) -> bool {
        let Some(r) = &self.reserve else { return true };
        let s = self.lock();
        match s.last {
            Some(last) if s.fresh && !s.disabled => {
                last.remaining
                    .saturating_sub(s.cost.current().ceil() as i64)
                    >= r.floor
            }
            _ => true,
        }
    }

    /// May a call start? A probe while waiting for credits always may.
    pub fn admit(self: &Arc<Self>, probing: bool) -> Admit {
        self.admit_items(probing, 1)
    }

    /// [`Ledger::admit`] for a call that carries `items` items (a batch):
    /// each is charged, so each counts in flight.
    pub fn admit_items(self: &Arc<Self>, probing: bool, items: u64) -> Admit {
        let items = items.max(1);
        let mut s = self.lock();
        if probing {
            s.in_flight += items;
            return Admit::Go(InFlight(Some(self.clone()), items));
        }
        // Told the credits are out: the run is halting (or about to wait);
        // another call would only be refused too.
        if s.exhausted {
            return Admit::WaitForBalance;
        }
        let Some(r) = &self.reserve else {
            // Counted even without a reserve: [`Ledger::spent`] reads it.
            return match (s.solo, s.in_flight) {
                (true, 1..) => Admit::WaitForBalance,
                _ => {
                    s.in_flight += items;
                    Admit::Go(InFlight(Some(self.clone()), items))
                }
            };
        };
        if s.disabled {
            s.in_flight += items;
            return Admit::Go(InFlight(Some(self.clone()), items));
        }
        // The balance is learnt from the first response and the cost of a
        // call from the next: until both are known, one call at a time, so
        // that a call costing many credits cannot overshoot the reserve.
        let below = |last: CreditSnapshot| {
            last.remaining
                .saturating_sub((s.cost.current() * items as f64).ceil() as i64)
                < r.floor
        };
        let last = match s.last {
            // Already below the reserve (the first call after a reserve
            // halt): no second call just to learn the cost.
            Some(last) if s.fresh && (s.cost.known() || below(last)) => last,
            _ if s.in_flight == 0 => {
                s.in_flight += items;
                return Admit::Go(InFlight(Some(self.clone()), items));
            }
            _ => return Admit::WaitForBalance,
        };
        let cost = s.cost.current();
        let need = (cost * (s.in_flight + items) as f64).ceil() as i64;
        if last.remaining.saturating_sub(need) < r.floor {
            // With calls still in flight the reserve is not reached yet: one
            // of them may fail and cost nothing. Wait for them to settle.
            if s.in_flight > 0 {
                return Admit::WaitForBalance;
            }
            let left = r.pending_at_start.saturating_sub(s.done_in_run);
            // A batch costs its items': say so, or "~1" reads as room.
            let call = match items {
                1 => format!("~{cost:.0}"),
                n => format!("~{:.0} ({n} items at ~{cost:.1})", cost * n as f64),
            };
            return Admit::Refused(format!(
                "reserve reached: {} credits left, a call costs {call}, the reserve is {}; \
                 {} item(s) done this run, {left} pending (~{} credits more would finish them). \
                 After a top-up or the renewal the same command goes on by itself: \
                 the next run checks the balance with one call",
                last.remaining,
                r.floor,
                s.done_in_run,
                (cost * left as f64).ceil() as i64,
            ));
        }
        s.in_flight += items;
        Admit::Go(InFlight(Some(self.clone()), items))
    }

    /// Feeds one response's credit headers. `charged` is false for an
    /// exhaustion answer, which moves the balance but says nothing about
    /// the cost of a call.
    pub fn observe(&self, snap: Option<CreditSnapshot>, success: bool, charged: bool) -> Observed {
        self.observe_items(snap, u64::from(success), charged)
    }

    /// [`Ledger::observe`] for a call that settled `done` items (a batch:
    /// the meter charges per item, so the cost is per item too).
    pub fn observe_items(
        &self,
        snap: Option<CreditSnapshot>,
        done: u64,
        charged: bool,
    ) -> Observed {
        let mut s = self.lock();
        let mut out = Observed::default();
        // Any answer says how things stand: the pool may open (an
        // exhaustion answer closes it until the run halts or a probe
        // gets through).
        let was = (s.solo, s.exhausted);
        s.solo = false;
        s.answered = true;
        s.exhausted = !charged || (s.exhausted && done == 0);
        let opened = was != (s.solo, s.exhausted);
        if let Some(snap) = snap {
            if !s.fresh || !snap.is_older_than(s.last) || Self::fell_back(&s, snap) {
                s.last = Some(snap);
                s.fresh = true;
                out.newer = Some(snap);
            }
            // Measured with or without a reserve: [`Ledger::spent`] reads it.
            if charged {
                s.cost.observe_items(&snap, done);
            }
        }
        if let (Some(r), true) = (self.reserve, charged) {
            match snap {
                Some(snap) => self.reserve_sees(&mut s, &r, snap, done, &mut out),
                None => Self::unmetered(&mut s, &r, &mut out),
            }
            drop(s);
            self.changed.send_modify(|n| *n += 1);
        } else if opened {
            drop(s);
            self.changed.send_modify(|n| *n += 1);
        }
        out
    }

    /// Whether `snap`'s `used` fell back from the last known further than
    /// an answer overtaken by the calls in flight can explain: below half,
    /// and by more than their cost. A new cycle shows so when the API
    /// sends no `x-api-renewal`; the balance must follow it, not keep the
    /// last cycle's.
    fn fell_back(s: &State, snap: CreditSnapshot) -> bool {
        let slack = (s.cost.current() * s.in_flight.max(1) as f64).ceil() as i64;
        s.last
            .is_some_and(|l| super::fell_back(snap.used, l.used, slack))
    }

    fn reserve_sees(
        &self,
        s: &mut State,
        r: &ReserveConfig,
        snap: CreditSnapshot,
        done: u64,
        out: &mut Observed,
    ) {
        s.done_in_run += done;
        // Once the cost of a call is known, project the rest.
        if !s.projected_checked && s.cost.known() {
            s.projected_checked = true;
            let left = r.pending_at_start.saturating_sub(s.done_in_run);
            let (line, crosses) = project(
                s.cost.current(),
                left,
                (snap.remaining, r.floor),
                "balance",
                r.require_full,
            );
            out.note = Some(line);
            if r.require_full {
                let done = s.done_in_run;
                out.refusal = crosses.map(|why| format!("{why}; {done} item(s) done this run"));
            }
        }
    }

    fn unmetered(s: &mut State, r: &ReserveConfig, out: &mut Observed) {
        s.unmetered_responses += 1;
        if !s.fresh && s.unmetered_responses >= 3 && !s.disabled {
            s.disabled = true;
            let what = match r.require_full {
                true => "--reserve and --require-full are",
                false => "--reserve is",
            };
            out.alert = Some(Alert::new(
                AlertKind::Unmetered,
                "reserve-unmetered",
                format!("{what} ignored: the API's answers state no credit balance (x-api-max-credits, with x-api-remaining-credits or x-api-credits-used); the run goes on"),
                None,
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(used: i64, renewal: u64) -> CreditSnapshot {
        CreditSnapshot {
            remaining: 100 - used,
            used,
            max: 100,
            renewal: Some(renewal),
        }
    }

    #[test]
    fn an_out_of_order_response_is_older_news_only_within_a_cycle() {
        assert!(!snap(5, 1).is_older_than(None));
        assert!(snap(5, 1).is_older_than(Some(snap(6, 1))));
        assert!(
            !snap(6, 1).is_older_than(Some(snap(6, 1))),
            "a top-up keeps used"
        );
        assert!(!snap(0, 2).is_older_than(Some(snap(6, 1))), "a new cycle");
    }

    #[test]
    fn the_balance_never_rolls_back() {
        let l = Ledger::new(None, None, None, false);
        assert_eq!(
            l.observe(Some(snap(6, 1)), true, true).newer,
            Some(snap(6, 1))
        );
        assert_eq!(l.observe(Some(snap(5, 1)), true, true).newer, None);
        assert_eq!(l.last(), Some(snap(6, 1)));
    }

    #[test]
    fn a_used_that_falls_back_clearly_is_a_new_balance() {
        let l = Ledger::new(None, None, None, false);
        let calls: Vec<_> = (0..4)
            .filter_map(|_| match l.admit(false) {
                Admit::Go(g) => Some(g),
                _ => None,
            })
            .collect();
        l.observe(Some(snap(7, 1)), true, true);
        // Four calls out: an answer 4 behind is older news, not a new cycle.
        assert_eq!(l.observe(Some(snap(3, 1)), true, true).newer, None);
        drop(calls);
        l.observe(Some(snap(60, 1)), true, true);
        assert_eq!(
            l.observe(Some(snap(1, 1)), true, true).newer,
            Some(snap(1, 1))
        );
        assert_eq!(l.last(), Some(snap(1, 1)));
    }

    #[test]
    fn spent_counts_what_the_other_calls_in_flight_may_spend() {
        let l = Ledger::new(None, None, None, false);
        let go = || match l.admit(false) {
            Admit::Go(g) => g,
            _ => panic!("no reserve: every call goes"),
        };
        let mut calls: Vec<InFlight> = (0..4).map(|_| go()).collect();
        assert!(!l.spent());
        // 2 left: the three other calls out may take them, a credit each.
        l.observe(Some(snap(98, 1)), true, true);
        assert!(l.spent());
        calls.truncate(1);
        assert!(!l.spent(), "2 left, no other call out");
        l.observe(Some(snap(100, 1)), true, true);
        assert!(l.spent(), "0 left");
        // An exhaustion answer without a balance: spent until one gets through.
        let l = Ledger::new(None, None, None, false);
        l.observe(None, false, false);
        assert!(l.spent());
        l.observe(None, true, true);
        assert!(!l.spent());
    }

    #[test]
    fn the_reserve_admits_one_call_until_the_cost_is_known_then_keeps_the_floor() {
        let r = ReserveConfig {
            floor: 90,
            require_full: false,
            pending_at_start: 100,
            per_call: 1,
            alone: true,
        };
        let l = Ledger::new(None, Some(r), None, false);
        let first = match l.admit(false) {
            Admit::Go(g) => g,
            _ => panic!("the first call learns the balance"),
        };
        assert!(matches!(l.admit(false), Admit::WaitForBalance));
        l.observe(Some(snap(2, 1)), true, true);
        drop(first);
        let second = match l.admit(false) {
            Admit::Go(g) => g,
            _ => panic!("the second call learns the cost"),
        };
        let seen = l.observe(Some(snap(4, 1)), true, true);
        assert!(seen.note.unwrap().contains("~2.0/item"));
        drop(second);
        // 96 left, 2 per call: 3 calls keep 90; the fourth would not.
        let g: Vec<_> = (0..3)
            .map(|_| match l.admit(false) {
                Admit::Go(g) => g,
                _ => panic!("room for three"),
            })
            .collect();
        assert!(matches!(l.admit(false), Admit::WaitForBalance));
        drop(g);
        l.observe(Some(snap(10, 1)), true, true);
        let Admit::Refused(why) = l.admit(false) else {
            panic!("the reserve is reached")
        };
        // What was done, what is left, and what lets it go on.
        assert!(why.contains("90 credits left"), "{why}");
        assert!(why.contains("3 item(s) done this run, 97 pending"), "{why}");
        assert!(why.contains("~388 credits more"), "{why}");
        assert!(why.contains("goes on by itself"), "{why}");
        assert!(matches!(l.admit(true), Admit::Go(_)), "a probe may go");
    }

    /// A reserve the API states no balance for: said once, as what it is
    /// (`unmetered`), not as a reserve halt a webhook receiver would page on.
    #[test]
    fn a_reserve_on_an_unmetered_api_is_said_as_unkept_not_as_a_halt() {
        for require_full in [false, true] {
            let r = ReserveConfig {
                floor: 90,
                require_full,
                pending_at_start: 10,
                per_call: 1,
                alone: true,
            };
            let l = Ledger::new(None, Some(r), None, false);
            let alerts: Vec<Alert> = (0..5)
                .filter_map(|_| l.observe(None, true, true).alert)
                .collect();
            assert_eq!(alerts.len(), 1, "{alerts:?}");
            assert_eq!(alerts[0].kind, AlertKind::Unmetered);
            let said = &alerts[0].message;
            assert_eq!(said.contains("--require-full"), require_full, "{said}");
            assert!(said.contains("the run goes on"), "{said}");
        }
    }

    #[test]
    fn a_first_call_that_finds_the_balance_below_the_reserve_is_the_only_one() {
        let r = ReserveConfig {
            floor: 90,
            require_full: false,
            pending_at_start: 100,
            per_call: 1,
            alone: true,
        };
        // The checkpoint's balance is not trusted, and no cost is known.
        let l = Ledger::new(Some(snap(5, 1)), Some(r), None, false);
        let Admit::Go(first) = l.admit(false) else {
            panic!("one call learns the balance")
        };
        l.observe(Some(snap(11, 1)), true, true);
        drop(first);
        assert!(matches!(l.admit(false), Admit::Refused(_)));
    }

    #[test]
    fn after_an_exhaustion_halt_one_call_learns_how_things_stand() {
        let l = Ledger::new(Some(snap(100, 1)), None, None, true);
        let first = match l.admit(false) {
            Admit::Go(g) => g,
            _ => panic!("one call goes"),
        };
        assert!(matches!(l.admit(false), Admit::WaitForBalance));
        // Still exhausted: nothing more goes out, though the call settled.
        l.observe(Some(snap(100, 1)), false, false);
        drop(first);
        assert!(matches!(l.admit(false), Admit::WaitForBalance));
        assert!(matches!(l.admit(true), Admit::Go(_)), "a probe may go");
        // A probe got through (a top-up): the whole pool opens.
        l.observe(Some(snap(10, 2)), true, true);
        let a = l.admit(false);
        let b = l.admit(false);
        assert!(matches!((a, b), (Admit::Go(_), Admit::Go(_))));
    }

    #[test]
    fn a_batch_learns_the_balance_with_one_item_when_a_batch_would_cross() {
        let r = ReserveConfig {
            floor: 20,
            require_full: false,
            pending_at_start: 20,
            per_call: 10,
            alone: true,
        };
        let at = |remaining: i64| CreditSnapshot {
            remaining,
            used: 100 - remaining,
            max: 100,
            renewal: Some(1),
        };
        // The checkpoint's 27 is less than a batch of 10 above 20.
        let l = Ledger::new(Some(at(27)), Some(r), Some(1.0), false);
        assert!(l.first_alone());
        let Admit::Go(first) = l.admit_items(false, 1) else {
            panic!("one item learns the balance")
        };
        l.observe_items(Some(at(26)), 1, true);
        drop(first);
        assert!(!l.first_alone(), "answered: batches again");
        let Admit::Refused(why) = l.admit_items(false, 10) else {
            panic!("a batch would cross the reserve")
        };
        assert!(why.contains("a call costs ~10 (10 items at ~1.0)"), "{why}");
        // Room for a batch, or no batch: the first call is whole.
        assert!(!Ledger::new(Some(at(60)), Some(r), Some(1.0), false).first_alone());
        // After a run killed with calls in flight, a batch of them sent
        // again as one item would go under another key: whole batches.
        let killed = ReserveConfig { alone: false, ..r };
        assert!(!Ledger::new(Some(at(27)), Some(killed), Some(1.0), false).first_alone());
        let one = ReserveConfig { per_call: 1, ..r };
        assert!(!Ledger::new(Some(at(27)), Some(one), Some(1.0), false).first_alone());
    }
}
