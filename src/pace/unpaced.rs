//! No per-period limit configured (Mega, `--limit none`): calls go at
//! once, but a 429 still pauses everyone. A server may still state limits
//! of its own, in any dialect (a key capped below its plan, a daily quota):
//! the first response that states a quota hands pacing over to a
//! [`WindowPacer`] keeping that quota (per minute when no window is
//! stated, as the plans' window), which follows every later statement as
//! it does for a configured limit: other policies, `remaining: 0` with its
//! reset, a quota used up beyond the bound halting the run resumably. A
//! server stating only quotas of tokens (an LLM endpoint limiting tokens
//! alone) hands over to the shortest of them, kept as a told `--limit
//! Q/W,tokens` is (but that an item heavier than it is sent, not failed
//! unsent: `--cost` items are weighed against told limits at start).

use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use reqwest::header::HeaderMap;
use tokio::time::Instant;

use super::window::{policy_set, Policies, WindowPacer};
use super::{ready, BoxFuture, PaceError, PaceNote, Pacer, Permit, Weight};
use crate::rate::announce::{Announced, Unit};
use crate::rate::bucket::skew_allowance;
use crate::rate::policies::{Heard, MAX_PREFILL, TOKEN_WINDOW};
use crate::rate::policy::{PolicySpec, TokenWeight};
use crate::rate::{Limit, Rate, STATED};

/// The pacer for an unlimited plan.
pub struct Unpaced {
    state: Mutex<UnpacedState>,
    /// `--wait-for-quota`, for the window pacer a stated quota hands over to.
    wait_for_quota: bool,
    /// Whether the stated quota's shape may be learnt (off when a call may
    /// weigh several, as for a configured limit).
    learn_shape: bool,
    /// The window pacer keeping what the server stated, once it stated a
    /// quota of calls: everything is its from then on.
    stated: OnceLock<WindowPacer>,
}

struct UnpacedState {
    paused_until: Option<Instant>,
    started: Instant,
    taken: u64,
    /// The estimated tokens of the calls taken: what the server may not
    /// have counted yet when it first states a quota of tokens.
    tokens_taken: TokenWeight,
    /// What the window pacer made of the headers that handed over: said
    /// through `note`, after the hand-over's own note.
    pending: Option<PaceNote>,
}

impl Default for Unpaced {
    fn default() -> Self {
        Unpaced::following(false, true)
    }
}

/// The window a quota stated without one is read against.
const CAP_WINDOW: Duration = Duration::from_secs(60);

impl Unpaced {
    /// An unpaced pacer that, once the server states a quota, keeps it with
    /// `wait_for_quota` (`--wait-for-quota`) and `learn_shape` as the window
    /// pacer of a configured limit would.
    pub fn following(wait_for_quota: bool, learn_shape: bool) -> Unpaced {
        Unpaced {
            state: Mutex::new(UnpacedState {
                paused_until: None,
                started: Instant::now(),
                taken: 0,
                tokens_taken: TokenWeight::default(),
                pending: None,
            }),
            wait_for_quota,
            learn_shape,
            stated: OnceLock::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, UnpacedState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The window pacer for the quota `first` states at `rate`, counting
    /// the calls already sent (those the server says it counts, and at
    /// least this run's own within the window) and any pause in force.
    fn hand_over(&self, first: &Announced, rate: Rate) -> WindowPacer {
        let now = Instant::now();
        let unit = first.unit.counted();
        let spec = [PolicySpec {
            unit,
            ..PolicySpec::sliding(Limit::Rate(rate))
        }];
        let p = Policies {
            specs: &spec,
            wait_for_quota: self.wait_for_quota,
            learn_shape: self.learn_shape,
            start: false,
            last_used: &[],
            recent_sends: &[],
        };
        let mut set = policy_set(p, rate, None, now.into_std());
        let s = self.lock();
        // The calls sent before the hand-over went untracked: counted as
        // answered so that they leave the window at the stated reset, or a
        // window from now (which errs on the slow side).
        let answered = (first.reset_in.filter(|&r| r < rate.period))
            .and_then(|r| (now + r).checked_sub(rate.period))
            .unwrap_or(now);
        let within =
            now.saturating_duration_since(s.started) < rate.period + skew_allowance(rate.period);
        let ours = if within { s.taken } else { 0 };
        // What a quota of tokens says was used is tokens, not calls: the
        // window pacer counts it against that policy from the same headers.
        let told = match first.unit {
            Unit::Calls => rate
                .count
                .saturating_sub(first.remaining.unwrap_or(rate.count)),
            _ => 0,
        };
        let w = set.primary_mut();
        for _ in 0..ours.max(told).min(rate.count).min(MAX_PREFILL) {
            w.admit_answered(answered.into_std());
        }
        if let Some(until) = s.paused_until.filter(|&u| u > now) {
            w.pause_until(until.into_std());
        }
        // Quotas of tokens count this run's own estimates as spent now: the
        // calls still on their way are not in what the server said was
        // used, nor in its reset (the same headers, read next, add what it
        // says was used beyond them, and the quotas of tokens it states
        // beside a quota of calls).
        if within {
            set.untracked_tokens(s.tokens_taken, now.into_std());
        }
        // A quota of tokens stated without a window may be a bucket
        // (OpenAI's, Anthropic's).
        if unit.is_tokens() && first.window.is_none() {
            set.watch_refill();
        }
        set.all_stated();
        WindowPacer::of(set).waiting_for_quota(self.wait_for_quota)
    }

    /// Hands pacing over when `headers` state a quota: the note that says
    /// so, or `None` when they state none (or another worker's response
    /// handed over first).
    fn follow(&self, headers: &HeaderMap) -> Option<PaceNote> {
        let stated = crate::rate::announce::read(headers, crate::util::unix_now());
        let (first, rate) = primary_of(&stated)?;
        self.stated.set(self.hand_over(first, rate)).ok()?;
        let tokens = first.unit.is_tokens();
        Some(match first.window {
            None if !tokens => PaceNote::LimitInForce(rate.count),
            _ => PaceNote::Heard(Heard::Added {
                name: first.name.clone(),
                quota: rate.count,
                window: rate.period,
                tokens,
            }),
        })
    }
}

/// The stated quota the window pacer's primary policy keeps: of the
/// quotas of calls stating a window, the shortest (a quota stated without
/// one is then read against the nearest, as for a configured limit); else
/// the least quota of calls stated without one, read per minute; else,
/// where only tokens are limited, the shortest quota of tokens (per minute
/// when no window is stated, as OpenAI and Anthropic publish theirs).
fn primary_of(stated: &[Announced]) -> Option<(&Announced, Rate)> {
    let of = |unit: fn(&Unit) -> bool, unstated: Duration| {
        stated
            .iter()
            .filter(move |a| unit(&a.unit))
            .filter_map(move |a| {
                let period = a.window.unwrap_or(unstated);
                Some((
                    a,
                    Rate {
                        count: a.quota?,
                        period,
                    },
                ))
            })
            .min_by_key(|(a, r)| (a.window.is_none(), r.period, r.count))
    };
    of(|u| *u == Unit::Calls, CAP_WINDOW).or_else(|| of(|u| u.is_tokens(), TOKEN_WINDOW))
}

impl Pacer for Unpaced {
    fn take(&self) -> BoxFuture<'_, Result<Permit, PaceError>> {
        self.take_weighted(Weight::default())
    }

    fn take_weighted(&self, weight: Weight) -> BoxFuture<'_, Result<Permit, PaceError>> {
        Box::pin(async move {
            loop {
                // Looked at again after every wait: a response may have
                // handed over meanwhile.
                if let Some(p) = self.stated.get() {
                    return p.take_weighted(weight).await;
                }
                let wait = self.paused_until();
                match wait {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => {
                        let mut s = self.lock();
                        s.taken += weight.calls;
                        s.tokens_taken = s.tokens_taken.saturating_add(weight.tokens);
                        return Ok(Permit::untracked());
                    }
                }
            }
        })
    }

    fn pause(&self, for_: Duration) -> BoxFuture<'_, Result<(), PaceError>> {
        if let Some(p) = self.stated.get() {
            return p.pause(for_);
        }
        let until = Instant::now() + for_;
        let mut s = self.lock();
        s.paused_until = Some(s.paused_until.map_or(until, |old| old.max(until)));
        ready(Ok(()))
    }

    fn hold(&self, for_: Duration) -> BoxFuture<'_, Result<(), PaceError>> {
        match self.stated.get() {
            Some(p) => p.hold(for_),
            None => self.pause(for_),
        }
    }

    fn observe<'a>(&'a self, headers: &'a HeaderMap) -> BoxFuture<'a, Option<PaceNote>> {
        Box::pin(async move {
            let said = match self.stated.get() {
                Some(_) => None,
                None => self.follow(headers),
            };
            let more = self.stated.get()?.observe(headers).await;
            match said {
                // The hand-over is said first; what the window pacer made
                // of the same headers follows through `note`.
                Some(said) => {
                    self.lock().pending = more;
                    Some(said)
                }
                // One still waiting from the hand-over goes first, and
                // this one waits in its place: the window pacer queues
                // the rest behind them.
                None => {
                    let mut l = self.lock();
                    match l.pending.take() {
                        Some(first) => {
                            l.pending = more;
                            Some(first)
                        }
                        None => more,
                    }
                }
            }
        })
    }

    fn note(&self) -> Option<PaceNote> {
        let pending = self.lock().pending.take();
        pending.or_else(|| self.stated.get()?.note())
    }

    fn paused_until(&self) -> Option<Instant> {
        if let Some(p) = self.stated.get() {
            return p.paused_until();
        }
        let s = self.lock();
        s.paused_until.filter(|&u| u > Instant::now())
    }

    fn held_until(&self) -> Option<Instant> {
        self.stated.get()?.held_until()
    }

    fn learnt(&self) -> Option<crate::rate::learn::Learnt> {
        self.stated.get()?.learnt()
    }

    fn occupancy(&self) -> Vec<crate::rate::Occupancy> {
        let Some(p) = self.stated.get() else {
            return Vec::new();
        };
        // The primary window is shown as configured by the window pacer:
        // here every policy is the server's.
        let mut o = p.occupancy();
        for x in &mut o {
            if !x.policy.ends_with(STATED) {
                x.policy.push_str(STATED);
            }
        }
        o
    }

    fn most_stated_tokens(&self) -> Option<(u64, String)> {
        self.stated.get()?.most_stated_tokens()
    }

    fn steady_per_min(&self) -> Option<f64> {
        self.stated.get()?.steady_per_min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pace::testing::{call, limit_header, max_in_window};
    use crate::rate::policy::Used;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (n, v) in pairs {
            let name = reqwest::header::HeaderName::from_bytes(n.as_bytes()).unwrap();
            h.insert(name, v.parse().unwrap());
        }
        h
    }

    /// GitHub's daily quota, used up, its reset an epoch second a day away.
    fn daily_quota_used_up() -> HeaderMap {
        let reset = (crate::util::unix_now() + Duration::from_secs(86_400)).as_secs();
        headers(&[
            ("x-ratelimit-limit", "5"),
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", &reset.to_string()),
        ])
    }

    #[tokio::test(start_paused = true)]
    async fn unpaced_only_waits_for_pauses() {
        let p = Unpaced::default();
        let t0 = Instant::now();
        for _ in 0..1000 {
            call(&p).await;
        }
        assert_eq!(Instant::now(), t0);
        p.pause(Duration::from_secs(2)).await.unwrap();
        call(&p).await;
        assert_eq!(Instant::now(), t0 + Duration::from_secs(2));
    }

    #[tokio::test(start_paused = true)]
    async fn an_unlimited_key_that_reports_a_cap_gets_paced_to_it() {
        let p = Unpaced::default();
        let t0 = Instant::now();
        for _ in 0..5 {
            call(&p).await;
        }
        assert_eq!(
            p.observe(&limit_header("20")).await,
            Some(PaceNote::LimitInForce(20))
        );
        let stamps = {
            let mut v = vec![t0; 5];
            for _ in 0..40 {
                call(&p).await;
                v.push(Instant::now());
            }
            v
        };
        let most = max_in_window(&stamps, Duration::from_secs(60));
        assert!(most <= 20, "{most} in one minute");
    }

    /// A daily quota stated in `X-RateLimit-*`, used up: takes fail naming
    /// it (the run halts resumably), where calls went on to a 429.
    #[tokio::test(start_paused = true)]
    async fn a_used_up_daily_quota_in_any_dialect_fails_takes_naming_it() {
        let p = Unpaced::default();
        call(&p).await;
        assert_eq!(
            p.observe(&daily_quota_used_up()).await,
            Some(PaceNote::LimitInForce(5))
        );
        let e = p.take().await.unwrap_err();
        let PaceError::QuotaExhausted { name, in_, .. } = &e else {
            panic!("{e}")
        };
        assert_eq!(name, "x-ratelimit");
        assert!(in_ > &Duration::from_secs(86_000), "{e}");
    }

    /// `--wait-for-quota`: the same quota is waited for instead.
    #[tokio::test(start_paused = true)]
    async fn told_to_wait_it_waits_for_the_used_up_quota() {
        let p = Unpaced::following(true, true);
        let t0 = Instant::now();
        p.observe(&daily_quota_used_up()).await;
        call(&p).await;
        assert!(Instant::now() - t0 >= Duration::from_secs(86_000));
    }

    /// What the hand-over heard is said in the order heard, even when
    /// another response is read before the run drains the notes.
    #[tokio::test(start_paused = true)]
    async fn notes_of_the_hand_over_keep_their_order() {
        let p = Unpaced::default();
        let first = headers(&[("ratelimit-policy", r#""a";q=10;w=1, "b";q=25;w=5"#)]);
        let next = headers(&[(
            "ratelimit-policy",
            r#""a";q=10;w=1, "b";q=25;w=5, "c";q=50;w=10"#,
        )]);
        let mut said: Vec<_> = p.observe(&first).await.into_iter().collect();
        said.extend(p.observe(&next).await);
        said.extend(std::iter::from_fn(|| p.note()));
        let quotas: Vec<u64> = said
            .iter()
            .filter_map(|n| match n {
                PaceNote::Heard(Heard::Added { quota, .. }) => Some(*quota),
                _ => None,
            })
            .collect();
        assert_eq!(quotas, [10, 25, 50], "{said:?}");
    }

    /// Nothing left, resetting soon: calls are held until the reset.
    #[tokio::test(start_paused = true)]
    async fn nothing_left_holds_calls_until_the_reset() {
        let p = Unpaced::default();
        let t0 = Instant::now();
        let h = headers(&[
            ("ratelimit-limit", "100"),
            ("ratelimit-remaining", "0"),
            ("ratelimit-reset", "5"),
        ]);
        p.observe(&h).await;
        call(&p).await;
        assert!(Instant::now() - t0 >= Duration::from_secs(5));
        assert!(Instant::now() - t0 < Duration::from_secs(7));
    }

    /// IETF policies with their windows: the first is kept from the
    /// response that states it, the second as well, each said once.
    #[tokio::test(start_paused = true)]
    async fn policies_stated_with_windows_are_all_kept() {
        let p = Unpaced::default();
        let h = headers(&[("ratelimit-policy", r#""a";q=10;w=1, "b";q=25;w=5"#)]);
        let first = p.observe(&h).await;
        assert!(
            matches!(
                &first,
                Some(PaceNote::Heard(Heard::Added { quota: 10, .. }))
            ),
            "{first:?}"
        );
        let rest: Vec<_> = std::iter::from_fn(|| p.note()).collect();
        assert!(
            matches!(&rest[..], [PaceNote::Heard(Heard::Added { quota: 25, .. })]),
            "{rest:?}"
        );
        assert_eq!(p.observe(&h).await, None, "said once");
        let mut stamps = Vec::new();
        for _ in 0..60 {
            call(&p).await;
            stamps.push(Instant::now());
        }
        assert!(max_in_window(&stamps, Duration::from_secs(1)) <= 10);
        assert!(max_in_window(&stamps, Duration::from_secs(5)) <= 25);
        let shown = p.occupancy();
        assert!(
            shown.iter().all(|o| o.policy.ends_with(" (stated)")),
            "{shown:?}"
        );
    }

    /// A call of 100 tokens.
    const HEAVY: Weight = Weight {
        calls: 1,
        tokens: TokenWeight::whole(100),
    };

    /// Three calls of 100 tokens sent before any answer, still on their way.
    async fn three_on_their_way(p: &Unpaced) -> Vec<Permit> {
        let mut on_their_way = Vec::new();
        for _ in 0..3 {
            on_their_way.push(p.take_weighted(HEAVY).await.expect("permit"));
        }
        on_their_way
    }

    /// A server stating only a quota of tokens (OpenAI's headers without
    /// the requests ones): pacing is handed over to it, where calls went on
    /// unpaced to a 429 in every window. 40 calls of 100 tokens each
    /// against 1000 a minute, after 3 sent before the first answer, which
    /// the server has not counted yet: at most 1000 tokens in any minute,
    /// counting the 300.
    #[tokio::test(start_paused = true)]
    async fn a_server_stating_only_tokens_gets_its_tokens_paced() {
        let p = Unpaced::default();
        let t0 = Instant::now();
        let on_their_way = three_on_their_way(&p).await;
        let h = headers(&[
            ("x-ratelimit-limit-tokens", "1000"),
            ("x-ratelimit-remaining-tokens", "1000"),
            ("x-ratelimit-reset-tokens", "0s"),
        ]);
        let said = p.observe(&h).await;
        assert!(
            matches!(
                &said,
                Some(PaceNote::Heard(Heard::Added {
                    quota: 1000,
                    tokens: true,
                    ..
                }))
            ),
            "{said:?}"
        );
        for permit in on_their_way {
            permit.complete_used(Instant::now(), Some(Used::whole(100)));
        }
        let mut stamps = Vec::new();
        for _ in 0..40 {
            let permit = p.take_weighted(HEAVY).await.expect("permit");
            permit.complete_used(Instant::now(), Some(Used::whole(100)));
            stamps.push(Instant::now());
        }
        let minute = Duration::from_secs(60);
        let in_first_minute = stamps.iter().filter(|&&t| t - t0 < minute).count();
        assert!(
            in_first_minute <= 7,
            "{in_first_minute} calls of 100 after 300 sent"
        );
        let most = max_in_window(&stamps, minute);
        assert!(most <= 10, "{most} calls of 100 tokens in one minute");
        assert!(
            Instant::now() - t0 < Duration::from_secs(300),
            "paced, not stalled"
        );
    }

    /// OpenAI's usual headers state requests and tokens: the hand-over
    /// goes to the quota of requests, and the policy of tokens added from
    /// the same headers counts the 300 tokens sent before them as well.
    #[tokio::test(start_paused = true)]
    async fn tokens_sent_before_a_hand_over_to_requests_count_in_the_tokens_added() {
        let p = Unpaced::default();
        let t0 = Instant::now();
        let on_their_way = three_on_their_way(&p).await;
        let h = headers(&[
            ("x-ratelimit-limit-requests", "500"),
            ("x-ratelimit-remaining-requests", "499"),
            ("x-ratelimit-limit-tokens", "1000"),
            ("x-ratelimit-remaining-tokens", "1000"),
            ("x-ratelimit-reset-tokens", "0s"),
        ]);
        p.observe(&h).await;
        for permit in on_their_way {
            permit.complete_used(Instant::now(), Some(Used::whole(100)));
        }
        let mut in_first_minute = 0;
        while Instant::now() - t0 < Duration::from_secs(60) {
            let permit = p.take_weighted(HEAVY).await.expect("permit");
            if Instant::now() - t0 < Duration::from_secs(60) {
                in_first_minute += 1;
            }
            permit.complete_used(Instant::now(), Some(Used::whole(100)));
        }
        assert!(
            in_first_minute <= 7,
            "{in_first_minute} calls of 100 after 300 sent"
        );
    }

    /// A 429's pause before any statement still holds after the hand-over.
    #[tokio::test(start_paused = true)]
    async fn a_pause_before_the_hand_over_still_holds() {
        let p = Unpaced::default();
        let t0 = Instant::now();
        p.pause(Duration::from_secs(3)).await.unwrap();
        p.observe(&limit_header("20")).await;
        assert_eq!(p.paused_until(), Some(t0 + Duration::from_secs(3)));
        call(&p).await;
        assert_eq!(Instant::now(), t0 + Duration::from_secs(3));
    }

    /// A quota's hold followed after the hand-over reaches the progress
    /// line too (it heard of none under `--limit none`; a review found it).
    #[tokio::test(start_paused = true)]
    async fn a_hold_after_the_hand_over_reaches_the_progress_line() {
        let p = Unpaced::default();
        call(&p).await;
        p.observe(&headers(&[
            ("x-ratelimit-limit", "5"),
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", "600"),
        ]))
        .await;
        let held = p.held_until().expect("a hold");
        assert!(
            held >= Instant::now() + Duration::from_secs(599),
            "{held:?}"
        );
    }
}
