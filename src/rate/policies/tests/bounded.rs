//! The most policies a set keeps, and which a response beyond it leaves
//! out.

use super::*;

/// Twenty windows stated beside the told one: the set keeps eight, and
/// none of them explains a 429 (each has room), so the told window still
/// learns from it.
#[test]
fn the_set_is_bounded_and_other_windows_stated_leave_the_learning_on() {
    let t0 = Instant::now();
    let mut s = set(&[(10, 1000)], t0);
    for i in 0..20 {
        s.announce(&[calls_policy(50, Some(2000 + i), None)], t0);
    }
    assert_eq!(s.windows().len(), MAX_WINDOWS);
    for _ in 0..3 {
        let slot = s.try_take(t0).unwrap();
        s.complete(slot, t0);
    }
    assert_eq!(s.rate_limited(t0), Some(2), "two accepted before it");
}

/// A response stating ten policies, the tightest last (nine of 1,000 calls
/// per 1-9 s, then 3 per 10 s): the set keeps the tightest eight beside
/// its own, so the 3 per 10 s is paced to, and says once which it left
/// out. It kept the first eight as stated and sent 12 calls in 0.2 s.
#[test]
fn beyond_the_most_kept_the_loosest_policies_are_left_out_and_said() {
    let t0 = Instant::now();
    let mut s = set(&[(100, 1000)], t0);
    let mut stated: Vec<Announced> = (1..=9)
        .map(|i| Announced {
            name: format!("p{i}"),
            ..calls_policy(1000, Some(1000 * i), None)
        })
        .collect();
    stated.push(Announced {
        name: "tight".into(),
        ..calls_policy(3, Some(10_000), None)
    });
    s.announce(&stated, t0);
    assert_eq!(s.windows().len(), MAX_WINDOWS);
    assert_eq!(at_once(&mut s, t0), 3, "3 per 10 s was not kept");
    let mut ignored = Vec::new();
    while let Some(n) = s.take_note(t0) {
        if let Note::Heard(Heard::Ignored { name, .. }) = n {
            ignored.push(name);
        }
    }
    // p1 is the primary's window (1 s): seven added beside it, the
    // loosest two of the rest, p2 and p3, left out (said tightest first).
    assert_eq!(ignored, ["p3", "p2"]);
    s.announce(&stated, t0);
    assert!(
        std::iter::from_fn(|| s.take_note(t0))
            .all(|n| !matches!(n, Note::Heard(Heard::Ignored { .. }))),
        "said twice"
    );
}
