use std::collections::{BTreeMap, HashMap, HashSet};

use proptest::prelude::*;
use serde_json::json;

use super::*;

fn spec() -> BatchSpec {
    BatchSpec {
        size: 3,
        body: None,
        results: "/results".into(),
        status: None,
        weight: Default::default(),
    }
}

fn req(body: &str) -> Request {
    Request {
        method: reqwest::Method::POST,
        url: "http://h/batch/echo".into(),
        headers: Default::default(),
        body: Some(body.as_bytes().to_vec()),
    }
}

fn members(lines: &[u64]) -> Vec<Member> {
    lines
        .iter()
        .map(|&line| Member {
            line,
            digest: line,
            attempts: 1,
        })
        .collect()
}

#[test]
fn the_batch_is_the_array_of_the_items_bodies_in_its_template() {
    let (a, b) = (req(r#"{"n":1}"#), req(r#"{"n":2}"#));
    let r = assemble(&spec(), &[&a, &b]).unwrap();
    assert_eq!(r.body.as_deref(), Some(br#"[{"n":1},{"n":2}]"#.as_slice()));
    assert_eq!(r.headers[reqwest::header::CONTENT_TYPE], "application/json");
    let wrapped = BatchSpec {
        body: Some(crate::request::BatchBody::parse(r#"{{"requests": {items}}}"#).unwrap()),
        ..spec()
    };
    let r = assemble(&wrapped, &[&a]).unwrap();
    assert_eq!(
        r.body.as_deref(),
        Some(br#"{"requests": [{"n":1}]}"#.as_slice())
    );
    let err = assemble(&spec(), &[&a, &req("n=3")]).unwrap_err();
    assert!(err.contains("not JSON"), "{err}");
}

#[test]
fn a_batch_key_is_its_items_keys_in_order() {
    let k = |ks: &[&str]| batch_key(&ks.iter().map(|s| s.to_string()).collect::<Vec<_>>());
    assert_eq!(k(&["a", "b"]), k(&["a", "b"]), "the same in any run");
    assert_ne!(k(&["a", "b"]), k(&["b", "a"]));
    assert_ne!(k(&["a", "b"]), k(&["a"]));
    assert_ne!(k(&["ab"]), k(&["a", "b"]));
    assert!(k(&["a"]).starts_with("batchrun-") && k(&["a"]).len() == 9 + 32);
}

#[test]
fn elements_pair_by_position_only_when_the_count_is_right() {
    let body = json!({"results": [{"status": 200}, {"code": "404"}, {"x": 1}]}).to_string();
    let e = pair(&spec(), 207, &body, 3).unwrap();
    let statuses: Vec<u16> = e.iter().map(|e| e.status).collect();
    assert_eq!(statuses, [200, 404, 207], "its own, else the call's");
    for (body, why) in [
        (
            json!({"results": [{}, {}]}).to_string(),
            "holds 2 results for 3 items",
        ),
        (json!({"data": []}).to_string(), "nothing at /results"),
        (json!({"results": {}}).to_string(), "no array at /results"),
        ("<html>".to_string(), "not JSON"),
    ] {
        let err = pair(&spec(), 200, &body, 3).unwrap_err();
        assert!(err.reason.contains(why), "{err}");
        assert_eq!(err.no_array, !why.contains("results for"), "{err}");
    }
    let bare = json!([{"status": "ok", "state": {"http": 409}}]).to_string();
    let pointed = BatchSpec {
        status: Some("/state/http".into()),
        ..spec()
    };
    assert_eq!(pair(&pointed, 200, &bare, 1).unwrap()[0].status, 409);
    assert_eq!(
        tally(&spec(), 200, &body).settled,
        2,
        "the 200 and the one without a status"
    );
}

#[test]
fn each_item_is_settled_by_its_own_status() {
    let unpaid = Element {
        exhausted: true,
        ..el(402)
    };
    let s = settle(
        &members(&[1, 2, 3, 4, 5]),
        vec![el(200), unpaid, el(503), el(422), el(201)],
        THROUGH,
        5,
    );
    assert_eq!((s.unpaid.clone(), s.again.clone()), (vec![1], vec![2]));
    let lines: Vec<(u64, bool)> = s
        .record
        .iter()
        .map(|e| match e {
            Event::Done { line, .. } => (*line, true),
            Event::Failed {
                line,
                status,
                reason,
                ..
            } => {
                assert_eq!(*status, Some(422));
                assert!(
                    reason.contains("HTTP 422") && reason.contains("why"),
                    "{reason}"
                );
                (*line, false)
            }
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(lines, [(1, true), (4, false), (5, true)]);
    // Out of attempts, a transient item fails with its own status.
    let s = settle(&members(&[9]), vec![el(503)], THROUGH, 1);
    assert!(matches!(
        s.record[..],
        [Event::Failed {
            status: Some(503),
            ..
        }]
    ));
    // A 429 with the credits at 0 is the credits', not the rate's.
    let out = Credits {
        out: true,
        got_through: true,
    };
    assert_eq!(verdict(429, false, out), Verdict::Unpaid);
    assert_eq!(verdict(429, false, THROUGH), Verdict::Limited);
}

#[test]
fn an_items_429_is_a_rate_limit_that_never_fails_it() {
    let limited = |body: serde_json::Value| Element {
        status: 429,
        body: body.to_string(),
        exhausted: false,
    };
    let elements = vec![
        limited(json!({"status": 429, "error": "slow down"})),
        el(200),
        limited(json!({"status": 429, "retry_after": "2"})),
        // What it says beside its 429 makes it no concurrency ceiling.
        limited(json!({"status": 429, "error": "too many concurrent requests", "Retry-After": 1})),
    ];
    // Others of the call accepted: the refusals are the items' own, each
    // an attempt, and at the last one they fail.
    let own = settle(&members(&[3, 4, 6, 9]), elements.clone(), THROUGH, 1);
    assert!(own.own && own.limited.is_empty(), "{own:?}");
    assert_eq!(own.record.len(), 4, "{own:?}");
    let s = settle(&members(&[3, 4, 6, 9]), elements, THROUGH, 2);
    assert!(s.own, "{s:?}");
    assert_eq!(s.limited, [0, 2, 3]);
    assert!(s.again.is_empty() && s.unpaid.is_empty(), "{s:?}");
    assert!(
        matches!(s.record[..], [Event::Done { line: 4, .. }]),
        "{s:?}"
    );
    // Every worker pauses as long as the longest element asked; the
    // first one's words are what the pause line quotes.
    let limit = s.limit.expect("a pause");
    assert_eq!(limit.retry_after, Some(Duration::from_secs(2)));
    assert_eq!(limit.message, "slow down");
    // Nothing asked: the run's default pause. Every element a 429: a
    // rate limit, which never fails an item, out of attempts or not.
    let s = settle(&members(&[1, 2]), vec![el(429), el(429)], THROUGH, 1);
    assert!(
        !s.own && s.record.is_empty() && s.limited == [0, 1],
        "{s:?}"
    );
    assert_eq!(s.limit.map(|l| l.retry_after), Some(None));
}

#[test]
fn an_answer_of_nothing_but_429s_is_a_rate_limit_for_max_wait() {
    let body = |v: serde_json::Value| json!({ "results": v }).to_string();
    let all = body(json!([{"status": 429}, {"status": 429, "error": "slow down"}]));
    assert!(tally(&spec(), 200, &all).all_limited);
    let one_done = body(json!([{"status": 429}, {"status": 200}]));
    let t = tally(&spec(), 200, &one_done);
    assert_eq!((t.settled, t.all_limited), (1, false));
    // The credits', not the rate's.
    let out = body(json!([{"status": 429, "code": "credits_exhausted"}]));
    assert!(!tally(&spec(), 200, &out).all_limited);
    assert!(!tally(&spec(), 200, &body(json!([]))).all_limited);
}

/// An element with its own status and an error.
fn el(status: u16) -> Element {
    Element {
        status,
        body: json!({"status": status, "error": "why"}).to_string(),
        exhausted: false,
    }
}

/// Credits left, and calls of the run got through.
const THROUGH: Credits = Credits {
    out: false,
    got_through: true,
};

#[test]
fn a_402_is_the_accounts_only_when_the_credits_say_so() {
    // Credits left and calls done: an add-on this item lacks. It fails
    // with its status, as unbatched; halting would halt every run on it.
    assert_eq!(verdict(402, false, THROUGH), Verdict::Failed);
    let s = settle(
        &members(&[14, 15, 16]),
        vec![el(200), el(402), el(200)],
        THROUGH,
        5,
    );
    assert!(s.unpaid.is_empty(), "{s:?}");
    assert!(matches!(
        s.record[1],
        Event::Failed {
            line: 15,
            status: Some(402),
            ..
        }
    ));
    // The credits say they are out: the headers, or the element's code.
    let out = Credits {
        out: true,
        got_through: true,
    };
    assert_eq!(verdict(402, false, out), Verdict::Unpaid);
    assert_eq!(verdict(402, true, THROUGH), Verdict::Unpaid);
    // Nothing got through yet: a bare 402 is the account's, as unbatched.
    let first = Credits {
        out: false,
        got_through: false,
    };
    assert_eq!(verdict(402, false, first), Verdict::Unpaid);
}

#[test]
fn too_large_is_a_413_or_says_so() {
    assert!(too_large(Some(413), "Payload Too Large"));
    assert!(too_large(Some(400), "Batch too large: 60 items"));
    assert!(!too_large(Some(400), "bad field"));
    assert!(!too_large(None, "batch too large"));
}

/// What the model server below answers for an item: its fate.
#[derive(Debug, Clone, Copy)]
enum Fate {
    Ok,
    /// Fails for good with its own 404.
    Missing,
    /// A 503 of its own the first time, then done.
    Flaky,
}

proptest! {
    /// Batches of random sizes, several in flight answered in any order,
    /// per-item statuses, answers cut short, and interruptions (answers
    /// never heard) at random points: every item ends exactly once in the
    /// results or the failures, with its own element.
    #[test]
    fn every_item_ends_once_with_its_own_element(
        n in 1u64..80,
        size in 1usize..12,
        seed in any::<u64>(),
    ) {
        let mut rng = fastrand::Rng::with_seed(seed);
        let fates: Vec<Fate> = (0..n)
            .map(|_| match rng.u8(0..10) {
                0 => Fate::Missing,
                1 => Fate::Flaky,
                _ => Fate::Ok,
            })
            .collect();
        let fate = |l: u64| fates[(l - 1) as usize];
        let mut recorded: BTreeMap<u64, Event> = BTreeMap::new();
        let mut stored: HashMap<(String, usize), serde_json::Value> = HashMap::new();
        let mut flaked: HashSet<u64> = HashSet::new();
        for _round in 0..500 {
            let pending: Vec<u64> = (1..=n).filter(|l| !recorded.contains_key(l)).collect();
            if pending.is_empty() {
                break;
            }
            let mut batches: Vec<Vec<u64>> = pending
                .chunks(size)
                .take(rng.usize(1..4))
                .map(<[u64]>::to_vec)
                .collect();
            rng.shuffle(&mut batches);
            let heard = rng.usize(0..=batches.len());
            for (i, b) in batches.iter().enumerate() {
                let keys: Vec<String> = b.iter().map(|l| format!("item-{l}")).collect();
                let key = batch_key(&keys);
                let mut array: Vec<serde_json::Value> = b
                    .iter()
                    .enumerate()
                    .map(|(pos, &l)| {
                        if let Some(e) = stored.get(&(key.clone(), pos)) {
                            return e.clone();
                        }
                        let e = match fate(l) {
                            Fate::Missing => json!({"status": 404, "error": "no such item"}),
                            Fate::Flaky if flaked.insert(l) => json!({"status": 503}),
                            _ => json!({"status": 200, "data": {"n": l}}),
                        };
                        if e["status"] != 503 {
                            stored.insert((key.clone(), pos), e.clone());
                        }
                        e
                    })
                    .collect();
                if i >= heard {
                    continue;
                }
                if rng.u8(0..6) == 0 {
                    array.pop();
                }
                let body = json!({"status": "ok", "results": array}).to_string();
                let Ok(elements) = pair(&spec(), 200, &body, b.len()) else {
                    continue;
                };
                let s = settle(&members(b), elements, THROUGH, 5);
                for ev in s.record {
                    let line = match &ev {
                        Event::Done { line, .. } | Event::Failed { line, .. } => *line,
                        other => panic!("{other:?}"),
                    };
                    prop_assert!(b.contains(&line));
                    prop_assert!(recorded.insert(line, ev).is_none(), "line {} twice", line);
                }
            }
        }
        prop_assert_eq!(recorded.len() as u64, n);
        for (line, ev) in &recorded {
            match ev {
                Event::Done { body, .. } => {
                    let v: serde_json::Value = serde_json::from_slice(body).unwrap();
                    prop_assert_eq!(&v["data"]["n"], &json!(line));
                }
                Event::Failed { status, .. } => {
                    prop_assert!(matches!(fate(*line), Fate::Missing));
                    prop_assert_eq!(*status, Some(404));
                }
                other => panic!("{other:?}"),
            }
        }
    }
}

/// Items as (line, tokens) for [`cut`].
fn cut_all(mut pending: Vec<(u64, u64)>, size: usize, most: Option<u64>) -> Vec<Vec<u64>> {
    let mut batches = Vec::new();
    while !pending.is_empty() {
        let b = cut(&mut pending, |e| e.0, |e| e.1, size, most);
        batches.push(b.iter().map(|e| e.0).collect());
    }
    batches
}

#[test]
fn a_batch_is_cut_in_line_order_to_fit_the_tokens_a_policy_admits_at_once() {
    // Sent back in the order they came back: the cut is the one a resume,
    // which takes pending items in line order, makes too.
    let pending = vec![(3, 70), (1, 40), (4, 20), (2, 90)];
    assert_eq!(
        cut_all(pending, 5, Some(100)),
        vec![vec![1], vec![2], vec![3, 4]]
    );
    assert_eq!(
        cut_all(vec![(2, 500), (1, 10)], 5, Some(100)),
        vec![vec![1], vec![2]],
        "an item heavier than the policy goes alone"
    );
    assert_eq!(
        cut_all(vec![(5, 1), (1, 1), (3, 1)], 2, None),
        vec![vec![1, 3], vec![5]]
    );
}

proptest! {
    /// Whatever order the pending items are in, the batches are the same,
    /// each within `size`, and within `most` tokens unless it is one item.
    #[test]
    fn the_batches_cut_depend_on_the_pending_items_not_their_order(
        items in proptest::collection::btree_map(1u64..200, 0u64..120, 1..30),
        size in 1usize..8,
        most in proptest::option::of(1u64..300),
        seed in any::<u64>(),
    ) {
        let sorted: Vec<(u64, u64)> = items.into_iter().collect();
        let mut shuffled = sorted.clone();
        let mut x = seed | 1;
        for i in (1..shuffled.len()).rev() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            shuffled.swap(i, (x % (i as u64 + 1)) as usize);
        }
        let tokens: HashMap<u64, u64> = sorted.iter().copied().collect();
        let batches = cut_all(shuffled, size, most);
        prop_assert_eq!(&batches, &cut_all(sorted, size, most));
        for b in &batches {
            prop_assert!(!b.is_empty() && b.len() <= size);
            let sum: u64 = b.iter().map(|l| tokens[l]).sum();
            if let (Some(most), true) = (most, b.len() > 1) {
                prop_assert!(sum <= most, "{:?} weighs {} > {}", b, sum, most);
            }
        }
    }
}
