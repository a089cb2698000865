//! The run's supervision: waiting for the workers, or for a signal, and
//! then for the calls in flight as long as the signal allows.

use tokio::sync::mpsc;
use tokio::task::JoinSet;

use super::gate::Halt;
use super::pool::Pool;
use super::recorder::Stop;
use super::INTERRUPT_GRACE;

/// Waits for every worker, or for the recorder's word that a signal came:
/// then the calls in flight get [`INTERRUPT_GRACE`] to finish before they
/// are abandoned (they stay pending; their Idempotency-Key makes the
/// resend safe), or none at all after a second signal. A worker that
/// panicked stops the run.
pub(super) async fn supervise(
    pool: &Pool,
    workers: &mut JoinSet<()>,
    mut stops: mpsc::UnboundedReceiver<Stop>,
) {
    let mut open = true;
    let now = loop {
        tokio::select! {
            r = workers.join_next() => match r {
                None => return,
                Some(Err(e)) if e.is_panic() => pool.gate.stop(Halt::Internal(
                    "a worker crashed (a bug in batchrun); the checkpoint is saved: run the same command to resume".into(),
                )),
                Some(_) => {}
            },
            s = stops.recv(), if open => match s {
                Some(Stop::Grace) => break false,
                Some(Stop::Now) => break true,
                None => open = false,
            },
        }
    };
    if !now {
        let grace = tokio::time::sleep(INTERRUPT_GRACE);
        tokio::pin!(grace);
        loop {
            tokio::select! {
                r = workers.join_next() => if r.is_none() { return },
                _ = &mut grace => break,
                s = stops.recv(), if open => match s {
                    Some(Stop::Now) => break,
                    Some(Stop::Grace) => {}
                    None => open = false,
                },
            }
        }
    }
    workers.abort_all();
    while workers.join_next().await.is_some() {}
}
