//! Announced policies the set keeps as [`Kept`] policies: token policies
//! (OpenAI's `x-ratelimit-*-tokens`, Anthropic's `*-tokens-*`, IETF
//! `qu="tokens"`) and call policies of a configured fixed window or bucket.

use std::time::{Duration, Instant};

use super::{Heard, PolicySet, SetSlot, MAX_WINDOWS};
use crate::rate::announce::Announced;
use crate::rate::exact::later;
use crate::rate::fixed::Align;
use crate::rate::kept::Kept;
use crate::rate::policy::{PolicySpec, Shape, Unit};
use crate::rate::refill::Said;
use crate::rate::{Limit, Rate};

/// The window of a token quota whose headers do not state one: OpenAI and
/// Anthropic both publish their token limits per minute.
pub const TOKEN_WINDOW: Duration = Duration::from_secs(60);

impl PolicySet {
    /// A call policy that a kept policy answers for: one of the same
    /// window, or, with no window stated, the policy whose configured
    /// quota is nearest when that is a kept one. Returns whether it did.
    pub(super) fn follow_kept(&mut self, p: &Announced, now: Instant) -> bool {
        let Some(i) = self.kept_for(p, Unit::Calls) else {
            return false;
        };
        if p.window.is_none() {
            let q = p.quota.unwrap_or(u64::MAX);
            let kept = distance(self.kept[i].spec().rate().map_or(1, |r| r.count), q);
            let window = self.windows[self.nearest(q)].configured();
            if p.quota.is_none() || distance(window, q) < kept {
                return false;
            }
        }
        self.announced |= p.quota.is_some();
        self.keep(i, p, now, false);
        true
    }

    /// The least quota of the token policies the server stated, with its
    /// name: the most one call may weigh there.
    pub fn most_stated_tokens(&self) -> Option<(u64, String)> {
        self.kept[self.configured.1.min(self.kept.len())..]
            .iter()
            .filter(|k| k.unit().is_tokens())
            .map(|k| (k.quota(), format!("{}{}", k.spec(), crate::rate::STATED)))
            .min_by_key(|(q, _)| *q)
    }

    /// A token policy counting `unit`: kept by the token policy of that
    /// unit of the same window (or the nearest quota when none is stated),
    /// else added.
    pub(super) fn follow_tokens(&mut self, p: &Announced, unit: Unit, now: Instant) {
        let i = match self.kept_for(p, unit) {
            Some(i) => i,
            None => match p.quota {
                Some(q) if self.kept.len() < MAX_WINDOWS => {
                    let window = p.window.unwrap_or(TOKEN_WINDOW);
                    self.add_tokens(
                        p,
                        Rate {
                            count: q.max(1),
                            period: window,
                        },
                        unit,
                        now,
                    )
                }
                Some(q) => {
                    self.ignored(p, q);
                    return;
                }
                None => return,
            },
        };
        self.keep(i, p, now, true);
    }

    /// The kept policy of `unit` an announcement is read against.
    pub(super) fn kept_for(&self, p: &Announced, unit: Unit) -> Option<usize> {
        let of_unit = || {
            self.kept
                .iter()
                .enumerate()
                .filter(move |(_, k)| k.unit() == unit)
        };
        match p.window {
            Some(w) => of_unit().find(|(_, k)| k.window() == w).map(|(i, _)| i),
            None => {
                let q = p.quota.unwrap_or(u64::MAX);
                of_unit()
                    .min_by(|a, b| {
                        let d = |k: &Kept| distance(k.spec().rate().map_or(1, |r| r.count), q);
                        d(a.1).total_cmp(&d(b.1))
                    })
                    .map(|(i, _)| i)
            }
        }
    }

    /// What the announcement says of kept policy `i`: its quota, its
    /// reset, whether it is used up.
    fn keep(&mut self, i: usize, p: &Announced, now: Instant, tokens: bool) {
        let configured = self.kept[i].spec().rate().map_or(0, |r| r.count);
        if let Some(q) = p.quota {
            if self.kept[i].lower_to(q) {
                self.heard.push_back(Heard::Lowered {
                    name: p.name.clone(),
                    quota: q,
                    window: p.window,
                    configured,
                    tokens,
                });
            } else if q > configured && self.said.insert(format!("above {} {q}", p.name)) {
                self.heard.push_back(Heard::Above {
                    name: p.name.clone(),
                    quota: q,
                    window: p.window,
                    configured,
                    tokens,
                });
            }
        }
        self.heard_reset(i, p, now);
        self.spent_elsewhere(i, p, now);
        if p.remaining == Some(0) && self.kept[i].refills() {
            // Its level holds it; a 429 meanwhile is still its quota's, as
            // the fleet's script reads it (`Said::explains`): until the
            // reset stated, the window for none.
            let r = p.reset_in.map_or(self.kept[i].window(), |_| Duration::ZERO);
            self.explain(p, r, now);
        }
        let Some(reset) = p.reset_in.filter(|r| !r.is_zero()) else {
            return;
        };
        if self.kept[i].is_fixed() {
            let a = Align::of(later(now, reset), reset, p.reset_dated, self.rtt);
            self.kept[i].align(a);
        }
        // A bucket refilling continuously is full again at its reset, and
        // takes the next call as soon as its tokens are back: its level
        // (the server's, from `spent_elsewhere`) paces it, not the reset.
        if p.remaining == Some(0) && !self.kept[i].refills() {
            let held = self.kept[i].emptied_hold(p, reset);
            self.kept[i].hold_until(later(now, held));
            self.used_up(p, held, now);
        }
    }

    /// Every policy kept was stated by the server, none configured (a set
    /// handed over to under `--limit none`): its quotas of tokens are the
    /// most a call may weigh ([`most_stated_tokens`](Self::most_stated_tokens)).
    pub fn all_stated(&mut self) {
        self.configured = (0, 0);
    }

    /// Watches every policy of tokens kept for a continuous refill: under
    /// `--limit none`, the quota of tokens handed over to, stated without a
    /// window (OpenAI's, Anthropic's).
    pub fn watch_refill(&mut self) {
        for k in &mut self.kept {
            k.watch_refill();
        }
    }

    /// A statement of kept policy `i` read for a continuous refill (a
    /// quota of tokens stated without a window, see
    /// [`Kept::watch_refill`]): once found, the policy is a bucket, and the
    /// calls out are counted in it anew.
    fn heard_reset(&mut self, i: usize, p: &Announced, now: Instant) {
        let (Some(left), Some(reset), true) = (p.remaining, p.reset_in, self.kept[i].watched())
        else {
            return;
        };
        let quota = p.quota.unwrap_or(self.kept[i].quota());
        let read_late = match p.reset_dated {
            true => Duration::ZERO,
            false => self.rtt.saturating_add(Duration::from_secs(1)),
        };
        let said = Said::new(quota, left, reset, p.reset_exact, read_late);
        let Some(rate) = self.kept[i].heard_reset(said, now) else {
            return;
        };
        self.become_bucket(i, rate, quota.saturating_sub(left), now);
        self.heard.push_back(Heard::Refills {
            name: p.name.clone(),
            quota,
            period: rate.period,
        });
    }

    /// The stated window of tokens counting `unit` over `window` refills
    /// continuously at `rate`, `used` of it used: kept as a bucket from
    /// `now`, as when its statements show it; a bucket found so already
    /// (its period `window`) is retimed to `rate`, as narrower statements
    /// do. The scenario harness's step
    /// ([`crate::rate::scenario::Op::Refill`]), which the fleet's script
    /// answers too. Returns whether there was such a policy.
    pub fn refill_stated(
        &mut self,
        unit: Unit,
        window: Duration,
        rate: Rate,
        used: u64,
        now: Instant,
    ) -> bool {
        let stated = self.configured.1.min(self.kept.len());
        let Some(i) = (stated..self.kept.len()).find(|&i| {
            let k = &self.kept[i];
            k.unit() == unit && k.window() == window
        }) else {
            return false;
        };
        if self.kept[i].spec().shape != Shape::Sliding {
            return self.kept[i].retime_bucket(rate, now);
        }
        self.become_bucket(i, rate, used, now);
        true
    }

    /// The configured fixed window counting `unit` over `window` is
    /// aligned to `a` ([`Kept::align`]), as a stated reset of that window
    /// aligns it: the scenario harness's step
    /// ([`crate::rate::scenario::Op::Aligned`]), which the fleet's script
    /// answers too. Returns whether it aligned now.
    pub fn align_fixed(&mut self, unit: Unit, window: Duration, a: Align) -> bool {
        self.kept
            .iter_mut()
            .find(|k| k.is_fixed() && k.unit() == unit && k.window() == window)
            .is_some_and(|k| k.align(a))
    }

    /// Kept policy `i` is kept as a bucket of `rate` from `now`, `stated`
    /// of its quota said used ([`Kept::become_bucket`]), the calls out
    /// counted in it anew.
    fn become_bucket(&mut self, i: usize, rate: Rate, stated: u64, now: Instant) {
        let unit = self.kept[i].unit();
        let (slots, tokens): (Vec<SetSlot>, Vec<u64>) = self
            .in_flight
            .iter()
            .filter(|(_, (_, _, ids, _))| ids.len() > i)
            .map(|(slot, (.., tokens))| (*slot, tokens.of(unit)))
            .unzip();
        let ids = self.kept[i].become_bucket(rate, stated, &tokens, now);
        // The bucket keeps no hold of the window it replaces: nor does the
        // progress display.
        self.held_until = None;
        for (slot, id) in slots.into_iter().zip(ids) {
            if let Some((_, _, ids, _)) = self.in_flight.get_mut(&slot) {
                ids[i] = id;
            }
        }
    }

    /// The server says less is left than this client counts spent: the
    /// rest was spent elsewhere (another client on the key, or calls that
    /// cost more than estimated), and counts as spent now. Counting what
    /// this client spent itself again only errs on the slow side.
    fn spent_elsewhere(&mut self, i: usize, p: &Announced, now: Instant) {
        let k = &mut self.kept[i];
        let (Some(left), Some(ours)) = (p.remaining, k.used(now)) else {
            return;
        };
        let quota = p.quota.unwrap_or(k.quota()).min(k.quota());
        let spent = quota.saturating_sub(left);
        if spent > ours {
            k.admit_answered(now, spent - ours);
        }
    }

    /// A token policy of `rate` counting `unit` the set did not have. What
    /// the server says was used already counts as spent now, and each call
    /// in flight as its estimate.
    fn add_tokens(&mut self, p: &Announced, rate: Rate, unit: Unit, now: Instant) -> usize {
        let (q, window) = (rate.count, rate.period);
        let spec = PolicySpec {
            limit: Limit::Rate(rate),
            shape: Shape::Sliding,
            unit,
            named: true,
        };
        let mut k = Kept::new(spec).expect("a rate");
        // A bucket states no window (OpenAI, Anthropic); a quota stated
        // with one is kept as the window it says.
        if p.window.is_none() {
            k.watch_refill();
        }
        let used = q.saturating_sub(p.remaining.unwrap_or(q));
        k.admit_answered(now, used.max(self.untracked_tokens.of(unit)));
        // The calls out weigh their estimates until they are answered:
        // the server counts them, and what it said was used did not.
        let index = self.kept.len();
        for (sent, _, ids, tokens) in self.in_flight.values_mut() {
            if ids.len() == index {
                ids.extend(k.admit_in_flight(*sent, *tokens));
            }
        }
        self.kept.push(k);
        self.heard.push_back(Heard::Added {
            name: p.name.clone(),
            quota: q,
            window,
            tokens: true,
        });
        self.kept.len() - 1
    }
}

/// How far apart two quotas are, by ratio.
fn distance(configured: u64, q: u64) -> f64 {
    (configured.max(1) as f64 / q.max(1) as f64).ln().abs()
}
