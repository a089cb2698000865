//! The checkpoint through its public API: records committed in groups,
//! read back after a reopen, retried, discarded, and upgraded from the old
//! layout.

use super::*;
use crate::checkpoint::log::LogWriter;

fn tmp(tag: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("batchrun-ckpt-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&p);
    p
}

fn new_job(s: &Store, id: &str, total: u64) -> JobMeta {
    let meta = JobMeta {
        id: id.into(),
        input: "/x/in.jsonl".into(),
        total,
        layout: LAYOUT,
        ..JobMeta::default()
    };
    s.save_job(&meta).unwrap();
    meta
}

/// A job of three lines whose first two are committed done.
fn two_of_three_done(s: &Store, id: &str) -> JobItems {
    let meta = new_job(s, id, 3);
    let mut items = s.items(id).unwrap();
    items.reserve_lines(3);
    let c = items.committer(meta, GroupCommit::default()).unwrap();
    c.record(done(1, "{}")).unwrap();
    c.record(done(2, "{}")).unwrap();
    assert!(c.finish().err.is_none());
    items
}

fn done(line: u64, body: &str) -> Record {
    Record {
        line,
        state: ItemState::Done,
        status: Some(200),
        attempts: 1,
        payload: body.as_bytes().to_vec(),
        unknown: false,
        digest: 1,
    }
}

fn payload(items: &JobItems, line: u64) -> Option<(ItemState, Option<u16>, u32, String)> {
    let mut r = items.results();
    let e = r.get(line).unwrap()?;
    let text = String::from_utf8(e.payload.to_vec()).unwrap();
    Some((e.state, e.status, e.attempts, text))
}

#[test]
fn records_survive_reopen_and_count() {
    let dir = tmp("reopen");
    {
        let s = Store::open(&dir).unwrap();
        let meta = new_job(&s, "j1", 3);
        let mut items = s.items("j1").unwrap();
        items.reserve_lines(3);
        let c = items.committer(meta, GroupCommit::default()).unwrap();
        c.record(done(1, r#"{"ok": true}"#)).unwrap();
        c.record(Record {
            line: 3,
            state: ItemState::Failed,
            status: Some(422),
            attempts: 1,
            payload: b"bad".to_vec(),
            unknown: false,
            digest: 1,
        })
        .unwrap();
        let committed = c.finish();
        assert!(committed.err.is_none(), "{:?}", committed.err);
        let meta = committed.meta.unwrap();
        assert_eq!(meta.counts(), Counts { done: 1, failed: 1 });
        s.flush().unwrap();
    }
    let s = Store::open(&dir).unwrap();
    assert_eq!(s.job("j1").unwrap().unwrap().total, 3);
    assert_eq!(s.jobs_for_input("/x/in.jsonl").unwrap().len(), 1);
    let items = s.items("j1").unwrap();
    assert_eq!(items.counts().unwrap(), Counts { done: 1, failed: 1 });
    assert_eq!(
        items.states().counts(),
        items.counts().unwrap(),
        "record and bits agree"
    );
    assert_eq!(payload(&items, 2), None);
    assert_eq!(
        payload(&items, 1),
        Some((ItemState::Done, Some(200), 1, r#"{"ok": true}"#.into())),
        "the body as it came, unparsed"
    );
    assert_eq!(
        payload(&items, 3),
        Some((ItemState::Failed, Some(422), 1, "bad".into()))
    );
    assert_eq!(items.generation(3).unwrap(), 0);
    assert!(!items.any_reopened());
    let mut meta = s.job("j1").unwrap().unwrap();
    assert_eq!(items.clear_failed(&mut meta).unwrap(), 1);
    assert_eq!(
        items.generation(3).unwrap(),
        1,
        "a retried item gets a new key"
    );
    assert!(items.any_reopened());
    assert_eq!(items.generation(1).unwrap(), 0, "a done item keeps its key");
    assert_eq!(items.counts().unwrap(), Counts { done: 1, failed: 0 });
    assert_eq!(meta.counts(), Counts { done: 1, failed: 0 });
    assert_eq!(items.states().state(3), None);
    assert_eq!(payload(&items, 3), None);
    let log = s.log_path("j1");
    assert!(log.exists());
    s.discard_job("j1").unwrap();
    assert!(s.job("j1").unwrap().is_none());
    assert!(!log.exists(), "--fresh removes the results log");
    let items = s.items("j1").unwrap();
    assert_eq!(items.counts().unwrap(), Counts::default());
    assert_eq!(items.states().counts(), Counts::default());
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_job_record_that_disagrees_with_its_line_states_is_damage() {
    let dir = tmp("counts");
    let s = Store::open(&dir).unwrap();
    let items = two_of_three_done(&s, "j4");
    let meta = s.job("j4").unwrap().unwrap();
    items.check_counts(&meta, 3).unwrap();
    // The input ends before a line the checkpoint has a result for.
    let e = items.check_counts(&meta, 1).unwrap_err().to_string();
    assert!(e.contains("line 2, past"), "{e}");
    // The record restored from an older copy, apart from its lines.
    let mut old = meta.clone();
    old.done = 1;
    s.save_job(&old).unwrap();
    let items = s.items("j4").unwrap();
    let e = items.check_counts(&old, 3).unwrap_err().to_string();
    assert!(e.contains("1 done") && e.contains("2 done"), "{e}");
    // A record lost (and made anew) while the lines stayed.
    let blank = JobMeta {
        id: "j4".into(),
        ..JobMeta::default()
    };
    assert!(items.check_counts(&blank, 3).is_err());
    drop((items, s));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn retry_failed_keeps_the_key_of_an_item_whose_outcome_is_unknown() {
    let dir = tmp("unknown");
    let s = Store::open(&dir).unwrap();
    let meta = new_job(&s, "j3", 3);
    let mut items = s.items("j3").unwrap();
    items.reserve_lines(3);
    let c = items.committer(meta, GroupCommit::default()).unwrap();
    // Timed out (may have run), answered 500, never answered (refused).
    for (line, unknown, status) in [(1, true, None), (2, false, Some(500)), (3, false, None)] {
        c.record(Record {
            line,
            state: ItemState::Failed,
            status,
            attempts: 5,
            payload: b"failed".to_vec(),
            unknown,
            digest: 1,
        })
        .unwrap();
    }
    assert!(c.finish().err.is_none());
    let mut meta = s.job("j3").unwrap().unwrap();
    assert_eq!(items.clear_failed(&mut meta).unwrap(), 3);
    assert_eq!(
        items.generation(3).unwrap(),
        0,
        "never answered: the same key, under which a killed run's call may have run"
    );
    assert_eq!(
        items.generation(1).unwrap(),
        0,
        "the call may have run: same key, so the server replays it"
    );
    assert_eq!(items.generation(2).unwrap(), 1, "a known failure: new key");
    assert_eq!(
        items.carried(1).unwrap(),
        (0, true),
        "may have run: remembered"
    );
    assert_eq!(items.carried(2).unwrap(), (1, false));
    // Failed again, unknown again: still the same key.
    let c = items.committer(meta, GroupCommit::default()).unwrap();
    c.record(Record {
        line: 1,
        state: ItemState::Failed,
        status: Some(504),
        attempts: 5,
        payload: b"gateway timeout".to_vec(),
        unknown: true,
        digest: 1,
    })
    .unwrap();
    assert!(c.finish().err.is_none());
    let mut meta = s.job("j3").unwrap().unwrap();
    assert_eq!(items.clear_failed(&mut meta).unwrap(), 1);
    assert_eq!(items.generation(1).unwrap(), 0);
    drop((items, s));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_result_in_the_log_but_not_committed_leaves_the_item_pending() {
    let dir = tmp("order");
    let s = Store::open(&dir).unwrap();
    let meta = new_job(&s, "j2", 4);
    // A crash after the log write and before the sled commit: the entry is
    // on disk, nothing points at it.
    let mut w = LogWriter::open(&s.log_path("j2")).unwrap();
    let mut bytes = Vec::new();
    Entry {
        line: 2,
        state: ItemState::Done,
        status: Some(200),
        attempts: 1,
        payload: b"{\"lost\":1}",
        unknown: false,
        digest: Some(9),
    }
    .encode(&mut bytes, w.version());
    w.append(&bytes).unwrap();
    drop(w);
    let mut items = s.items("j2").unwrap();
    items.reserve_lines(4);
    assert_eq!(
        items.states().state(2),
        None,
        "still pending: it is sent again"
    );
    let c = items.committer(meta, GroupCommit::default()).unwrap();
    c.record(done(2, "{\"again\":1}")).unwrap();
    c.record(done(4, "plain text")).unwrap();
    let committed = c.finish();
    assert_eq!(
        committed.meta.unwrap().counts(),
        Counts { done: 2, failed: 0 }
    );
    assert_eq!(items.states().counts(), Counts { done: 2, failed: 0 });
    assert_eq!(payload(&items, 2).unwrap().3, "{\"again\":1}");
    assert_eq!(payload(&items, 4).unwrap().3, "plain text");
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_group_is_committed_when_full_without_waiting_for_its_deadline() {
    let dir = tmp("group");
    let s = Store::open(&dir).unwrap();
    let meta = new_job(&s, "j3", 10);
    let mut items = s.items("j3").unwrap();
    items.reserve_lines(10);
    let policy = GroupCommit {
        max_records: 3,
        max_wait: std::time::Duration::from_secs(3600),
    };
    let c = items.committer(meta, policy).unwrap();
    let backlog = c.backlog();
    for line in 1..=3 {
        c.record(done(line, "{}")).unwrap();
    }
    // A full group holds the feeder back until it is committed, which does
    // not wait for its hour to be up.
    backlog.wait();
    assert_eq!(items.states().counts().done, 3);
    assert_eq!(
        items.counts().unwrap().done,
        3,
        "counts committed with the states"
    );
    c.record(done(4, "{}")).unwrap();
    let committed = c.finish();
    assert_eq!(committed.meta.unwrap().done, 4, "the last group at the end");
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_counts_ride_in_a_small_progress_record_that_wins_only_when_newer() {
    let dir = tmp("progress");
    let s = Store::open(&dir).unwrap();
    let items = two_of_three_done(&s, "j5");
    // The groups wrote the progress record, not the job record.
    let raw: JobMeta = serde_json::from_slice(&s.jobs.get("j5").unwrap().unwrap()).unwrap();
    assert_eq!((raw.done, raw.revision), (0, 0));
    let progress = s.jobs.get(progress_key("j5")).unwrap().unwrap();
    assert_eq!(progress.len(), PROGRESS_LEN);
    let meta = s.job("j5").unwrap().unwrap();
    assert_eq!(meta.counts(), Counts { done: 2, failed: 0 });
    assert_eq!(s.items("j5").unwrap().counts().unwrap(), meta.counts());
    assert_eq!(s.jobs().unwrap().len(), 1, "the progress record is no job");
    assert_eq!(s.jobs().unwrap()[0].counts(), meta.counts());
    s.items("j5").unwrap().check_counts(&meta, 3).unwrap();
    // A job record written later (a newer revision) carries the counts.
    let mut newer = meta.clone();
    newer.revision += 1;
    newer.done = 1;
    s.save_job(&newer).unwrap();
    assert_eq!(s.job("j5").unwrap().unwrap().done, 1);
    // A damaged progress record is damage, not a guess.
    s.jobs.insert(progress_key("j5"), &[1u8, 2, 3][..]).unwrap();
    let e = s.job("j5").unwrap_err().to_string();
    assert!(e.contains("progress record"), "{e}");
    // --fresh starts the counts again from the job record it makes.
    s.discard_job("j5").unwrap();
    assert!(s.jobs.get(progress_key("j5")).unwrap().is_none());
    drop((items, s));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_job_record_from_before_shape_learning_opens_with_a_window_learnt() {
    let dir = tmp("learnt-shape");
    let s = Store::open(&dir).unwrap();
    let mut meta = new_job(&s, "j9", 3);
    meta.learnt_limit = Some(6);
    // What an older version wrote: the learnt limit and no shape.
    let mut old = serde_json::to_value(&meta).unwrap();
    old.as_object_mut().unwrap().remove("learnt_burst");
    old.as_object_mut().unwrap().remove("learnt_fixed_too");
    old.as_object_mut().unwrap().remove("learnt_fixed");
    old.as_object_mut().unwrap().remove("learnt_most");
    s.jobs
        .insert("j9", serde_json::to_vec(&old).unwrap())
        .unwrap();
    let read = s.job("j9").unwrap().unwrap();
    assert_eq!((read.learnt_limit, read.learnt_burst), (Some(6), None));
    assert_eq!((read.learnt_fixed_too, read.learnt_fixed), (None, false));
    assert_eq!(read.learnt_most, None);
    // And a bucket learnt is kept with its burst, and the fixed window its
    // refusal would switch to.
    meta.learnt_burst = Some(5);
    meta.learnt_fixed_too = Some(4);
    s.save_job(&meta).unwrap();
    let read = s.job("j9").unwrap().unwrap();
    assert_eq!((read.learnt_limit, read.learnt_burst), (Some(6), Some(5)));
    assert_eq!(read.learnt_fixed_too, Some(4));
    // And a fixed window learnt is kept as one.
    meta.learnt_burst = None;
    meta.learnt_fixed = true;
    s.save_job(&meta).unwrap();
    assert!(s.job("j9").unwrap().unwrap().learnt_fixed);
    // And the most a fit allowed, above which a resumed run does not probe.
    meta.learnt_most = Some(10);
    s.save_job(&meta).unwrap();
    assert_eq!(s.job("j9").unwrap().unwrap().learnt_most, Some(10));
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_job_recorded_before_field_order_was_left_out_keeps_it() {
    // A record as an older batchrun wrote it: no such field.
    let mut record = serde_json::to_value(JobMeta::default()).unwrap();
    record.as_object_mut().unwrap().remove("any_field_order");
    let old: JobMeta = serde_json::from_value(record).unwrap();
    assert_eq!(old.field_order(), crate::input::FieldOrder::Kept);
    let new = JobMeta {
        any_field_order: true,
        ..old
    };
    let again: JobMeta = serde_json::from_str(&serde_json::to_string(&new).unwrap()).unwrap();
    assert_eq!(again.field_order(), crate::input::FieldOrder::Ignored);
}
