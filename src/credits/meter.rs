//! The credit meter: follows the balance across a run's metered responses and
//! raises threshold and burn-rate alerts once per billing cycle.

use std::collections::VecDeque;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::alert::{describe_renewal, format_unix_date, group, pct, rate, span};
use super::{Alert, AlertKind, CreditSnapshot, ID_PROJECTED};

/// The projection refuses to extrapolate from less data than this: a few
/// minutes of a burst would otherwise predict doom for the whole cycle.
pub const MIN_PROJECTION_SPAN: Duration = Duration::from_secs(30 * 60);

/// Parses `--alert-at`, e.g. "0.5,0.8,0.95" or "50%,80%,95%".
///
/// Each value must lie in (0, 1] (or (0%, 100%]). The result is sorted and
/// deduplicated so thresholds fire in order. An empty string or "none"
/// disables threshold alerts.
pub fn parse_thresholds(s: &str) -> Result<Vec<f64>, String> {
    let s = s.trim();
    if s.is_empty() || s.eq_ignore_ascii_case("none") {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for part in s.split(',') {
        let part = part.trim();
        if part.is_empty() {
            return Err(format!(
                "empty value in alert thresholds {s:?}; expected e.g. 0.5,0.8,0.95"
            ));
        }
        let (num, scale) = match part.strip_suffix('%') {
            Some(p) => (p.trim(), 100.0),
            None => (part, 1.0),
        };
        let v = num.parse::<f64>().map_err(|_| {
            format!("alert threshold {part:?} is not a number; expected e.g. 0.8 or 80%")
        })? / scale;
        if !(v.is_finite() && v > 0.0 && v <= 1.0) {
            let hint = if scale == 1.0 && v > 1.0 && v <= 100.0 {
                format!(" (did you mean {}%?)", num)
            } else {
                String::new()
            };
            return Err(format!(
                "alert threshold {part:?} is out of range: use a fraction of the allowance \
                 in (0, 1], e.g. 0.8, or a percentage like 80%{hint}"
            ));
        }
        out.push(v);
    }
    out.sort_by(f64::total_cmp);
    out.dedup();
    Ok(out)
}

/// How far the API's clock and this machine's may differ: a renewal time
/// this close ahead is taken as passed.
pub const CLOCK_SKEW: Duration = Duration::from_secs(5 * 60);

/// Tuning of [`CreditMeter`].
#[derive(Debug, Clone, PartialEq)]
pub struct MeterConfig {
    /// Fractions of the allowance used at which to alert, e.g. 0.8 = 80%.
    pub thresholds: Vec<f64>,
    /// Trailing window the burn rate is measured over (`--burn-window`). A
    /// window shorter than [`MIN_PROJECTION_SPAN`] never projects.
    pub burn_window: Duration,
    /// The most calls in flight at once (`--concurrency`): how many
    /// answers may arrive after a later one, older than it.
    pub in_flight: u64,
}

impl Default for MeterConfig {
    fn default() -> Self {
        MeterConfig {
            thresholds: vec![0.5, 0.8, 0.95],
            burn_window: Duration::from_secs(6 * 3600),
            in_flight: 1,
        }
    }
}

/// Which billing cycle a snapshot belongs to, as [`CreditMeter`] reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cycle {
    /// The current one.
    Same,
    /// A new one began: the fired alerts and the burn samples are cleared.
    New,
    /// The one before, answered late (out of order): it says nothing new.
    Stale,
}

/// The part of the meter kept in the checkpoint, so that an alert fired
/// before a halt is not fired again by the resumed run in the same cycle.
///
/// Samples are deliberately not persisted: the wall-clock gap between a halt
/// and its resume would be averaged into the burn rate as time spent burning
/// nothing (or, with a stale baseline, credits spent by other clients would be
/// charged to this run's pace). A resumed run starts a fresh window instead.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MeterState {
    /// The last snapshot observed.
    pub last: Option<CreditSnapshot>,
    /// Alert ids already fired in this cycle, in firing order.
    pub fired: Vec<String>,
    /// Renewal time of the cycle `fired` belongs to, when known.
    pub cycle_renewal: Option<u64>,
}

impl MeterState {
    /// Whether the job's last word on credits is that they ran out: an
    /// exhaustion alert that no later success ended, or a balance of 0 or
    /// less. The next run then learns how things stand with one call.
    pub fn out_of_credits(&self) -> bool {
        self.fired
            .iter()
            .any(|f| super::alert::is_repeat_of(f, super::alert::ID_EXHAUSTED))
            || self.last.is_some_and(|l| l.remaining <= 0)
    }
}

/// A burn-rate forecast.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Projection {
    /// Credits spent per hour over the trailing window.
    pub per_hour: f64,
    /// How long the remaining credits last at that rate (zero if none left).
    pub runs_out_in: Duration,
    /// How long before renewal they run out; `None` when they last until
    /// renewal, or the renewal is unknown or already past.
    pub before_renewal: Option<Duration>,
}

/// Tracks the account's credits across responses and decides which alerts
/// are due. Feed it every metered response with [`CreditMeter::observe`].
#[derive(Debug, Clone)]
pub struct CreditMeter {
    thresholds: Vec<f64>,
    window: Duration,
    /// (time, used) at most one per `spacing`; see `observe`.
    samples: VecDeque<(SystemTime, i64)>,
    fired: Vec<String>,
    last: Option<CreditSnapshot>,
    cycle_renewal: Option<u64>,
    /// The most `used` seen in this cycle.
    peak: i64,
    /// The largest rise of `used` from one snapshot of this run to the
    /// next: what a call (or the calls between two answers) may cost.
    /// Not from the checkpoint's: other traffic between runs spent that.
    step: i64,
    /// A snapshot of this run was seen.
    seen: bool,
    /// [`MeterConfig::in_flight`].
    in_flight: u64,
}

impl CreditMeter {
    /// A meter with `cfg`, continuing from a checkpointed `restored` state if
    /// any (its fired alerts stay fired while the cycle is the same).
    pub fn new(cfg: MeterConfig, restored: Option<MeterState>) -> Self {
        let mut thresholds: Vec<f64> = cfg
            .thresholds
            .into_iter()
            .filter(|t| t.is_finite() && *t > 0.0)
            .collect();
        thresholds.sort_by(f64::total_cmp);
        thresholds.dedup();
        let st = restored.unwrap_or_default();
        CreditMeter {
            thresholds,
            window: cfg.burn_window,
            samples: VecDeque::new(),
            cycle_renewal: st.cycle_renewal.or(st.last.and_then(|l| l.renewal)),
            fired: st.fired,
            peak: st.last.map_or(0, |l| l.used),
            step: 0,
            seen: false,
            in_flight: cfg.in_flight.max(1),
            last: st.last,
        }
    }

    /// Records one metered response seen at `now` and returns the alerts that
    /// became due (each id at most once per billing cycle), in order.
    ///
    /// A new cycle (see [`CreditMeter::cycle_of`]) clears the burn samples
    /// and the fired set, so thresholds can fire again against the fresh
    /// allowance. An answer of the cycle before, arriving late, is ignored.
    pub fn observe(&mut self, snap: CreditSnapshot, now: SystemTime) -> Vec<Alert> {
        match self.cycle_of(&snap, now) {
            Cycle::Stale => return Vec::new(),
            Cycle::New => {
                self.samples.clear();
                self.fired.clear();
                self.peak = snap.used;
                self.cycle_renewal = snap.renewal.or(self.cycle_renewal);
            }
            Cycle::Same => {
                if let Some(l) = self.last.filter(|_| self.seen) {
                    self.step = self.step.max(snap.used - l.used);
                }
                self.peak = self.peak.max(snap.used);
            }
        }
        self.last = Some(snap);
        self.seen = true;
        self.record(snap.used, now);

        let mut alerts = Vec::new();
        if snap.max > 0 {
            let ratio = snap.used as f64 / snap.max as f64;
            for i in 0..self.thresholds.len() {
                let th = self.thresholds[i];
                if ratio < th {
                    break;
                }
                let id = format!("pct-{th}");
                if self.mark_fired(&id) {
                    let message = format!(
                        "{}% of credits used ({} of {}; {} remaining; {})",
                        pct(th),
                        group(snap.used),
                        group(snap.max),
                        group(snap.remaining),
                        describe_renewal(snap.renewal),
                    );
                    alerts.push(Alert::new(AlertKind::Threshold, id, message, Some(snap)));
                }
            }
        }

        if snap.remaining > 0 && !self.has_fired(ID_PROJECTED) {
            if let Some(p) = self.projection(now) {
                if let (Some(before), Some(r)) = (p.before_renewal, snap.renewal) {
                    self.mark_fired(ID_PROJECTED);
                    let message = format!(
                        "at {} credits/hour, credits run out in {}, {} before renewal ({})",
                        rate(p.per_hour),
                        span(p.runs_out_in),
                        span(before),
                        format_unix_date(r),
                    );
                    alerts.push(Alert::new(
                        AlertKind::Projection,
                        ID_PROJECTED,
                        message,
                        Some(snap),
                    ));
                }
            }
        }
        alerts
    }

    /// Which cycle `snap`, seen at `now`, belongs to; adopts its renewal
    /// when it is the first known or moved earlier within the cycle.
    ///
    /// Only the balance shows a new cycle: the renewal moved later once
    /// the cycle's own renewal time has passed (give or take
    /// [`CLOCK_SKEW`]), or `used` fell back further than answers arriving
    /// out of order can explain (see [`CreditMeter::fell_back`]). A
    /// renewal that merely differs does not: backends a second apart, or
    /// one that says "now + 30 days" on every answer, raised every
    /// threshold again at each answer.
    fn cycle_of(&mut self, snap: &CreditSnapshot, now: SystemTime) -> Cycle {
        let now = now
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
            .saturating_add(CLOCK_SKEW.as_secs());
        match (self.cycle_renewal, snap.renewal) {
            (Some(c), Some(r)) if r > c && c <= now => return Cycle::New,
            (Some(c), Some(r)) if r < c && r <= now => return Cycle::Stale,
            // Still ahead: the renewal moved earlier (a plan changed).
            (Some(c), Some(r)) if r < c => self.cycle_renewal = Some(r),
            (None, Some(r)) => self.cycle_renewal = Some(r),
            _ => {}
        }
        match self.fell_back(snap.used) {
            true => Cycle::New,
            false => Cycle::Same,
        }
    }

    /// Whether `used` fell back clearly: below half the most seen this
    /// cycle, and by more than the calls in flight could cost (at the
    /// largest rise seen between two answers, and at least one credit
    /// each). An answer overtaken by later ones is older by at most that.
    fn fell_back(&self, used: i64) -> bool {
        let slack = (self.in_flight as i64).saturating_mul(self.step.max(1));
        super::fell_back(used, self.peak, slack)
    }

    /// Adds a burn sample and trims the window.
    fn record(&mut self, used: i64, now: SystemTime) {
        // Keeping at most ~360 samples per window bounds memory on fast runs
        // (thousands of responses an hour) while costing well under 1% of
        // accuracy: a merged bucket keeps its first time and its highest used.
        let spacing = self.window / 360;
        match self.samples.back() {
            // The clock stepped back; samples ahead of it would give nonsense.
            Some(&(t, _)) if now < t => self.samples.clear(),
            // Used fell below the window's baseline: a top-up or a reset the
            // renewal header did not announce. The old samples belong to a
            // different balance, and measuring across them would give a
            // negative rate. A small dip above the baseline is just concurrent
            // responses arriving out of order, and is kept.
            _ if self.samples.front().is_some_and(|&(_, u0)| used < u0) => self.samples.clear(),
            _ => {}
        }
        // The first sample is never merged into, so the baseline stays exact.
        let merge = self.samples.len() >= 2
            && self
                .samples
                .back()
                .is_some_and(|&(t, _)| now.duration_since(t).unwrap_or_default() < spacing);
        match self.samples.back_mut() {
            Some((_, u)) if merge => *u = (*u).max(used),
            _ => self.samples.push_back((now, used)),
        }
        while let Some(&(t, _)) = self.samples.front() {
            if now.duration_since(t).unwrap_or_default() > self.window {
                self.samples.pop_front();
            } else {
                break;
            }
        }
    }

    /// The burn-rate forecast at `now`, from the samples in the trailing
    /// window: `None` with less than [`MIN_PROJECTION_SPAN`] of data, without a
    /// snapshot, or when nothing is being spent.
    pub fn projection(&self, now: SystemTime) -> Option<Projection> {
        let last = self.last?;
        let mut in_window = self
            .samples
            .iter()
            .filter(|&&(t, _)| now.duration_since(t).is_ok_and(|age| age <= self.window));
        let &(t0, u0) = in_window.next()?;
        let span = now.duration_since(t0).ok()?;
        if span < MIN_PROJECTION_SPAN {
            return None;
        }
        // The highest used, not the latest: out-of-order responses from
        // concurrent workers can make the latest one slightly stale.
        let u_end = in_window.map(|&(_, u)| u).fold(u0, i64::max);
        let hours = span.as_secs_f64() / 3600.0;
        let per_hour = u_end.saturating_sub(u0) as f64 / hours;
        if !(per_hour > 0.0 && per_hour.is_finite()) {
            return None;
        }
        let runs_out_in =
            Duration::try_from_secs_f64(last.remaining.max(0) as f64 / per_hour * 3600.0)
                .unwrap_or(Duration::MAX);
        let before_renewal = last.renewal.and_then(|r| {
            let until_renewal = UNIX_EPOCH
                .checked_add(Duration::from_secs(r))?
                .duration_since(now)
                .ok()?;
            until_renewal
                .checked_sub(runs_out_in)
                .filter(|d| !d.is_zero())
        });
        Some(Projection {
            per_hour,
            runs_out_in,
            before_renewal,
        })
    }

    /// The last snapshot observed (or restored).
    pub fn last(&self) -> Option<CreditSnapshot> {
        self.last
    }

    /// The state to keep in the checkpoint.
    pub fn state(&self) -> MeterState {
        MeterState {
            last: self.last,
            fired: self.fired.clone(),
            cycle_renewal: self.cycle_renewal,
        }
    }

    /// Marks alert `id` as fired in this cycle; true if it was not already.
    ///
    /// The runner uses this for the exhaustion and reserve alerts. Call
    /// [`CreditMeter::observe`] with the triggering response's snapshot first,
    /// so a cycle change is noticed before the id is checked.
    pub fn mark_fired(&mut self, id: &str) -> bool {
        if self.has_fired(id) {
            return false;
        }
        self.fired.push(id.to_string());
        true
    }

    /// Forgets that alert `base` and its repeats ([`super::alert::repeat_id`])
    /// fired, so they can fire again this cycle: an exhaustion that ended (a
    /// call succeeded after a top-up) makes the next one a new outage worth
    /// its own alert, counted from one. Returns the ids forgotten.
    pub fn unmark_fired(&mut self, base: &str) -> Vec<String> {
        let (gone, kept) = std::mem::take(&mut self.fired)
            .into_iter()
            .partition(|f| super::alert::is_repeat_of(f, base));
        self.fired = kept;
        gone
    }

    /// How many alerts of `base` ([`super::alert::repeat_id`]) fired in
    /// this cycle: the next one is the count plus one.
    pub fn times_fired(&self, base: &str) -> usize {
        self.fired
            .iter()
            .filter(|f| super::alert::is_repeat_of(f, base))
            .count()
    }

    /// Whether alert `id` already fired in this cycle.
    pub fn has_fired(&self, id: &str) -> bool {
        self.fired.iter().any(|f| f == id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::credits::tests::snap;
    use crate::credits::{format_unix_date, format_unix_utc, ID_EXHAUSTED};

    const HOUR: u64 = 3600;
    const DAY: u64 = 86_400;
    /// The fake clock's origin: a UTC midnight in late 2026.
    const T0: u64 = 1_796_000_000 - 1_796_000_000 % DAY;

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    fn ids(alerts: &[Alert]) -> Vec<&str> {
        alerts.iter().map(|a| a.id.as_str()).collect()
    }

    #[test]
    fn thresholds_fire_once_each_in_order() {
        let renewal = Some(T0 + 20 * DAY);
        let mut m = CreditMeter::new(MeterConfig::default(), None);
        assert!(m.observe(snap(4_999, 10_000, renewal), at(T0)).is_empty());
        let a = m.observe(snap(5_000, 10_000, renewal), at(T0 + 1));
        assert_eq!(ids(&a), ["pct-0.5"]);
        assert_eq!(a[0].kind, AlertKind::Threshold);
        assert_eq!(a[0].remaining, Some(5_000));
        assert_eq!(a[0].max, Some(10_000));
        assert_eq!(a[0].renewal, renewal);
        assert!(
            a[0].message
                .starts_with("50% of credits used (5,000 of 10,000"),
            "{}",
            a[0].message
        );
        assert!(m
            .observe(snap(6_000, 10_000, renewal), at(T0 + 2))
            .is_empty());
        // Jumping past two thresholds at once fires both, lowest first.
        let a = m.observe(snap(9_600, 10_000, renewal), at(T0 + 3));
        assert_eq!(ids(&a), ["pct-0.8", "pct-0.95"]);
        assert!(
            a[1].message.starts_with("95% of credits used"),
            "{}",
            a[1].message
        );
        assert!(m
            .observe(snap(9_700, 10_000, renewal), at(T0 + 4))
            .is_empty());
        assert!(m
            .observe(snap(10_000, 10_000, renewal), at(T0 + 5))
            .is_empty());
        assert_eq!(m.state().fired, ["pct-0.5", "pct-0.8", "pct-0.95"]);
    }

    #[test]
    fn thresholds_ignore_a_zero_allowance() {
        let mut m = CreditMeter::new(MeterConfig::default(), None);
        assert!(m.observe(snap(5, 0, None), at(T0)).is_empty());
    }

    #[test]
    fn restored_state_suppresses_refiring_in_the_same_cycle() {
        let renewal = Some(T0 + 20 * DAY);
        let mut m = CreditMeter::new(MeterConfig::default(), None);
        assert_eq!(
            ids(&m.observe(snap(8_500, 10_000, renewal), at(T0))),
            ["pct-0.5", "pct-0.8"]
        );
        assert!(m.mark_fired(ID_EXHAUSTED));
        assert!(!m.mark_fired(ID_EXHAUSTED));

        // Round-trip through JSON the way the checkpoint stores it.
        let json = serde_json::to_string(&m.state()).unwrap();
        let restored: MeterState = serde_json::from_str(&json).unwrap();
        assert_eq!(restored, m.state());

        let mut m2 = CreditMeter::new(MeterConfig::default(), Some(restored));
        assert_eq!(m2.last(), Some(snap(8_500, 10_000, renewal)));
        assert!(m2
            .observe(snap(8_600, 10_000, renewal), at(T0 + HOUR))
            .is_empty());
        // (Under 30 minutes of samples, so no projection alert joins in.)
        assert!(!m2.mark_fired(ID_EXHAUSTED));
        assert_eq!(
            ids(&m2.observe(snap(9_500, 10_000, renewal), at(T0 + HOUR + 60))),
            ["pct-0.95"]
        );
    }

    #[test]
    fn restored_state_from_another_cycle_is_dropped() {
        let old = MeterState {
            last: Some(snap(9_000, 10_000, Some(T0))),
            fired: vec!["pct-0.5".into(), "pct-0.8".into(), ID_EXHAUSTED.into()],
            cycle_renewal: Some(T0),
        };
        let mut m = CreditMeter::new(MeterConfig::default(), Some(old));
        let a = m.observe(snap(8_000, 10_000, Some(T0 + 30 * DAY)), at(T0 + 60));
        assert_eq!(ids(&a), ["pct-0.5", "pct-0.8"]);
        assert!(m.mark_fired(ID_EXHAUSTED));
        assert_eq!(m.state().cycle_renewal, Some(T0 + 30 * DAY));
    }

    #[test]
    fn cycle_change_resets_fired_and_samples() {
        let r1 = Some(T0 + DAY);
        let r2 = Some(T0 + 31 * DAY);
        let mut m = CreditMeter::new(MeterConfig::default(), None);
        assert_eq!(
            ids(&m.observe(snap(5_000, 10_000, r1), at(T0))),
            ["pct-0.5"]
        );
        m.observe(snap(6_000, 10_000, r1), at(T0 + HOUR));
        assert!(m.projection(at(T0 + HOUR)).is_some());
        // A response without a renewal does not end the cycle.
        assert!(m
            .observe(snap(6_100, 10_000, None), at(T0 + HOUR + 1))
            .is_empty());
        assert_eq!(m.state().cycle_renewal, r1);

        let a = m.observe(snap(10, 10_000, r2), at(T0 + 2 * HOUR));
        assert!(a.is_empty());
        assert!(m.state().fired.is_empty());
        assert_eq!(m.projection(at(T0 + 2 * HOUR)), None, "samples were reset");
        assert_eq!(
            ids(&m.observe(snap(5_000, 10_000, r2), at(T0 + 2 * HOUR + 60))),
            ["pct-0.5"]
        );
    }

    #[test]
    fn a_renewal_that_wobbles_or_moves_with_the_clock_is_one_cycle() {
        let r = T0 + 20 * DAY;
        let mut m = CreditMeter::new(MeterConfig::default(), None);
        let mut fired = Vec::new();
        for used in 1..=100 {
            // Backends a second apart, answering in turn.
            let flip = snap(used, 100, Some(r + used as u64 % 2));
            fired.extend(m.observe(flip, at(T0 + used as u64)));
        }
        assert_eq!(ids(&fired), ["pct-0.5", "pct-0.8", "pct-0.95"]);

        let mut m = CreditMeter::new(MeterConfig::default(), None);
        let mut fired = Vec::new();
        for used in 1..=100 {
            // "Now + 30 days" on every answer.
            let now = T0 + used as u64 * 7;
            fired.extend(m.observe(snap(used, 100, Some(now + 30 * DAY)), at(now)));
        }
        assert_eq!(ids(&fired), ["pct-0.5", "pct-0.8", "pct-0.95"]);
    }

    #[test]
    fn answers_out_of_order_across_a_renewal_do_not_flip_cycles() {
        let (r1, r2) = (T0 + DAY, T0 + 31 * DAY);
        let mut m = CreditMeter::new(MeterConfig::default(), None);
        assert_eq!(
            ids(&m.observe(snap(9_000, 10_000, Some(r1)), at(T0))),
            ["pct-0.5", "pct-0.8"]
        );
        // The renewal passed (answered by a clock a minute behind ours).
        let after = r1 + 60;
        assert!(m.observe(snap(10, 10_000, Some(r2)), at(after)).is_empty());
        assert_eq!(m.state().cycle_renewal, Some(r2));
        // A late answer of the cycle before: neither a cycle nor alerts.
        assert!(m
            .observe(snap(9_100, 10_000, Some(r1)), at(after + 1))
            .is_empty());
        assert!(m
            .observe(snap(20, 10_000, Some(r2)), at(after + 2))
            .is_empty());
        assert_eq!(
            ids(&m.observe(snap(5_000, 10_000, Some(r2)), at(after + 3))),
            ["pct-0.5"]
        );
        // Within the clock skew of the renewal, a later one is the next cycle.
        let mut m = CreditMeter::new(MeterConfig::default(), None);
        m.observe(snap(9_000, 10_000, Some(r1)), at(T0));
        let skewed = r1 - CLOCK_SKEW.as_secs() + 1;
        assert_eq!(
            ids(&m.observe(snap(9_500, 10_000, Some(r2)), at(skewed))),
            ["pct-0.5", "pct-0.8", "pct-0.95"]
        );
    }

    #[test]
    fn without_a_renewal_used_falling_back_clearly_is_a_new_cycle() {
        let cfg = MeterConfig {
            in_flight: 8,
            ..MeterConfig::default()
        };
        let mut m = CreditMeter::new(cfg.clone(), None);
        assert_eq!(
            ids(&m.observe(snap(8_500, 10_000, None), at(T0))),
            ["pct-0.5", "pct-0.8"]
        );
        // Out of order by a few calls: the same cycle.
        assert!(m.observe(snap(8_490, 10_000, None), at(T0 + 1)).is_empty());
        assert!(m.observe(snap(8_510, 10_000, None), at(T0 + 2)).is_empty());
        // Back near 0: a new cycle, whose thresholds fire again.
        assert!(m.observe(snap(30, 10_000, None), at(T0 + 3)).is_empty());
        assert!(m.state().fired.is_empty());
        assert_eq!(
            ids(&m.observe(snap(5_000, 10_000, None), at(T0 + 4))),
            ["pct-0.5"]
        );
        // Early in a cycle, answers of 8 calls in flight may fall below
        // half the most seen: not a new cycle.
        let mut m = CreditMeter::new(cfg, None);
        assert_eq!(ids(&m.observe(snap(6, 10, None), at(T0))), ["pct-0.5"]);
        m.observe(snap(9, 10, None), at(T0 + 1));
        assert!(m.observe(snap(2, 10, None), at(T0 + 2)).is_empty());
        assert_eq!(m.state().fired, ["pct-0.5", "pct-0.8"]);
    }

    #[test]
    fn unknown_renewal_never_changes_cycle() {
        let mut m = CreditMeter::new(MeterConfig::default(), None);
        assert_eq!(
            ids(&m.observe(snap(5_000, 10_000, None), at(T0))),
            ["pct-0.5"]
        );
        // The first known renewal adopts the cycle rather than starting a new one.
        assert!(m
            .observe(snap(5_100, 10_000, Some(T0 + DAY)), at(T0 + 1))
            .is_empty());
        assert_eq!(m.state().cycle_renewal, Some(T0 + DAY));
    }

    /// Steady burn: `per_hour` credits every hour, one sample every 10 minutes
    /// over `hours`, ending with `remaining_end` left. Returns the alerts.
    fn burn(
        m: &mut CreditMeter,
        start: u64,
        hours: u64,
        per_hour: i64,
        remaining_end: i64,
        renewal: Option<u64>,
    ) -> Vec<Alert> {
        let max = 1_000_000;
        let used_end = max - remaining_end;
        let steps = hours * 6;
        let mut alerts = Vec::new();
        for i in 0..=steps {
            let used = used_end - per_hour * (steps - i) as i64 / 6;
            let s = CreditSnapshot {
                remaining: max - used,
                used,
                max,
                renewal,
            };
            alerts.extend(m.observe(s, at(start + i * 600)));
        }
        alerts
    }

    fn no_thresholds() -> MeterConfig {
        MeterConfig {
            thresholds: vec![],
            ..MeterConfig::default()
        }
    }

    #[test]
    fn seed_case_projection() {
        // 40,000 remaining, renewal 10 days away, a steady 250/hour over 6 h.
        let now = T0 + 6 * HOUR;
        let renewal = now + 10 * DAY;
        let mut m = CreditMeter::new(no_thresholds(), None);
        let alerts = burn(&mut m, T0, 6, 250, 40_000, Some(renewal));

        let p = m.projection(at(now)).unwrap();
        assert!((p.per_hour - 250.0).abs() < 1e-9, "{}", p.per_hour);
        let days = p.runs_out_in.as_secs_f64() / DAY as f64;
        assert!((days - 6.667).abs() < 0.001, "{days}");
        let before = p.before_renewal.unwrap().as_secs_f64() / DAY as f64;
        assert!((before - 3.333).abs() < 0.001, "{before}");

        // The alert fired as soon as it was due (after 30 minutes, when a
        // little more was left), and only once.
        assert_eq!(ids(&alerts), [ID_PROJECTED]);
        assert_eq!(alerts[0].kind, AlertKind::Projection);
        assert!(
            alerts[0].message.contains("3.3 days before renewal"),
            "{}",
            alerts[0].message
        );
        let more = m.observe(snap(961_000, 1_000_000, Some(renewal)), at(now + 600));
        assert!(more.is_empty());
    }

    #[test]
    fn seed_case_alert_message() {
        // Two readings six hours apart measure the same steady 250/hour; the
        // alert is first due at the second one, where 40,000 are left.
        let renewal = 1_796_860_800;
        assert_eq!(format_unix_date(renewal), "2026-12-10");
        assert_eq!(format_unix_utc(renewal), "2026-12-10 00:00 UTC");
        let now = renewal - 10 * DAY;
        let mut m = CreditMeter::new(no_thresholds(), None);
        let first = snap(958_500, 1_000_000, Some(renewal));
        assert!(m.observe(first, at(now - 6 * HOUR)).is_empty());
        let alerts = m.observe(snap(960_000, 1_000_000, Some(renewal)), at(now));
        assert_eq!(ids(&alerts), [ID_PROJECTED]);
        let a = &alerts[0];
        assert_eq!(
            a.message,
            "at 250 credits/hour, credits run out in 6.7 days, 3.3 days before renewal (2026-12-10)"
        );
        assert_eq!(
            (a.remaining, a.max, a.renewal),
            (Some(40_000), Some(1_000_000), Some(renewal))
        );
    }

    #[test]
    fn projection_needs_thirty_minutes_of_data() {
        let renewal = Some(T0 + 10 * DAY);
        let mut m = CreditMeter::new(no_thresholds(), None);
        // A furious burn over 29 minutes: no projection, no alert.
        for i in 0..=29u64 {
            let a = m.observe(
                snap(100_000 + i as i64 * 1_000, 1_000_000, renewal),
                at(T0 + i * 60),
            );
            assert!(a.is_empty());
        }
        assert_eq!(m.projection(at(T0 + 29 * 60)), None);
        let a = m.observe(snap(130_000, 1_000_000, renewal), at(T0 + 30 * 60));
        assert_eq!(ids(&a), [ID_PROJECTED]);
        assert!(m.projection(at(T0 + 30 * 60)).is_some());
    }

    #[test]
    fn no_projection_alert_when_credits_outlast_renewal() {
        // 40,000 at 250/hour lasts 6.7 days; renewal in 5 days.
        let now = T0 + 6 * HOUR;
        let renewal = now + 5 * DAY;
        let mut m = CreditMeter::new(no_thresholds(), None);
        let alerts = burn(&mut m, T0, 6, 250, 40_000, Some(renewal));
        assert!(alerts.is_empty());
        let p = m.projection(at(now)).unwrap();
        assert_eq!(p.before_renewal, None);
    }

    #[test]
    fn no_projection_alert_without_renewal() {
        let mut m = CreditMeter::new(no_thresholds(), None);
        let alerts = burn(&mut m, T0, 6, 250, 40_000, None);
        assert!(alerts.is_empty());
        let p = m.projection(at(T0 + 6 * HOUR)).unwrap();
        assert_eq!(p.before_renewal, None);
    }

    #[test]
    fn projection_uses_only_the_trailing_window() {
        // A 6-hour window after 8 hours: a heavy first 2 hours must not count.
        let now = T0 + 8 * HOUR;
        let renewal = Some(now + 10 * DAY);
        let mut m = CreditMeter::new(no_thresholds(), None);
        burn(&mut m, T0, 2, 5_000, 41_500, renewal);
        burn(&mut m, T0 + 2 * HOUR, 6, 250, 40_000, renewal);
        let p = m.projection(at(now)).unwrap();
        assert!((p.per_hour - 250.0).abs() < 1e-9, "{}", p.per_hour);
    }

    #[test]
    fn idle_meter_does_not_project() {
        let renewal = Some(T0 + DAY);
        let mut m = CreditMeter::new(no_thresholds(), None);
        for i in 0..=12u64 {
            assert!(m
                .observe(snap(900, 1_000, renewal), at(T0 + i * 600))
                .is_empty());
        }
        assert_eq!(m.projection(at(T0 + 2 * HOUR)), None);
    }

    #[test]
    fn used_decreasing_resets_samples_without_negative_rates() {
        let renewal = Some(T0 + 10 * DAY);
        let mut m = CreditMeter::new(no_thresholds(), None);
        m.observe(snap(500_000, 1_000_000, renewal), at(T0));
        m.observe(snap(510_000, 1_000_000, renewal), at(T0 + HOUR));
        assert!(m.projection(at(T0 + HOUR)).is_some());
        // Used drops: a top-up or an unannounced reset.
        let a = m.observe(snap(100, 1_000_000, renewal), at(T0 + HOUR + 60));
        assert!(a.is_empty());
        assert_eq!(m.projection(at(T0 + 2 * HOUR)), None);
        m.observe(snap(1_100, 1_000_000, renewal), at(T0 + 2 * HOUR));
        let p = m.projection(at(T0 + 2 * HOUR)).unwrap();
        assert!(
            p.per_hour > 0.0 && (p.per_hour - 1_016.9).abs() < 1.0,
            "{}",
            p.per_hour
        );
    }

    #[test]
    fn out_of_order_responses_do_not_reset_the_window() {
        let renewal = Some(T0 + 10 * DAY);
        let mut m = CreditMeter::new(no_thresholds(), None);
        m.observe(snap(1_000, 1_000_000, renewal), at(T0));
        m.observe(snap(2_000, 1_000_000, renewal), at(T0 + HOUR));
        // A slow worker's older response lands late.
        m.observe(snap(1_990, 1_000_000, renewal), at(T0 + HOUR + 1));
        let p = m.projection(at(T0 + HOUR + 1)).unwrap();
        assert!((p.per_hour - 1_000.0).abs() < 1.0, "{}", p.per_hour);
    }

    #[test]
    fn clock_stepping_back_does_not_panic_or_project_nonsense() {
        let renewal = Some(T0 + 10 * DAY);
        let mut m = CreditMeter::new(no_thresholds(), None);
        m.observe(snap(1_000, 1_000_000, renewal), at(T0 + HOUR));
        m.observe(snap(2_000, 1_000_000, renewal), at(T0 + 2 * HOUR));
        m.observe(snap(2_100, 1_000_000, renewal), at(T0));
        assert_eq!(m.projection(at(T0)), None);
    }

    #[test]
    fn many_samples_stay_bounded() {
        let renewal = Some(T0 + 30 * DAY);
        let mut m = CreditMeter::new(no_thresholds(), None);
        for i in 0..20_000u64 {
            m.observe(snap(i as i64, 1_000_000, renewal), at(T0 + i * 2));
        }
        assert!(m.samples.len() <= 400, "{}", m.samples.len());
        let p = m.projection(at(T0 + 39_998)).unwrap();
        assert!((p.per_hour - 1_800.0).abs() < 20.0, "{}", p.per_hour);
    }

    #[test]
    fn parse_thresholds_cases() {
        assert_eq!(parse_thresholds("0.5,0.8,0.95"), Ok(vec![0.5, 0.8, 0.95]));
        assert_eq!(
            parse_thresholds(" 95% , 50%,0.8,0.5 "),
            Ok(vec![0.5, 0.8, 0.95])
        );
        assert_eq!(parse_thresholds("1"), Ok(vec![1.0]));
        assert_eq!(parse_thresholds(""), Ok(vec![]));
        assert_eq!(parse_thresholds("none"), Ok(vec![]));
        for bad in [
            "0", "-0.1", "1.5", "abc", "0.5,,0.8", "NaN", "0%", "101%", "inf",
        ] {
            assert!(parse_thresholds(bad).is_err(), "{bad}");
        }
        let e = parse_thresholds("80").unwrap_err();
        assert!(e.contains("80%"), "{e}");
    }
}
