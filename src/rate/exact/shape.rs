//! The window's side of learning a secret limit's shape: what it tells
//! the [`ShapeLearner`] and what it takes from it (a bucket learnt, or
//! fitted to every answer). The rules themselves are the learner's.

use std::time::Instant;

use super::{ExactWindow, Learning, SlotId};
use crate::rate::learn::{FittedKind, Learnt, LearntShape, Phase, ShapeLearner, Verdict};

impl ExactWindow {
    /// Starts from what an earlier run learnt, as
    /// [`with_learnt`](Self::with_learnt), and learns the limit's shape
    /// too: a 429 after a burst first paces evenly at the limit, and a
    /// bucket an earlier run learnt is paced evenly from the start.
    pub fn learning_shape(self, learnt: Option<Learnt>) -> ExactWindow {
        let w = self.with_learnt(learnt.map(|l| l.limit));
        // No probing above a fixed window's count, nor above what the
        // earlier run allowed itself: the lower of the two.
        let fixed = w
            .learn
            .learnt
            .filter(|_| learnt.is_some_and(|l| l.shape.fixed));
        let most = [fixed, learnt.and_then(|l| l.shape.most)]
            .into_iter()
            .flatten()
            .min();
        let mut w = w.probing_at_most(most);
        w.shape = Some(ShapeLearner::restored(w.window, learnt));
        w
    }

    /// The shape learner (if any) with no start: the limit is known to be
    /// a window (a plan's), so its first span goes at once.
    pub fn without_start(mut self) -> ExactWindow {
        self.shape = self.shape.map(ShapeLearner::without_start);
        self
    }

    /// Whether calls go at an even pace (a bucket was seen, or is being
    /// probed for), not as a window.
    pub fn paced_evenly(&self) -> bool {
        self.shape().is_some_and(|p| p != Phase::Window)
    }

    /// Where the shape learning stands (`None` when not enabled).
    pub fn shape(&self) -> Option<Phase> {
        self.shape.as_ref().map(ShapeLearner::phase)
    }

    /// The burst of the bucket learnt, once the limit was learnt to be one.
    pub fn learnt_burst(&self) -> Option<u64> {
        self.shape.as_ref().and_then(ShapeLearner::burst)
    }

    /// What the limit was learnt to be beyond its count, for the
    /// checkpoint: with shape learning, its shape; with or without, the
    /// most probing goes to (a fit's, or one below a limit refused).
    pub fn learnt_shape(&self) -> LearntShape {
        let mut shape = self
            .shape
            .as_ref()
            .map_or_else(LearntShape::default, ShapeLearner::learnt_shape);
        // A limit was refused above the learnt one in this run, which
        // probes no higher than below it: nor does a resumed run (it would
        // probe up to the refusal again, and pay a 429 for it).
        if self.learn.learnt.is_some() {
            let ceiling = self.learn.refused_at.map(|r| r.saturating_sub(1));
            shape.most = [shape.most, ceiling].into_iter().flatten().min();
        }
        shape
    }

    /// Probes a learnt limit no higher than `most` (what an earlier run's
    /// checkpoint says it allowed; `None`: up to the configured limit).
    pub fn probing_at_most(mut self, most: Option<u64>) -> ExactWindow {
        if let Some(most) = most.filter(|_| self.learn.learnt.is_some()) {
            self.probe_at_most(most);
        }
        self
    }

    /// The call in `slot` was refused with a rate-limit 429 at `arrived`:
    /// as [`complete`](Self::complete), and the shape learner keeps the
    /// refusal as evidence of the server's bucket (the 429 itself comes
    /// with [`rate_limited`](Self::rate_limited)).
    pub fn complete_refused(&mut self, slot: SlotId, arrived: Instant) {
        if let Some(s) = &mut self.shape {
            s.refused_call(slot.0);
        }
        self.complete(slot, arrived);
    }

    /// A response of a server that states its quota said `remaining` is
    /// left of it at `now`, before [`remaining_zero`](Self::remaining_zero)
    /// or a hold until its reset when nothing is: in the start, with less
    /// left than this client's own calls explain, the shape learner paces
    /// evenly from now (a bucket whose burst is smaller than its quota; see
    /// [`ShapeLearner::spent_early`]). The calls sent before, at the
    /// start's pace, are not the even pace's: a 429 of theirs teaches
    /// nothing. Not the learning clock, as for `remaining_zero`: the
    /// learner tells the start's end itself.
    pub fn spent_early(&mut self, remaining: u64, now: Instant) {
        if self.reported.is_none() {
            return;
        }
        let limit = self.limit();
        let calls = (self.done.len() as u64, self.in_flight.len() as u64);
        if let Some(s) = &mut self.shape {
            if s.spent_early(limit, remaining, calls, now) {
                self.learn.lowered_at = Some(now);
                self.learn.last_stale_done = None;
            }
        }
    }

    /// A rate-limit 429 from a server that states its limit: the rate is
    /// what it says, so nothing is lowered, but a 429 after a burst within
    /// the stated quota says the server keeps a bucket (its headers state
    /// one as a quota per window): the shape learner paces evenly.
    pub fn rate_limited_stated(&mut self, now: Instant) {
        self.advance(now);
        if self.paused_until(now).is_some() || self.done.is_empty() {
            return;
        }
        if self.sent_before_the_change() {
            return;
        }
        // The rate is stated: no ramp needed to tell it.
        self.shape_verdict(now, false);
    }

    /// Whether a call sent before the last lowering (or change of pace) is
    /// still in flight: a 429 now may be its, and teaches nothing of the
    /// new pace.
    pub(super) fn sent_before_the_change(&self) -> bool {
        self.learn
            .lowered_at
            .is_some_and(|at| self.in_flight.values().any(|&s| s <= at))
    }

    /// What the shape learner makes of a 429 at `now` (`secret`: the
    /// server states nothing), with the calls accepted in the window; `None`
    /// without one. Any verdict but a lowering changes the pace, so calls
    /// sent before now went at the old one.
    pub(super) fn shape_verdict(&mut self, now: Instant, secret: bool) -> Option<Verdict> {
        let limit = self.limit();
        let accepted = (self.done.len() as u64).saturating_sub(1);
        let verdict = self.shape.as_mut()?.refused(limit, accepted, now, secret);
        if verdict != Verdict::Lower {
            self.learn.lowered_at = Some(now);
            self.learn.last_stale_done = None;
        }
        Some(verdict)
    }

    /// Runs the shape learner's clock: once the even pace held, the limit
    /// in force is learnt, as a bucket, and settled at once.
    pub(super) fn advance_shape(&mut self, now: Instant) {
        if self.paused_until(now).is_some() {
            return;
        }
        // A bucket fitted to every answer replaces the lowering's count,
        // and probing stops at the most any fit allows.
        match self.shape.as_mut().and_then(|s| s.take_fit(now)) {
            None => {}
            Some(None) => {
                if let Some(learnt) = self.learn.learnt {
                    self.push_event(Learning::Lowered(learnt));
                }
            }
            Some(Some(f)) => {
                self.probe_at_most(f.most);
                let limit = f.limit.clamp(1, self.configured);
                let said = match f.kind {
                    FittedKind::Bucket(burst) => Learning::Bucket { limit, burst },
                    FittedKind::FixedWindow => Learning::FixedWindow(limit),
                    // Its count, as a lowering says it, settled as one
                    // is once a window holds.
                    FittedKind::SlidingWindow => {
                        self.learn.learnt = Some(limit);
                        self.push_event(Learning::Lowered(limit));
                        return;
                    }
                };
                self.settle_shape(limit, said, now);
                return;
            }
        }
        let Some(burst) = self.shape.as_mut().and_then(|s| s.advance(now)) else {
            return;
        };
        let limit = self.limit();
        self.settle_shape(limit, Learning::Bucket { limit, burst }, now);
    }

    /// A fitted bucket was refused and a fixed window of `fixed` fitted
    /// as well: the limit is that window's, settled, with no probing above
    /// it (a probe above a fixed window's limit is refused in every window
    /// it tries). Returns the limit.
    pub(super) fn switched_to_fixed(&mut self, fixed: u64, now: Instant) -> u64 {
        let limit = fixed.clamp(1, self.configured);
        self.probe_at_most(limit);
        self.settle_shape(limit, Learning::FixedWindow(limit), now);
        limit
    }

    /// Probing rises no higher than `limit` (as if `limit + 1` had been
    /// refused): the most a fit allows, or a fixed window's count, above
    /// which a probe is refused in every window it tries. Not capped at the
    /// configured limit here (probing is, in `advance`): a run told less
    /// would otherwise keep a refusal that never came for the next one.
    fn probe_at_most(&mut self, limit: u64) {
        self.learn.refused_at = Some(limit.saturating_add(1));
    }

    /// The limit is learnt with its shape (`said`: a bucket, or a fixed
    /// window paced as a sliding one), `limit` per window, settled at
    /// once.
    fn settle_shape(&mut self, limit: u64, said: Learning, now: Instant) {
        let l = &mut self.learn;
        l.learnt = Some(limit);
        l.settled = true;
        l.clean_since = now;
        l.pressed = false;
        self.push_event(said);
    }
}
