//! The pool's per-call logic on a scripted transport and tokio's paused
//! clock: no server, no binary.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinSet;

use super::events::Event;
use super::gate::{Gate, Halt};
use super::pool::{Pool, PoolConfig, Queue};
use crate::credits::Ledger;
use crate::exit::RunState;
use crate::input::Item;
use crate::pace::{Pacer, Unpaced};
use crate::rate::backoff::Backoff;
use crate::request::{Body, RequestSpec};
use crate::secret::Secret;
use crate::template::Template;
use crate::transport::fake::{FakeTransport, Step};
use crate::transport::Request;

fn spec() -> Arc<RequestSpec> {
    Arc::new(RequestSpec {
        method: reqwest::Method::GET,
        url: Template::parse("http://api.test/v1/echo?n={n}").unwrap(),
        headers: Vec::new(),
        body: Body::None,
        key_header: crate::wire::API_KEY,
        key: Some(Secret::new("k")),
    })
}

/// A pool of `workers` over `n` items answered by `script`; returns what
/// the transport saw, every event, and the halt.
async fn run_pool(
    n: u64,
    workers: usize,
    wait_for_credits: bool,
    script: impl Fn(&Request, u64) -> Step + Send + Sync + 'static,
) -> (Arc<FakeTransport>, Vec<Event>, Option<Halt>) {
    let transport = Arc::new(FakeTransport::new(script));
    let (tx, mut rx) = mpsc::unbounded_channel();
    let pacer: Arc<dyn Pacer> = Arc::new(Unpaced::default());
    let pool = Arc::new(Pool {
        spec: spec(),
        transport: transport.clone(),
        pacer,
        gate: Arc::new(Gate::new(Duration::from_secs(60))),
        ledger: Ledger::new(None, None, None, false),
        events: tx,
        cfg: PoolConfig {
            keys: super::keys::KeyScheme {
                job: "test".into(),
                epoch: 0,
                varying: Vec::new(),
                by_content: true,
                sorted_body: false,
            },
            policy: super::react::Policy {
                max_attempts: 5,
                default_pause: Duration::from_secs(30),
                backoff: Backoff::default(),
                wait_for_credits,
                max_wait: Duration::from_secs(600),
                wait_for_quota: false,
            },
            verbose: false,
            cost: None,
            max_body: 1 << 20,
        },
        limited_since: std::sync::Mutex::new(None),
        got_through: Default::default(),
        refusals_in_a_row: Default::default(),
        deferred: Default::default(),
        long_wait_said: Default::default(),
        scrub_said: Default::default(),
        watch: super::watch::Watch::new(10, None),
        slots: std::sync::Arc::new(super::pool::Slots::new(workers)),
    });
    let (item_tx, item_rx) = mpsc::channel(n as usize + 1);
    for line in 1..=n {
        let value = serde_json::json!({ "n": line });
        let item = Item::new(line, value);
        let queued = super::pool::Queued {
            item,
            generation: 0,
            maybe_ran: false,
            repeat: 0,
            block: 0,
        };
        item_tx.send(queued).await.unwrap();
    }
    drop(item_tx);
    let queue: Queue = Arc::new(tokio::sync::Mutex::new(item_rx));
    let mut set = JoinSet::new();
    for _ in 0..workers {
        set.spawn(pool.clone().worker(queue.clone()));
    }
    // No signal comes: the recorder, which would hear one, is not here.
    let (_stops, stopped) = mpsc::unbounded_channel();
    super::supervise(&pool, &mut set, stopped).await;
    let halt = pool.gate.halt();
    drop(pool);
    let mut events = Vec::new();
    while let Some(e) = rx.recv().await {
        events.push(e);
    }
    (transport, events, halt)
}

fn done_lines(events: &[Event]) -> Vec<u64> {
    let mut v: Vec<u64> = events
        .iter()
        .filter_map(|e| match e {
            Event::Done { line, .. } => Some(*line),
            _ => None,
        })
        .collect();
    v.sort();
    v
}

/// Rate-limit 429s that paused the window (not concurrency 429s).
fn window_pauses(events: &[Event]) -> usize {
    events
        .iter()
        .filter(|e| {
            matches!(
                e,
                Event::RateLimited {
                    concurrency: false,
                    ..
                }
            )
        })
        .count()
}

fn failed(events: &[Event]) -> usize {
    events
        .iter()
        .filter(|e| matches!(e, Event::Failed { .. }))
        .count()
}

#[tokio::test(start_paused = true)]
async fn a_rate_limit_429_pauses_every_worker() {
    let (t, events, halt) = run_pool(8, 4, false, |_, n| {
        if n == 0 {
            Step::status(429, &[("retry-after", "3")], "slow down").after(Duration::from_millis(10))
        } else {
            Step::ok("{}").after(Duration::from_millis(100))
        }
    })
    .await;
    assert_eq!(halt, None);
    assert_eq!(done_lines(&events), (1..=8).collect::<Vec<_>>());
    assert_eq!(failed(&events), 0);
    let calls = t.calls();
    assert_eq!(calls.len(), 9, "eight items and one requeue");
    // The first wave went out at once; every call after the 429 waited
    // out its Retry-After, whichever worker made it.
    assert!(calls[..4].iter().all(|c| c.0 == Duration::ZERO));
    for (at, url, _) in &calls[4..] {
        assert!(*at >= Duration::from_millis(3010), "{url} went at {at:?}");
    }
    // The requeued item was sent again under the same Idempotency-Key.
    let refused = &calls[0].2;
    assert_eq!(calls.iter().filter(|c| &c.2 == refused).count(), 2);
    let paused = window_pauses(&events);
    assert_eq!(paused, 1);
}

#[tokio::test(start_paused = true)]
async fn a_transient_error_is_retried_with_backoff() {
    let (t, events, halt) = run_pool(1, 1, false, |_, n| match n {
        0 => Step::status(503, &[("retry-after", "2")], "busy"),
        1 => Step::fail(crate::transport::FailureKind::Timeout),
        _ => Step::ok("{\"ok\":true}"),
    })
    .await;
    assert_eq!(halt, None);
    let calls = t.calls();
    assert_eq!(calls.len(), 3);
    assert!(
        calls.iter().all(|c| c.2 == calls[0].2),
        "one key for every try"
    );
    // The server's Retry-After beats the formula; then full jitter within
    // the second retry's ceiling.
    assert_eq!(calls[1].0 - calls[0].0, Duration::from_secs(2));
    assert!(calls[2].0 - calls[1].0 <= Backoff::default().ceiling(2));
    let retries = events.iter().filter(|e| matches!(e, Event::Retry)).count();
    assert_eq!(retries, 2);
    match events.iter().find(|e| matches!(e, Event::Done { .. })) {
        Some(Event::Done { attempts, .. }) => assert_eq!(*attempts, 3),
        other => panic!("not done: {other:?}"),
    }
}

/// With one worker, an item the server asks to wait ten minutes is set
/// aside: the others go first, and it goes again under its key, its
/// attempts counted on.
#[tokio::test(start_paused = true)]
async fn an_item_asked_to_wait_long_does_not_hold_its_worker() {
    let (t, events, halt) = run_pool(4, 1, false, |_, n| match n {
        0 => Step::status(503, &[("retry-after", "600")], "busy"),
        _ => Step::ok("{}"),
    })
    .await;
    assert_eq!(halt, None);
    assert_eq!(done_lines(&events), vec![1, 2, 3, 4]);
    let calls = t.calls();
    let lines: Vec<&str> = calls.iter().map(|c| &c.1[c.1.len() - 1..]).collect();
    assert_eq!(lines, ["1", "2", "3", "4", "1"], "{calls:?}");
    assert!(calls[1..4].iter().all(|c| c.0 == Duration::ZERO));
    assert_eq!(calls[4].0, Duration::from_secs(600));
    assert_eq!(calls[4].2, calls[0].2, "the same Idempotency-Key");
    let attempts = events.iter().find_map(|e| match e {
        Event::Done {
            line: 1, attempts, ..
        } => Some(*attempts),
        _ => None,
    });
    assert_eq!(attempts, Some(2));
}

/// An item set aside for a first refusal waits for an answer that tells
/// the key's refusal from its own: the next item's long wait is none.
#[tokio::test(start_paused = true)]
async fn a_refused_item_set_aside_waits_past_an_item_asked_to_wait() {
    let (t, events, halt) = run_pool(4, 1, false, |_, n| match n {
        0 | 3 => Step::status(401, &[], "not for this item"),
        1 => Step::status(503, &[("retry-after", "600")], "busy"),
        _ => Step::ok("{}"),
    })
    .await;
    assert_eq!(halt, None, "the key works: item 3 got through");
    let calls = t.calls();
    let lines: Vec<&str> = calls.iter().map(|c| &c.1[c.1.len() - 1..]).collect();
    assert_eq!(lines, ["1", "2", "3", "1", "4", "2"], "{calls:?}");
    assert_eq!(done_lines(&events), vec![2, 3, 4]);
    assert_eq!(failed(&events), 1, "item 1's refusal is its own");
}

#[tokio::test(start_paused = true)]
async fn exhaustion_halts_with_nothing_failed() {
    let (t, events, halt) = run_pool(10, 2, false, |_, n| {
        if n < 2 {
            Step::ok("{}")
        } else {
            Step::status(429, &[("x-api-remaining-credits", "0")], "no credits")
        }
    })
    .await;
    assert_eq!(halt, Some(Halt::Exhausted));
    assert_eq!(failed(&events), 0, "exhaustion fails nothing");
    assert_eq!(done_lines(&events).len(), 2);
    assert!(t.calls().len() <= 4, "the pool stopped: {:?}", t.calls());
}

#[tokio::test(start_paused = true)]
async fn a_panic_in_a_worker_is_not_reported_as_done() {
    let (_, events, halt) = run_pool(3, 1, false, |_, n| {
        if n == 1 {
            panic!("a bug in a transport");
        }
        Step::ok("{}")
    })
    .await;
    let Some(h @ Halt::Internal(_)) = halt else {
        panic!("no internal halt: {halt:?}");
    };
    assert_eq!(h.state(), RunState::Failed);
    let (state, why) = super::finish::end_state(&Some(h), 2, true, None, "KEY");
    assert_eq!(state, RunState::Failed);
    assert!(why.unwrap().contains("crashed"));
    assert_eq!(done_lines(&events), vec![1]);
}

#[tokio::test(start_paused = true)]
async fn a_server_that_only_rate_limits_halts_after_max_wait() {
    let (t, events, halt) = run_pool(3, 2, false, |_, _| {
        Step::status(429, &[("retry-after", "60")], "slow down")
    })
    .await;
    let Some(h @ Halt::Stalled(for_)) = halt else {
        panic!("not stalled: {halt:?}");
    };
    assert!(for_ >= Duration::from_secs(600), "{for_:?}");
    assert_eq!(h.state(), RunState::Halted, "resumable: exit 75");
    assert_eq!(failed(&events), 0);
    assert!(done_lines(&events).is_empty());
    // One pause after another, each a Retry-After long: about ten minutes.
    assert!(t.calls().len() <= 2 * 12, "{} calls", t.calls().len());
}

#[tokio::test(start_paused = true)]
async fn a_concurrency_429_lowers_the_calls_in_flight_not_the_window() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    // A server that allows two calls in flight and answers 429 with
    // x-concurrency-limit beyond that.
    let now = Arc::new(AtomicUsize::new(0));
    let peak_after = Arc::new(AtomicUsize::new(0));
    let (n2, p2) = (now.clone(), peak_after.clone());
    let (t, events, halt) = run_pool(12, 4, false, move |_, call| {
        let inflight = n2.fetch_add(1, Ordering::SeqCst) + 1;
        let n3 = n2.clone();
        if call >= 8 {
            p2.fetch_max(inflight, Ordering::SeqCst);
        }
        let step = if inflight > 2 {
            Step::status(
                429,
                &[("x-concurrency-limit", "2"), ("retry-after", "1")],
                "busy",
            )
        } else {
            Step::ok("{}").after(Duration::from_millis(200))
        };
        // The fake cannot observe completion, so count it down on a timer
        // matching the step's own duration.
        let after = step.after;
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            n3.fetch_sub(1, Ordering::SeqCst);
        });
        step
    })
    .await;
    assert_eq!(halt, None);
    assert_eq!(done_lines(&events), (1..=12).collect::<Vec<_>>());
    let lowered = events
        .iter()
        .filter(|e| matches!(e, Event::Note(n) if n.contains("at most")))
        .count();
    assert!(lowered >= 1, "never lowered");
    assert!(
        peak_after.load(Ordering::SeqCst) <= 2,
        "still over the ceiling late in the run"
    );
    let paused = window_pauses(&events);
    assert_eq!(paused, 0, "the window was never paused");
    assert!(t.calls().len() >= 12);
}

#[tokio::test(start_paused = true)]
async fn a_call_without_a_verdict_fails_as_unknown_under_one_key() {
    use crate::transport::FailureKind;
    // Item 1 always times out; item 2 is refused with a 400.
    let (t, events, halt) = run_pool(2, 1, false, |req, _| {
        if req.url.ends_with("n=1") {
            Step::fail(FailureKind::Timeout)
        } else {
            Step::status(400, &[], "{\"error\":\"bad\"}")
        }
    })
    .await;
    assert_eq!(halt, None);
    let calls = t.calls();
    let first: Vec<_> = calls.iter().filter(|c| c.1.ends_with("n=1")).collect();
    assert_eq!(first.len(), 5, "every attempt spent");
    assert!(
        first.iter().all(|c| c.2 == first[0].2),
        "one key throughout"
    );
    let mut unknowns = events.iter().filter_map(|e| match e {
        Event::Failed {
            line,
            unknown,
            reason,
            ..
        } => Some((*line, *unknown, reason.clone())),
        _ => None,
    });
    let (a, b) = (unknowns.next().unwrap(), unknowns.next().unwrap());
    let (timed_out, refused) = if a.0 == 1 { (a, b) } else { (b, a) };
    assert!(timed_out.1, "a timeout may have run: {timed_out:?}");
    assert!(
        timed_out.2.starts_with("outcome unknown"),
        "{}",
        timed_out.2
    );
    assert!(!refused.1, "a 400 is a verdict: {refused:?}");
}

#[tokio::test(start_paused = true)]
async fn running_out_of_file_handles_fails_nothing_and_spends_no_attempt() {
    use crate::transport::FailureKind;
    // The first twelve calls find no file handle free; the rest go through.
    let (t, events, halt) = run_pool(4, 4, false, |_, n| {
        if n < 12 {
            Step::fail(FailureKind::Resources)
        } else {
            Step::ok("{}")
        }
    })
    .await;
    assert_eq!(halt, None, "not a systemic failure of the job");
    assert_eq!(failed(&events), 0);
    assert_eq!(done_lines(&events), vec![1, 2, 3, 4]);
    for e in &events {
        if let Event::Done { attempts, .. } = e {
            assert_eq!(*attempts, 1, "an unsent call is no attempt");
        }
    }
    let notes = events
        .iter()
        .filter(|e| matches!(e, Event::Note(n) if n.contains("EMFILE")))
        .count();
    assert_eq!(notes, 1, "said once");
    assert_eq!(t.calls().len(), 16);
}

#[tokio::test(start_paused = true)]
async fn a_call_that_may_have_run_keeps_the_item_unknown_whatever_follows() {
    use crate::transport::FailureKind;
    // The first call times out (it may have run); every retry gets a 503.
    let (_, events, _) = run_pool(1, 1, false, |_, n| match n {
        0 => Step::fail(FailureKind::Timeout),
        _ => Step::status(503, &[], "busy"),
    })
    .await;
    let unknown = events.iter().find_map(|e| match e {
        Event::Failed { unknown, .. } => Some(*unknown),
        _ => None,
    });
    assert_eq!(unknown, Some(true), "a later 503 proves nothing");
}
