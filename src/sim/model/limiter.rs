//! Per-key pace: the key's policies (each kept by its shape's model, see
//! [`super::policy`]), the cooldown after a sliding-window overrun, and the
//! concurrency ceiling.
//!
//! Each check answers `Err((why, rate headers))` when it refuses; the model
//! adds the credit headers and counts the refusal.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::admission::{PolicyView, RateInfo, Rejection};
use super::config::Config;
use super::policy::{Policy, PolicyStats, Tokens};
use crate::rate::policy::PolicySpec;
use crate::rate::{Limit, Rate};
use crate::sim::model::sliding_window::{ceil_secs, RetryIn};

/// A refusal from one of the per-key checks, with the rate headers to send.
pub(super) type Refusal = (Rejection, Option<RateInfo>);

/// The policies in force for `key`: the configured ones, the first lowered
/// by the key's cap.
fn key_policies(cfg: &Config, key: &str) -> Vec<(PolicySpec, Rate)> {
    let cap = cfg.key_caps.get(key).copied();
    let mut out: Vec<(PolicySpec, Rate)> = cfg
        .policies
        .iter()
        .filter_map(|p| p.rate().map(|r| (*p, r)))
        .collect();
    match (out.first_mut(), cap) {
        (Some((_, r)), Some(c)) => r.count = r.count.min(c),
        // A capped key on a plan without a per-minute limit gets a
        // per-minute limit of its cap: the lowest applicable cap wins (docs/design.md).
        (None, Some(c)) => {
            let r = Rate {
                count: c,
                period: Duration::from_secs(60),
            };
            out.push((PolicySpec::sliding(Limit::Rate(r)), r));
        }
        (_, None) => {}
    }
    out
}

/// One API key's pace state.
pub(super) struct KeyState {
    /// Every policy of the key, the first the one the default headers state.
    policies: Vec<Policy>,
    /// When the current cooldown started (it lasts `cfg.cooldown`). Kept as
    /// a start, not an end, so an absurd cooldown cannot overflow an Instant.
    cooling_since: Option<Instant>,
    /// Admitted requests of this key not yet handed back.
    pub(super) in_flight: usize,
}

impl KeyState {
    fn new(cfg: &Config, key: &str, origin: Instant, now: Instant) -> Self {
        let policies = key_policies(cfg, key)
            .iter()
            .map(|(spec, rate)| Policy::new(spec, *rate, cfg.kind, origin, now))
            .collect();
        KeyState {
            policies,
            cooling_since: None,
            in_flight: 0,
        }
    }

    /// The default headers: the first policy's limit and `remaining`.
    fn info(&self, remaining: u64) -> Option<RateInfo> {
        self.policies.first().map(|p| RateInfo {
            limit: p.limit(),
            remaining,
        })
    }

    /// Cooldown: answered without looking at anything else, and not counted
    /// in the window. Clears a cooldown that has run out.
    pub(super) fn check_cooldown(
        &mut self,
        cooldown: Duration,
        now: Instant,
    ) -> Result<(), Refusal> {
        let Some(since) = self.cooling_since else {
            return Ok(());
        };
        let left = cooldown.saturating_sub(now.saturating_duration_since(since));
        if left.is_zero() {
            self.cooling_since = None;
            return Ok(());
        }
        let why = Rejection::Cooldown {
            retry_after: ceil_secs(left),
        };
        Err((why, self.info(0)))
    }

    /// `--rate-limit-forever`: a rate-limit refusal that asks for a retry in
    /// one second, without a cooldown, whatever the window holds.
    pub(super) fn refuse_forever(&self) -> Refusal {
        (Rejection::Rate { retry_after: 1 }, self.info(0))
    }

    /// The concurrency ceiling: `ceiling` requests of this key in flight.
    pub(super) fn check_concurrency(&self, ceiling: usize, now: Instant) -> Result<(), Refusal> {
        if self.in_flight < ceiling {
            return Ok(());
        }
        let remaining = self.policies.first().map_or(0, |p| p.remaining(now));
        Err((
            Rejection::Concurrency { limit: ceiling },
            self.info(remaining),
        ))
    }

    /// The policies: the rate headers if a request needing `tokens` fits every
    /// one at `now`. An overrun of a sliding window starts the cooldown
    /// (unless it is zero); a bucket or a fixed window has none. The wait
    /// asked is the longest any refusing policy needs, and never more than
    /// that policy's window (a request too heavy ever to fit is told to
    /// come back after one).
    pub(super) fn check_rate(
        &mut self,
        cooldown: Duration,
        tokens: Tokens,
        now: Instant,
    ) -> Result<Option<RateInfo>, Refusal> {
        let mut first_left = 0;
        let mut refused: Option<(RetryIn, bool)> = None;
        for (i, p) in self.policies.iter().enumerate() {
            match p.check(now, tokens) {
                Ok(left) if i == 0 => first_left = left,
                Ok(_) => {}
                Err(RetryIn(wait)) => {
                    let wait = RetryIn(wait.min(p.view(now).window));
                    let cools = p.cools_down();
                    refused = Some(match refused {
                        Some((w, c)) => (RetryIn(w.0.max(wait.0)), c || cools),
                        None => (wait, cools),
                    });
                }
            }
        }
        let Some((wait, cools)) = refused else {
            return Ok(self.info(first_left));
        };
        if cools && !cooldown.is_zero() {
            self.cooling_since = Some(now);
        }
        let why = Rejection::Rate {
            retry_after: wait.whole_seconds(),
        };
        Err((why, self.info(0)))
    }

    /// Records an accepted request charged `tokens` in every policy, raising
    /// each one's `peaks`; returns the first policy's count in its window.
    pub(super) fn record(
        &mut self,
        now: Instant,
        tokens: Tokens,
        peaks: &mut [PolicyStats],
    ) -> u64 {
        let mut spare = PolicyStats::default();
        for (i, p) in self.policies.iter_mut().enumerate() {
            p.record(now, tokens, peaks.get_mut(i).unwrap_or(&mut spare));
        }
        self.in_window(now)
    }

    /// Every policy of the key as of `now`, the first one first.
    pub(super) fn policies(&self, now: Instant) -> Vec<PolicyView> {
        self.policies.iter().map(|p| p.view(now)).collect()
    }

    /// Accepted units inside the first policy's window at `now`.
    pub(super) fn in_window(&self, now: Instant) -> u64 {
        self.policies.first().map_or(0, |p| p.in_window(now))
    }
}

/// Every key seen so far, and the instant fixed windows are aligned to.
pub(super) struct Keys {
    map: HashMap<String, KeyState>,
    origin: Instant,
}

impl Keys {
    /// No keys yet; fixed windows start at `origin` (the sim's start).
    pub(super) fn new(origin: Instant) -> Self {
        Keys {
            map: HashMap::new(),
            origin,
        }
    }

    /// The state of `key`, created at `now` on first sight (and counted in
    /// `seen`).
    pub(super) fn entry(
        &mut self,
        cfg: &Config,
        key: &str,
        now: Instant,
        seen: &mut u64,
    ) -> &mut KeyState {
        let origin = self.origin;
        self.map.entry(key.to_owned()).or_insert_with(|| {
            *seen += 1;
            KeyState::new(cfg, key, origin, now)
        })
    }

    pub(super) fn get(&self, key: &str) -> Option<&KeyState> {
        self.map.get(key)
    }

    pub(super) fn get_mut(&mut self, key: &str) -> Option<&mut KeyState> {
        self.map.get_mut(key)
    }
}

#[cfg(test)]
mod tests {
    use super::super::testkit::*;
    use super::super::*;

    #[test]
    fn window_overrun_gives_retry_after_to_the_oldest_then_a_cooldown() {
        let (mut m, t0) = model(Config {
            cooldown: secs(50),
            ..cfg("60/1m")
        });
        // Sixty in the first second.
        for i in 0..60 {
            let a = call(&mut m, "k", t0 + ms(i * 16));
            assert!(executed(&a), "call {i}");
            assert_eq!(
                rate(&a),
                Some(RateInfo {
                    limit: 60,
                    remaining: 59 - i
                })
            );
        }
        let a = call(&mut m, "k", t0 + ms(1000));
        assert_eq!(rejection(&a), Some(&Rejection::Rate { retry_after: 59 }));
        assert_eq!(
            rate(&a),
            Some(RateInfo {
                limit: 60,
                remaining: 0
            })
        );
        // The cooldown runs 50 s from the overrun; retrying doesn't shorten
        // or extend it, and isn't counted.
        for s in [1, 10, 30, 49] {
            let a = call(&mut m, "k", t0 + ms(1000) + secs(s) - ms(500));
            assert_eq!(
                rejection(&a),
                Some(&Rejection::Cooldown {
                    retry_after: 50 - s + 1
                })
            );
        }
        // Over at 51 s; the window still holds the 60 until 60 s.
        let a = call(&mut m, "k", t0 + secs(51));
        assert_eq!(rejection(&a), Some(&Rejection::Rate { retry_after: 9 }));
        let s = m.stats(t0 + secs(51));
        assert_eq!(
            (
                s.accepted,
                s.rejected_rate,
                s.rejected_cooldown,
                s.max_in_window
            ),
            (60, 2, 4, 60)
        );
        // ...which started a new cooldown, to 101 s.
        let a = call(&mut m, "k", t0 + secs(100));
        assert_eq!(rejection(&a), Some(&Rejection::Cooldown { retry_after: 1 }));
        assert!(executed(&call(&mut m, "k", t0 + secs(101))));
    }

    #[test]
    fn a_zero_cooldown_disables_it() {
        let (mut m, t0) = model(Config {
            cooldown: Duration::ZERO,
            ..cfg("5/2s")
        });
        for _ in 0..5 {
            assert!(executed(&call(&mut m, "k", t0)));
        }
        let a = call(&mut m, "k", t0 + ms(100));
        assert_eq!(rejection(&a), Some(&Rejection::Rate { retry_after: 2 }));
        let a = call(&mut m, "k", t0 + ms(1500));
        assert_eq!(rejection(&a), Some(&Rejection::Rate { retry_after: 1 }));
        assert!(executed(&call(&mut m, "k", t0 + secs(2))));
    }

    #[test]
    fn sub_keys_isolate_pace_not_budget() {
        let (mut m, t0) = model(Config {
            credits: 10,
            ..cfg("3/1m")
        });
        for _ in 0..3 {
            assert!(executed(&call(&mut m, "backfill", t0)));
        }
        assert!(rejection(&call(&mut m, "backfill", t0)).is_some());
        assert!(matches!(
            rejection(&call(&mut m, "backfill", t0)),
            Some(Rejection::Cooldown { .. })
        ));
        // The other key is not paused by the backfill's overrun...
        let a = call(&mut m, "prod", t0);
        assert!(executed(&a));
        // ...but it pays from the same balance.
        let c = credits(&a);
        assert_eq!((c.remaining, c.used), (6, 4));
        assert_eq!(m.stats(t0).keys, 2);
    }

    #[test]
    fn key_caps_lower_the_limit_in_force() {
        let mut c = cfg("60/1m");
        c.key_caps.insert("capped".into(), 2);
        c.key_caps.insert("loose".into(), 1000);
        let (mut m, t0) = model(c);
        assert_eq!(rate(&call(&mut m, "capped", t0)).map(|r| r.limit), Some(2));
        assert_eq!(rate(&call(&mut m, "loose", t0)).map(|r| r.limit), Some(60));
        assert_eq!(rate(&call(&mut m, "other", t0)).map(|r| r.limit), Some(60));
        assert!(executed(&call(&mut m, "capped", t0)));
        assert!(matches!(
            rejection(&call(&mut m, "capped", t0)),
            Some(Rejection::Rate { retry_after: 60 })
        ));

        // Without a plan limit a cap is per minute.
        let mut c = cfg("none");
        c.key_caps.insert("capped".into(), 1);
        let (mut m, t0) = model(c);
        assert_eq!(rate(&call(&mut m, "capped", t0)).map(|r| r.limit), Some(1));
        assert_eq!(rate(&call(&mut m, "free", t0)), None);
    }

    #[test]
    fn unlimited_keys_still_have_a_concurrency_ceiling() {
        let (mut m, t0) = model(Config {
            concurrency: 2,
            ..cfg("none")
        });
        let mut tickets = Vec::new();
        for _ in 0..2 {
            match m.admit("k", "echo", None, t0) {
                Admission::Admitted { ticket, rate, .. } => {
                    assert_eq!(rate, None);
                    tickets.push(ticket);
                }
                other => panic!("{other:?}"),
            }
        }
        let a = m.admit("k", "echo", None, t0);
        assert_eq!(refused(&a), Some(&Rejection::Concurrency { limit: 2 }));
        // Another key has its own ceiling.
        let other = m.admit("k2", "echo", None, t0);
        assert!(matches!(other, Admission::Admitted { .. }));
        if let Admission::Admitted { ticket, .. } = other {
            m.abandon(ticket);
        }
        let t = tickets.pop().unwrap();
        let _ = m.complete(t, Bytes::new(), t0);
        assert!(matches!(
            m.admit("k", "echo", None, t0),
            Admission::Admitted { .. }
        ));
        let s = m.stats(t0);
        assert_eq!((s.in_flight_max, s.rejected_concurrency), (2, 1));
        assert_eq!(s.in_flight, 2);
        // One executed plus two reserved in flight; the abandoned call was
        // refunded.
        assert_eq!(s.credits_used, 3);
        assert_eq!(s.abandoned, 1);
    }

    #[test]
    fn a_request_must_fit_every_limit_and_each_is_stated() {
        let (mut m, t0) = model(Config {
            concurrency: 100,
            cooldown: Duration::ZERO,
            ..cfgs(&["2/1s", "3/10s"])
        });
        assert!(executed(&call(&mut m, "k", t0)));
        assert!(executed(&call(&mut m, "k", t0)));
        assert!(matches!(
            refused(&call_admit(&mut m, t0 + ms(10))),
            Some(Rejection::Rate { retry_after: 1 })
        ));
        assert!(executed(&call(&mut m, "k", t0 + secs(1))));
        // The ten-second limit is used up, though the per-second one is not.
        assert!(matches!(
            refused(&call_admit(&mut m, t0 + secs(2))),
            Some(Rejection::Rate { retry_after: 8 })
        ));
        let view = m.policies("k", t0 + secs(2));
        assert_eq!(
            view.iter()
                .map(|p| (p.limit, p.remaining))
                .collect::<Vec<_>>(),
            [(2, 2), (3, 0)]
        );
        assert_eq!(view[1].reset, secs(8));
        assert!(executed(&call(&mut m, "k", t0 + secs(10))));
    }

    fn call_admit(m: &mut Model, at: Instant) -> Admission {
        m.admit("k", "echo", None, at)
    }

    #[test]
    fn a_concurrency_refusal_is_not_counted_in_the_window() {
        let (mut m, t0) = model(Config {
            concurrency: 1,
            ..cfg("2/1m")
        });
        let Admission::Admitted { ticket, .. } = m.admit("k", "echo", None, t0) else {
            panic!()
        };
        for _ in 0..5 {
            assert!(matches!(
                refused(&m.admit("k", "echo", None, t0)),
                Some(Rejection::Concurrency { limit: 1 })
            ));
        }
        let _ = m.complete(ticket, Bytes::new(), t0);
        assert!(executed(&call(&mut m, "k", t0)));
        assert_eq!(m.in_window("k", t0), 2);
    }

    #[test]
    fn spike_arrest_keys_follow_the_seed_play_by_play() {
        let (mut m, t0) = model(Config {
            kind: ModelKind::SpikeArrest,
            concurrency: 1000,
            cooldown: secs(50),
            ..cfg("30ps")
        });
        let passed = (0..60u32)
            .filter(|i| executed(&call(&mut m, "k", t0 + ms(40) * *i / 59)))
            .count();
        assert_eq!(passed, 4);
        // No cooldown in this model: once a token drips in, it passes.
        let a = call(&mut m, "k", t0 + ms(41));
        assert!(matches!(
            rejection(&a),
            Some(Rejection::Rate { retry_after: 1 })
        ));
        assert_eq!(
            rate(&a),
            Some(RateInfo {
                limit: 30,
                remaining: 0
            })
        );
        assert!(executed(&call(&mut m, "k", t0 + ms(67))));
        let s = m.stats(t0 + ms(67));
        assert_eq!(
            (s.accepted, s.rejected_cooldown, s.max_in_window),
            (5, 0, 5)
        );
    }

    #[test]
    fn rate_limit_forever_refuses_everything_with_retry_after_one() {
        let (mut m, t0) = model(Config {
            rate_limit_forever: true,
            ..cfg("60/1m")
        });
        for i in 0..100 {
            let a = call(&mut m, "k", t0 + secs(i));
            assert_eq!(rejection(&a), Some(&Rejection::Rate { retry_after: 1 }));
            assert_eq!(
                rate(&a),
                Some(RateInfo {
                    limit: 60,
                    remaining: 0
                })
            );
        }
        // Not even an idempotent replay or an unlimited key gets through.
        let a = call_idem(&mut m, "other", Some("i"), t0);
        assert_eq!(rejection(&a), Some(&Rejection::Rate { retry_after: 1 }));
        let s = m.stats(t0 + secs(100));
        assert_eq!((s.requests, s.rejected_rate), (101, 101));
        assert_eq!((s.accepted, s.side_effects, s.credits_used), (0, 0, 0));
        assert_eq!((s.rejected_cooldown, s.max_in_window), (0, 0));
        assert!(m.arrivals().is_empty());
    }
}
