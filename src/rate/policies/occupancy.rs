//! How full each policy of a set is: read by the run's observers (the
//! timeline, the metrics), never by the decisions.

use std::time::{Duration, Instant};

use super::PolicySet;
use crate::rate::policy::{Shape, Unit};
use crate::rate::{Limit, Occupancy, Rate};

/// At most this many policies are shown: the timeline keeps four.
pub const SHOWN: usize = 4;

impl PolicySet {
    /// Every policy's occupancy at `now`, the configured ones first (the
    /// primary window first unless it only stands for the first kept
    /// policy), then those the server stated, at most [`SHOWN`].
    pub fn occupancy(&mut self, now: Instant) -> Vec<Occupancy> {
        let (windows, kept) = self.configured;
        let skip = usize::from(self.envelope_first);
        let mut out = Vec::new();
        for (i, w) in self.windows.iter().enumerate().skip(skip) {
            let name = Rate {
                count: w.configured(),
                period: w.window(),
            }
            .to_string();
            let stated = i >= windows;
            out.push((
                stated,
                Occupancy {
                    policy: label(name, stated),
                    limit: w.limit(),
                    used: w.occupancy(now),
                },
            ));
        }
        for (i, k) in self.kept.iter_mut().enumerate() {
            let (limit, used) = k.occupancy(now);
            let stated = i >= kept;
            out.push((
                stated,
                Occupancy {
                    policy: label(k.spec().to_string(), stated),
                    limit,
                    used,
                },
            ));
        }
        // Stable: configured ones first, in their order.
        out.sort_by_key(|(stated, _)| *stated);
        out.into_iter().map(|(_, o)| o).take(SHOWN).collect()
    }
}

impl PolicySet {
    /// Counts `used` (what each configured policy held when a run of the
    /// job before this one was last saved, by the names [`Self::occupancy`]
    /// gives) as answered at `answered`: a resume within a long window
    /// does not send that window's quota again. A policy of calls with no
    /// record there (added or changed since, or empty then) counts
    /// `sent_within` its window instead: the calls the job's timeline shows
    /// sent in it. Buckets are left out: they start as they would for a
    /// new run.
    pub fn resume_use(
        &mut self,
        used: &[(String, u64)],
        sent_within: &dyn Fn(Duration) -> u64,
        answered: Instant,
    ) {
        let (windows, kept) = self.configured;
        let held = |name: &str| used.iter().find(|(n, _)| n == name).map(|&(_, u)| u);
        for w in self.windows.iter_mut().take(windows) {
            let name = Rate {
                count: w.configured(),
                period: w.window(),
            }
            .to_string();
            let units = held(&name).unwrap_or_else(|| sent_within(w.window()));
            for _ in 0..units.min(w.limit()) {
                w.admit_answered(answered);
            }
        }
        for k in self.kept.iter_mut().take(kept) {
            let spec = k.spec();
            if matches!(spec.shape, Shape::Bucket { .. }) {
                continue;
            }
            let timeline = match (spec.unit, spec.limit) {
                (Unit::Calls, Limit::Rate(r)) => sent_within(r.period),
                _ => 0,
            };
            k.admit_answered(answered, held(&spec.to_string()).unwrap_or(timeline));
        }
    }
}

fn label(name: String, stated: bool) -> String {
    match stated {
        true => format!("{name}{}", crate::rate::STATED),
        false => name,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::rate::exact::ExactWindow;
    use crate::rate::kept::Kept;
    use crate::rate::policy::PolicySpec;
    use crate::rate::policy::TokenWeight;

    fn spec(s: &str) -> PolicySpec {
        s.parse().unwrap()
    }

    #[test]
    fn each_policy_shows_what_it_holds_and_an_envelope_is_not_shown() {
        let t0 = Instant::now();
        let set = PolicySet::new(
            ExactWindow::new(36, Duration::from_secs(1), t0),
            vec![ExactWindow::new(1000, Duration::from_secs(3600), t0)],
        )
        .with_kept(vec![
            Kept::new(spec("30/1s,burst=5")).unwrap(),
            Kept::new(spec("900/1m,tokens")).unwrap(),
        ]);
        let mut set = set.primary_is_envelope();
        for _ in 0..4 {
            set.try_take_weighted(t0, 1, TokenWeight::whole(100))
                .unwrap();
        }
        let o = set.occupancy(t0);
        let shown: Vec<(&str, u64, u64)> = o
            .iter()
            .map(|o| (o.policy.as_str(), o.limit, o.used))
            .collect();
        assert_eq!(
            shown,
            [
                ("1000/1h", 1000, 4),
                ("30ps,burst=5", 6, 4),
                ("900/1m,tokens", 900, 400),
            ]
        );
        // A second later the bucket has drained; the windows still hold
        // their calls.
        let o = set.occupancy(t0 + Duration::from_secs(1));
        assert_eq!(o[1].used, 0);
        assert_eq!(o[0].used, 4);
    }
}
