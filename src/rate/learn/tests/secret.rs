//! Secret limits at a third of the told one, each case one the survey
//! (`grid.rs`) once found over the bars: what the learner fits,
//! and that nothing is probed above what the answers allow.

use super::*;

/// The server's answers, as `job` runs them, with the limit each call was
/// sent at: for tests that look at what was probed.
fn calls_against(
    workers: usize,
    fates: &[Fate],
    server: &mut dyn FnMut(Instant) -> bool,
) -> (Vec<Call>, Vec<Learning>) {
    let t0 = Instant::now();
    let mut c = Paced(ExactWindow::new(30, W, t0).learning_shape(None));
    let calls = drive(&mut c, workers, fates, t0, server);
    let end = calls.iter().filter_map(|c| c.arrival).max().unwrap_or(t0);
    let said = std::iter::from_fn(|| c.0.take_event(end)).collect();
    (calls, said)
}

/// A secret sliding window at a third: no bucket fits the start and the
/// ramp, a sliding window of exactly its count does, and nothing is
/// probed above that count (where a probe a call above it was refused: a
/// fourth 429).
#[test]
fn a_secret_sliding_window_is_fitted_and_never_probed_above_its_count() {
    let fates = link(ITEMS + 60, ms(38), ms(0), 0);
    let mut sliding = Sliding {
        limit: 10,
        window: W,
        accepted: Default::default(),
    };
    let (calls, said) = calls_against(2, &fates, &mut |at| sliding.admit(at));
    let refused: Vec<usize> = (0..calls.len()).filter(|&i| calls[i].refused).collect();
    assert_eq!(
        refused.len(),
        3,
        "the start's two and the ramp's: {refused:?}"
    );
    let after = &calls[refused[2] + 1..];
    assert!(after.iter().all(|c| c.limit == 10), "{said:?}");
    assert_eq!(said, [Learning::Lowered(10), Learning::Settled(10)]);
}

/// What the fit allowed is in the checkpoint's shape: a run resumed from it
/// probes no higher either, where one resumed from the count alone probes
/// above the window's count again.
#[test]
fn a_resumed_run_probes_no_higher_than_the_fit_allowed() {
    let fates = link(ITEMS + 60, ms(38), ms(0), 0);
    let t0 = Instant::now();
    let mut sliding = Sliding {
        limit: 10,
        window: W,
        accepted: Default::default(),
    };
    let mut c = Paced(ExactWindow::new(30, W, t0).learning_shape(None));
    drive(&mut c, 2, &fates, t0, &mut |at| sliding.admit(at));
    let shape = c.0.learnt_shape();
    assert_eq!(shape.most, Some(10));
    let resumed = |shape: LearntShape| {
        let t1 = Instant::now() + W * 600;
        let learnt = Learnt { limit: 10, shape };
        let mut c = Paced(ExactWindow::new(30, W, t1).learning_shape(Some(learnt)));
        let mut sliding = Sliding {
            limit: 10,
            window: W,
            accepted: Default::default(),
        };
        drive(&mut c, 2, &fates, t1, &mut |at| sliding.admit(at))
    };
    let calls = resumed(shape);
    assert!(calls.iter().all(|c| c.limit == 10 && !c.refused));
    let without = resumed(LearntShape::default());
    assert!(
        without.iter().any(|c| c.limit > 10),
        "the count alone probes"
    );
}

/// A secret bucket with no burst at a third: the fit's rate is paced a
/// tenth under, with no probe above it (one a step above, at the rate
/// itself, was refused by the first arrival a little early).
#[test]
fn a_secret_bucket_with_no_burst_is_not_probed_above_its_fit() {
    let fates = link(ITEMS + 60, ms(38), ms(2), 0);
    let mut bucket = Gcra::new(10.0, 0);
    let (calls, said) = calls_against(2, &fates, &mut |at| bucket.admit(at));
    let refused = calls.iter().filter(|c| c.refused).count();
    assert_eq!(refused, 3, "{said:?}");
    let fitted = calls.iter().rposition(|c| c.refused).map_or(0, |i| i + 1);
    assert!(calls[fitted..].iter().all(|c| c.limit == 10), "{said:?}");
    assert_eq!(
        said,
        [Learning::Bucket {
            limit: 10,
            burst: 0
        }]
    );
}

/// A bucket of 10 a second with a burst of 3 whose start and ramp fitted
/// a fixed window of 5 as well: two windows held at the bucket's even
/// pace (9 a second) rule that window out, and a probe's refusal later
/// lowers the bucket, where it had switched to the window (1.8 times the
/// ideal time).
#[test]
fn a_pace_that_held_rules_out_a_fixed_window_below_it() {
    let fates = link(ITEMS + 60, ms(38), ms(4), 1);
    let mut bucket = Gcra::new(10.0, 3);
    let o = job(30, 1, &fates, ITEMS, &mut |at| bucket.admit(at));
    let ideal = Duration::from_secs_f64((ITEMS - 4) as f64 / 10.0);
    assert!(within_bar(&o, ideal), "{o:?} against {ideal:?}");
    assert!(
        !o.said.iter().any(|s| matches!(s, Learning::FixedWindow(_))),
        "{o:?}"
    );
    assert!(o.refused <= 3, "{o:?}");
}

/// The harness's own rule, which every test here leans on: a worker
/// sends its next call only once its last was answered (a wake while it
/// waited once let one worker keep two calls in flight).
#[test]
fn a_worker_waits_for_its_answer_before_its_next_call() {
    let fates = link(ITEMS, ms(36), ms(4), 6);
    let mut sliding = Sliding {
        limit: 10,
        window: W,
        accepted: Default::default(),
    };
    let (calls, _) = calls_against(1, &fates, &mut |at| sliding.admit(at));
    for (i, pair) in calls.windows(2).enumerate() {
        let answered = pair[0].sent + fates[i].latency;
        assert!(
            pair[1].sent >= answered,
            "call {} sent before call {i} was answered",
            i + 1
        );
    }
}
