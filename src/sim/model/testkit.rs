//! Helpers shared by the model's unit tests: a model on fake time and a
//! `call` that admits and at once completes a request.

use std::time::{Duration, Instant};

use axum::body::Bytes;

use super::{Admission, Config, CreditView, Faults, Model, RateInfo, Rejection};

pub(super) const UNIX: Duration = Duration::from_secs(1_800_000_000);

pub(super) fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

pub(super) fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

pub(super) fn model(cfg: Config) -> (Model, Instant) {
    let t0 = Instant::now();
    (Model::new(cfg, t0, UNIX), t0)
}

pub(super) fn cfg(limit: &str) -> Config {
    cfgs(&[limit])
}

/// A configuration keeping every policy of `limits` (`none` keeps none).
pub(super) fn cfgs(limits: &[&str]) -> Config {
    Config {
        policies: limits
            .iter()
            .filter(|l| **l != "none")
            .map(|l| l.parse().unwrap())
            .collect(),
        ..Config::default()
    }
}

/// What became of a request that was admitted and at once completed.
#[derive(Debug)]
pub(super) enum Out {
    Executed {
        rate: Option<RateInfo>,
        credits: CreditView,
    },
    Replayed {
        body: Bytes,
        rate: Option<RateInfo>,
        credits: CreditView,
    },
    Rejected {
        why: Rejection,
        rate: Option<RateInfo>,
        credits: CreditView,
    },
}

pub(super) fn call(m: &mut Model, key: &str, now: Instant) -> Out {
    call_idem(m, key, None, now)
}

pub(super) fn call_idem(m: &mut Model, key: &str, idem: Option<&str>, now: Instant) -> Out {
    match m.admit(key, "echo", idem, now) {
        Admission::Admitted {
            ticket,
            rate,
            faults,
        } => {
            assert_eq!(faults, Faults::default(), "no faults configured");
            let credits = m.complete(ticket, Bytes::from_static(b"{}"), now);
            Out::Executed { rate, credits }
        }
        Admission::Replay {
            body,
            rate,
            credits,
        } => Out::Replayed {
            body,
            rate,
            credits,
        },
        Admission::Rejected { why, rate, credits } => Out::Rejected { why, rate, credits },
    }
}

pub(super) fn executed(a: &Out) -> bool {
    matches!(a, Out::Executed { .. })
}

pub(super) fn rejection(a: &Out) -> Option<&Rejection> {
    match a {
        Out::Rejected { why, .. } => Some(why),
        _ => None,
    }
}

pub(super) fn refused(a: &Admission) -> Option<&Rejection> {
    match a {
        Admission::Rejected { why, .. } => Some(why),
        _ => None,
    }
}

pub(super) fn rate(a: &Out) -> Option<RateInfo> {
    match a {
        Out::Executed { rate, .. } | Out::Replayed { rate, .. } | Out::Rejected { rate, .. } => {
            *rate
        }
    }
}

pub(super) fn credits(a: &Out) -> CreditView {
    match a {
        Out::Executed { credits, .. }
        | Out::Replayed { credits, .. }
        | Out::Rejected { credits, .. } => *credits,
    }
}
