//! The bucket as a client keeps it: GCRA (the generic cell rate algorithm,
//! nginx `limit_req`, SpikeArrest) with a rate of N per W and room for
//! `burst` units beyond the one the rate allows now.
//!
//! # The server's rule
//!
//! With an emission interval T = W/N and a tolerance τ = burst·T, the server
//! keeps a theoretical arrival time (TAT); a call weighing w arriving at t
//! passes when `max(TAT, t) + (w−1)·T ≤ t + τ`, and then
//! `TAT = max(TAT, t) + w·T`. For one unit that is nginx's
//! `excess = max(0, excess − rate·elapsed + 1) ≤ burst`.
//!
//! # The skew allowance
//!
//! The client decides at the send, the server at the arrival, and the two
//! differ by the call's latency, which varies. A send sequence that passes
//! GCRA(T, τ − D) reaches the server as a sequence that passes GCRA(T, τ)
//! whenever latencies vary by at most D: arrivals in any span L were sent
//! in a span of at most L + D. So the client keeps the same rate with its
//! tolerance less D. The rate is never touched: only the burst shrinks, by
//! D/T calls, and with no burst at all consecutive sends are spaced T + D.
//! D is [`skew_allowance`](crate::rate::bucket::skew_allowance) (a
//! twentieth of W, at most 200 ms, the allowance of the token-bucket
//! pacer), but no more than the burst's own tolerance, nor less than
//! [`MIN_ALLOWANCE`] of T: a bucket with no burst is then paced 5% under
//! its rate, robust to a twentieth of T of jitter (1.7 ms at 30 a second;
//! on loopback the spread between sends and arrivals is well under that).
//! A told bucket the server refuses anyway (a path that jitters more)
//! [`widen`](Gcra::widen)s its allowance, doubling it up to one T: a 429
//! costs a pause, so the first one buys a margin for the rest of the run.
//!
//! A call given back unsent takes its units back; a call that reports
//! using more or fewer units than estimated moves the TAT by the
//! difference. Both only ever leave the TAT at or above the server's.
//!
//! Pure: every method takes the instant it acts at.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::bucket::skew_allowance;
use super::exact::later;
use super::Rate;

/// The least skew allowance, as a share of T: the spacing a bucket with no
/// burst keeps beyond its rate. A tenth cost 10% of the run against such a
/// bucket; measured on loopback, a twentieth meets it with no 429
/// (docs/performance.md), and a 429 widens it.
pub const MIN_ALLOWANCE: u32 = 20;

/// A client-side GCRA of `rate` with `burst`.
#[derive(Debug, Clone)]
pub struct Gcra {
    /// T: one unit's share of the window, rounded up (never faster than
    /// the server).
    interval: Duration,
    burst: u64,
    /// τ = burst·T.
    tolerance: Duration,
    /// D.
    allowance: Duration,
    tat: Option<Instant>,
    /// Estimated units of calls in flight, by id.
    in_flight: HashMap<u64, u64>,
    next: u64,
    held_until: Option<Instant>,
}

/// The emission interval of `rate`: W/N rounded up to the nanosecond.
pub fn interval(rate: Rate) -> Duration {
    let n = u128::from(rate.count.max(1));
    let ns = rate.period.as_nanos().div_ceil(n);
    Duration::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX))
}

impl Gcra {
    /// A bucket of `rate` with room for `burst` beyond one, idle.
    pub fn new(rate: Rate, burst: u64) -> Gcra {
        let t = interval(rate);
        let allowance = skew_allowance(rate.period)
            .min(mul(t, burst))
            .max(t / MIN_ALLOWANCE);
        Gcra::with_allowance(rate, burst, allowance)
    }

    /// [`new`](Self::new) with a skew allowance of `d`.
    pub fn with_allowance(rate: Rate, burst: u64, d: Duration) -> Gcra {
        let t = interval(rate);
        Gcra {
            interval: t,
            burst,
            tolerance: mul(t, burst),
            allowance: d,
            tat: None,
            in_flight: HashMap::new(),
            next: 0,
            held_until: None,
        }
    }

    /// The burst kept (units beyond one).
    pub fn burst(&self) -> u64 {
        self.burst
    }

    /// The skew allowance D.
    pub fn allowance(&self) -> Duration {
        self.allowance
    }

    /// Units per second.
    pub fn per_second(&self) -> f64 {
        1.0 / self.interval.as_secs_f64().max(1e-12)
    }

    /// The units' worth the bucket holds at `now`: how many of its
    /// [`burst`](Gcra::burst) and one are taken.
    pub fn level(&self, now: Instant) -> u64 {
        let ahead = self
            .tat
            .map_or(Duration::ZERO, |t| t.saturating_duration_since(now));
        let t = self.interval.as_nanos().max(1);
        ahead.as_nanos().div_ceil(t).min(u64::MAX as u128) as u64
    }

    /// Claims `weight` units at `now`, or says when to look again.
    pub fn try_take(&mut self, now: Instant, weight: u64) -> Result<u64, Instant> {
        // Held: not before the hold's end, nor before the bucket admits
        // the call then (as the fleet's script answers: the later wait).
        let held = self.held_until.filter(|&h| h > now);
        let at = held.unwrap_or(now);
        let extra = mul(self.interval, weight.saturating_sub(1));
        if let Some(tat) = self.tat {
            let start = later(tat, self.allowance).max(at);
            let lhs = later(start, extra);
            let rhs = later(at, self.tolerance);
            // A call heavier than the whole bucket can only go alone.
            let alone = weight > self.burst.saturating_add(1) && start == at;
            if lhs > rhs && !alone {
                // Heavier than the bucket: when it is empty; else when the
                // TAT has drained far enough.
                let due = if extra > self.tolerance {
                    start
                } else {
                    lhs.checked_sub(self.tolerance).unwrap_or(lhs)
                };
                return Err(due.max(at));
            }
        }
        if let Some(h) = held {
            return Err(h);
        }
        let tat = self.tat.map_or(now, |t| t.max(now));
        self.tat = Some(later(tat, mul(self.interval, weight)));
        let id = self.next;
        self.next += 1;
        self.in_flight.insert(id, weight);
        Ok(id)
    }

    /// Call `id` was answered, having used `used` units (its estimate when
    /// `None`): the TAT moves by the difference.
    pub fn complete(&mut self, id: u64, used: Option<u64>) {
        let Some(est) = self.in_flight.remove(&id) else {
            return;
        };
        let Some(used) = used else { return };
        if let Some(tat) = self.tat {
            self.tat = Some(if used >= est {
                later(tat, mul(self.interval, used - est))
            } else {
                tat.checked_sub(mul(self.interval, est - used))
                    .unwrap_or(tat)
            });
        }
    }

    /// Call `id` was never sent: its units come back.
    pub fn cancel(&mut self, id: u64) -> bool {
        let Some(w) = self.in_flight.remove(&id) else {
            return false;
        };
        if let Some(tat) = self.tat {
            self.tat = Some(tat.checked_sub(mul(self.interval, w)).unwrap_or(tat));
        }
        true
    }

    /// The server refused a call all the same: the spread between sends
    /// and arrivals is wider than allowed for. The allowance doubles, up
    /// to the larger of T and the burst's tolerance (a bucket with no
    /// burst is then paced at half its rate at worst); returns whether it
    /// grew.
    pub fn widen(&mut self) -> bool {
        let cap = self.interval.max(self.tolerance);
        let wider = self
            .allowance
            .saturating_mul(2)
            .max(Duration::from_nanos(1))
            .min(cap);
        let grew = wider > self.allowance;
        self.allowance = self.allowance.max(wider);
        grew
    }

    /// No call starts before `until`.
    pub fn hold_until(&mut self, until: Instant) {
        self.held_until = Some(self.held_until.map_or(until, |h| h.max(until)));
    }

    /// `units` spent at `now` outside this bucket's calls (what a server
    /// says was used beyond them): the TAT moves on by as many intervals,
    /// full or held as it may be.
    pub fn spend(&mut self, now: Instant, units: u64) {
        let tat = self.tat.map_or(now, |t| t.max(now));
        self.tat = Some(later(tat, mul(self.interval, units)));
    }

    /// The bucket refills at `rate` from `now`, with room for `burst`
    /// beyond one: its level in units is kept, at most the new room (a
    /// level beyond it waits as long as an empty bucket would), and the
    /// calls out by their units.
    pub fn retime(&mut self, rate: Rate, burst: u64, now: Instant) {
        let level = self.level(now).min(burst.saturating_add(1));
        let fresh = Gcra::new(rate, burst);
        self.interval = fresh.interval;
        self.burst = burst;
        self.tolerance = fresh.tolerance;
        self.allowance = self.allowance.max(fresh.allowance);
        self.tat = (level > 0).then(|| later(now, mul(self.interval, level)));
    }

    /// Counts a call of `units` already on its way as spent at `now`: its
    /// id, to complete it with.
    pub fn admit(&mut self, now: Instant, units: u64) -> u64 {
        self.spend(now, units);
        let id = self.next;
        self.next += 1;
        self.in_flight.insert(id, units);
        id
    }

    /// The server's bucket is empty and holds until `until`: no call before
    /// it, then one per interval, with no burst until the bucket refills
    /// (its whole burst went at `until` after a short hold, where another
    /// client had emptied the server's bucket and one unit was back).
    pub fn empty_until(&mut self, until: Instant) {
        self.hold_until(until);
        let full = later(until, self.tolerance);
        let tat = full.checked_sub(self.allowance).unwrap_or(full);
        self.tat = Some(self.tat.map_or(tat, |t| t.max(tat)));
    }
}

fn mul(d: Duration, n: u64) -> Duration {
    let ns = d.as_nanos().saturating_mul(u128::from(n));
    Duration::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests;
