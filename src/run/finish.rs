//! The end of a run: decide its end state, raise the billing alert, save
//! the checkpoint, write the outputs and build the summary.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio::time::Instant;

use super::events::Stats;
use super::gate::Halt;
use super::react::KEY_REVOKED_AFTER;
use super::recorder::Recorded;
use crate::checkpoint::{JobItems, JobMeta, Store};
use crate::credits::Alerter;
use crate::credits::{Alert, AlertKind, CreditMeter, CreditSnapshot, Ledger};
use crate::exit::RunState;
use crate::exit::{self, RunError};
use crate::fleet::FleetAlerts;
use crate::rate::retry_after::MAX_QUOTA_RESET;
use crate::report::{self, Reporter, Summary};
use crate::settings::Settings;

/// Everything the end of a run reads.
pub struct Ending<'a> {
    /// The run's settings.
    pub settings: &'a Settings,
    /// The checkpoint.
    pub store: &'a Store,
    /// The job's items.
    pub items: &'a JobItems,
    /// Progress and notes.
    pub reporter: &'a Reporter,
    /// Billing alerts.
    pub alerter: &'a Alerter,
    /// The run's counters.
    pub stats: &'a Stats,
    /// The balance.
    pub ledger: &'a Arc<Ledger>,
    /// Items in the input.
    pub total: u64,
    /// When the run started.
    pub started: Instant,
    /// With `--redis`: the fleet decides which process sends an alert.
    pub fleet_alerts: Option<&'a FleetAlerts>,
}

/// How the input feeder ended.
pub type FeederResult = Result<anyhow::Result<()>, tokio::task::JoinError>;

/// The billing alert a halt raises, on every such halt: exhaustion counted
/// over the halts with no item done in between, the reserve over the halts
/// of this cycle (`meter` knows both).
fn billing_alert(
    halt: &Option<Halt>,
    reserve: i64,
    last: Option<CreditSnapshot>,
    meter: &CreditMeter,
) -> Option<Alert> {
    match halt {
        Some(Halt::Exhausted) => {
            let nth = meter.times_fired(crate::credits::ID_EXHAUSTED) + 1;
            Some(Alert::exhausted(last, nth))
        }
        Some(Halt::Reserve(why)) => {
            let nth = meter.times_fired(crate::credits::ID_RESERVE) + 1;
            let mut a = Alert::reserve(reserve, last, nth);
            // One sentence: the alert's words go on after the reason, not as
            // a new one that starts in lower case.
            a.message = format!("{why}; {}", a.message);
            Some(a)
        }
        _ => None,
    }
}

/// The end state and its reason.
pub(crate) fn end_state(
    halt: &Option<Halt>,
    left: u64,
    feeder_ok: bool,
    billing: Option<&Alert>,
    api_key_env: &str,
) -> (RunState, Option<String>) {
    let Some(h) = halt else {
        // Every worker ended without a halt yet items are pending: never
        // report that as done.
        if left > 0 && feeder_ok {
            return (
                RunState::Failed,
                Some(format!(
                    "the pool stopped with {left} item(s) pending (a bug in batchrun); run the same command to resume"
                )),
            );
        }
        return (RunState::Done, None);
    };
    let reason = match h {
        Halt::Exhausted | Halt::Reserve(_) => billing.map(|a| a.message.clone()).unwrap_or_default(),
        Halt::Auth {
            status,
            line,
            reason,
            mid_run: false,
        } => format!(
            "the API rejected the key (HTTP {status} for line {line}: {reason}) before any call got through: check {api_key_env} holds a valid key for this API; nothing was marked failed"
        ),
        Halt::Auth {
            status,
            line,
            reason,
            mid_run: true,
        } => format!(
            "the API rejected the key (HTTP {status} for line {line}: {reason}, {KEY_REVOKED_AFTER} calls in a row) after earlier calls got through: it was revoked or expired while the run went; put a valid key in {api_key_env} and run the same command to resume, with --retry-failed for the items refused before the run stopped"
        ),
        Halt::Interrupted(sig) => sig.describe().to_string(),
        Halt::Stalled(for_) => format!(
            "the server answered nothing but rate limits (429) for {}; halted with the checkpoint saved: run the same command to resume later, or raise --max-wait",
            humantime::format_duration(std::time::Duration::from_secs(for_.as_secs_f64().round() as u64))
        ),
        Halt::QuotaExhausted {
            name,
            resets_at,
            in_,
        } => quota_used_up(name, resets_at, *in_),
        Halt::Internal(why)
        | Halt::Systemic(why)
        | Halt::PacerUnavailable(why)
        | Halt::Silent(why)
        | Halt::Checkpoint(why) => why.clone(),
    };
    (h.state(), Some(reason))
}

/// Why a run halted at a used-up quota. A reset read further off than
/// [`MAX_QUOTA_RESET`] was cut to it, so one within a day of that bound
/// says "or later": the server's own date may be years away.
fn quota_used_up(name: &str, resets_at: &str, in_: Duration) -> String {
    // An empty name: a 429 said it (its Retry-After, or a reset alone),
    // naming no quota.
    let (quota, said) = match name.is_empty() {
        true => (String::new(), ", as a 429 said (its Retry-After or reset)"),
        false => (format!("{name:?} "), ""),
    };
    let later = match in_ + Duration::from_secs(86_400) >= MAX_QUOTA_RESET {
        true => " or later",
        false => "",
    };
    format!(
        "the server's quota {quota}is used up until {resets_at}{later} (in {}{said}); halted with the checkpoint saved: run the same command after it resets to resume, or add --wait-for-quota to wait for it",
        humantime::format_duration(in_)
    )
}

/// Saves the job record and brings the outputs up to date, unless a run
/// stopped by failures before it finished anything (a mistyped URL): that
/// one has nothing to put in place of results already there.
fn write(e: &Ending<'_>, meta: &JobMeta, halt: &Option<Halt>, done: u64) -> Result<(), Ended> {
    let keep_old = matches!(halt, Some(Halt::Systemic(_)))
        && done == 0
        && std::fs::metadata(&e.settings.out).is_ok_and(|m| m.len() > 0);
    if keep_old {
        e.reporter.println(&format!(
            "batchrun: {} is left as it was: this run finished no item",
            e.settings.out.display()
        ));
    }
    save(e, meta).and_then(|()| match keep_old {
        true => Ok(()),
        false => {
            super::outputs::write_outputs(e.settings, e.items).map_err(|err| output_failed(e, err))
        }
    })
}

/// Ends the run: see the module docs.
pub async fn finish(
    e: Ending<'_>,
    halt: Option<Halt>,
    recorded: Recorded,
    feeder: FeederResult,
) -> Result<Summary, RunError> {
    let Recorded {
        mut meta,
        mut meter,
        err: record_err,
        calls,
    } = recorded;
    // A write that failed in the last group, after the pool was over, still
    // means a resumable halt, not a fatal error.
    let halt = match (&record_err, halt) {
        (Some(err), None) => Some(Halt::Checkpoint(super::damage::checkpoint_failed(
            &e.settings.state_dir,
            &format!("{err:#}"),
        ))),
        (_, h) => h,
    };
    let storage_failed = matches!(halt, Some(Halt::Checkpoint(_)));
    let counts = e.items.counts().context("reading the checkpoint")?;
    let last = e.ledger.last();
    let billing = billing_alert(&halt, e.settings.credits.reserve.unwrap_or(0), last, &meter);
    if let Some(a) = &billing {
        raise(&e, &mut meter, a).await;
        meta.meter = meter.state();
    }
    let left = e.total.saturating_sub(counts.done + counts.failed);
    let feeder_ok = matches!(feeder, Ok(Ok(())));
    let (mut state, mut halt_reason) = end_state(
        &halt,
        left,
        feeder_ok,
        billing.as_ref(),
        &e.settings.api_key_env,
    );
    page_rejected_key(&e, &halt, &halt_reason, last);
    let mut exit_code = match &halt {
        Some(Halt::Interrupted(sig)) => sig.exit_code(),
        _ => exit::for_state(state, counts.failed),
    };
    // Calls still out when the run stopped (its grace ran out, a second
    // Ctrl-C, a halt) got no outcome; items whose last call timed out or
    // lost its answer may have run and are pending; and calls answered
    // while the checkpoint could not be written ran unrecorded.
    let unsure = Stats::get(&e.stats.requests).saturating_sub(calls.answered())
        + calls.unsure_pending()
        + u64::from(matches!(halt, Some(Halt::Checkpoint(_))));
    close_record(&e, &mut meta, (state, unsure), &halt_reason);
    close_run(&e, &mut meta, state, exit_code);
    let written = write(&e, &meta, &halt, counts.done);
    match written {
        Ok(()) => {}
        // The storage already failed: what is on disk is what was
        // committed, and the halt says so; this is only more of the same.
        Err(err) if storage_failed => e.reporter.println(&format!(
            "batchrun: the outputs were not brought up to date: {err}"
        )),
        // A full disk at the very end: every result is in the checkpoint,
        // and the same command writes the outputs without sending anything.
        Err(Ended::Resumable(why)) => {
            (state, exit_code) = (RunState::Halted, exit::HALTED);
            record_halt(&e, &why);
            halt_reason = Some(why);
        }
        Err(Ended::Error(err)) => return Err(err),
    }
    e.reporter.finish();
    // Made before the webhook's grace: a receiver that never answers must
    // not count in the run's time and rate.
    let summary = summary(&e, state, counts, last, exit_code, halt_reason, &calls);
    e.alerter.flush(crate::credits::WEBHOOK_GRACE).await;
    fatal(record_err.filter(|_| !storage_failed), feeder)?;
    let text = report::human_summary(&summary);
    match e.settings.style.bar {
        true => report::err_line(&text),
        // In a log, the summary's first line carries the time like the rest.
        false => report::err_line(&crate::report::progress::stamped(&text)),
    }
    Ok(summary)
}

/// A revoked key stops every nightly run: each one pages, naming the input
/// and the host like the billing alerts.
fn page_rejected_key(
    e: &Ending<'_>,
    halt: &Option<Halt>,
    why: &Option<String>,
    last: Option<crate::credits::CreditSnapshot>,
) {
    if let (Some(Halt::Auth { .. }), Some(why)) = (halt, why) {
        let id = crate::credits::ID_KEY_REJECTED;
        e.alerter
            .send(&Alert::new(AlertKind::KeyRejected, id, why.clone(), last));
    }
}

/// Sends the halt's billing alert, once per cycle (in a fleet, by one
/// process); otherwise it is only said.
async fn raise(e: &Ending<'_>, meter: &mut CreditMeter, a: &Alert) {
    let ours = meter.mark_fired(&a.id)
        && match e.fleet_alerts {
            Some(f) => f.claim(a).await,
            None => true,
        };
    if ours {
        e.alerter.send(a);
    } else {
        e.reporter.println(&format!("batchrun: {}", a.message));
    }
}

/// The job record says how the run ended, what the calls cost and counted.
fn close_record(
    e: &Ending<'_>,
    meta: &mut JobMeta,
    (state, unsure): (RunState, u64),
    why: &Option<String>,
) {
    if let Some(c) = e.ledger.measured_cost() {
        meta.cost_per_item = Some(c);
    }
    meta.requests += Stats::get(&e.stats.requests);
    meta.rate_limited += Stats::get(&e.stats.rate_limited);
    // Every item finished: whatever a killed run had in flight has its
    // verdict. Else calls this run abandoned (or that timed out, or ran
    // unrecorded) may have run, as a killed run's may: a changed request
    // must not send them under other keys.
    if meta.done + meta.failed >= meta.total {
        meta.unsettled = false;
    } else if unsure > 0 {
        meta.unsettled = true;
    }
    meta.retries += Stats::get(&e.stats.retries);
    meta.halt_reason = why.clone();
    meta.last_state = serde_json::to_value(state)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string));
}

/// This run's record: when it ended, how, and what it did.
fn close_run(e: &Ending<'_>, meta: &mut JobMeta, state: RunState, exit_code: i32) {
    let failed = meta.failed;
    let Some(run) = meta.last_run_mut() else {
        return;
    };
    run.ended_unix_ms = Some(crate::util::unix_now().as_millis() as u64);
    run.state = serde_json::to_value(state)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string));
    run.exit_code = Some(exit_code);
    e.stats.count_in(run);
    run.failed = failed.saturating_sub(run.failed_before);
}

/// The run fails on an error recording results (unless the halt already
/// says the storage failed) or reading the input.
fn fatal(record_err: Option<anyhow::Error>, feeder: FeederResult) -> Result<(), RunError> {
    if let Some(err) = record_err {
        return Err(RunError::Fatal(
            err.context("recording results in the checkpoint"),
        ));
    }
    match feeder {
        Ok(Ok(())) => Ok(()),
        Ok(Err(err)) => Err(RunError::Fatal(err.context("reading the input"))),
        Err(err) => Err(RunError::Fatal(anyhow::anyhow!("reading the input: {err}"))),
    }
}

/// How writing the outputs went wrong.
enum Ended {
    /// The run halts, resumably, for this reason.
    Resumable(String),
    /// The run fails with this error.
    Error(RunError),
}

impl std::fmt::Display for Ended {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Ended::Resumable(why) => f.write_str(why),
            Ended::Error(e) => write!(f, "{e:#}"),
        }
    }
}

impl From<anyhow::Error> for Ended {
    fn from(e: anyhow::Error) -> Ended {
        Ended::Error(RunError::Fatal(e))
    }
}

/// What an output failure means for the run.
fn output_failed(e: &Ending<'_>, err: super::outputs::OutputError) -> Ended {
    use super::outputs::OutputError;
    match err {
        OutputError::Write(err) => Ended::Resumable(format!(
            "the outputs could not be written ({err:#}); every result is in the checkpoint: \
             free space and run the same command to write them (nothing is sent again)"
        )),
        OutputError::Changed(why) => Ended::Error(RunError::Fatal(anyhow::anyhow!(why))),
        // Found by the output pass, after this run's calls (the check before
        // them passed): the damage came during the run.
        OutputError::Checkpoint(err) => Ended::Error(super::damage::damaged_when(
            &e.settings.state_dir,
            err,
            "It was found while writing the outputs, after this run's calls; no outputs were written",
        )),
        OutputError::Input(err) => Ended::Error(RunError::Input(err)),
    }
}

/// The job record says how the run ended (re-read: writing the outputs may
/// have changed it).
fn record_halt(e: &Ending<'_>, why: &str) {
    if let Ok(Some(mut meta)) = e.items.job() {
        meta.last_state = Some("halted".into());
        meta.halt_reason = Some(why.to_string());
        if let Some(run) = meta.last_run_mut() {
            run.state = Some("halted".into());
            run.exit_code = Some(exit::HALTED);
        }
        let _ = e.store.save_job(&meta).and_then(|()| e.store.flush());
    }
}

/// The job record and the meter state, on disk.
fn save(e: &Ending<'_>, meta: &JobMeta) -> Result<(), Ended> {
    e.store.save_job(meta).context("saving the checkpoint")?;
    e.store
        .save_meter_state(&e.settings.origin, &meta.meter)
        .context("saving the checkpoint")?;
    e.store.flush().context("flushing the checkpoint")?;
    Ok(())
}

fn summary(
    e: &Ending<'_>,
    state: RunState,
    counts: crate::checkpoint::Counts,
    last: Option<CreditSnapshot>,
    exit_code: i32,
    halt_reason: Option<String>,
    calls: &crate::report::calls::CallStats,
) -> Summary {
    let elapsed = e.started.elapsed().as_secs_f64();
    let done_this_run = Stats::get(&e.stats.done_this_run);
    Summary {
        state,
        total: e.total,
        done: counts.done,
        failed: counts.failed,
        pending: e.total.saturating_sub(counts.done + counts.failed),
        requests: Stats::get(&e.stats.requests),
        rate_limited: Stats::get(&e.stats.rate_limited),
        retries: Stats::get(&e.stats.retries),
        credits_remaining: last.map(|s| s.remaining),
        elapsed_s: (elapsed * 1000.0).round() / 1000.0,
        achieved_per_min: if elapsed > 0.0 {
            ((done_this_run as f64 * 60.0 / elapsed) * 10.0).round() / 10.0
        } else {
            0.0
        },
        exit_code,
        halt_reason,
        renewal: last.and_then(|s| s.renewal),
        alerts: e.alerter.fired(),
        out: e.settings.out.display().to_string(),
        failures: e.settings.failures.display().to_string(),
        status_counts: {
            // Calls still out when the run stopped (Ctrl-C, a halt) got
            // nothing back: counted as such, so the counts add up.
            let mut counts = calls.status_counts();
            let unanswered = Stats::get(&e.stats.requests).saturating_sub(calls.answered());
            if unanswered > 0 {
                counts.insert("no_answer".into(), unanswered);
            }
            counts
        },
        latency_p50_ms: calls.percentile_ms(0.5),
        latency_p99_ms: calls.percentile_ms(0.99),
        replayed: calls.replayed(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quota_reset_cut_to_a_year_and_a_day_says_or_later() {
        let far = quota_used_up("daily", "2027-12-07T00:00:00Z", MAX_QUOTA_RESET);
        assert!(
            far.starts_with("the server's quota \"daily\" is used up until 2027-12-07T00:00:00Z or later (in 1year"),
            "{far}"
        );
        let near = quota_used_up("", "2026-12-07T00:00:00Z", Duration::from_secs(86_400));
        assert!(
            near.starts_with("the server's quota is used up until 2026-12-07T00:00:00Z (in 1day, as a 429 said (its Retry-After or reset))"),
            "{near}"
        );
    }
}
