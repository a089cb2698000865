//! Several policies at once (`--limit 10/1s --limit 1000/1h,fixed
//! --limit 90000/1m,tokens`, or policies the server announces): a call may
//! start only when every policy admits it, so the lowest applicable limit
//! always wins.
//!
//! Each sliding window of calls is an [`ExactWindow`] with its own L and W;
//! every other policy (a fixed window, a bucket, anything counting tokens)
//! is a [`Kept`]. The set takes a place in each, waits for the latest of
//! their answers, and settles every permit in all of them. Each policy's
//! own guarantee then holds separately: no server policy is exceeded.
//!
//! The first window is the *primary* one: the slowest configured limit in
//! calls per second. Pauses start from it, and only it learns a limit from
//! 429s: not once the server states its quota, nor while a quota it
//! stated is used up, which explains the 429. A window-less
//! announcement (`X-RateLimit-Limit`, OpenAI's and Anthropic's headers)
//! lowers the window whose configured limit is nearest to it.

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use super::announce::{reset_or_now, Announced, Unit};
use super::exact::{later, ExactWindow, Learning, SlotId};
use super::kept::Kept;
use super::learn::even_interval;
use super::policy::{TokenWeight, Unit as PolicyUnit, Used};

mod heard;
mod occupancy;
#[cfg(test)]
mod tests;
mod tokens;

pub use heard::Heard;
pub use tokens::TOKEN_WINDOW;

/// At most this many windows: each take asks all of them, and a server
/// announcing dozens of policies is not one to follow blindly.
pub const MAX_WINDOWS: usize = 8;

/// The most answered calls a window added for a stated policy counts at
/// once (one entry each, 16 bytes): a monthly quota of a billion calls
/// nearly used up by other clients would otherwise take 16 GB at its first
/// statement. Beyond it the window lets through more than the server has
/// left, and the server's `remaining: 0` with its reset (which holds every
/// call) or its 429 says the rest.
pub const MAX_PREFILL: u64 = 100_000;

/// A hold longer than this is worth telling the operator about.
pub const LONG_HOLD: Duration = Duration::from_secs(60);

/// A used-up quota that resets further away than this cannot refill within
/// a run worth waiting in: the run halts resumably instead (unless told to
/// wait), as it does when credits run out.
pub const QUOTA_BOUND: Duration = Duration::from_secs(15 * 60);

/// A policy the server says is used up, resetting beyond [`QUOTA_BOUND`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exhausted {
    /// The policy's name in the headers.
    pub name: String,
    /// How long from when it was heard until it resets.
    pub for_: Duration,
    /// When it resets.
    pub until: Instant,
}

/// One call's place in every window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SetSlot(u64);

/// What the set has for the caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Note {
    /// The primary window learnt from 429s.
    Learning(Learning),
    /// Something the headers said.
    Heard(Heard),
}

/// A call in flight: when it was sent, its places in each window (one per
/// call it counts as), its ids in the kept policies, and its estimated
/// tokens (which a token policy added while it is out counts).
type Places = (Instant, Vec<Vec<SlotId>>, Vec<u64>, TokenWeight);

/// Several exact sliding windows, every call counted in each.
#[derive(Debug, Clone)]
pub struct PolicySet {
    /// The primary window first, then the other configured ones, then those
    /// the server announced.
    windows: Vec<ExactWindow>,
    /// The policies that are not sliding windows of calls.
    kept: Vec<Kept>,
    /// Calls in flight: their place in each window and each kept policy.
    in_flight: HashMap<SetSlot, Places>,
    /// The longest round trip seen: how early a reset measured at the
    /// server may lie before the response that carried it.
    rtt: Duration,
    next: u64,
    /// Whether a server stated the primary window's quota (no higher than
    /// the told one), or a told bucket's or fixed window's: then 429s
    /// teach no lower rate.
    /// A quota stated for another window leaves a limit the server keeps
    /// unstated (a second's, beside a stated hour's) to be learnt.
    announced: bool,
    /// Until when a quota the server stated is used up: a 429 before then
    /// is that quota's (other clients on the key), not a secret limit's.
    explained_until: Option<Instant>,
    /// What was said already.
    said: HashSet<String>,
    /// The latest used-up quota resetting beyond [`QUOTA_BOUND`].
    exhausted: Option<Exhausted>,
    /// When the latest hold for a quota a response said used up ends: for
    /// the progress display.
    pub(super) held_until: Option<Instant>,
    heard: VecDeque<Heard>,
    /// Windows and kept policies configured (those after were stated).
    configured: (usize, usize),
    /// The primary window is only the envelope of the first kept policy.
    envelope_first: bool,
    /// The tokens the answered calls weighed (what each answer said it
    /// used, else its estimate), and how many calls: their mean turns a
    /// token policy's rate into calls for [`per_second`](Self::per_second).
    weighed: (TokenWeight, u64),
    /// Tokens this client's calls were estimated at before the set kept
    /// them (sent unpaced before a server stated its first quota): a
    /// policy of tokens the server states counts them as spent when added,
    /// as it may not have counted those still on their way.
    untracked_tokens: TokenWeight,
}

impl PolicySet {
    /// A set of `primary` and `others`, all empty.
    pub fn new(primary: ExactWindow, others: Vec<ExactWindow>) -> PolicySet {
        let mut windows = vec![primary];
        windows.extend(others);
        windows.truncate(MAX_WINDOWS);
        PolicySet {
            windows,
            kept: Vec::new(),
            in_flight: HashMap::new(),
            rtt: Duration::ZERO,
            next: 0,
            announced: false,
            explained_until: None,
            said: HashSet::new(),
            exhausted: None,
            held_until: None,
            heard: VecDeque::new(),
            configured: (0, 0),
            envelope_first: false,
            weighed: (TokenWeight::default(), 0),
            untracked_tokens: TokenWeight::default(),
        }
        .configured_now()
    }

    /// What the set holds now is what was configured.
    fn configured_now(mut self) -> PolicySet {
        self.configured = (self.windows.len(), self.kept.len());
        self
    }

    /// The primary window stands only as the envelope of the first kept
    /// policy (a bucket or fixed window told first): it is not shown as a
    /// policy of its own.
    pub fn primary_is_envelope(mut self) -> PolicySet {
        self.envelope_first = true;
        self
    }

    /// The set with the further policies `kept` as well.
    pub fn with_kept(mut self, mut kept: Vec<Kept>) -> PolicySet {
        kept.truncate(MAX_WINDOWS);
        self.kept = kept;
        self.configured_now()
    }

    /// The policies that are not sliding windows of calls.
    pub fn kept(&self) -> &[Kept] {
        &self.kept
    }

    /// The windows, the primary first.
    pub fn windows(&self) -> &[ExactWindow] {
        &self.windows
    }

    /// The primary window.
    pub fn primary(&self) -> &ExactWindow {
        &self.windows[0]
    }

    /// The primary window, to pause, hold or teach.
    pub fn primary_mut(&mut self) -> &mut ExactWindow {
        &mut self.windows[0]
    }

    /// The set takes over at `now` from calls sent untracked, estimated at
    /// `tokens` in all: each policy of tokens it keeps counts them as spent
    /// now, and so does each one added later (see `untracked_tokens`).
    pub fn untracked_tokens(&mut self, tokens: TokenWeight, now: Instant) {
        self.untracked_tokens = tokens;
        for k in &mut self.kept {
            k.admit_answered(now, tokens.of(k.unit()));
        }
    }

    /// Calls per second the set allows at most: the lowest of its windows,
    /// and of its token policies at the calls answered so far's mean
    /// weight (none before an answer, or while they weighed nothing).
    pub fn per_second(&self) -> f64 {
        let (tokens, calls) = self.weighed;
        let mean = |unit| {
            let t = tokens.of(unit);
            (calls > 0 && t > 0).then(|| t as f64 / calls as f64)
        };
        let kept = self.kept.iter().filter_map(|k| match k.unit() {
            PolicyUnit::Calls => Some(k.per_second()),
            unit => Some(k.per_second() / mean(unit)?),
        });
        self.windows
            .iter()
            .map(|w| w.limit() as f64 / w.window().as_secs_f64().max(1e-9))
            .chain(kept)
            .fold(f64::INFINITY, f64::min)
    }

    /// Claims a place in every window at `now`, or says when to look again:
    /// the latest of the refusing windows' answers, since every one of them
    /// must admit the call.
    pub fn try_take(&mut self, now: Instant) -> Result<SetSlot, Instant> {
        self.try_take_weighted(now, 1, TokenWeight::default())
    }

    /// [`try_take`](Self::try_take) for a call counting as `calls` calls
    /// against every call policy (a batch whose API counts its items; at
    /// most a window's limit, so that it can ever fit) and costing an
    /// estimated `tokens` against the token policies.
    pub fn try_take_weighted(
        &mut self,
        now: Instant,
        calls: u64,
        tokens: TokenWeight,
    ) -> Result<SetSlot, Instant> {
        let mut taken = Vec::with_capacity(self.windows.len());
        let mut kept = Vec::with_capacity(self.kept.len());
        let mut wait: Option<Instant> = None;
        let refused = |wait: &mut Option<Instant>, at: Instant| {
            *wait = Some(wait.map_or(at, |x: Instant| x.max(at)));
        };
        // Every policy is asked, so that the wait is the latest of all
        // their answers (as the fleet's script answers too).
        for (i, w) in self.windows.iter_mut().enumerate() {
            let n = calls.clamp(1, w.limit().max(1));
            let mut slots = Vec::new();
            for _ in 0..n {
                match w.try_take(now) {
                    Ok(s) => slots.push(s),
                    Err(at) => {
                        refused(&mut wait, at);
                        break;
                    }
                }
            }
            taken.push((i, slots));
        }
        for (i, k) in self.kept.iter_mut().enumerate() {
            match k.try_take(now, calls, tokens) {
                Ok(id) => kept.push((i, id)),
                Err(at) => refused(&mut wait, at),
            }
        }
        if let Some(at) = wait {
            // The policies that granted give their places back.
            for (i, slots) in taken {
                for s in slots {
                    self.windows[i].cancel(s);
                }
            }
            for (i, id) in kept {
                self.kept[i].cancel(id);
            }
            return Err(at);
        }
        let taken = taken.into_iter().map(|(_, s)| s).collect();
        let kept = kept.into_iter().map(|(_, id)| id).collect();
        let id = SetSlot(self.next);
        self.next += 1;
        self.in_flight.insert(id, (now, taken, kept, tokens));
        Ok(id)
    }

    /// The call in `slot` was answered (or gave up) at `arrived`.
    pub fn complete(&mut self, slot: SetSlot, arrived: Instant) {
        self.complete_used(slot, arrived, None);
    }

    /// [`complete`](Self::complete), with the tokens the call really used
    /// when the response said: the token policies count those instead of
    /// the estimate.
    pub fn complete_used(&mut self, slot: SetSlot, arrived: Instant, used: Option<Used>) {
        self.settle(slot, arrived, used, false);
    }

    /// The call in `slot` was refused with a rate-limit 429 at `arrived`:
    /// the primary window's shape learner keeps that as evidence.
    pub fn complete_refused(&mut self, slot: SetSlot, arrived: Instant) {
        self.settle(slot, arrived, None, true);
    }

    fn settle(&mut self, slot: SetSlot, arrived: Instant, used: Option<Used>, refused: bool) {
        if let Some((sent, slots, kept, estimate)) = self.in_flight.remove(&slot) {
            if !refused {
                let (tokens, calls) = self.weighed;
                let weighed = used.map_or(estimate, |u| u.or(estimate));
                self.weighed = (tokens.saturating_add(weighed), calls.saturating_add(1));
            }
            self.rtt = self.rtt.max(arrived.saturating_duration_since(sent));
            for (i, (w, slots)) in self.windows.iter_mut().zip(slots).enumerate() {
                for s in slots {
                    match refused && i == 0 {
                        true => w.complete_refused(s, arrived),
                        false => w.complete(s, arrived),
                    }
                }
            }
            for (k, id) in self.kept.iter_mut().zip(kept) {
                k.complete(id, arrived, used);
            }
        }
    }

    /// The call in `slot` was never sent. Returns whether it was in flight.
    pub fn cancel(&mut self, slot: SetSlot) -> bool {
        let Some((_, slots, kept, _)) = self.in_flight.remove(&slot) else {
            return false;
        };
        for (w, slots) in self.windows.iter_mut().zip(slots) {
            for s in slots {
                w.cancel(s);
            }
        }
        for (k, id) in self.kept.iter_mut().zip(kept) {
            k.cancel(id);
        }
        true
    }

    /// A rate-limit 429 at `now`: the primary window learns from it; when a
    /// server stated the primary window's quota, or a quota it stated is
    /// used up, only the shape (a bucket stated as a quota per window is
    /// paced evenly), never a lower rate.
    pub fn rate_limited(&mut self, now: Instant) -> Option<u64> {
        if self.announced || self.explained_until.is_some_and(|u| u > now) {
            self.windows[0].rate_limited_stated(now);
            return None;
        }
        self.windows[0].rate_limited(now)
    }

    /// A rate-limit 429 came from a server whose buckets this set keeps:
    /// each widens its allowance for jitter (see
    /// [`Gcra::widen`](super::gcra::Gcra::widen)), as the fleet's script
    /// widens each bucket's at its `pause` (the scenario harness asks both).
    pub fn widen_buckets(&mut self) {
        for k in &mut self.kept {
            k.widen();
        }
    }

    /// The next thing heard, else the next learning event, oldest first.
    pub fn take_note(&mut self, now: Instant) -> Option<Note> {
        if let Some(h) = self.heard.pop_front() {
            return Some(Note::Heard(h));
        }
        self.windows[0].take_event(now).map(Note::Learning)
    }

    /// The next thing heard, oldest first (no learning event: those come
    /// with responses, as they always did).
    pub fn take_heard(&mut self) -> Option<Heard> {
        self.heard.pop_front()
    }

    /// What a response arriving at `now` announced. Call policies become
    /// windows of the set (lowering a configured one whose window matches,
    /// or the nearest one when no window is stated, or added); a used-up
    /// policy holds calls until it resets. Returns whether a limit grew (a
    /// report replaced a lower learnt limit), so that waiters look again.
    pub fn announce(&mut self, policies: &[Announced], now: Instant) -> bool {
        let before: Vec<u64> = self.windows.iter().map(ExactWindow::limit).collect();
        // Beyond the most a set keeps, the loosest policies a response
        // states are the ones left out: read the tightest first then.
        let ordered = match self.overflows(policies) {
            true => tightest_first(policies),
            false => policies.iter().collect(),
        };
        for p in ordered {
            match p.unit {
                Unit::Calls if self.follow_kept(p, now) => {}
                Unit::Calls => self.follow(p, now),
                u if u.is_tokens() => self.follow_tokens(p, u.counted(), now),
                // Content bytes, concurrent requests: nothing paced here.
                _ => {}
            }
        }
        self.windows.iter().zip(before).any(|(w, b)| w.limit() > b)
    }

    /// One call policy.
    fn follow(&mut self, p: &Announced, now: Instant) {
        let i = match (p.window, p.quota) {
            (None, None) => Some(0),
            (None, Some(q)) => Some(self.nearest(q)),
            (Some(w), q) => match self.windows.iter().position(|x| x.window() == w) {
                Some(i) => Some(i),
                None => q.and_then(|q| self.add(p, q, w, now).or_else(|| self.ignored(p, q))),
            },
        };
        let Some(i) = i else { return };
        if let Some(q) = p.quota {
            // A quota above what the primary window was told does not
            // explain a 429, nor one of another window with room left: a
            // limit the server keeps unstated does, and its 429s still
            // teach the primary window.
            self.announced |= i == 0 && q <= self.windows[i].configured();
            self.report(i, p, q, now);
        }
        // What is left of a quota this response did not state says
        // nothing of the quota the window keeps.
        if let (Some(r), Some(_)) = (p.remaining, p.quota) {
            self.windows[i].spent_early(r, now);
        }
        if p.remaining == Some(0) {
            let w = &mut self.windows[i];
            // The reset says when exactly; without one (or one rounded down
            // to nothing), until one of this client's occupancies ends. Paced
            // evenly (a bucket seen), a reset within the window and the
            // second a reset in whole seconds may be late by (the IETF
            // fields, X-RateLimit-Reset, an RFC 3339 instant) is the
            // bucket's next unit rounded up (or a window's end, which the
            // even pace keeps anyway): the even pace governs. A reset stated
            // finer (OpenAI's) and beyond one even interval is no bucket's
            // next unit, which its rate frees within one: something else
            // fills the quota (another client's calls), and it holds.
            let reset = p.reset_in;
            let rounding = w.window() + Duration::from_secs(1);
            let unit = even_interval(w.window(), w.limit());
            let beyond_a_unit = |r: Duration| p.reset_exact && r > unit;
            let reset = reset.filter(|&r| r > rounding || !w.paced_evenly() || beyond_a_unit(r));
            let r = match reset {
                // Told nothing of when: until one of this client's calls
                // leaves the window, said when long, and halting beyond the
                // quota bound as a reset stated that far does.
                None => w.remaining_zero(now).saturating_duration_since(now),
                // A reset of nothing (`t=0`, whole seconds rounded down, an
                // instant already past by the server's clock): the quota is
                // back, or within the second. Held for the window, one
                // call an hour went for a whole hour's quota.
                Some(r) => {
                    let r = p.hold(reset_or_now(r), p.window.unwrap_or(w.window()));
                    w.hold_until(later(now, r));
                    r
                }
            };
            self.used_up(p, r, now);
        }
    }

    /// Policy `p`, said used up, holds calls for `r` from `now`: the hold
    /// for the progress display, the quota remembered when beyond the
    /// bound, a hold over a minute said once, and a 429 explained until
    /// the reset as stated, not as held (a hold cut to the window, or to
    /// the even pace, may send before the server's quota is back, and that
    /// call's 429 is the quota's too).
    pub(super) fn used_up(&mut self, p: &Announced, r: Duration, now: Instant) {
        let until = later(now, r);
        self.held_until = Some(self.held_until.map_or(until, |h| h.max(until)));
        if r > QUOTA_BOUND && self.exhausted.as_ref().map_or(true, |e| e.until < until) {
            self.exhausted = Some(Exhausted {
                name: p.name.clone(),
                for_: r,
                until,
            });
        }
        self.explain(p, r, now);
        if r > LONG_HOLD && self.said.insert(format!("exhausted {}", p.name)) {
            self.heard.push_back(Heard::Exhausted {
                name: p.name.clone(),
                for_: r,
            });
        }
    }

    /// Policy `p`, said used up at `now` and held for `r`, explains a 429
    /// until the later of the hold and its reset as stated: that 429 is its
    /// quota's, and teaches no secret limit.
    pub(super) fn explain(&mut self, p: &Announced, r: Duration, now: Instant) {
        if p.quota.is_some() {
            let stated = p.reset_in.map_or(Duration::ZERO, reset_or_now);
            let until = later(now, r.max(stated));
            self.explained_until = Some(self.explained_until.map_or(until, |e| e.max(until)));
        }
    }

    /// When the hold for a quota a response said used up ends, while one
    /// is in force (the progress display's; the rules hold the calls).
    pub fn held_until(&self, now: Instant) -> Option<Instant> {
        self.held_until.filter(|&h| h > now)
    }

    /// The used-up quota that resets beyond [`QUOTA_BOUND`], while it lasts.
    pub fn exhausted(&self, now: Instant) -> Option<&Exhausted> {
        self.exhausted.as_ref().filter(|e| e.until > now)
    }

    /// The window a quota without a window is read against: the one whose
    /// configured limit is nearest to it (by ratio), the primary one on a
    /// tie. With one window that is the configured window, as it always
    /// was; with `--limit 10/1s --limit 5000/1h`, GitHub's 5000 goes to the
    /// hour and a per-second cap of 8 to the second, not 8 an hour.
    fn nearest(&self, q: u64) -> usize {
        let distance = |w: &ExactWindow| (w.configured() as f64 / q.max(1) as f64).ln().abs();
        self.windows
            .iter()
            .enumerate()
            .min_by(|a, b| distance(a.1).total_cmp(&distance(b.1)))
            .map_or(0, |(i, _)| i)
    }

    /// The server's quota `q` for window `i`.
    fn report(&mut self, i: usize, p: &Announced, q: u64, now: Instant) {
        let w = &mut self.windows[i];
        let configured = w.configured();
        if w.set_limit_in_force(q, now) {
            self.heard.push_back(Heard::Lowered {
                name: p.name.clone(),
                quota: q,
                window: p.window,
                configured,
                tokens: false,
            });
        } else if q > configured && self.said.insert(format!("above {} {q}", p.name)) {
            self.heard.push_back(Heard::Above {
                name: p.name.clone(),
                quota: q,
                window: p.window,
                configured,
                tokens: false,
            });
        }
    }

    /// Whether `policies` state more new windows than the set has room
    /// for: of calls, beside its windows (and the fixed windows and
    /// buckets it keeps), or of tokens, beside the policies it keeps (as
    /// `follow_tokens` reads them).
    fn overflows(&self, policies: &[Announced]) -> bool {
        let mut calls: Vec<Duration> = Vec::new();
        let mut tokens: Vec<(Unit, Duration)> = Vec::new();
        for p in policies.iter().filter(|p| p.quota.is_some()) {
            let (Some(w), Unit::Calls) = (p.window, p.unit) else {
                if p.unit.is_tokens() && self.kept_for(p, p.unit.counted()).is_none() {
                    let key = (p.unit, p.window.unwrap_or(tokens::TOKEN_WINDOW));
                    if !tokens.contains(&key) {
                        tokens.push(key);
                    }
                }
                continue;
            };
            let kept = self.windows.iter().any(|x| x.window() == w)
                || self
                    .kept
                    .iter()
                    .any(|k| k.unit() == crate::rate::policy::Unit::Calls && k.window() == w);
            if !kept && !calls.contains(&w) {
                calls.push(w);
            }
        }
        self.windows.len() + calls.len() > MAX_WINDOWS
            || self.kept.len() + tokens.len() > MAX_WINDOWS
    }

    /// A policy `p` of quota `q` left out, the set keeping the most it
    /// keeps: said once. Always `None`.
    pub(super) fn ignored(&mut self, p: &Announced, q: u64) -> Option<usize> {
        if self.said.insert(format!("ignored {}", p.name)) {
            self.heard.push_back(Heard::Ignored {
                name: p.name.clone(),
                quota: q,
                window: p.window,
                tokens: p.unit.is_tokens(),
            });
        }
        None
    }

    /// A window for a policy of `q` per `w` the set did not have, counting
    /// the calls in flight and, when the server says how much is left, the
    /// calls it already accepted. `None` when the set is full.
    fn add(&mut self, p: &Announced, q: u64, w: Duration, now: Instant) -> Option<usize> {
        if self.windows.len() >= MAX_WINDOWS {
            return None;
        }
        let mut x = ExactWindow::new(q, w, now);
        for (sent, slots, ..) in self.in_flight.values_mut() {
            let weight = slots.first().map_or(1, Vec::len);
            slots.push((0..weight).map(|_| x.admit_in_flight(*sent)).collect());
        }
        // Answered calls that may still be in the server's window: those the
        // server says it counts beyond the ones in flight, and at least
        // those still occupying the primary window (the call that carried
        // this announcement among them). Counted as ending W from now, which
        // errs on the slow side.
        let used = q.saturating_sub(p.remaining.unwrap_or(q));
        let primary = &self.windows[0];
        let answered_here = primary.occupancy(now) - primary.in_flight() as u64;
        let calls_in_flight: usize = self
            .in_flight
            .values()
            .map(|(_, slots, ..)| slots.first().map_or(1, Vec::len))
            .sum();
        let answered = used
            .saturating_sub(calls_in_flight as u64)
            .max(answered_here);
        for _ in 0..answered.min(q).min(MAX_PREFILL) {
            x.admit_answered(now);
        }
        self.windows.push(x);
        self.heard.push_back(Heard::Added {
            name: p.name.clone(),
            quota: q,
            window: w,
            tokens: false,
        });
        Some(self.windows.len() - 1)
    }
}

/// `policies` with those of a known rate (a quota and a window) first,
/// the tightest (least per second) first, then the rest as stated.
fn tightest_first(policies: &[Announced]) -> Vec<&Announced> {
    let mut v: Vec<&Announced> = policies.iter().collect();
    let rate = |p: &Announced| match (p.quota, p.window) {
        (Some(q), Some(w)) if !w.is_zero() => q as f64 / w.as_secs_f64(),
        _ => f64::INFINITY,
    };
    v.sort_by(|a, b| rate(a).total_cmp(&rate(b)));
    v
}
