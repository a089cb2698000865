use super::*;
use crate::rate::testing::{check_windows, drive, fates, Client, Fate};
use crate::sim::model::sliding_window::SlidingWindow;
use proptest::prelude::*;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

const W: Duration = Duration::from_secs(1);

/// Takes places at `now` until the window is full, answering each at once.
fn fill(w: &mut ExactWindow, now: Instant) -> u64 {
    let mut n = 0;
    while let Ok(s) = w.try_take(now) {
        w.complete(s, now);
        n += 1;
    }
    n
}

#[test]
fn admits_the_limit_then_waits_until_w_after_the_first_response() {
    let t0 = Instant::now();
    let mut w = ExactWindow::new(3, W, t0);
    let s: Vec<_> = (0..3).map(|_| w.try_take(t0).unwrap()).collect();
    // All three in flight: none can end before W from now.
    assert_eq!(w.try_take(t0), Err(t0 + W));
    w.complete(s[0], t0 + ms(100));
    assert_eq!(w.try_take(t0 + ms(200)), Err(t0 + ms(1100)));
    assert_eq!(w.occupancy(t0 + ms(1099)), 3);
    assert_eq!(w.occupancy(t0 + ms(1100)), 2);
    assert!(w.try_take(t0 + ms(1100)).is_ok());
}

#[test]
fn a_call_holds_its_place_for_its_whole_round_trip_plus_w() {
    let t0 = Instant::now();
    let mut w = ExactWindow::new(1, W, t0);
    let s = w.try_take(t0).unwrap();
    // Still in flight five seconds later: the place is still taken.
    assert_eq!(w.try_take(t0 + ms(5000)), Err(t0 + ms(6000)));
    w.complete(s, t0 + ms(5000));
    assert_eq!(w.try_take(t0 + ms(5999)), Err(t0 + ms(6000)));
    assert!(w.try_take(t0 + ms(6000)).is_ok());
}

#[test]
fn a_call_never_sent_frees_its_place_at_once() {
    let t0 = Instant::now();
    let mut w = ExactWindow::new(2, W, t0);
    let a = w.try_take(t0).unwrap();
    let _b = w.try_take(t0).unwrap();
    assert!(w.try_take(t0).is_err());
    assert!(w.cancel(a));
    assert!(!w.cancel(a), "a slot is freed once");
    assert!(w.try_take(t0).is_ok());
    // Completing a cancelled slot changes nothing.
    w.complete(a, t0);
    assert_eq!(w.occupancy(t0), 2);
}

#[test]
fn responses_out_of_order_end_in_order_of_arrival() {
    let t0 = Instant::now();
    let mut w = ExactWindow::new(3, W, t0);
    let s: Vec<_> = (0..3).map(|_| w.try_take(t0).unwrap()).collect();
    w.complete(s[1], t0 + ms(300));
    w.complete(s[0], t0 + ms(100));
    w.complete(s[2], t0 + ms(200));
    let now = t0 + ms(400);
    assert_eq!(w.try_take(now), Err(t0 + ms(1100)));
    assert!(w.try_take(t0 + ms(1100)).is_ok());
    assert_eq!(w.try_take(t0 + ms(1100)), Err(t0 + ms(1200)));
}

#[test]
fn a_response_stamped_before_its_send_counts_from_the_send() {
    let t0 = Instant::now();
    let mut w = ExactWindow::new(1, W, t0);
    let s = w.try_take(t0 + ms(10)).unwrap();
    w.complete(s, t0);
    assert_eq!(w.try_take(t0 + ms(20)), Err(t0 + ms(1010)));
}

#[test]
fn a_pause_holds_every_call_and_is_reported() {
    let t0 = Instant::now();
    let mut w = ExactWindow::new(10, W, t0);
    w.pause_until(t0 + ms(3000));
    w.pause_until(t0 + ms(2000));
    assert_eq!(
        w.paused_until(t0),
        Some(t0 + ms(3000)),
        "the longer pause wins"
    );
    assert_eq!(w.try_take(t0 + ms(100)), Err(t0 + ms(3000)));
    assert!(w.try_take(t0 + ms(3000)).is_ok());
    assert_eq!(w.paused_until(t0 + ms(3000)), None);
}

#[test]
fn a_hold_is_a_full_window_not_a_pause() {
    let t0 = Instant::now();
    let mut w = ExactWindow::new(10, W, t0);
    w.hold_until(t0 + ms(1500));
    assert_eq!(w.try_take(t0), Err(t0 + ms(1500)));
    assert_eq!(w.paused_until(t0), None);
    assert!(w.try_take(t0 + ms(1500)).is_ok());
}

#[test]
fn a_reported_limit_shrinks_at_once_and_never_grows() {
    let t0 = Instant::now();
    let mut w = ExactWindow::new(10, W, t0);
    let s: Vec<_> = (0..6).map(|_| w.try_take(t0).unwrap()).collect();
    assert!(w.set_limit_in_force(4, t0));
    assert_eq!(w.limit(), 4);
    assert!(!w.set_limit_in_force(8, t0), "never grows");
    assert!(!w.set_limit_in_force(4, t0), "already in force");
    assert_eq!(w.limit(), 4);
    assert!(w.set_limit_in_force(3, t0), "the lowest wins");
    assert!(!w.set_limit_in_force(20, t0));
    assert_eq!(w.limit(), 3);
    // Six occupy; below three needs four of them to end.
    for (i, s) in s.iter().enumerate() {
        w.complete(*s, t0 + ms(10 * i as u64));
    }
    assert_eq!(w.try_take(t0 + ms(100)), Err(t0 + ms(1030)));
    assert!(w.try_take(t0 + ms(1030)).is_ok());
    assert!(w.try_take(t0 + ms(1030)).is_err());
}

#[test]
fn a_reported_limit_at_or_above_the_configured_one_changes_nothing() {
    let t0 = Instant::now();
    let mut w = ExactWindow::new(10, W, t0);
    assert!(!w.set_limit_in_force(10, t0));
    assert!(!w.set_limit_in_force(1000, t0));
    assert_eq!(w.limit(), 10);
    assert_eq!(fill(&mut w, t0), 10);
}

/// A limit the server lowered for a moment and raised again is followed
/// back up once raised for a whole window with nothing lower between (it
/// held a run at 5 a second to the end where 50 were allowed), never above
/// the configured one.
#[test]
fn a_reported_limit_raised_again_for_a_window_is_followed() {
    let t0 = Instant::now();
    let mut w = ExactWindow::new(50, W, t0);
    assert!(w.set_limit_in_force(5, t0));
    assert!(!w.set_limit_in_force(40, t0 + ms(100)));
    assert_eq!(w.limit(), 5, "not at once");
    // A report at the limit in force between: the window starts again.
    assert!(!w.set_limit_in_force(5, t0 + ms(600)));
    assert!(!w.set_limit_in_force(40, t0 + ms(700)));
    assert!(!w.set_limit_in_force(1000, t0 + ms(1600)));
    assert_eq!(w.limit(), 5);
    assert!(!w.set_limit_in_force(1000, t0 + ms(1700)));
    assert_eq!(w.limit(), 40, "the least reported meanwhile");
    assert!(!w.set_limit_in_force(1000, t0 + ms(1800)));
    assert!(!w.set_limit_in_force(1000, t0 + ms(2800)));
    assert_eq!(w.limit(), 50, "the configured one at most");
}

/// A server stating a limit above the configured one (1000 told 10) keeps
/// a lower one unstated: its 429s still teach, and what they taught stays.
#[test]
fn a_report_above_the_configured_limit_leaves_learning_on() {
    let (mut w, _, t0) = refused_after(10, 7, 1);
    assert!(!w.set_limit_in_force(1000, t0));
    assert_eq!(w.rate_limited(t0 + ms(10)), Some(5));
    assert!(!w.set_limit_in_force(1000, t0 + ms(20)));
    assert_eq!((w.limit(), w.learnt()), (5, Some(5)));
}

#[test]
fn remaining_zero_holds_until_an_occupancy_ends() {
    let t0 = Instant::now();
    let mut w = ExactWindow::new(10, W, t0);
    let a = w.try_take(t0).unwrap();
    let _b = w.try_take(t0).unwrap();
    w.complete(a, t0 + ms(50));
    w.remaining_zero(t0 + ms(60));
    assert_eq!(w.try_take(t0 + ms(70)), Err(t0 + ms(1050)));
    assert!(w.try_take(t0 + ms(1050)).is_ok());

    // Nothing answered yet: the server's window frees within W at the latest.
    let mut w = ExactWindow::new(10, W, t0);
    let _a = w.try_take(t0).unwrap();
    w.remaining_zero(t0 + ms(5));
    assert_eq!(w.try_take(t0 + ms(6)), Err(t0 + ms(1005)));
}

/// A window that took `sent` calls at `t0`, answered all but `in_flight`
/// of them at `t0 + 10 ms`, the last answered one refused.
fn refused_after(limit: u64, sent: u64, in_flight: u64) -> (ExactWindow, Vec<SlotId>, Instant) {
    let t0 = Instant::now();
    let mut w = ExactWindow::new(limit, W, t0);
    let s: Vec<_> = (0..sent).map(|_| w.try_take(t0).unwrap()).collect();
    for slot in &s[..(sent - in_flight) as usize] {
        w.complete(*slot, t0 + ms(10));
    }
    (w, s, t0)
}

#[test]
fn a_429_without_limit_headers_teaches_what_the_server_had_accepted() {
    // Seven sent, six answered, the sixth refused: five were accepted.
    let (mut w, _, t0) = refused_after(10, 7, 1);
    assert_eq!(w.rate_limited(t0 + ms(10)), Some(5));
    assert_eq!((w.limit(), w.learnt()), (5, Some(5)));
    assert_eq!(w.take_event(t0 + ms(10)), Some(Learning::Lowered(5)));
    assert_eq!(w.take_event(t0 + ms(10)), None);
}

#[test]
fn every_teaching_429_lowers_by_at_least_one_and_never_below_one() {
    // The window holds as many as the limit: the estimate alone would not
    // lower it.
    let (mut w, _, t0) = refused_after(4, 4, 0);
    assert_eq!(w.rate_limited(t0 + ms(10)), Some(3));
    let (mut w, _, t0) = refused_after(4, 1, 0);
    assert_eq!(w.rate_limited(t0 + ms(10)), Some(1));
    let (mut w, _, t0) = refused_after(1, 1, 0);
    assert_eq!(
        w.rate_limited(t0 + ms(10)),
        None,
        "one a window is the floor"
    );
    assert_eq!(w.learnt(), None);
}

#[test]
fn a_429_with_no_answered_call_in_the_window_measures_nothing() {
    let (mut w, _, t0) = refused_after(4, 2, 2);
    assert_eq!(w.rate_limited(t0 + ms(10)), None);
    assert_eq!(w.limit(), 4);
}

#[test]
fn a_server_that_reports_its_limit_teaches_nothing() {
    let (mut w, _, t0) = refused_after(10, 7, 1);
    w.set_limit_in_force(10, t0);
    assert_eq!(w.rate_limited(t0 + ms(10)), None);
    assert_eq!(w.limit(), 10);
    // And a report replaces what an earlier run learnt.
    let mut w = ExactWindow::new(10, W, t0).with_learnt(Some(4));
    assert_eq!(w.limit(), 4);
    assert!(w.set_limit_in_force(8, t0));
    assert_eq!((w.limit(), w.learnt()), (8, None));
}

#[test]
fn a_429_during_a_pause_or_for_a_call_sent_before_the_lowering_teaches_nothing() {
    let (mut w, s, t0) = refused_after(10, 7, 1);
    assert_eq!(w.rate_limited(t0 + ms(10)), Some(5));
    w.pause_until(t0 + ms(510));
    // The call in flight comes back refused while the pause holds.
    w.complete(s[6], t0 + ms(20));
    assert_eq!(w.rate_limited(t0 + ms(20)), None);
    assert_eq!(w.limit(), 5);

    // Same, but the old call comes back just after the pause.
    let (mut w, s, t0) = refused_after(10, 7, 1);
    w.rate_limited(t0 + ms(10));
    w.pause_until(t0 + ms(510));
    w.complete(s[6], t0 + ms(600));
    assert_eq!(w.rate_limited(t0 + ms(600)), None);
    // A call sent after the pause that is refused later does teach.
    let later = t0 + ms(2000);
    let fresh = w.try_take(later).unwrap();
    w.complete(fresh, later);
    let taught = w.rate_limited(later);
    assert!(taught.is_some_and(|l| l < 5), "{taught:?}");
}

#[test]
fn a_learnt_limit_settles_after_a_clean_window_then_probes_one_per_used_window() {
    let (mut w, _, t0) = refused_after(10, 7, 0);
    assert_eq!(w.rate_limited(t0 + ms(10)), Some(6));
    w.take_event(t0 + ms(10));
    w.pause_until(t0 + ms(1010));
    // The clean window starts when the pause ends.
    let mut now = t0 + ms(2000);
    fill(&mut w, now);
    assert_eq!(w.take_event(now), None);
    now = t0 + ms(2010);
    assert_eq!(fill(&mut w, now), 0, "the window is still full");
    assert_eq!(w.take_event(now), Some(Learning::Settled(6)));
    // Each window that used the whole limit without a 429 allows one more,
    // up to one below the refused limit.
    let mut seen = Vec::new();
    for _ in 0..6 {
        now += W;
        seen.push(fill(&mut w, now));
    }
    assert_eq!(seen, [7, 8, 9, 9, 9, 9]);
    assert_eq!(w.learnt(), Some(9));
    assert_eq!(w.take_event(now), None, "probing is not an event");
}

/// The checkpoint keeps what probing stays under (one below the limit
/// refused), and a resumed run stays under it too: restored from the
/// count alone, it probes up to the refused limit again.
#[test]
fn a_resumed_run_probes_no_higher_than_the_run_that_was_refused() {
    let (mut w, _, t0) = refused_after(10, 7, 0);
    assert_eq!(w.rate_limited(t0 + ms(10)), Some(6));
    assert_eq!(w.learnt_shape().most, Some(9));
    let resumed = |most: Option<u64>| {
        let mut w = ExactWindow::new(10, W, t0)
            .with_learnt(Some(6))
            .probing_at_most(most);
        let mut now = t0;
        for _ in 0..12 {
            fill(&mut w, now);
            now += W;
        }
        w.learnt()
    };
    assert_eq!(resumed(Some(9)), Some(9));
    assert_eq!(resumed(None), Some(10), "the count alone probes on");
    // A checkpoint's most of 19, resumed told 10: the 19 goes on, for a
    // run told 30 again (no refusal at 10 is made up).
    let told_less = ExactWindow::new(10, W, t0)
        .with_learnt(Some(19))
        .probing_at_most(Some(19));
    assert_eq!(told_less.learnt_shape().most, Some(19));
}

#[test]
fn an_idle_window_is_no_reason_to_probe() {
    let (mut w, _, t0) = refused_after(10, 5, 0);
    assert_eq!(w.rate_limited(t0 + ms(10)), Some(4));
    let mut now = t0 + ms(10);
    for _ in 0..10 {
        now += W;
        let s = w.try_take(now).unwrap();
        w.complete(s, now);
    }
    assert_eq!(w.learnt(), Some(4));
}

#[test]
fn a_429_while_probing_caps_the_probe_below_it() {
    let (mut w, _, t0) = refused_after(10, 5, 0);
    assert_eq!(w.rate_limited(t0 + ms(10)), Some(4));
    let mut now = t0 + ms(10);
    for _ in 0..2 {
        now += W;
        fill(&mut w, now);
    }
    assert_eq!(w.learnt(), Some(5));
    // Refused at 5 with 5 answered calls in the window: back to 4, and
    // probing never tries 5 again in this run.
    assert_eq!(w.rate_limited(now), Some(4));
    for _ in 0..10 {
        now += W;
        fill(&mut w, now);
    }
    assert_eq!(w.learnt(), Some(4));
}

#[test]
fn a_resumed_learnt_limit_is_clamped_taken_as_settled_and_probed_from() {
    let t0 = Instant::now();
    let w = ExactWindow::new(10, W, t0).with_learnt(Some(50));
    assert_eq!(w.limit(), 10);
    let w = ExactWindow::new(10, W, t0).with_learnt(Some(0));
    assert_eq!(w.limit(), 1);
    let mut w = ExactWindow::new(10, W, t0).with_learnt(Some(3));
    let mut now = t0;
    for _ in 0..12 {
        fill(&mut w, now);
        now += W;
    }
    assert_eq!(w.learnt(), Some(10), "up to the configured limit");
    assert_eq!(w.take_event(now), None);
}

#[test]
fn memory_stays_bounded_by_the_limit() {
    let t0 = Instant::now();
    let mut w = ExactWindow::new(5, ms(100), t0);
    let mut now = t0;
    for _ in 0..2000 {
        match w.try_take(now) {
            Ok(s) => w.complete(s, now + ms(3)),
            Err(at) => now = at,
        }
        assert!(w.done.len() <= 5);
    }
    assert_eq!(w.in_flight(), 0);
}

#[test]
fn an_absurd_window_does_not_overflow() {
    let t0 = Instant::now();
    let mut w = ExactWindow::new(1, Duration::MAX, t0);
    let s = w.try_take(t0).unwrap();
    w.complete(s, t0);
    let at = w.try_take(t0 + ms(1)).unwrap_err();
    assert!(at > t0 + Duration::from_secs(86_400 * 365));
}

/// The state machine as the driver sees it: reports and remaining-zero
/// headers on some responses, a pause on every refusal.
struct Exact {
    w: ExactWindow,
    headers: Vec<(Option<u64>, bool)>,
    answered: usize,
    pause: Duration,
    lowerings: u64,
}

impl Client for Exact {
    type Slot = SlotId;
    fn try_take(&mut self, now: Instant) -> Result<SlotId, Instant> {
        self.w.try_take(now)
    }
    fn complete(&mut self, slot: SlotId, at: Instant, refused: bool) {
        self.w.complete(slot, at);
        let (report, zero) = self.headers[self.answered % self.headers.len()];
        self.answered += 1;
        if let Some(l) = report {
            self.w.set_limit_in_force(l, at);
        }
        if zero {
            self.w.remaining_zero(at);
        }
        if refused {
            if self.w.rate_limited(at).is_some() {
                self.lowerings += 1;
            }
            self.w.pause_until(at + self.pause);
        }
        let l = self.w.learnt().unwrap_or(1);
        assert!((1..=self.w.configured()).contains(&l), "learnt {l}");
    }
    fn cancel(&mut self, slot: SlotId) {
        self.w.cancel(slot);
    }
    fn limit(&self) -> u64 {
        self.w.limit()
    }
}

/// A window and fates whose round trips go from nothing to three windows,
/// so responses overtake one another and calls hold their place for longer
/// than W.
fn scenario() -> impl Strategy<Value = (Duration, Vec<Fate>)> {
    (10u64..=2000, 0u32..=300)
        .prop_flat_map(|(w, pct)| (Just(ms(w)), fates(150, ms(w) * pct / 100)))
}

fn headers() -> impl Strategy<Value = Vec<(Option<u64>, bool)>> {
    let h = (0u32..100, 1u64..=15, 0u32..100).prop_map(|(r, l, z)| ((r < 5).then_some(l), z < 5));
    proptest::collection::vec(h, 1..20)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn no_server_window_ever_holds_more_than_the_limit(
        limit in 1u64..=12,
        (window, fates) in scenario(),
        workers in 1usize..=8,
        headers in headers(),
    ) {
        let t0 = Instant::now();
        let mut c = Exact {
            w: ExactWindow::new(limit, window, t0),
            headers,
            answered: 0,
            pause: window,
            lowerings: 0,
        };
        let calls = drive(&mut c, workers, &fates, t0, &mut |_| true);
        prop_assert!(calls.iter().all(|c| c.limit <= limit));
        if let Err(e) = check_windows(&calls, window) {
            prop_assert!(false, "{}", e);
        }
    }

    #[test]
    fn a_secret_limit_is_learnt_within_bounds(
        configured in 1u64..=15,
        secret_frac in 0.0f64..=1.0,
        (window, fates) in scenario(),
        workers in 1usize..=8,
    ) {
        let secret = ((configured as f64 * secret_frac).ceil() as u64).clamp(1, configured);
        let t0 = Instant::now();
        let mut server = SlidingWindow::new(secret, window);
        let mut c = Exact {
            w: ExactWindow::new(configured, window, t0),
            headers: vec![(None, false)],
            answered: 0,
            pause: window,
            lowerings: 0,
        };
        let calls = drive(&mut c, workers, &fates, t0, &mut |at| server.try_acquire(at).is_ok());
        let learnt = c.w.learnt().unwrap_or(configured);
        prop_assert!((1..=configured).contains(&learnt), "learnt {}", learnt);
        prop_assert!(c.lowerings < configured.max(2), "{} lowerings", c.lowerings);
        // Every overrun teaches, so 429s stop: each lowering costs at most
        // the calls of a window and of the pool that were already under way.
        let refused = calls.iter().filter(|c| c.refused).count() as u64;
        let bound = (c.lowerings + 1) * (configured + workers as u64);
        prop_assert!(refused <= bound, "{} refused, {} lowerings", refused, c.lowerings);
        if calls.iter().any(|c| c.refused) && configured > 1 {
            prop_assert!(c.w.learnt().is_some());
        }
        // The client's own limit, however it moved, was never overrun.
        if let Err(e) = check_windows(&calls, window) {
            prop_assert!(false, "{}", e);
        }
    }
}
