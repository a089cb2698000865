//! What a run says before its first call: the start line, warnings about
//! what it is about to repeat, and `--dry-run`, which says what it would
//! send and sends nothing.

use std::time::Duration;

use tokio::time::Instant;

use crate::checkpoint::{JobMeta, Store};
use crate::exit::RunError;
use crate::input;
use crate::report::Summary;
use crate::settings::{PoolSize, Settings, DRY_RUN_KEY};

/// Results exist where this job writes, but the checkpoint knows nothing
/// of them: say so before sending anything, and say only what is known.
pub(super) fn orphaned_results(
    settings: &Settings,
    meta: &JobMeta,
    recorded: u64,
) -> Option<String> {
    // With --fresh the checkpoint was emptied on purpose, and the items go
    // again under new keys: nothing to warn about here.
    if recorded > 0 || meta.requests > 0 || settings.fresh {
        return None;
    }
    let len = std::fs::metadata(&settings.out).ok()?.len();
    if len == 0 {
        return None;
    }
    let out = settings.out.display();
    Some(match super::owner::owner_of(&settings.out) {
        // This job wrote them: its checkpoint is what went missing.
        Some(o) if o.job == meta.id => format!(
            "batchrun: WARNING: {out} holds this job's results, but the checkpoint in {} knows \
             nothing of this job (lost, damaged or another --state-dir?). Every item is sent again \
             under the Idempotency-Key it was sent with before, so an API that honours it \
             replays the calls it already ran.",
            settings.state_dir.display()
        ),
        // A rehearsal's, which a real run replaces: the owners' check said
        // so.
        Some(o) if o.rehearsal && settings.origin != crate::settings::SIM_ORIGIN => return None,
        Some(o) => format!(
            "batchrun: --force-outputs: {out} holds the results of job {} (on {}); \
             this job replaces them when it ends",
            o.job, o.input
        ),
        None => format!(
            "batchrun: WARNING: {out} already holds results no batchrun job is known to have \
             written; this job replaces them when it ends"
        ),
    })
}

/// The pace the limit allows, items per minute; None when unlimited.
pub(super) fn steady_per_min(settings: &Settings) -> Option<f64> {
    settings.limit.rate().map(|r| r.per_second() * 60.0)
}

/// What the run is about to do, printed before the first call. `pace` is
/// the pacer's own pace (items per minute) when it differs from the limit's.
pub(super) fn start_line(
    settings: &Settings,
    meta: &JobMeta,
    (pending, total): (u64, u64),
    pace: Option<f64>,
) -> String {
    let learnt = meta
        .learnt_limit
        .zip(settings.limit.rate())
        .map(|(l, r)| l as f64 * 60.0 / r.period.as_secs_f64());
    let per_min = learnt.or(pace).or(steady_per_min(settings));
    let projected = match per_min {
        Some(per_min) if pending > 0 => projection(settings, per_min, pending),
        _ => String::new(),
    };
    let learnt = match (meta.learnt_limit, meta.learnt_burst, settings.limit.rate()) {
        (Some(l), Some(b), Some(r)) => format!(
            ", learnt earlier: a bucket of {l}/{} with burst {b}",
            humantime::format_duration(r.period)
        ),
        (Some(l), None, Some(r)) if meta.learnt_fixed => format!(
            ", learnt earlier: a fixed window of {l}/{}",
            humantime::format_duration(r.period)
        ),
        (Some(l), ..) => format!(", learnt {l} per window from the server"),
        _ => String::new(),
    };
    // Said first: a rehearsal's URL and key are the sim's, whatever the
    // options or the environment name.
    let rehearsal = match settings.rehearsal {
        true => "rehearsal on the built-in sim (nothing leaves this machine, no key is sent); ",
        false => "",
    };
    format!(
        "batchrun: {rehearsal}job {}: {} ({pending} of {total} items pending); limit {} ({}{learnt}), {}; state in {}; results to {}, failures to {}{projected}{}",
        meta.id,
        super::job::shown_input(settings),
        settings.limit,
        settings.limit_source,
        concurrency(settings),
        settings.state_dir.display(),
        settings.out.display(),
        settings.failures.display(),
        bound(settings, per_min),
    )
}

/// "concurrency 5", or how a pool sized by the limit grows.
fn concurrency(settings: &Settings) -> String {
    match settings.pool {
        PoolSize::Fixed => format!("concurrency {}", settings.concurrency),
        PoolSize::Grows(start) => format!(
            "concurrency from {start}, growing to what the limit needs at the measured latency (at most {})",
            settings.concurrency
        ),
    }
}

/// How long the pending items take at `per_min`, the limit's pace. The
/// window pacer sends a whole window at once, then a window's worth per
/// window: only the items past the first window wait, and the first
/// window goes as fast as the calls in flight allow.
fn projection(settings: &Settings, per_min: f64, pending: u64) -> String {
    let mut pending = calls(settings, pending);
    // A shard of a fleet shares the limit with its siblings, which run
    // alongside with about as many calls each.
    if let (Some(shard), Some(_)) = (settings.shard, &settings.fleet) {
        pending = pending.saturating_mul(shard.count);
    }
    let (waiting, window) = match (settings.pacer, settings.limit.rate()) {
        (crate::pace::PacerKind::Window, Some(r)) => {
            let per_window = (per_min * r.period.as_secs_f64() / 60.0).max(1.0);
            let waiting = ((pending as f64 / per_window).ceil() - 1.0).max(0.0) * per_window;
            (waiting, Some(r.period))
        }
        _ => (pending as f64, None),
    };
    match window {
        Some(_) if waiting == 0.0 && settings.concurrency as u64 >= pending => {
            "; all within the first window".to_string()
        }
        // Fewer calls in flight than items: the window holds them all, but
        // only calls quick enough get them through within it.
        Some(w) if waiting == 0.0 => format!(
            "; all within the first window if calls take under {} ms",
            (w.as_secs_f64() * 1000.0 * settings.concurrency as f64 / pending as f64).floor()
        ),
        _ => {
            let d = Duration::try_from_secs_f64(waiting * 60.0 / per_min).unwrap_or(Duration::MAX);
            format!(
                "; about {} at the limit's pace",
                crate::report::progress::fmt_secs(d)
            )
        }
    }
}

/// How many calls `pending` items take: under `--batch` counted as one
/// call each, a batch's worth of items go in one.
fn calls(settings: &Settings, pending: u64) -> u64 {
    match &settings.batch {
        Some(b) if b.weight == crate::request::BatchWeight::Calls => {
            pending.div_ceil(b.size.max(1) as u64)
        }
        _ => pending,
    }
}

/// A shard's job that forms its batches from blocks of input lines, as
/// every job did before shards formed theirs from their own items: it
/// keeps them while calls so formed may have run (under their keys), and
/// its batches hold about N/M items, so the shards make about M times the
/// calls. Said at start, with when that ends.
pub(super) fn batches_of_lines(
    settings: &Settings,
    formation: Option<&super::batch::Formation>,
) -> Option<String> {
    let shard = settings.shard.filter(|s| s.count > 1)?;
    let super::batch::Blocks::Lines(size) = formation?.blocks else {
        return None;
    };
    Some(format!(
        "batchrun: note: this shard's job began forming --batch {size} from blocks of {size} \
         input lines, of which it holds about {}, so the shards make about {} times the calls; \
         calls so formed may have run unanswered, and it keeps forming them so (under the same \
         keys) until a run of it ends with none unsettled; then its batches are formed from \
         its own items, {size} a call",
        size.div_ceil(shard.count),
        shard.count,
    ))
}

/// When the calls in flight, not the limit, bound the run: said up front
/// for any latency under a second (the run says it again once it has
/// measured one).
fn bound(settings: &Settings, per_min: Option<f64>) -> String {
    let most = settings.concurrency;
    let Some(per_min) = per_min else {
        return format!("; no limit: at most {most} call(s) in flight bound the run (-c)");
    };
    let breakeven = most as f64 * 60.0 / per_min;
    if breakeven >= 1.0 {
        return String::new();
    }
    format!(
        "; {most} call(s) in flight bound the run, not the limit, if a call takes over {} ms",
        (breakeven * 1000.0).floor()
    )
}

/// What the real run would refuse that the dry run's checks of the input
/// do not show: a request changed under a job with items done (the
/// checkpoint read, not written; a running job's is left alone).
fn changed_note(settings: &Settings) -> Option<String> {
    if settings.fresh || settings.keep_done || !crate::checkpoint::held(&settings.state_dir) {
        return None;
    }
    let store = Store::open_to_read(&settings.state_dir).ok()?;
    let located = super::job::locate(&store, settings).ok()?;
    let old = located.changed.iter().max_by_key(|m| m.done)?;
    Some(format!(
        "batchrun: dry run: the real run would stop before any call: the request changed \
         since job {} ({} of {} item(s) done); it says how, and what --keep-done and --fresh \
         would do",
        old.id, old.done, old.total
    ))
}

/// `--dry-run N`: check the whole input, show the first N requests as
/// they would go, the key hidden, and send nothing.
pub(super) fn dry_run(
    settings: &Settings,
    n: usize,
    started: Instant,
) -> Result<Summary, RunError> {
    use std::io::Write;
    let spec = &settings.request;
    let scan = tokio::task::block_in_place(|| {
        input::scan(&settings.input, settings.format, &mut |item| {
            spec.render(item).map(|_| ())
        })
    })?;
    let total = scan.total;
    // With --json, stdout is the summary's alone.
    let mut out: Box<dyn Write> = if settings.json {
        Box::new(std::io::stderr().lock())
    } else {
        Box::new(std::io::stdout().lock())
    };
    let hide = |s: &str| match &spec.key {
        Some(k) => k.redact(s),
        None => s.to_string(),
    };
    for item in input::Reader::open(&settings.input, settings.format)?.take(n) {
        let item = item?;
        let req = spec.render(&item).map_err(RunError::Usage)?;
        let mut text = format!("# line {}\n{} {}\n", item.line, req.method, hide(&req.url));
        for (name, value) in &req.headers {
            let v = if *name == spec.key_header {
                "***".to_string()
            } else {
                hide(&String::from_utf8_lossy(value.as_bytes()))
            };
            text.push_str(&format!("{name}: {v}\n"));
        }
        if let Some(body) = &req.body {
            text.push_str(&format!("\n{}\n", hide(&String::from_utf8_lossy(body))));
        }
        let _ = writeln!(out, "{text}");
    }
    crate::report::err_line(&format!(
        "batchrun: dry run: {total} item(s) checked, nothing sent"
    ));
    let keyless = (spec.key.as_ref()).is_some_and(|k| k.expose() == DRY_RUN_KEY);
    if keyless {
        crate::report::err_line(
            "batchrun: dry run: no usable API key is set: the real run stops there \
             (set BATCHRUN_API_KEY, or the variable --api-key-env names)",
        );
    }
    if let Some(note) = changed_note(settings) {
        crate::report::err_line(&note);
    }
    Ok(Summary {
        state: crate::exit::RunState::Checked,
        total,
        done: 0,
        failed: 0,
        pending: total,
        requests: 0,
        rate_limited: 0,
        retries: 0,
        credits_remaining: None,
        elapsed_s: started.elapsed().as_secs_f64(),
        achieved_per_min: 0.0,
        exit_code: crate::exit::OK,
        halt_reason: None,
        renewal: None,
        alerts: Vec::new(),
        out: settings.out.display().to_string(),
        failures: settings.failures.display().to_string(),
        status_counts: Default::default(),
        latency_p50_ms: None,
        latency_p99_ms: None,
        replayed: 0,
    })
}

/// `--fresh` sends every item again under new keys: say so first when some
/// of them failed with their outcome unknown, since those may run twice.
pub(super) fn warn_unknown(store: &Store, old: &JobMeta) {
    if old.failed == 0 {
        return;
    }
    let unknown = store
        .items(&old.id)
        .and_then(|items| items.unknown_failures())
        .unwrap_or(0);
    if unknown > 0 {
        crate::report::err_line(&format!(
            "batchrun: WARNING: --fresh: {unknown} item(s) failed with their outcome unknown \
             (their calls may have run); they are sent again under new Idempotency-Keys and \
             may run twice. --retry-failed would send them under their old keys instead"
        ));
    }
}

/// What holds the first calls of a window-paced run when the last run on
/// this API ended less than its shortest window ago (`last_active`, unix
/// time): its calls may still count there, so the start waits them out,
/// which a start line saying "all within the first window" would not
/// explain. Only waits longer than a few seconds are said.
pub(super) fn held_by_last_run(settings: &Settings, last_active: Duration) -> Option<String> {
    // The fleet's windows are in Redis, and the other pacers hold nothing.
    if settings.pacer != crate::pace::PacerKind::Window || settings.fleet.is_some() {
        return None;
    }
    let shortest = crate::pace::shortest_window(settings.limit, &settings.policies)?;
    let now = crate::util::unix_now();
    let held = crate::pace::still_counted(shortest, last_active, now);
    if held < Duration::from_secs(5) {
        return None;
    }
    let until = crate::util::rfc3339((now + held).as_secs())?;
    let today = crate::util::rfc3339(now.as_secs())?;
    Some(format!(
        "batchrun: the last run on this API sent calls {} ago, which its {} window may still \
         count: the first calls wait until {} UTC",
        humantime::format_duration(Duration::from_secs(
            now.saturating_sub(last_active).as_secs()
        )),
        humantime::format_duration(shortest),
        wait_until(&until, &today)
    ))
}

/// The time of day of RFC 3339 instant `until`, with its date when that
/// is not `today`'s: a day's window waited "until 19:03:48" read as three
/// seconds away, not tomorrow.
fn wait_until<'a>(until: &'a str, today: &str) -> std::borrow::Cow<'a, str> {
    let (Some(day), Some(time)) = (until.get(..10), until.get(11..19)) else {
        return until.into();
    };
    match today.get(..10) == Some(day) {
        true => time.into(),
        false => format!("{day} {time}").into(),
    }
}

/// A policy of tokens told with no `--cost`: each call is estimated at
/// what its request asks, read from the fields OpenAI's and Anthropic's
/// bodies use. Said at start, so that a job whose
/// requests say it otherwise (other field names) knows to give `--cost`.
pub(super) fn uncosted_tokens(settings: &Settings) -> Option<String> {
    let c = &settings.costing;
    let told = (settings.policies.iter()).any(|p| p.unit.is_tokens());
    (told && c.guessed()).then(|| {
        format!(
            "batchrun: note: a token policy is told and --cost is not: each call is estimated at \
             what its request asks (max_tokens, max_completion_tokens or max_output_tokens, and \
             a token per 4 characters of prompt, input, system and messages, read from --body \
             rendered or else the item) and counted at what its answer used ({}); give --cost where the requests say \
             it otherwise",
            match c.usage.is_empty() {
                true => "nothing: --usage is empty".to_string(),
                false => format!("--usage {}", c.usage),
            }
        )
    })
}

/// The start line, and the notes and warnings before the first call.
/// `items`: the job's pending items and all of them; `formation`: how
/// this run forms its batches.
pub(super) fn announce(
    settings: &Settings,
    (meta, items, formation): (&JobMeta, (u64, u64), Option<&super::batch::Formation>),
    pacer: &dyn crate::pace::Pacer,
    reporter: &crate::report::Reporter,
) {
    // Said once the pacer is built: a bucket's pace is its refill rate.
    let pace = (settings.pacer == crate::pace::PacerKind::Bucket)
        .then(|| pacer.steady_per_min())
        .flatten();
    reporter.println(&start_line(settings, meta, items, pace));
    if let Some(note) = held_by_last_run(settings, super::last_active(settings, meta)) {
        reporter.println(&note);
    }
    if let Some(note) = uncosted_tokens(settings) {
        reporter.println(&note);
    }
    if settings.burst.is_some() && settings.pacer != crate::pace::PacerKind::Bucket {
        reporter.println(&format!(
            "batchrun: note: --burst applies to --pacer bucket only; the {} pacer ignores it",
            match settings.pacer {
                crate::pace::PacerKind::Spike => "spike",
                _ => "window",
            }
        ));
    }
    if let Some(note) = batches_of_lines(settings, formation) {
        reporter.println(&note);
    }
    let counts = meta.counts();
    if let Some(warning) = orphaned_results(settings, meta, counts.done + counts.failed) {
        reporter.say(&warning);
    }
}

#[cfg(test)]
mod tests {
    use super::wait_until;

    #[test]
    fn a_wait_into_another_day_names_the_day() {
        let today = "2026-12-07T19:03:45Z";
        assert_eq!(wait_until("2026-12-07T20:03:23Z", today), "20:03:23");
        assert_eq!(
            wait_until("2026-12-08T19:03:48Z", today),
            "2026-12-08 19:03:48"
        );
    }
}
