//! Failing fast on a wrong job, and halting a run whose failures pile up.
//!
//! A typo in `--url` makes every call fail the same way: a refused
//! connection, an unknown host, a 404 or a 405 on every item. Until the
//! first call succeeds the run is on probation: when the first calls all
//! fail with one such cause, it halts with the cause and a hint, and the
//! items it touched stay pending instead of being marked failed.
//! `--max-failures` then bounds the failures of the rest of the run.
//!
//! A server that accepts calls and never answers would let every call time
//! out and the items drip into "failed": when the last calls all timed out
//! with no answer among them, the run halts resumably, and the failures of
//! that silent stretch stay pending.

use std::sync::Mutex;
use std::time::Duration;

use super::events::Event;
use crate::settings::values::MaxFailures;

/// A cause that says more about the job than about its items.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Systemic {
    /// The connection could not be made (refused, DNS, TLS); the reason.
    Connect(String),
    /// The server answered 404 or 405.
    Status(u16),
    /// A batch's answer held no array of results to pair with its items
    /// (an endpoint of one item a call); the reason.
    Unpaired(String),
}

impl Systemic {
    fn same_as(&self, other: &Systemic) -> bool {
        match (self, other) {
            // The detail (a port, an address) may vary; the kind is the cause.
            (Systemic::Connect(_), Systemic::Connect(_)) => true,
            (Systemic::Unpaired(_), Systemic::Unpaired(_)) => true,
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
            Systemic::Unpaired(_) => {
                "check that --url is the API's batch endpoint, and that --batch-results names \
                 its array of results"
            }
        }
    }

    fn describe(&self) -> String {
        match self {
            Systemic::Connect(r) => r.clone(),
            Systemic::Status(s) => format!("HTTP {s} on every item"),
            Systemic::Unpaired(r) => r.clone(),
        }
    }
}

/// What the watch decided about one outcome.
#[derive(Debug, PartialEq)]
pub enum Verdict {
    /// Go on; these events (held ones included) are to be recorded now.
    Record(Vec<Event>),
    /// Record these events, then halt the run for this reason.
    Halt {
        /// What is recorded first (the failure that passed --max-failures).
        record: Vec<Event>,
        /// Why the run halts.
        why: String,
    },
}

/// What hearing (or not hearing) from the server led to.
#[derive(Debug, PartialEq)]
pub enum Heard {
    /// Nothing to do.
    Nothing,
    /// An answer ended a silent stretch: what it held is decided now.
    Released(Verdict),
    /// The server has been silent too long: halt resumably, for this reason.
    Silent(String),
}

/// How many unanswered calls in a row make the server silent, and the
/// timeout they each waited, for the reason.
#[derive(Debug, Clone, Copy)]
pub struct SilenceLimit {
    /// Calls in a row that timed out (0: never halt for silence).
    pub calls: u32,
    /// `--timeout`.
    pub timeout: Duration,
}

impl SilenceLimit {
    /// Every call in flight timing out twice over, and never fewer than 5:
    /// one slow answer among many in flight does not make a silent server.
    pub fn for_concurrency(concurrency: usize, timeout: Duration) -> SilenceLimit {
        let calls = u32::try_from(concurrency.saturating_mul(2)).unwrap_or(u32::MAX);
        SilenceLimit {
            calls: calls.max(5),
            timeout,
        }
    }
}

#[derive(Debug, Default)]
struct Silence {
    /// Calls in a row that timed out.
    streak: u32,
    /// Failures of the silent stretch, held until an answer comes.
    held: Vec<Event>,
    /// The run halted for silence.
    tripped: bool,
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
    silence: Silence,
    finished: u64,
    failed: u64,
    /// `--max-failures` halted the run.
    over: bool,
}

/// Watches each call's outcome.
#[derive(Debug)]
pub struct Watch {
    state: Mutex<State>,
    fail_fast: u32,
    max_failures: Option<MaxFailures>,
    silence: SilenceLimit,
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
                silence: Silence::default(),
                finished: 0,
                failed: 0,
                over: false,
            }),
            fail_fast,
            max_failures,
            silence: SilenceLimit {
                calls: 0,
                timeout: Duration::ZERO,
            },
        }
    }

    /// Halts when `limit.calls` calls in a row time out.
    pub fn with_silence(mut self, limit: SilenceLimit) -> Watch {
        self.silence = limit;
        self
    }

    /// A call ended with an answer (`true`, any HTTP response) or timed out
    /// waiting for one (`false`).
    pub fn heard(&self, answered: bool) -> Heard {
        let mut s = self.lock();
        if answered {
            s.silence.streak = 0;
            let held = std::mem::take(&mut s.silence.held);
            return match held.is_empty() {
                true => Heard::Nothing,
                false => Heard::Released(self.count(&mut s, held)),
            };
        }
        s.silence.streak = s.silence.streak.saturating_add(1);
        let limit = self.silence;
        if limit.calls == 0 || s.silence.streak < limit.calls || s.silence.tripped {
            return Heard::Nothing;
        }
        s.silence.tripped = true;
        // Their items stay pending: the server never said anything about them.
        s.silence.held.clear();
        Heard::Silent(format!(
            "the last {} calls all timed out (--timeout {}) and none was answered: the server \
             accepts calls but does not answer. Nothing was marked failed and the checkpoint is \
             saved: run the same command once the API answers again (or raise --timeout if its \
             calls are this slow)",
            s.silence.streak,
            humantime::format_duration(limit.timeout)
        ))
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
        let failed = matches!(event, Some(Event::Failed { .. }));
        if failed && systemic.is_none() && (s.silence.streak > 0 || s.silence.tripped) {
            // A failure in a silent stretch: decided once the server speaks
            // again, and dropped (left pending) if it never does.
            if !s.silence.tripped {
                s.silence.held.extend(event);
            }
            return Verdict::Record(Vec::new());
        }
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
                return Verdict::Halt {
                    record: Vec::new(),
                    why: format!(
                        "the first {calls} calls all failed the same way: {what} (URL {}); {hint}. \
                         Nothing was marked failed: fix the job and run the same command",
                        url()
                    ),
                };
            }
            return Verdict::Record(Vec::new());
        }
        self.count(&mut s, event.into_iter().collect())
    }

    /// The pool is over without a halt: outcomes still held (fewer calls
    /// than the fail-fast count, all failing alike, or a silent stretch
    /// shorter than the limit) are recorded after all.
    pub fn release(&self) -> Vec<Event> {
        let mut s = self.lock();
        let mut held = match std::mem::replace(&mut s.probation, Probation::Passed) {
            Probation::Armed { held, .. } => held,
            Probation::Passed => Vec::new(),
        };
        // A run that ended in a silent stretch short of the limit: its
        // failures are failures after all.
        held.append(&mut s.silence.held);
        held
    }

    fn count(&self, s: &mut State, mut events: Vec<Event>) -> Verdict {
        if s.over {
            // Halted for --max-failures: calls still in flight that went
            // through are kept (they ran), failures stay pending, so the
            // reason's count stays the run's.
            events.retain(|e| !matches!(e, Event::Failed { .. }));
            return Verdict::Record(events);
        }
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
        let allowed = match self.max_failures {
            Some(MaxFailures::Count(n)) if s.failed > n => format!("at most {n}"),
            Some(MaxFailures::Percent(p))
                if s.finished >= 20 && s.failed as f64 * 100.0 > p * s.finished as f64 =>
            {
                format!(
                    "at most {p}% of the items finished, and {} were",
                    s.finished
                )
            }
            _ => return Verdict::Record(events),
        };
        s.over = true;
        Verdict::Halt {
            record: events,
            why: format!(
                "{} items failed in this run; --max-failures allows {allowed}. See the failures \
                 file, fix the cause, then rerun (--retry-failed re-sends them)",
                s.failed
            ),
        }
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
            Verdict::Halt { record, why } => {
                assert!(record.is_empty());
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
            Verdict::Halt { why, .. } => assert!(why.contains("host and port"), "{why}"),
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
        match w.outcome(None, failed(3), || "u".into()) {
            // The failure that passed the bound is recorded: the reason's
            // count is what the failures file holds.
            Verdict::Halt { record, why } => {
                assert_eq!(record, vec![failed(3).unwrap()]);
                assert!(why.starts_with("3 items failed in this run"), "{why}");
                assert!(why.contains("allows at most 2"), "{why}");
            }
            v => panic!("{v:?}"),
        }
        // Failures still in flight stay pending; calls that went through count.
        assert_eq!(
            w.outcome(None, failed(4), || "u".into()),
            Verdict::Record(vec![])
        );
        assert_eq!(
            w.outcome(None, done(5), || "u".into()),
            Verdict::Record(vec![done(5).unwrap()])
        );
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
            matches!(
                w.outcome(None, failed(20), || "u".into()),
                Verdict::Halt { .. }
            ),
            "3 of 21"
        );
        assert!("x".parse::<MaxFailures>().is_err());
        assert!("101%".parse::<MaxFailures>().is_err());
    }

    fn silent(calls: u32) -> Watch {
        Watch::new(3, None).with_silence(SilenceLimit {
            calls,
            timeout: Duration::from_secs(1),
        })
    }

    #[test]
    fn a_silent_stretch_holds_its_failures_and_an_answer_records_them() {
        let w = silent(5);
        assert_eq!(w.heard(false), Heard::Nothing);
        assert_eq!(
            w.outcome(None, failed(1), || "u".into()),
            Verdict::Record(vec![])
        );
        match w.heard(true) {
            Heard::Released(Verdict::Record(ev)) => assert_eq!(ev, vec![failed(1).unwrap()]),
            h => panic!("{h:?}"),
        }
        assert_eq!(w.heard(true), Heard::Nothing);
    }

    #[test]
    fn calls_that_all_time_out_halt_and_leave_their_items_pending() {
        let w = silent(5);
        for line in 1..5 {
            assert_eq!(w.heard(false), Heard::Nothing);
            w.outcome(None, failed(line), || "u".into());
        }
        match w.heard(false) {
            Heard::Silent(why) => {
                assert!(why.contains("last 5 calls all timed out"), "{why}");
                assert!(why.contains("--timeout 1s"), "{why}");
                assert!(why.contains("Nothing was marked failed"), "{why}");
            }
            h => panic!("{h:?}"),
        }
        // Later failures and answers record nothing of the stretch.
        assert_eq!(
            w.outcome(None, failed(9), || "u".into()),
            Verdict::Record(vec![])
        );
        assert_eq!(w.heard(false), Heard::Nothing);
        assert!(w.release().is_empty());
    }

    #[test]
    fn an_answer_breaks_the_streak_and_silence_is_off_without_a_limit() {
        let w = silent(3);
        w.heard(false);
        w.heard(false);
        w.heard(true);
        w.heard(false);
        assert_eq!(w.heard(false), Heard::Nothing);
        let off = silent(0);
        for _ in 0..100 {
            assert_eq!(off.heard(false), Heard::Nothing);
        }
        assert_eq!(SilenceLimit::for_concurrency(1, Duration::ZERO).calls, 5);
        assert_eq!(SilenceLimit::for_concurrency(20, Duration::ZERO).calls, 40);
    }
}
