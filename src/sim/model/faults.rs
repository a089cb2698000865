//! The fault dice: injected latency, 503s and connection resets, drawn from
//! one seeded generator in arrival order so a seed replays the same faults.

use std::time::Duration;

use super::admission::Faults;
use super::config::Config;

pub(super) struct Dice {
    rng: fastrand::Rng,
    latency: Option<(Duration, Duration)>,
    fail_rate: f64,
    reset_rate: f64,
}

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
            latency: cfg.latency,
            fail_rate: cfg.fail_rate,
            reset_rate: cfg.reset_rate,
        }
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
}
