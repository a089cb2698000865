//! What one fleet process knows of its own calls: enough to put them back
//! should Redis lose the fleet's state, and the notes it has for its run.

use std::collections::{HashMap, HashSet, VecDeque};

use tokio::time::Instant;

use crate::pace::PaceNote;
use crate::rate::exact::MAX_EVENTS;
use crate::rate::learn::Learnt;
use crate::rate::Limit;

/// What this process knows of its own calls.
#[derive(Default)]
pub(super) struct Local {
    /// Permits not yet completed: their leases are renewed.
    pub(super) in_flight: HashSet<String>,
    /// Completed calls still occupying the window, with when they stop
    /// and the tokens their responses said they used.
    pub(super) recent: VecDeque<(String, Instant, Option<u64>)>,
    /// Completions and cancellations not yet in Redis, with the tokens a
    /// response said its call used.
    pub(super) settles: Vec<(String, Option<Instant>, Option<u64>)>,
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
    /// Since when the fleet has been paced evenly with nothing lowered:
    /// two windows of it held say the told rate is a bucket's, with no
    /// burst (its ramp rises over the first).
    pub(super) even_since: Option<Instant>,
    /// The fleet's limit in force as last heard (0: none yet).
    pub(super) limit: u64,
    /// What the job's checkpoint says an earlier run learnt (the limit, 0
    /// for none; whether paced evenly), until the first take is answered.
    pub(super) recall: Option<(u64, bool)>,
    pub(super) notes: VecDeque<PaceNote>,
    /// The fleet holds new calls until then (a response said remaining: 0).
    pub(super) held_until: Option<Instant>,
    /// The quotas whose long hold was said already (each said once).
    pub(super) said: HashSet<String>,
    /// When each token window kept may next be corrected for what a
    /// response says was spent elsewhere (see `Inner::spent_elsewhere`).
    pub(super) elsewhere_at: HashMap<String, Instant>,
    /// The fleet's epoch as last heard: Redis forgetting the fleet with the
    /// connection up shows as its absence or change.
    pub(super) epoch: Option<i64>,
    /// The bare rate told (`30/1s`), while the fleet's even pace (begun
    /// when a burst under it was refused) is still to be said, with how
    /// to name a bucket's shape to keep its burst.
    pub(super) name_the_shape: Option<String>,
}

impl Local {
    /// A process told `limit` (`shape_unknown`: a bare rate) whose job's
    /// checkpoint says an earlier run `learnt` it: its first take puts it
    /// back if that take begins the fleet. Not said again as news when the
    /// fleet answers with it: the start line says it.
    pub(super) fn new(limit: Limit, shape_unknown: bool, learnt: Option<Learnt>) -> Local {
        // The fleet keeps no burst: a bucket learnt is its even pace.
        let recall = learnt.map(|l| (l.limit, l.shape.burst.is_some()));
        let even = recall.is_some_and(|r| r.1);
        Local {
            name_the_shape: match limit {
                Limit::Rate(r) if shape_unknown && !even => Some(r.spec()),
                _ => None,
            },
            learnt: recall.map_or(0, |r| r.0),
            settled_told: recall.is_some(),
            even,
            recall,
            ..Local::default()
        }
    }

    /// What a granted take said of the fleet's learnt limit (`limit` being
    /// the one in force): a lowering (by any process), its settling and the
    /// even pace begun under a bare rate are each announced once here.
    pub(super) fn heard(&mut self, limit: u64, learnt: u64, settled: bool, even: bool) {
        self.even = even;
        self.limit = limit;
        match even {
            true => _ = self.even_since.get_or_insert_with(Instant::now),
            false => self.even_since = None,
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
    /// The learning is a job checkpoint's, not heard from the fleet.
    pub(super) recalled: bool,
    /// Redis lost the fleet: the calls go back, and the loss check waits.
    pub(super) lost: bool,
    pub(super) entries: Vec<(String, u64, bool)>,
}
