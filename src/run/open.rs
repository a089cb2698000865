//! Opening a job: its checkpoint, and its whole input checked before any
//! request is sent.

use anyhow::Context as _;

use super::batch::Formation;
use super::damage::damaged;
use super::job::Located;
use super::layouts::Siblings;
use super::repeats::{Counter, Repeats};
use super::start::warn_unknown;
use crate::checkpoint::{GroupCommit, ItemState, JobItems, JobMeta, Record, Store};
use crate::exit::RunError;
use crate::input;
use crate::settings::Settings;

/// The job's checkpoint and its input, checked.
pub(super) struct Opened {
    pub(super) store: Store,
    pub(super) items: JobItems,
    pub(super) meta: JobMeta,
    pub(super) scan: input::Scan,
    /// The feeder's count of each item's earlier lines of the same content
    /// (taken once).
    pub(super) repeats: std::sync::Mutex<Counter>,
    /// How this run forms its batches, as decided against the checkpoint
    /// (`None`: one item per call).
    pub(super) formation: Option<Formation>,
}

impl Opened {
    /// This run's record, on disk and flushed before any call, and the
    /// committer that records its results. Killed with its first calls in
    /// flight, the run is one that never ended, whose calls may have run:
    /// a run in another layout must not send them again. Nothing is sent
    /// when either fails, and the record goes again if the results log
    /// cannot be opened (else the next run would take it for a killed one).
    pub(super) fn start_recording(
        &self,
        state_dir: &std::path::Path,
    ) -> Result<(JobMeta, crate::checkpoint::Committer), RunError> {
        let mut meta = self.meta.clone();
        meta.start_run(crate::util::unix_now().as_millis() as u64);
        let saved = |m: &JobMeta| self.store.save_job(m).and_then(|()| self.store.flush());
        saved(&meta).map_err(|e| {
            RunError::Unable(anyhow::anyhow!(
                "the checkpoint in {} could not be written ({e}); nothing was sent. Free \
                 space there (or fix the file) and run the same command",
                state_dir.display()
            ))
        })?;
        match self.items.committer(meta.clone(), GroupCommit::default()) {
            Ok(c) => Ok((meta, c)),
            Err(e) => {
                let _ = saved(&self.meta);
                Err(anyhow::Error::new(e)
                    .context("opening the results log")
                    .into())
            }
        }
    }
}

/// Opens the checkpoint, checks the whole input before any request is sent,
/// and opens (or creates) the job. The checkpoint comes first: a line that
/// will not be sent again is parsed but not rendered.
pub(super) fn open_job(settings: &Settings) -> Result<Opened, RunError> {
    let store = Store::open(&settings.state_dir).map_err(|e| damaged(&settings.state_dir, e))?;
    let located = locate(&store, settings)?;
    // `--fresh` and `--keep-done` change the checkpoint before the scan
    // below: every line is checked first, so that a typo in the new
    // request, or a bad row, fails (exit 2) with the job as it was.
    if settings.fresh || settings.keep_done {
        scan_input(settings, (None, input::FieldOrder::default()), None)?;
    }
    let (id, superseded) = changed_request(&store, settings, &located)?;
    super::owner::check_owners(settings, &id, &superseded)?;
    // A job the checkpoint does not know (lost, or moved aside as damaged)
    // takes back from its earlier outputs the epoch and generations its keys
    // were last made with, so that it sends those keys again and the API
    // replays what already ran.
    let old = store.job(&id).ok().flatten();
    if old.is_none() {
        super::layouts::check(settings)?;
    }
    let recovered = match &old {
        None => super::outputs::recover([&settings.out, &settings.failures], &id),
        Some(_) => super::outputs::Recovered::default(),
    };
    let mut epoch = old.as_ref().map_or(recovered.epoch, |o| o.epoch);
    let mut id = id;
    let (by_line, shard, order) = made_as(settings, old.as_ref(), &id);
    if settings.fresh {
        epoch = fresh(&store, &id, old.as_ref(), epoch)?;
    }
    let mut items = store.items(&id).context("opening the checkpoint")?;
    let (mut scan, mut invalid, mut repeats) = scan_input(settings, (shard, order), Some(&items))?;
    if let Some(old) = old.as_ref().filter(|o| grown(settings, o, &scan)) {
        let so = "rows added to the last block would join its batch";
        check_moved_batches(settings, &items, old, ("grew", so))?;
    }
    // A regenerated input: the items it still holds keep their results.
    if let Some(old) = super::regen::regenerated(&store, settings, &id, &scan)? {
        let valid = scan.total.saturating_sub(invalid.len() as u64);
        check_regenerated(settings, &items, &old, valid)?;
        drop(items);
        id = super::regen::by_content(&store, settings, &old, &scan)?;
        items = store.items(&id).context("opening the checkpoint")?;
        (scan, invalid, repeats) = scan_input(settings, (shard, order), Some(&items))?;
    }
    items.reserve_lines(scan.last_line);
    let mut meta = super::job::open(&store, settings, &scan, (&id, epoch, order), located.window)?;
    if by_line && meta.shards_by_content {
        meta.shards_by_content = false;
        store.save_job(&meta).context("writing the checkpoint")?;
    }
    if old.is_none() && !settings.fresh {
        items
            .restore_generations(&recovered.generations)
            .context("writing the checkpoint")?;
    }
    check_checkpoint(settings, &items, &mut meta, scan.last_line)?;
    meta.close_killed_run();
    let formation = check_batching(settings, &items, &meta)?;
    record_batching(&store, formation.as_ref(), &mut meta)?;
    // Until this run ends, a reader of the checkpoint sees it unfinished.
    meta.last_state = None;
    meta.halt_reason = None;
    if settings.retry_failed {
        items
            .clear_failed(&mut meta)
            .context("clearing failed items")?;
    }
    record_invalid(&items, &mut meta, invalid)?;
    // New keys from here on: saved beside the outputs before any call, so
    // that a checkpoint lost later still leads back to them.
    if settings.retry_failed || settings.fresh {
        let carried = items.carried_all().context("reading the checkpoint")?;
        super::outputs::save_keys(&settings.out, &meta.id, meta.epoch, &carried)?;
    }
    Ok(Opened {
        store,
        items,
        meta,
        scan,
        repeats: std::sync::Mutex::new(repeats),
        formation,
    })
}

/// The job for this input and request ([`super::job::locate`]); for a
/// pipe of new content, the pipe's last job when the content holds every
/// result of it, or when a run of it was killed.
fn locate(store: &Store, settings: &Settings) -> Result<Located, RunError> {
    let mut located = super::job::locate(store, settings)?;
    if let Some(before) = located.pipe_before.take() {
        // A killed run's pipe is resumed whatever it lost: its calls may
        // have run, and only its job's keys (by content) replay them.
        let killed = super::job::unsettled(&before);
        if killed || super::regen::holds_every_result(store, settings, &before)? {
            located = Located {
                id: before.id,
                window: located.window,
                ..Located::default()
            };
        }
    }
    Ok(located)
}

/// How the job splits its shards and fingerprints its items: as it was
/// made; a new shard as its siblings. Whether by line, the shard, and the
/// field order.
fn made_as(
    settings: &Settings,
    old: Option<&JobMeta>,
    id: &str,
) -> (bool, Option<crate::fleet::Shard>, input::FieldOrder) {
    let siblings = match (old, settings.shard, settings.fresh) {
        (None, Some(_), false) => super::layouts::siblings_made(settings),
        _ => Siblings::default(),
    };
    let by_line = line_split(settings, old, siblings);
    let shard = (settings.shard).map(|s| s.by_content(!by_line));
    (by_line, shard, field_order(settings, old, id, siblings))
}

/// Whether this run's shard splits its input by line: a job made before
/// shards followed content, continued (not discarded by `--fresh`, whose
/// new job splits by content).
fn line_split(settings: &Settings, old: Option<&JobMeta>, siblings: Siblings) -> bool {
    if settings.shard.is_none() || settings.fresh {
        return false;
    }
    match old {
        Some(o) => !o.shards_by_content,
        // A new shard beside shards of the job made before: split as they do.
        None => siblings.split_by_line,
    }
}

/// How the job fingerprints its items ([`input::FieldOrder`]): as it was
/// made, for its life (its results, keys and shards were made with it).
/// A job the checkpoint lost, as the owner record beside its outputs says;
/// a new shard, as the other shards of its job do (or they would not
/// partition the input); a new job (`--fresh` too) leaves field order out.
fn field_order(
    settings: &Settings,
    old: Option<&JobMeta>,
    id: &str,
    siblings: Siblings,
) -> input::FieldOrder {
    if settings.fresh {
        return input::FieldOrder::Ignored;
    }
    if let Some(o) = old {
        return o.field_order();
    }
    if let Some(order) = super::owner::field_order_of(settings, id) {
        return order;
    }
    if siblings.keep_field_order {
        return input::FieldOrder::Kept;
    }
    input::FieldOrder::Ignored
}

/// Refuses to resume `old` by content on a regenerated input where that
/// could send a call twice: batches whose blocks of lines moved after
/// calls that may have run, and shards split by line (rows moved between
/// shards, and a shard cannot know what another did).
fn check_regenerated(
    settings: &Settings,
    items: &JobItems,
    old: &JobMeta,
    valid: u64,
) -> Result<(), RunError> {
    // An export cut off before its first row, a file emptied by mistake,
    // or one replaced by something else (an error page, every row invalid
    // under --skip-invalid): carrying nothing over would drop every
    // result, and the file restored would send them again.
    let finished = old.done + old.failed;
    if valid == 0 && finished > 0 {
        return Err(RunError::Usage(format!(
            "{} holds no valid items now, where its job {} finished {finished}: running on it \
             would drop their results from the checkpoint and the outputs. Nothing was sent \
             and nothing changed. Restore the file (an export cut short?) and run again; to \
             start over, use another --state-dir",
            super::job::shown_input(settings),
            old.id
        )));
    }
    let so = "batches are formed from blocks of lines, which moved, so they would go again";
    check_moved_batches(
        settings,
        items,
        old,
        ("changed since its checkpoint was made,", so),
    )?;
    if settings.shard.is_some() && !old.shards_by_content {
        return Err(RunError::Usage(format!(
            "{} changed since its checkpoint was made, and this shard's job (made before \
             shards followed content) splits the input by line: rows moved between shards, \
             and a shard cannot know what another did. Run every shard on the input it was \
             made from, or start the shards again on this one with --fresh",
            super::job::shown_input(settings)
        )));
    }
    Ok(())
}

/// `--keep-done` on a changed request: the pending items go under the new
/// request's keys, and `--retry-failed` sends the failed ones so too. An
/// item failed with its outcome unknown may have run under the earlier
/// request's key: sent under a new one, an API that ran it runs it again.
/// Refused while there are any; `--retry-failed` with the earlier request
/// settles them first.
fn refuse_unknown_under_new_keys(
    store: &Store,
    settings: &Settings,
    old: &JobMeta,
) -> Result<(), RunError> {
    let items = store.items(&old.id).context("opening the checkpoint")?;
    let unknown = items.unknown_failures().context("reading the checkpoint")?;
    if unknown == 0 {
        return Ok(());
    }
    Err(RunError::Usage(format!(
        "--keep-done: {unknown} item(s) of job {} on {} failed with their outcome unknown: \
         their calls may have run under the earlier request's keys, and the new request \
         would send them again under its own. Nothing was sent. Run the earlier command \
         with --retry-failed to settle them (the API replays what ran), then change the \
         request; or use --fresh to send every item again",
        old.id,
        settings.input.display()
    )))
}

/// `--fresh` means "run them again": the job `id` (`old`) is discarded,
/// and its items go under the next epoch's keys.
fn fresh(store: &Store, id: &str, old: Option<&JobMeta>, epoch: u32) -> Result<u32, RunError> {
    if let Some(old) = old {
        if old.done > 0 {
            crate::report::err_line(&format!(
                "batchrun: --fresh: the {} item(s) done are sent again, under new \
                 Idempotency-Keys",
                old.done
            ));
        }
        warn_unknown(store, old);
    }
    store.discard_job(id).context("discarding the checkpoint")?;
    Ok(epoch.saturating_add(1))
}

/// Records how this run forms its calls, on disk before any call: a run
/// killed after its first batch must find how it formed them.
fn record_batching(
    store: &Store,
    formation: Option<&Formation>,
    meta: &mut JobMeta,
) -> Result<(), RunError> {
    let batching = formation.map(|f| f.how.clone());
    if meta.batching != batching {
        meta.batching = batching;
        store.save_job(meta).context("writing the checkpoint")?;
        store.flush().context("flushing the checkpoint")?;
    }
    Ok(())
}

/// How this run forms its calls: as asked, unless some of the last run's
/// calls may have run unanswered (a run killed with calls in flight, or
/// items failed with their outcome unknown, sent again by
/// `--retry-failed`) and it formed them otherwise. A batch's
/// Idempotency-Key is made of its items': formed otherwise, those items
/// would go under other keys, and an API that ran them would run them
/// again. Refused then; a shard's job begun with blocks of lines keeps
/// them instead (its user changed nothing).
fn check_batching(
    settings: &Settings,
    items: &JobItems,
    meta: &JobMeta,
) -> Result<Option<Formation>, RunError> {
    let asked = Formation::asked(settings);
    let now = asked.as_ref().map(|f| f.how.clone());
    if now == meta.batching || settings.fresh {
        return Ok(asked);
    }
    // Failed ones too, whether or not this run sends them: a run that
    // recorded the new batching would let a later --retry-failed by.
    let why = match may_have_run(items, meta)? {
        (0, false) => return Ok(asked),
        (0, true) => "a run of this job was killed, or stopped before its calls in flight came back: those calls".to_string(),
        (n, _) => format!("{n} item(s) failed with their outcome unknown: their calls"),
    };
    if let Some(lines) =
        Formation::by_lines(settings).filter(|f| meta.batching.as_deref() == Some(f.how.as_str()))
    {
        return Ok(Some(lines));
    }
    let way = |b: &Option<String>| match b {
        Some(b) => format!("in batches ({b})"),
        None => "one item per call".to_string(),
    };
    let (was, is) = (way(&meta.batching), way(&now));
    Err(RunError::Usage(format!(
        "{why} may have run, sent {was}; this run would send them {is}, under other \
         Idempotency-Keys, and the API could run them twice. Nothing was sent. Run {was} \
         until every item is finished (--retry-failed for those of unknown outcome; the API \
         replays what already ran), then change it; or use --fresh to send every item again"
    )))
}

/// Calls of `meta` that may have run with nothing recorded: how many items
/// failed with their outcome unknown, and whether a run of it was killed
/// with items pending.
fn may_have_run(items: &JobItems, meta: &JobMeta) -> Result<(u64, bool), RunError> {
    let unknown = items.unknown_failures().context("reading the checkpoint")?;
    Ok((unknown, super::job::unsettled(meta)))
}

/// An input that moved its lines (`what` happened to it, and `so` what
/// follows for its batches) while calls of the job `old` may have run in
/// batches: a batch is formed from a block of lines, so those calls would
/// go in other batches, under other keys. Refused; one item per call is
/// safe (its key follows its content).
fn check_moved_batches(
    settings: &Settings,
    items: &JobItems,
    old: &JobMeta,
    (what, so): (&str, &str),
) -> Result<(), RunError> {
    if settings.batch.is_none() || old.batching.is_none() || settings.fresh {
        return Ok(());
    }
    let why = match may_have_run(items, old)? {
        (0, false) => return Ok(()),
        (0, true) => "a run was killed, stopped with calls in flight, or halted with calls \
                      that timed out or went unrecorded"
            .to_string(),
        (n, _) => format!("{n} item(s) of unknown outcome"),
    };
    Err(RunError::Usage(format!(
        "{} {what} while calls of this job may have run in batches ({why}): {so}, under \
         another Idempotency-Key, and the API could run them twice. Nothing was sent. Run the \
         file as it was until every item is finished (--retry-failed for those of unknown \
         outcome); or use --fresh to send every item again",
        settings.input.display()
    )))
}

/// Whether the input only grew since the job `old` was made: it keeps the
/// job, its old lines unchanged.
fn grown(settings: &Settings, old: &JobMeta, scan: &input::Scan) -> bool {
    old.fingerprint != scan.fingerprint && super::job::grew(settings, old)
}

/// Catches the line states up with the results log, then checks them
/// against their counts and the input, and every result they vouch for,
/// before any call. A database that went back to an older or empty state
/// (cut short, damaged bytes) opens without an error: what the log holds
/// beyond it is taken from the log, never sent again.
fn check_checkpoint(
    settings: &Settings,
    items: &JobItems,
    meta: &mut JobMeta,
    last_line: u64,
) -> Result<(), RunError> {
    let dir = &settings.state_dir;
    let adopted = items
        .adopt_logged(meta, last_line)
        .map_err(|e| damaged(dir, e))?;
    if adopted > 0 {
        crate::report::err_line(&format!(
            "batchrun: the checkpoint database in {} did not record {adopted} finished item(s) \
             that its results log holds (damaged or an older copy, or a run killed before it \
             recorded them): they are taken from the log and not sent again",
            dir.display()
        ));
    }
    items
        .check_counts(meta, last_line)
        .and_then(|()| items.check_results())
        .map_err(|e| damaged(dir, e))
}

/// A job on this input made for another request has items done: a new job
/// would send them again. The run stops before any call and says what
/// differs, unless told which way to go: `--keep-done` carries the job over
/// to the new request, `--fresh` starts a new job. Jobs on the input with
/// nothing done are replaced by the new one. Returns the job's id, and the
/// jobs whose outputs it takes over.
fn changed_request(
    store: &Store,
    settings: &Settings,
    located: &Located,
) -> Result<(String, Vec<String>), RunError> {
    let discard = |ids: &mut dyn Iterator<Item = &String>| -> Result<Vec<String>, RunError> {
        let mut gone = Vec::new();
        for id in ids {
            store.discard_job(id).context("discarding the checkpoint")?;
            gone.push(id.clone());
        }
        Ok(gone)
    };
    let Some(old) = located
        .changed
        .iter()
        .max_by_key(|m| (m.done, m.created_unix))
    else {
        let gone = discard(&mut located.idle.iter())?;
        return Ok((located.id.clone(), gone));
    };
    let others = located
        .changed
        .iter()
        .filter(|m| m.id != old.id)
        .map(|m| &m.id);
    let pending = old.total.saturating_sub(old.done + old.failed);
    if super::job::unsettled(old) && !settings.fresh {
        return Err(RunError::Usage(format!(
            "the request changed since job {} on {}, whose run was killed with items pending (or \
             stopped before its calls in flight came back, or halted with calls that timed out or \
             went unrecorded): those calls may have run under the \
             earlier request's keys, and the new request would send them again under its own. \
             Nothing was sent. Run the earlier \
             command once more to settle them (the API replays what ran), then change the \
             request; or use --fresh to send every item again",
            old.id,
            settings.input.display()
        )));
    }
    if settings.keep_done {
        refuse_unknown_under_new_keys(store, settings, old)?;
        let mut gone = discard(&mut others.chain(located.idle.iter()))?;
        let mut meta = old.clone();
        meta.template = settings.identity.clone();
        // The pending items go under the new request's keys.
        meta.key_base = Some(located.id.clone());
        store.save_job(&meta).context("writing the checkpoint")?;
        crate::report::err_line(&format!(
            "batchrun: --keep-done: the request changed; the {} item(s) of job {} finished \
             under the earlier request stay done, and the pending ones go under the new one",
            old.done + old.failed,
            old.id
        ));
        gone.push(old.id.clone());
        return Ok((old.id.clone(), gone));
    }
    if settings.fresh {
        crate::report::err_line(&format!(
            "batchrun: --fresh: the request changed; the {} item(s) done under the earlier \
             request (job {}) are sent again under the new one, under new Idempotency-Keys",
            old.done, old.id
        ));
        let all = located
            .changed
            .iter()
            .map(|m| &m.id)
            .chain(located.idle.iter());
        let gone = discard(&mut all.collect::<Vec<_>>().into_iter())?;
        return Ok((located.id.clone(), gone));
    }
    let diff = super::job::request_diff(&settings.keyless(&old.template), &settings.identity);
    Err(RunError::Usage(format!(
        "the request changed since job {} on {} ({} of {} item(s) done, {pending} pending); \
         this command differs in:\n  {}\nNothing was sent. Run it again with --keep-done to \
         keep those {} item(s) done (their results kept) and send only the pending ones under \
         the new request, or with --fresh to start over under the new request (the {} \
         executed item(s) are sent again)",
        old.id,
        settings.input.display(),
        old.done,
        old.total,
        diff.join("\n  "),
        old.done,
        old.done
    )))
}

/// The input's rows skipped by `--skip-invalid`: line and reason.
type Invalid = Vec<(u64, String)>;

/// The whole input checked before any call: every item parses, and renders
/// unless it will not be sent again; a shard counts its own.
fn scan_input(
    settings: &Settings,
    (shard, order): (Option<crate::fleet::Shard>, input::FieldOrder),
    items: Option<&JobItems>,
) -> Result<(input::Scan, Invalid, Counter), RunError> {
    let spec = &settings.request;
    let len = std::fs::metadata(&settings.input).map_or(0, |m| m.len());
    let repeats = std::cell::RefCell::new(Repeats::sized(len));
    // None: every line is to be sent, and rendered here.
    let states = items.map(JobItems::states);
    let retry_failed = settings.retry_failed;
    let in_shard = std::cell::Cell::new(0u64);
    let ours = |line: u64, digest: Option<u64>| shard.map_or(true, |s| s.takes(line, digest));
    let mut invalid: Invalid = Vec::new();
    let mut skip = |e: input::InputError| {
        let line = e.line().unwrap_or_default();
        if ours(line, None) {
            in_shard.set(in_shard.get() + 1);
            invalid.push((line, e.to_string()));
        }
    };
    let skip: Option<&mut dyn FnMut(input::InputError)> = match settings.skip_invalid {
        true => Some(&mut skip),
        false => None,
    };
    let check = &mut |item: &input::Item| {
        let digest = item.digest();
        repeats.borrow_mut().see(digest);
        let checked = match states.as_ref().and_then(|s| s.state(item.line)) {
            Some(ItemState::Done) => Ok(()),
            Some(ItemState::Failed) if !retry_failed => Ok(()),
            _ => spec.render(item).map(|_| ()),
        };
        // A row that does not render is counted by `skip` (with
        // --skip-invalid): counted here too, the feeder would look for an
        // item more than the file holds and call the input changed.
        if checked.is_ok() {
            in_shard.set(in_shard.get() + u64::from(ours(item.line, Some(digest))));
        }
        checked
    };
    let mut scan = tokio::task::block_in_place(|| {
        input::scan_with(&settings.input, (settings.format, order), check, skip)
    })?;
    scan.total = in_shard.get();
    Ok((scan, invalid, repeats.into_inner().counter()))
}

/// `--skip-invalid`: the bad rows not yet recorded are failures, with
/// their reason, committed before any call (so the feeder passes them by).
fn record_invalid(items: &JobItems, meta: &mut JobMeta, invalid: Invalid) -> Result<(), RunError> {
    let states = items.states();
    let new: Vec<_> = invalid
        .into_iter()
        .filter(|(line, _)| !states.is_finished(*line))
        .collect();
    drop(states);
    let Some((_, first)) = new.first() else {
        return Ok(());
    };
    crate::report::err_line(&format!(
        "batchrun: --skip-invalid: {} bad row(s) recorded as failed, not sent (the first: {first})",
        new.len()
    ));
    let committer = items
        .committer(meta.clone(), GroupCommit::default())
        .context("opening the results log")?;
    for (line, reason) in new {
        committer
            .record(Record {
                line,
                state: ItemState::Failed,
                status: None,
                attempts: 0,
                payload: reason.into_bytes(),
                unknown: false,
                digest: 0,
            })
            .context("writing the checkpoint")?;
    }
    let committed = committer.finish();
    if let Some(e) = committed.err {
        return Err(anyhow::Error::new(e)
            .context("writing the checkpoint")
            .into());
    }
    if let Some(m) = committed.meta {
        meta.adopt_committed(&m);
    }
    Ok(())
}

impl Opened {
    /// Items of the input not yet finished.
    pub(super) fn pending(&self) -> u64 {
        let counts = self.meta.counts();
        self.scan.total.saturating_sub(counts.done + counts.failed)
    }
}
