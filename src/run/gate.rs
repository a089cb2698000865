//! The pool's gate: may workers send? One stop state for the whole run, and
//! the credit gate with its single prober while the run waits for credits.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::exit::RunState;

/// Why the pool stopped early.
#[derive(Debug, Clone, PartialEq)]
pub enum Halt {
    /// Credits ran out.
    Exhausted,
    /// The reserve was reached (the reason says how).
    Reserve(String),
    /// The key was rejected: before any call got through (401 or 403), or
    /// later by a 401 (revoked or expired while the run went): the status,
    /// the line of the item whose call it was, and the server's words
    /// (quoted).
    Auth {
        /// 401 or 403.
        status: u16,
        /// The item's line.
        line: u64,
        /// What the server said, quoted.
        reason: String,
        /// Whether calls of the run had got through before.
        mid_run: bool,
    },
    /// Ctrl-C or SIGTERM.
    Interrupted(crate::exit::Signal),
    /// The server answered nothing but rate-limit 429s for too long.
    Stalled(Duration),
    /// A bug or an internal failure (the reason says which).
    Internal(String),
    /// The job itself is wrong (every call fails alike) or its failures
    /// passed `--max-failures`; the reason says which.
    Systemic(String),
    /// The pacer's shared state (the fleet's Redis) stayed out of reach: no
    /// call may go out without a slot, so the run stops resumably.
    PacerUnavailable(String),
    /// The server says a quota is used up and resets too far away to wait
    /// for (no `--wait-for-quota`): not the pacer's failure, so it has its
    /// own halt, which names the quota and when it resets.
    QuotaExhausted {
        /// The quota's name in the server's headers (empty: a 429's
        /// `Retry-After` said it, naming none).
        name: String,
        /// When it resets (RFC 3339, UTC).
        resets_at: String,
        /// How long until then, in whole seconds.
        in_: Duration,
    },
    /// The server accepted calls and answered none of the last ones: the
    /// items stay pending and the run stops resumably (the reason says so).
    Silent(String),
    /// The checkpoint could not be written (a full disk, a file size limit):
    /// no call may go out that cannot be recorded, so the run stops
    /// resumably. The reason is the storage error.
    Checkpoint(String),
}

impl Halt {
    /// The halt of a pacer that cannot hand out permits: resumable, since
    /// the items stay pending and nothing went out without a slot. A
    /// used-up quota is the server's word, not the pacer's failure, and
    /// halts as such.
    pub fn of_pace_error(e: &crate::pace::PaceError) -> Halt {
        use crate::pace::PaceError;
        match e {
            PaceError::QuotaExhausted {
                name,
                resets_at,
                in_,
            } => Halt::QuotaExhausted {
                name: name.clone(),
                resets_at: resets_at.clone(),
                in_: *in_,
            },
            PaceError::Unavailable(_) => Halt::PacerUnavailable(format!(
                "{e}; the checkpoint is saved: run the same command to resume"
            )),
        }
    }

    /// The end state this halt leads to.
    pub fn state(&self) -> RunState {
        match self {
            Halt::Exhausted
            | Halt::Reserve(_)
            | Halt::Stalled(_)
            | Halt::PacerUnavailable(_)
            | Halt::QuotaExhausted { .. }
            | Halt::Silent(_)
            | Halt::Checkpoint(_) => RunState::Halted,
            Halt::Auth { .. } | Halt::Internal(_) | Halt::Systemic(_) => RunState::Failed,
            Halt::Interrupted(_) => RunState::Interrupted,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
enum State {
    Running,
    /// Waiting for credits; the next probe is due at this instant.
    Waiting(Instant),
    Stopped,
}

/// What the gate lets a worker do.
#[derive(Debug, PartialEq)]
pub enum Pass {
    /// Send as usual.
    Run,
    /// Send one call to find out whether credits are back.
    Probe,
    /// Stop.
    Stop,
}

/// The gate every worker passes before each call.
pub struct Gate {
    state: watch::Sender<State>,
    halt: Mutex<Option<Halt>>,
    prober: AtomicBool,
    probe_every: Duration,
}

impl Gate {
    /// An open gate; while waiting for credits it lets one probe through
    /// every `probe_every`.
    pub fn new(probe_every: Duration) -> Gate {
        Gate {
            state: watch::channel(State::Running).0,
            halt: Mutex::new(None),
            prober: AtomicBool::new(false),
            probe_every,
        }
    }

    /// How often a probe goes while waiting for credits.
    pub fn probe_every(&self) -> Duration {
        self.probe_every
    }

    /// Whether the run has stopped.
    pub fn is_stopped(&self) -> bool {
        *self.state.borrow() == State::Stopped
    }

    /// Whether workers may send without probing.
    pub fn is_running(&self) -> bool {
        *self.state.borrow() == State::Running
    }

    /// Stops the run for `why`; the first reason given is the one kept.
    pub fn stop(&self, why: Halt) {
        {
            let mut h = self.halt.lock().unwrap_or_else(|p| p.into_inner());
            if h.is_none() {
                *h = Some(why);
            }
        }
        self.state.send_replace(State::Stopped);
    }

    /// Closes the gate without a halt: the pool is over.
    pub fn close(&self) {
        self.state.send_replace(State::Stopped);
    }

    /// Why the run stopped early, if it did.
    pub fn halt(&self) -> Option<Halt> {
        self.halt.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Resolves once the run stops.
    pub async fn until_stopped(&self) {
        let mut rx = self.state.subscribe();
        let _ = rx.wait_for(|g| *g == State::Stopped).await;
    }

    /// Sleeps unless the run stops first. False if it stopped.
    pub async fn sleep(&self, d: Duration) -> bool {
        tokio::select! {
            _ = tokio::time::sleep(d) => !self.is_stopped(),
            _ = self.until_stopped() => false,
        }
    }

    /// Waits at the gate. While the pool waits for credits, the first worker
    /// to find the probe due becomes the one prober; everyone else waits
    /// for the gate to change.
    pub async fn pass(&self) -> Pass {
        let mut rx = self.state.subscribe();
        loop {
            let g = rx.borrow_and_update().clone();
            let next = match g {
                State::Running => return Pass::Run,
                State::Stopped => return Pass::Stop,
                State::Waiting(next) => next,
            };
            if Instant::now() >= next {
                if self
                    .prober
                    .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
                    .is_ok()
                {
                    return Pass::Probe;
                }
                if rx.changed().await.is_err() {
                    return Pass::Stop;
                }
            } else {
                tokio::select! {
                    _ = tokio::time::sleep_until(next) => {}
                    r = rx.changed() => if r.is_err() { return Pass::Stop },
                }
            }
        }
    }

    fn next_probe(&self) -> Instant {
        let now = Instant::now();
        now.checked_add(self.probe_every)
            .unwrap_or(now + Duration::from_secs(365 * 86_400))
    }

    /// Credits are out (or the reserve is reached): the pool stops sending
    /// until a probe finds them back. True if this began a waiting spell.
    pub fn start_waiting(&self) -> bool {
        let next = self.next_probe();
        self.state.send_if_modified(|g| {
            if *g == State::Running {
                *g = State::Waiting(next);
                true
            } else {
                false
            }
        })
    }

    /// The probe found no credits: next probe one interval from now.
    pub fn probe_failed(&self) {
        let next = self.next_probe();
        self.state.send_modify(|g| {
            if matches!(g, State::Waiting(_)) {
                *g = State::Waiting(next);
            }
        });
        self.prober.store(false, Ordering::SeqCst);
    }

    /// The probe could not tell (a rate limit, a transient error): hand the
    /// probe back, still due, to whoever passes the gate next.
    pub fn release_probe(&self) {
        self.prober.store(false, Ordering::SeqCst);
        // Wake the waiters so one of them can take the probe.
        self.state.send_modify(|_| {});
    }

    /// The probe went through: resume everyone. True if the run resumed.
    pub fn probe_succeeded(&self) -> bool {
        let resumed = self.state.send_if_modified(|g| {
            if matches!(g, State::Waiting(_)) {
                *g = State::Running;
                true
            } else {
                false
            }
        });
        self.prober.store(false, Ordering::SeqCst);
        resumed
    }

    /// While waiting for credits: the time to the next probe.
    pub fn waiting_probe_in(&self, now: Instant) -> Option<Duration> {
        match *self.state.borrow() {
            State::Waiting(next) => Some(next.saturating_duration_since(now)),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[tokio::test(start_paused = true)]
    async fn one_prober_at_a_time_while_waiting() {
        let g = Arc::new(Gate::new(Duration::from_secs(10)));
        assert_eq!(g.pass().await, Pass::Run);
        assert!(g.start_waiting());
        assert!(!g.start_waiting(), "one waiting spell");
        let t0 = Instant::now();
        assert_eq!(g.pass().await, Pass::Probe);
        assert_eq!(Instant::now() - t0, Duration::from_secs(10));
        let other = tokio::spawn({
            let g = g.clone();
            async move { g.pass().await }
        });
        tokio::task::yield_now().await;
        assert!(!other.is_finished(), "a second worker waits for the probe");
        assert!(g.probe_succeeded());
        assert_eq!(other.await.unwrap(), Pass::Run);
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_halt_is_the_one_kept() {
        let g = Gate::new(Duration::from_secs(1));
        g.stop(Halt::Exhausted);
        g.stop(Halt::Interrupted(crate::exit::Signal::Interrupt));
        assert_eq!(g.halt(), Some(Halt::Exhausted));
        assert_eq!(g.pass().await, Pass::Stop);
        assert!(!g.sleep(Duration::from_secs(1)).await);
    }

    #[test]
    fn a_lost_pacer_halts_resumably() {
        let h = Halt::PacerUnavailable("lost Redis".into());
        assert_eq!(h.state(), RunState::Halted);
        assert_eq!(crate::exit::for_state(h.state(), 0), crate::exit::HALTED);
    }

    #[test]
    fn a_used_up_quota_is_its_own_resumable_halt() {
        let e = crate::pace::PaceError::QuotaExhausted {
            name: "core".into(),
            resets_at: "2026-12-03T00:00:00Z".into(),
            in_: Duration::from_secs(3600),
        };
        let h = Halt::of_pace_error(&e);
        assert!(matches!(&h, Halt::QuotaExhausted { name, .. } if name == "core"));
        assert_eq!(crate::exit::for_state(h.state(), 0), crate::exit::HALTED);
        let lost = Halt::of_pace_error(&crate::pace::PaceError::Unavailable("lost Redis".into()));
        assert!(matches!(lost, Halt::PacerUnavailable(why) if why.contains("resume")));
    }
}
