//! What one fleet process knows of its own calls: enough to put them back
//! should Redis lose the fleet's state, and the notes it has for its run.

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::Duration;

use tokio::time::Instant;

use crate::pace::PaceNote;
use crate::rate::exact::MAX_EVENTS;
use crate::rate::learn::{Learnt, LearntShape};
use crate::rate::policy::TokenWeight;
use crate::rate::refill::RefillFit;
use crate::rate::Limit;

/// What this process knows of its own calls.
#[derive(Default)]
pub(super) struct Local {
    /// Permits not yet completed: their leases are renewed.
    pub(super) in_flight: HashSet<String>,
    /// Completed calls still occupying the window, with when they stop
    /// and the tokens their responses said they used (each part not said
    /// at its estimate).
    pub(super) recent: VecDeque<(String, Instant, Option<TokenWeight>)>,
    /// Completions and cancellations not yet in Redis, with the tokens a
    /// response said its call used, as for `recent`.
    pub(super) settles: Vec<(String, Option<Instant>, Option<TokenWeight>)>,
    /// Redis failed since the last take that put our calls back.
    pub(super) lost: bool,
    pub(super) paused_until: Option<Instant>,
    /// The fleet's learnt limit as last heard (0: none), whether its
    /// settling was announced, and what the operator is still to hear.
    pub(super) learnt: u64,
    pub(super) settled_told: bool,
    /// Whether the fleet was last heard paced evenly for a refused burst:
    /// put back, with `learnt`, should Redis forget it.
    pub(super) even: bool,
    /// Since when the fleet has been paced evenly, and the takes granted
    /// to this process since: two windows of it held, with calls, say the
    /// told rate is a bucket's with no burst (its ramp rises over the
    /// first), when nothing was lowered.
    pub(super) even_since: Option<Instant>,
    pub(super) even_grants: u64,
    /// The fleet's limit in force as last heard (0: none yet).
    pub(super) limit: u64,
    /// The most the learnt limit is not probed above (a lowering, or the
    /// checkpoint's), kept with it.
    pub(super) most: Option<u64>,
    /// What the job's checkpoint says an earlier run learnt, to pass with
    /// the first take (cleared once a take is answered).
    pub(super) recall: Option<Recall>,
    /// The same, until a granted take says what the fleet keeps: what this
    /// process reports as learnt until then, and no news when the fleet
    /// answers with it (the start line said it).
    pub(super) recalled: Option<Recall>,
    pub(super) notes: VecDeque<PaceNote>,
    /// The fleet holds new calls until then (a response said remaining: 0).
    pub(super) held_until: Option<Instant>,
    /// Until when a quota the server stated is used up: a 429 before then
    /// teaches nothing (`Said::explains`).
    pub(super) explained_until: Option<Instant>,
    /// The quotas whose long hold was said already (each said once).
    pub(super) said: HashSet<String>,
    /// The stated policies left out, the fleet adopting the most it keeps
    /// (each said once).
    pub(super) left_out: HashSet<String>,
    /// When each token window kept may next be corrected for what a
    /// response says was spent elsewhere (see `Inner::spent_elsewhere`).
    pub(super) elsewhere_at: HashMap<String, Instant>,
    /// The fleet's epoch as last heard: Redis forgetting the fleet with the
    /// connection up shows as its absence or change.
    pub(super) epoch: Option<i64>,
    /// The epoch heard before a loss was found (answered with the new
    /// one), until this process's calls are put back: a fleet begun
    /// meanwhile from a checkpoint takes its learning (see the script's
    /// `recall`).
    pub(super) epoch_before_loss: Option<i64>,
    /// This job sent calls within the last hour (its checkpoint says so):
    /// a fleet missing from Redis on the first take was forgotten (a
    /// FLUSHALL, a restart), not never begun, since the fleet's epoch
    /// outlives its last take by an hour. See `loss_check`.
    pub(super) ran_lately: bool,
    /// The bare rate told (`30/1s`), while the fleet's even pace (begun
    /// when a burst under it was refused) is still to be said, with how
    /// to name a bucket's shape to keep its burst.
    pub(super) name_the_shape: Option<String>,
    /// The statements of each adopted window of tokens stated without a
    /// window, read for a continuous refill, by the window's key.
    pub(super) fits: HashMap<String, RefillFit>,
    /// Each such window the fleet keeps as a bucket since, and each such
    /// bucket retimed since, with the key that replaced it.
    pub(super) refilled: HashMap<String, String>,
    /// The longest round trip of this process's calls, grant to answer:
    /// how much earlier than read a stated reset may have been measured.
    pub(super) longest_trip: Duration,
    /// The fixed windows whose alignment is settled: aligned, by this
    /// process or another (`fleet/pacer/fixed.rs`).
    pub(super) aligned: HashSet<String>,
}

/// What a job's checkpoint says an earlier run learnt, as the fleet keeps
/// it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Recall {
    /// As the checkpoint keeps it: reported as learnt, whole, until the
    /// fleet answers (a burst or a fixed window the fleet does not keep
    /// are not lost by a run that never got a take).
    pub(super) learnt: Learnt,
    /// Paced evenly: a bucket (the fleet keeps no burst).
    pub(super) even: bool,
    /// Not probed above this (the earlier run had a limit refused above
    /// it): the fit's most, or a fixed window's count.
    pub(super) most: Option<u64>,
}

impl Recall {
    fn of(l: Learnt) -> Recall {
        Recall {
            learnt: l,
            even: l.shape.burst.is_some(),
            most: l.shape.most.or(l.shape.fixed.then_some(l.limit)),
        }
    }

    /// The limit learnt.
    pub(super) fn limit(&self) -> u64 {
        self.learnt.limit
    }
}

impl Local {
    /// A process told `limit` (`shape_unknown`: a bare rate) whose job's
    /// checkpoint says an earlier run `learnt` it: its first take puts it
    /// back if that take begins the fleet.
    pub(super) fn new(limit: Limit, shape_unknown: bool, learnt: Option<Learnt>) -> Local {
        let recall = learnt.filter(|l| l.limit > 0).map(Recall::of);
        Local {
            name_the_shape: match limit {
                Limit::Rate(r) if shape_unknown => Some(r.spec()),
                _ => None,
            },
            recall,
            recalled: recall,
            ..Local::default()
        }
    }

    /// What this process reports as learnt, for its job's checkpoint:
    /// until a granted take says what the fleet keeps, the checkpoint's
    /// own learning, whole; then the fleet's learnt limit, with the most
    /// it is not probed above, else the limit in force once the even pace
    /// held two `window`s with calls (the told rate, probed above if told
    /// more; not during the ramp, which has not tried it yet). Paced
    /// evenly, a bucket with no burst: the fleet keeps none.
    pub(super) fn learnt_as_of(&self, window: std::time::Duration) -> Option<Learnt> {
        if let Some(r) = self.recalled {
            return Some(r.learnt);
        }
        let (limit, most) = if self.learnt > 0 {
            (self.learnt, self.most)
        } else {
            let since = self.even_since.filter(|_| self.even && self.limit > 0)?;
            let held = Instant::now().saturating_duration_since(since) >= window.saturating_mul(2);
            if !held || self.even_grants < 2 {
                return None;
            }
            (self.limit, None)
        };
        let shape = LearntShape {
            burst: self.even.then_some(0),
            most,
            ..LearntShape::default()
        };
        Some(Learnt { limit, shape })
    }

    /// What a granted take said of the fleet's learnt limit (`limit` being
    /// the one in force): a lowering (by any process), its settling and the
    /// even pace begun under a bare rate are each announced once here.
    pub(super) fn heard(&mut self, limit: u64, learnt: u64, settled: bool, even: bool) {
        // What the checkpoint said, if the fleet keeps it, is no news, and
        // keeps the checkpoint's most.
        let mut kept = false;
        if let Some(r) = self.recalled.take() {
            if even && r.even {
                self.name_the_shape = None;
            }
            if learnt > 0 && learnt == r.limit() {
                (self.learnt, self.settled_told, self.most) = (learnt, true, r.most);
                kept = true;
            }
        }
        // A lowering has a limit refused above it: not probed above by a
        // resumed fleet. A rise (probing) moves that most along.
        if !kept {
            self.most = match (learnt, self.most) {
                (0, _) => None,
                _ if self.learnt == 0 || learnt < self.learnt => Some(learnt),
                (_, m) => m.map(|m| m.max(learnt)),
            };
        }
        self.even = even;
        self.limit = limit;
        match even {
            true => {
                self.even_since.get_or_insert_with(Instant::now);
                self.even_grants += 1;
            }
            false => (self.even_since, self.even_grants) = (None, 0),
        }
        if even {
            if let Some(told) = self.name_the_shape.take() {
                self.push(PaceNote::FleetPacedEvenly { limit, told });
            }
        }
        if learnt == 0 {
            self.learnt = 0;
            return;
        }
        if self.learnt == 0 || learnt < self.learnt {
            self.settled_told = false;
            self.push(PaceNote::Learnt(learnt));
        }
        self.learnt = learnt;
        if settled && !self.settled_told {
            self.settled_told = true;
            self.push(PaceNote::LearntSettled(learnt));
        }
    }

    pub(super) fn push(&mut self, note: PaceNote) {
        // A few at most matter: newer news supersedes older.
        if self.notes.len() >= MAX_EVENTS {
            self.notes.pop_front();
        }
        self.notes.push_back(note);
    }
}

/// Where the learning a restore block carries comes from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) enum Source {
    /// Nothing to put back, or heard from the fleet in no epoch yet: the
    /// bare flag.
    #[default]
    Heard,
    /// Heard from the fleet before a loss, last in this epoch.
    HeardIn(i64),
    /// A job checkpoint's, not probed above the most if there is one.
    Checkpoint(Option<u64>),
}

impl Source {
    /// The restore block's even flag with this source as its prefix
    /// (`recall`, window.lua): `l@E:1`, `c:0`, `c@M:1`, or the bare `0`/`1`.
    pub(super) fn flag(self, even: bool) -> String {
        let even = u8::from(even);
        match self {
            Source::Heard => even.to_string(),
            Source::HeardIn(e) => format!("l@{e}:{even}"),
            Source::Checkpoint(None) => format!("c:{even}"),
            Source::Checkpoint(Some(m)) => format!("c@{m}:{even}"),
        }
    }
}

/// This process's share of the fleet's state, to put back after Redis lost
/// it: the pause left (ms), what it last heard of the fleet's learning (the
/// learnt limit, 0 for none; whether paced evenly) and each call's (id, ms
/// left occupying, in flight). Or, in its first take, what its job's
/// checkpoint says was learnt.
#[derive(Default)]
pub(super) struct Restore {
    pub(super) paused: u64,
    pub(super) learnt: u64,
    pub(super) even: bool,
    /// Where the learning comes from (the script's flag prefix).
    pub(super) from: Source,
    /// Redis lost the fleet: the calls go back, and the loss check waits.
    pub(super) lost: bool,
    pub(super) entries: Vec<(String, u64, bool)>,
}
