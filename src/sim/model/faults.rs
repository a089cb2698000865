//! The fault dice: injected latency, 503s and connection resets, drawn from
//! one seeded generator in arrival order so a seed replays the same faults.

use std::time::Duration;

use super::admission::Faults;
use super::config::Config;

pub(super) struct Dice {
    rng: fastrand::Rng,
    /// Transit-in delays come from their own generator, so turning
    /// `--latency-in` on does not change the fault sequence of a seed.
    transit_rng: fastrand::Rng,
    latency_in: Option<(Duration, Duration)>,
    latency: Option<(Duration, Duration)>,
    fail_rate: f64,
    reset_rate: f64,
}

/// Mixed into the seed of the transit generator (any fixed odd constant).
const TRANSIT_SEED: u64 = 0x9e37_79b9_7f4a_7c15;

/// A duration uniform in `[lo, hi]`.
fn uniform(rng: &mut fastrand::Rng, (lo, hi): (Duration, Duration)) -> Duration {
    let lo_n = u64::try_from(lo.as_nanos()).unwrap_or(u64::MAX);
    let hi_n = u64::try_from(hi.as_nanos()).unwrap_or(u64::MAX);
    Duration::from_nanos(rng.u64(lo_n..=hi_n.max(lo_n)))
}

impl Dice {
    pub(super) fn new(cfg: &Config) -> Self {
        Dice {
            rng: fastrand::Rng::with_seed(cfg.seed),
            transit_rng: fastrand::Rng::with_seed(cfg.seed ^ TRANSIT_SEED),
            latency_in: cfg.latency_in,
            latency: cfg.latency,
            fail_rate: cfg.fail_rate,
            reset_rate: cfg.reset_rate,
        }
    }

    /// The transit-in delay of the next request (zero without
    /// `--latency-in`).
    pub(super) fn transit(&mut self) -> Duration {
        self.latency_in.map_or(Duration::ZERO, |range| {
            uniform(&mut self.transit_rng, range)
        })
    }

    /// The faults of the next admitted request.
    pub(super) fn draw(&mut self) -> Faults {
        let mut f = Faults::default();
        if let Some(range) = self.latency {
            f.latency = uniform(&mut self.rng, range);
        }
        if self.fail_rate > 0.0 && self.rng.f64() < self.fail_rate {
            // Real gateways send retry-after on some 503s and not others;
            // clients must cope with both.
            f.fail = Some(self.rng.bool().then_some(1));
        }
        if self.reset_rate > 0.0 && self.rng.f64() < self.reset_rate {
            f.reset = true;
        }
        f
    }
}

#[cfg(test)]
mod tests {
    use super::super::testkit::*;
    use super::super::*;

    #[test]
    fn faults_follow_the_seed() {
        let draw = |seed| {
            let (mut m, t0) = model(Config {
                fail_rate: 0.3,
                reset_rate: 0.3,
                latency: Some((ms(10), ms(20))),
                seed,
                ..cfg("none")
            });
            (0..50)
                .map(|_| match m.admit("k", "echo", None, t0) {
                    Admission::Admitted { ticket, faults, .. } => {
                        m.abandon(ticket);
                        faults
                    }
                    other => panic!("{other:?}"),
                })
                .collect::<Vec<_>>()
        };
        let a = draw(7);
        assert_eq!(a, draw(7));
        assert_ne!(a, draw(8));
        assert!(a.iter().all(|f| f.latency >= ms(10) && f.latency <= ms(20)));
        let fails = a.iter().filter(|f| f.fail.is_some()).count();
        let resets = a.iter().filter(|f| f.reset).count();
        assert!((5..=25).contains(&fails) && (5..=25).contains(&resets));
    }

    #[test]
    fn transit_delays_follow_the_seed_without_moving_the_faults() {
        let run = |latency_in| {
            let (mut m, t0) = model(Config {
                fail_rate: 0.5,
                latency_in,
                seed: 11,
                ..cfg("none")
            });
            let mut transit = Vec::new();
            let mut faults = Vec::new();
            for _ in 0..20 {
                transit.push(m.transit_begin());
                assert_eq!(m.stats(t0).in_transit, 1);
                m.transit_end();
                match m.admit("k", "echo", None, t0) {
                    Admission::Admitted {
                        ticket, faults: f, ..
                    } => {
                        m.abandon(ticket);
                        faults.push(f);
                    }
                    other => panic!("{other:?}"),
                }
            }
            assert_eq!(m.stats(t0).in_transit, 0);
            (transit, faults)
        };
        let (none, faults) = run(None);
        assert!(none.iter().all(|d| d.is_zero()));
        let (a, faults_a) = run(Some((ms(100), ms(300))));
        assert_eq!(a, run(Some((ms(100), ms(300)))).0);
        assert!(a.iter().all(|d| (ms(100)..=ms(300)).contains(d)));
        assert!(a.iter().any(|d| *d != a[0]), "{a:?}");
        assert_eq!(faults, faults_a);
        let (exact, _) = run(Some((ms(50), ms(50))));
        assert!(exact.iter().all(|d| *d == ms(50)));
    }
}
