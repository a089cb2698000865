//! Failing fast on a wrong job, and halting a run whose failures pile up.
//!
//! A typo in `--url` makes every call fail the same way: a refused
//! connection, an unknown host, a 404 or a 405 on every item. Until the
//! first call succeeds the run is on probation: when the first calls all
//! fail with one such cause, it halts with the cause and a hint, and the
//! items it touched stay pending instead of being marked failed.
//! `--max-failures` then bounds the failures of the rest of the run.

use std::sync::Mutex;

use super::events::Event;
use crate::settings::values::MaxFailures;

/// A cause that says more about the job than about its items.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Systemic {
    /// The connection could not be made (refused, DNS, TLS); the reason.
    Connect(String),
    /// The server answered 404 or 405.
    Status(u16),
}

impl Systemic {
    fn same_as(&self, other: &Systemic) -> bool {
        match (self, other) {
            // The detail (a port, an address) may vary; the kind is the cause.
            (Systemic::Connect(_), Systemic::Connect(_)) => true,
            (a, b) => a == b,
        }
    }

    fn hint(&self) -> &'static str {
        match self {
            Systemic::Connect(r) if r.contains("dns") || r.contains("resolve") => {
                "check the host name in --url"
            }
            Systemic::Connect(r) if r.contains("tls") || r.contains("certificate") => {
                "check the scheme (https:// to an http:// server?) and the certificate"
            }
            Systemic::Connect(_) => "check the host and port in --url, and that the API is up",
            Systemic::Status(405) => "check --method",
            Systemic::Status(_) => "check the path in --url",
        }
    }

    fn describe(&self) -> String {
        match self {
            Systemic::Connect(r) => r.clone(),
            Systemic::Status(s) => format!("HTTP {s} on every item"),
        }
    }
}

/// What the watch decided about one outcome.
#[derive(Debug, PartialEq)]
pub enum Verdict {
    /// Go on; these events (held ones included) are to be recorded now.
    Record(Vec<Event>),
    /// Halt the run for this reason; nothing is recorded.
    Halt(String),
}

#[derive(Debug)]
enum Probation {
    Armed {
        first: Option<Systemic>,
        calls: u32,
        held: Vec<Event>,
    },
    Passed,
}

#[derive(Debug)]
struct State {
    probation: Probation,
    finished: u64,
    failed: u64,
}

/// Watches each call's outcome.
#[derive(Debug)]
pub struct Watch {
    state: Mutex<State>,
    fail_fast: u32,
    max_failures: Option<MaxFailures>,
}

impl Watch {
    /// Halts after `fail_fast` identical systemic failures from the start
    /// (0 turns that off), and past `max_failures`.
    pub fn new(fail_fast: u32, max_failures: Option<MaxFailures>) -> Watch {
        let probation = if fail_fast == 0 {
            Probation::Passed
        } else {
            Probation::Armed {
                first: None,
                calls: 0,
                held: Vec::new(),
            }
        };
        Watch {
            state: Mutex::new(State {
                probation,
                finished: 0,
                failed: 0,
            }),
            fail_fast,
            max_failures,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One call ended. `systemic` is its cause when it is one of the
    /// job-wide kind; `event` is what it would record (a done or failed
    /// item), if anything; `url` the call's URL with the key hidden.
    pub fn outcome(
        &self,
        systemic: Option<Systemic>,
        event: Option<Event>,
        url: impl FnOnce() -> String,
    ) -> Verdict {
        let mut s = self.lock();
        if let Probation::Armed { first, calls, held } = &mut s.probation {
            match (&systemic, first.as_ref()) {
                (Some(c), None) => *first = Some(c.clone()),
                (Some(c), Some(f)) if c.same_as(f) => {}
                _ => {
                    // A different outcome: the job itself works.
                    let mut out = std::mem::take(held);
                    out.extend(event);
                    s.probation = Probation::Passed;
                    return self.count(&mut s, out);
                }
            }
            *calls += 1;
            held.extend(event);
            if *calls >= self.fail_fast {
                let cause = first.as_ref().map(|c| (c.describe(), c.hint()));
                let (what, hint) = cause.unwrap_or_default();
                return Verdict::Halt(format!(
                    "the first {calls} calls all failed the same way: {what} (URL {}); {hint}. \
                     Nothing was marked failed: fix the job and run the same command",
                    url()
                ));
            }
            return Verdict::Record(Vec::new());
        }
        self.count(&mut s, event.into_iter().collect())
    }

    /// The pool is over without a halt: outcomes still held (fewer calls
    /// than the fail-fast count, all failing alike) are recorded after all.
    pub fn release(&self) -> Vec<Event> {
        let mut s = self.lock();
        match std::mem::replace(&mut s.probation, Probation::Passed) {
            Probation::Armed { held, .. } => held,
            Probation::Passed => Vec::new(),
        }
    }

    fn count(&self, s: &mut State, events: Vec<Event>) -> Verdict {
        for e in &events {
            match e {
                Event::Done { .. } => s.finished += 1,
                Event::Failed { .. } => {
                    s.finished += 1;
                    s.failed += 1;
                }
                _ => {}
            }
        }
        let over = match self.max_failures {
            Some(MaxFailures::Count(n)) => s.failed > n,
            Some(MaxFailures::Percent(p)) => {
                s.finished >= 20 && s.failed as f64 * 100.0 > p * s.finished as f64
            }
            None => false,
        };
        if over {
            return Verdict::Halt(format!(
                "{} of the {} items finished in this run failed, more than --max-failures allows; \
                 see the failures file, fix the cause, then rerun (--retry-failed re-sends them)",
                s.failed, s.finished
            ));
        }
        Verdict::Record(events)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failed(line: u64) -> Option<Event> {
        Some(Event::Failed {
            line,
            status: Some(404),
            reason: "HTTP 404".into(),
            attempts: 1,
            unknown: false,
            digest: 1,
        })
    }

    fn done(line: u64) -> Option<Event> {
        Some(Event::Done {
            line,
            status: 200,
            body: b"{}".to_vec(),
            attempts: 1,
            digest: 1,
        })
    }

    #[test]
    fn the_same_404_on_the_first_calls_halts_with_nothing_recorded() {
        let w = Watch::new(3, None);
        let u = "http://api.test/v1/ehco?n=1";
        assert_eq!(
            w.outcome(Some(Systemic::Status(404)), failed(1), || u.into()),
            Verdict::Record(vec![])
        );
        assert_eq!(
            w.outcome(Some(Systemic::Status(404)), failed(2), || u.into()),
            Verdict::Record(vec![])
        );
        match w.outcome(Some(Systemic::Status(404)), failed(3), || u.into()) {
            Verdict::Halt(why) => {
                assert!(why.contains("HTTP 404 on every item"), "{why}");
                assert!(why.contains("/v1/ehco"), "{why}");
                assert!(why.contains("check the path"), "{why}");
            }
            v => panic!("{v:?}"),
        }
    }

    #[test]
    fn a_success_ends_probation_and_releases_the_held_failures() {
        let w = Watch::new(3, None);
        w.outcome(Some(Systemic::Status(404)), failed(1), || "u".into());
        match w.outcome(None, done(2), || "u".into()) {
            Verdict::Record(ev) => assert_eq!(ev.len(), 2, "{ev:?}"),
            v => panic!("{v:?}"),
        }
        assert!(w.release().is_empty());
        // Past probation, 404s are just failed items.
        for line in 3..10 {
            assert!(matches!(
                w.outcome(Some(Systemic::Status(404)), failed(line), || "u".into()),
                Verdict::Record(ev) if ev.len() == 1
            ));
        }
    }

    #[test]
    fn a_short_job_that_fails_alike_still_records_its_failures() {
        let w = Watch::new(10, None);
        w.outcome(Some(Systemic::Status(404)), failed(1), || "u".into());
        w.outcome(Some(Systemic::Status(404)), failed(2), || "u".into());
        assert_eq!(w.release().len(), 2);
    }

    #[test]
    fn refused_connections_count_whatever_the_detail() {
        let w = Watch::new(2, None);
        let c = |r: &str| Some(Systemic::Connect(format!("could not connect: {r}")));
        w.outcome(c("127.0.0.1:9 refused"), None, || "u".into());
        match w.outcome(c("[::1]:9 refused"), None, || "u".into()) {
            Verdict::Halt(why) => assert!(why.contains("host and port"), "{why}"),
            v => panic!("{v:?}"),
        }
    }

    #[test]
    fn max_failures_by_count_and_by_share() {
        let w = Watch::new(0, Some(MaxFailures::Count(2)));
        assert!(matches!(
            w.outcome(None, failed(1), || "u".into()),
            Verdict::Record(_)
        ));
        assert!(matches!(
            w.outcome(None, failed(2), || "u".into()),
            Verdict::Record(_)
        ));
        assert!(matches!(
            w.outcome(None, failed(3), || "u".into()),
            Verdict::Halt(_)
        ));
        let w = Watch::new(0, Some("10%".parse().unwrap()));
        for line in 0..18 {
            assert!(matches!(
                w.outcome(None, done(line), || "u".into()),
                Verdict::Record(_)
            ));
        }
        assert!(
            matches!(
                w.outcome(None, failed(18), || "u".into()),
                Verdict::Record(_)
            ),
            "19 finished"
        );
        assert!(
            matches!(
                w.outcome(None, failed(19), || "u".into()),
                Verdict::Record(_)
            ),
            "10% is allowed"
        );
        assert!(
            matches!(w.outcome(None, failed(20), || "u".into()), Verdict::Halt(_)),
            "3 of 21"
        );
        assert!("x".parse::<MaxFailures>().is_err());
        assert!("101%".parse::<MaxFailures>().is_err());
    }
}
