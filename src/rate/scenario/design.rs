//! Hand-written scenarios from the design's numbers, for both stores: the
//! in-process tests check what they must answer, the fleet's test that the
//! script answers the same.

use super::{Op, Scenario, Step};
use crate::rate::policy::{TokenWeight, Unit, Used};

/// A scenario written step by step.
struct Build(Scenario);

impl Build {
    fn new(limit: u64, window: u64) -> Build {
        Build(Scenario::of(limit, window))
    }

    fn at(mut self, at: u64, op: Op) -> Build {
        self.0.steps.push(Step { at, op });
        self
    }

    fn n(mut self, n: usize, at: u64, op: Op) -> Build {
        for _ in 0..n {
            self = self.at(at, op);
        }
        self
    }

    /// Takes `n` places at `at`, each answered at once (so no other call
    /// may be out: a settle picks the oldest).
    fn calls(self, n: usize, at: u64) -> Build {
        (0..n).fold(self, |b, _| {
            b.at(at, Op::Take).at(at, Op::Settle { pick: 0, ago: 0 })
        })
    }
}

const OLDEST: Op = Op::Settle { pick: 0, ago: 0 };

/// 600 calls per 6 s: the whole limit at once, then a place frees W after
/// the first response and not before.
pub fn burst_600_per_6s() -> Scenario {
    Build::new(600, 6000)
        .n(601, 0, Op::Take)
        .at(100, OLDEST)
        .at(200, Op::Take)
        .n(599, 300, OLDEST)
        .at(6099, Op::Take)
        .at(6100, Op::Take)
        .at(6101, Op::Take)
        .0
}

/// 10 per 1 s with every place held by a call in flight: a place could
/// free W from now at the earliest, and then W after the first response.
pub fn in_flight_10_per_1s() -> Scenario {
    Build::new(10, 1000)
        .n(11, 0, Op::Take)
        .at(300, OLDEST)
        .at(400, Op::Take)
        .at(1299, Op::Take)
        .at(1300, Op::Take)
        .0
}

/// 10 per 1 s against a server that accepts 6: the 429 at the seventh call
/// teaches 6; the limit settles after a clean window, then probes to 7
/// after a window that used it in full.
pub fn secret_6_of_10_per_1s() -> Scenario {
    Build::new(10, 1000)
        .calls(7, 0)
        .at(10, Op::RateLimited { pause: 1000 })
        .at(500, Op::Take)
        .calls(1, 1010)
        .calls(1, 2010)
        .calls(5, 2020)
        .at(2030, Op::Take)
        .calls(1, 3010)
        .0
}

/// 10 per 1 s: a 429 lowers the limit while a call from before is still
/// out; its own 429, until the grace (100 ms) after it came back, teaches
/// nothing more, and one at the grace does.
pub fn late_429_10_per_1s() -> Scenario {
    Build::new(10, 1000)
        .calls(8, 0)
        .at(0, Op::Take)
        .at(5, Op::RateLimited { pause: 20 })
        .at(50, OLDEST)
        .at(60, Op::RateLimited { pause: 0 })
        .at(149, Op::RateLimited { pause: 0 })
        .at(150, Op::RateLimited { pause: 0 })
        .0
}

/// 10 per 1 s: a server that reports its limit lowers it at once, raises
/// it only after a window of higher reports (a lower one between starts it
/// again), and a 429 then teaches nothing; `remaining: 0` holds new
/// calls until the first place frees.
pub fn reported_10_per_1s() -> Scenario {
    Build::new(10, 1000)
        .calls(3, 0)
        .at(10, Op::InForce { limit: 4 })
        .at(11, Op::InForce { limit: 6 })
        .at(12, Op::InForce { limit: 4 })
        .at(20, Op::Take)
        .at(30, Op::Take)
        .at(40, Op::RateLimited { pause: 0 })
        .at(50, OLDEST)
        .at(60, Op::Full)
        .at(70, Op::Take)
        .at(1000, Op::Take)
        .0
}

/// 10 per 1 s: a limit reported at 4, then above the configured one and at
/// 8: followed back up to 8 once a window passed since the first higher
/// report, not before.
pub fn raised_again_10_per_1s() -> Scenario {
    Build::new(10, 1000)
        .at(0, Op::InForce { limit: 4 })
        .at(100, Op::InForce { limit: 20 })
        .at(200, Op::Take)
        .at(1099, Op::InForce { limit: 8 })
        .at(1099, Op::Take)
        .at(1100, Op::InForce { limit: 8 })
        .at(1100, Op::Take)
        .0
}

/// 10 per 1 s, learning: `remaining: 0` after a clean window does not
/// start the next one (the learning clock runs at takes and 429s only), so
/// the probe after it comes a window after the take that started it.
pub fn held_while_learning_10_per_1s() -> Scenario {
    Build::new(10, 1000)
        .calls(3, 0)
        .at(0, Op::RateLimited { pause: 0 })
        .calls(1, 1000)
        .calls(1, 1005)
        .at(2001, Op::Full)
        .calls(3, 2100)
        .at(3050, Op::Take)
        .calls(1, 3100)
        .0
}

/// 10 per 1 s: a call granted in the very millisecond of a lowering, before
/// it, was paced to the old limit; while it is out, and just after it is
/// back, a 429 may be its own and teaches nothing.
pub fn granted_at_the_lowering_10_per_1s() -> Scenario {
    Build::new(10, 1000)
        .calls(4, 0)
        .at(0, Op::Take)
        .at(0, Op::RateLimited { pause: 0 })
        .at(200, Op::RateLimited { pause: 0 })
        .at(300, OLDEST)
        .at(301, Op::RateLimited { pause: 0 })
        .at(500, Op::RateLimited { pause: 0 })
        .0
}

/// 10 per 1 s and 15 per 3 s (`--limit` twice): the second window refuses
/// once 15 occupy it though the first has room, and its places free 3 s
/// after their responses.
pub fn two_limits_10_per_1s_and_15_per_3s() -> Scenario {
    let mut b = Build::new(10, 1000).calls(10, 0).calls(5, 1000);
    b.0.further = vec![(15, 3000)];
    b.at(1000, Op::Take)
        .at(2000, Op::Take)
        .at(3000, Op::Take)
        .at(3001, Op::Take)
        .0
}

/// `--limit 30/1s,burst=5`: the primary window is the bucket's envelope
/// (36 per 1 s, as in-process) and the bucket is GCRA with T = 33.3 ms and
/// a tolerance of 5 T less the skew allowance (50 ms): 4 go at once, the
/// next 17 ms later, then one each T; a call never sent gives its unit
/// back, and a take the window or a pause refuses moves an idle TAT up.
pub fn bucket_30_per_1s_burst_5() -> Scenario {
    let mut b = Build::new(36, 1000).n(6, 0, Op::Take);
    b.0.buckets = vec![(30, 1000, 5)];
    b.at(17, Op::Take)
        .at(18, Op::Take)
        .at(20, Op::Cancel { pick: 0 })
        .at(20, Op::Take)
        .at(40, OLDEST)
        .at(51, Op::Take)
        .at(51, Op::RateLimited { pause: 100 })
        .at(60, Op::Take)
        .at(151, Op::Take)
        .at(152, Op::Take)
        .at(1500, Op::Full)
        .n(3, 1500, Op::Take)
        .n(6, 3000, Op::Take)
        .0
}

/// A bucket with no burst under a window of 2 per 1 s: its calls are
/// spaced T + D (110 ms), and a take the full window refuses still moves
/// the bucket's TAT up to now.
pub fn bucket_10_per_1s_under_2_per_1s() -> Scenario {
    let mut b = Build::new(2, 1000);
    b.0.buckets = vec![(10, 1000, 0)];
    b.at(0, Op::Take)
        .at(0, OLDEST)
        .at(0, Op::Take)
        .at(200, Op::Take)
        .at(200, OLDEST)
        .at(995, Op::Take)
        .at(1000, Op::Take)
        .at(1005, Op::Take)
        .0
}

/// A bucket with no burst refused all the same: each 429 doubles its skew
/// allowance D (5 ms, a twentieth of T = 100 ms), up to T, so calls are
/// spaced 105 ms, then 110, 120, and at most 200.
pub fn bucket_10_per_1s_widened() -> Scenario {
    let mut b = Build::new(20, 1000);
    b.0.buckets = vec![(10, 1000, 0)];
    b.at(0, Op::Take)
        .at(1, Op::Take)
        .at(105, Op::Take)
        .at(106, Op::RateLimited { pause: 0 })
        .at(106, Op::Take)
        .at(215, Op::Take)
        .at(216, Op::RateLimited { pause: 0 })
        .at(216, Op::Take)
        .at(217, Op::RateLimited { pause: 0 })
        .at(218, Op::RateLimited { pause: 0 })
        .at(219, Op::RateLimited { pause: 0 })
        .at(219, Op::Take)
        .0
}

/// `--limit 5/1s,fixed`: the primary window is its envelope (10 per
/// 1 s) and the fixed window, no reset having aligned it, is kept as a
/// sliding one of 5 per 1 s: the 6th call waits until the first ends, 1 s
/// after its response.
pub fn fixed_5_per_1s() -> Scenario {
    let mut b = Build::new(10, 1000).calls(5, 0);
    b.0.fixed = vec![(5, 1000, Unit::Calls)];
    b.at(0, Op::Take)
        .at(500, Op::Take)
        .at(1000, Op::Take)
        .n(5, 1000, Op::Take)
        .at(1100, OLDEST)
        .at(1100, Op::Cancel { pick: 0 })
        .at(1100, Op::Take)
        .0
}

/// `--limit 5/1s,fixed` aligned to a stated reset: four calls answered
/// at 100 ms and one out; a reset too uncertain (80 ms early, 30 late: over
/// a tenth of W) aligns nothing; one at 500 ms, 20 ms early and 10 late at
/// most, aligns the window: the four occupy until the boundary after
/// their answer and early, plus late (510 ms), not until 1100 ms, and so
/// does the call out, answered at 400 ms. A call at 510 goes; answered at
/// 520 ms it occupies until 1510 ms. A second reset changes nothing.
pub fn fixed_5_per_1s_aligned() -> Scenario {
    let mut b = Build::new(10, 1000).calls(4, 100);
    b.0.fixed = vec![(5, 1000, Unit::Calls)];
    let aligned = |reset, early, late| Op::Aligned {
        fixed: 0,
        reset,
        early,
        late,
    };
    b.at(100, Op::Take)
        .at(150, aligned(350, 80, 30))
        .at(200, aligned(300, 20, 10))
        .at(300, Op::Take)
        .at(400, OLDEST)
        .at(510, Op::Take)
        .at(520, OLDEST)
        .at(600, aligned(100, 0, 0))
        .n(5, 1000, Op::Take)
        .0
}

/// `--limit 5/1s,fixed`, the window aligned only after its calls ended:
/// five answered at 100 ms stop occupying at 1100 ms; a reset aligning the
/// window at 1150 ms (its boundary then) leaves them ended, for each call
/// occupies until the earlier of its sliding and its aligned end, so a
/// call at 1160 ms goes. In-process gave them their aligned end (1200 ms)
/// where the script had let them go (a review found it).
pub fn fixed_aligned_after_its_calls_ended() -> Scenario {
    let mut b = Build::new(10, 1000).calls(5, 100);
    b.0.fixed = vec![(5, 1000, Unit::Calls)];
    b.at(
        1150,
        Op::Aligned {
            fixed: 0,
            reset: 0,
            early: 50,
            late: 50,
        },
    )
    .at(1160, Op::Take)
    .0
}

/// 100 tokens per 1 s beside 10 calls per 1 s (`--limit 100/1s,tokens`):
/// an estimate waits on calls in flight for W; a response's usage
/// corrects its call's weight, which frees room at once; a call that does
/// not fit waits until enough answered weight ends, and one heavier than
/// the whole budget waits until nothing occupies.
pub fn tokens_100_per_1s() -> Scenario {
    let mut b = Build::new(10, 1000);
    b.0.tokens = vec![(100, 1000, Unit::Tokens)];
    let take = |n| Op::TakeTokens {
        tokens: TokenWeight::whole(n),
    };
    b.at(0, take(60))
        .at(0, take(50))
        .at(
            10,
            Op::SettleUsed {
                pick: 0,
                ago: 0,
                used: Used::whole(30),
            },
        )
        .at(10, take(50))
        .at(20, take(30))
        .at(20, take(150))
        .at(1010, take(20))
        .0
}

/// `--limit 5/1s,fixed`, another client on the key: one call answered at
/// 0 ms; at 10 ms a statement says 4 of the 5 are used, so 3 count as
/// answered then (until 1010 ms) and a call at 20 ms is the last that
/// fits: the next waits until the first ends (1000 ms). Aligned at 30 ms
/// (boundary 500 ms), the answered ones and the 3 end at 500 ms, so the
/// call in flight and those four fill it until then. Past the boundary, 4
/// used again means 3 more beside the call in flight, until 1500 ms: one
/// call goes and the next waits for the boundary.
pub fn fixed_5_per_1s_spent_elsewhere() -> Scenario {
    let mut b = Build::new(10, 1000).calls(1, 0);
    b.0.fixed = vec![(5, 1000, Unit::Calls)];
    let spent = |used| Op::Spent { fixed: 0, used };
    b.at(10, spent(4))
        .at(20, Op::Take)
        .at(20, Op::Take)
        .at(
            30,
            Op::Aligned {
                fixed: 0,
                reset: 470,
                early: 0,
                late: 0,
            },
        )
        .at(40, Op::Take)
        .at(40, spent(5))
        .at(600, spent(4))
        .at(600, Op::Take)
        .at(600, Op::Take)
        .0
}

/// A fixed window of 100 tokens per 1 s beside 10 calls per 1 s
/// (`--limit 100/1s,fixed,tokens`): 60 tokens taken at 0 ms and answered
/// at 100 ms occupy until 1100 ms while no reset aligned the window, so a
/// call of 50 at 150 ms waits; a reset stated at 200 ms (at 500 ms, 20 ms
/// early and 10 late at most) aligns it, and the 60 occupy until the
/// boundary after their answer and early, plus late (510 ms): a call of 50
/// at 300 ms waits until then and goes; answered at 520 ms using 45, its
/// tokens occupy until 1510 ms, so 60 more at 1000 ms wait until then.
pub fn fixed_tokens_100_per_1s_aligned() -> Scenario {
    let mut b = Build::new(10, 1000);
    b.0.fixed = vec![(100, 1000, Unit::Tokens)];
    let take = |n| Op::TakeTokens {
        tokens: TokenWeight::whole(n),
    };
    b.at(0, take(60))
        .at(100, OLDEST)
        .at(150, take(50))
        .at(
            200,
            Op::Aligned {
                fixed: 0,
                reset: 300,
                early: 20,
                late: 10,
            },
        )
        .at(300, take(50))
        .at(510, take(50))
        .at(
            520,
            Op::SettleUsed {
                pick: 0,
                ago: 0,
                used: Used::whole(45),
            },
        )
        .at(1000, take(60))
        .0
}

/// A bucket of 100 tokens per 1 s with a burst of 50 beside 10 calls per
/// 1 s (`--limit 100/1s,burst=50,tokens`): T = 10 ms a token and a
/// tolerance of 500 ms, less D = 50 ms for the first call's TAT. A call
/// takes its estimate's worth; a response's usage moves the TAT back by
/// what it did not use, a call never sent gives all of it back, and one
/// heavier than the whole bucket goes alone once the bucket is empty.
pub fn token_bucket_100_per_1s_burst_50() -> Scenario {
    let mut b = Build::new(10, 1000);
    b.0.token_buckets = vec![(100, 1000, 50, Unit::Tokens)];
    let take = |n| Op::TakeTokens {
        tokens: TokenWeight::whole(n),
    };
    b.at(0, take(30))
        .at(0, take(30))
        .at(
            10,
            Op::SettleUsed {
                pick: 0,
                ago: 0,
                used: Used::whole(10),
            },
        )
        .at(10, take(30))
        .at(20, take(200))
        .at(20, Op::Cancel { pick: 0 })
        .at(460, take(200))
        .at(470, take(1))
        .0
}

/// Anthropic's budgets kept apart (`--limit 100/1s,input-tokens --limit
/// 40/1s,burst=20,output-tokens`) beside 10 calls per 1 s: the window
/// takes each call's prompt, the bucket its answer (T = 25 ms a token).
/// Two calls of 40 + 30 fit the window's 100 together where their totals
/// (140) would not; a third's prompt waits for room; a response saying
/// only its output moves the bucket and leaves the window at the
/// estimate, one saying only its input frees the window at once.
pub fn input_and_output_tokens() -> Scenario {
    let mut b = Build::new(10, 1000);
    b.0.tokens = vec![(100, 1000, Unit::InputTokens)];
    b.0.token_buckets = vec![(40, 1000, 20, Unit::OutputTokens)];
    let take = |input, output| Op::TakeTokens {
        tokens: TokenWeight::split(input, output),
    };
    let said = |input, output| Op::SettleUsed {
        pick: 0,
        ago: 0,
        used: Used {
            total: None,
            input,
            output,
        },
    };
    b.at(0, take(40, 3))
        .at(0, take(40, 3))
        .at(0, take(30, 0))
        .at(10, said(None, Some(1)))
        .at(10, take(30, 0))
        .at(20, said(Some(10), None))
        .at(20, take(30, 0))
        .at(20, take(0, 30))
        .0
}

/// 100 tokens per 2 s stated while two calls of 40 are out, then found to
/// refill continuously over 1 s: the window's answered call and the calls
/// out are replayed into a bucket of 100 per 1 s, which what the server
/// says is used and each usage correct from then on.
pub fn stated_window_refills() -> Scenario {
    let take = Op::TakeTokens {
        tokens: TokenWeight::whole(40),
    };
    let stated = |used| Op::Stated {
        quota: 100,
        window: 2000,
        used,
        unit: Unit::Tokens,
    };
    let said = |used| Op::SettleUsed {
        pick: 0,
        ago: 0,
        used: Used {
            total: Some(used),
            input: None,
            output: None,
        },
    };
    Build::new(10, 1000)
        .n(2, 0, take)
        .at(0, stated(0))
        .at(10, said(30))
        .at(20, take)
        .at(
            20,
            Op::Refill {
                period: 1000,
                used: 60,
            },
        )
        .at(20, take)
        .at(20, stated(95))
        .at(20, take)
        .at(30, said(10))
        .at(30, take)
        .0
}

/// Every hand-written scenario, named.
pub fn all() -> Vec<(&'static str, Scenario)> {
    vec![
        ("burst_600_per_6s", burst_600_per_6s()),
        ("in_flight_10_per_1s", in_flight_10_per_1s()),
        ("secret_6_of_10_per_1s", secret_6_of_10_per_1s()),
        ("late_429_10_per_1s", late_429_10_per_1s()),
        ("reported_10_per_1s", reported_10_per_1s()),
        ("raised_again_10_per_1s", raised_again_10_per_1s()),
        (
            "held_while_learning_10_per_1s",
            held_while_learning_10_per_1s(),
        ),
        (
            "granted_at_the_lowering_10_per_1s",
            granted_at_the_lowering_10_per_1s(),
        ),
        (
            "two_limits_10_per_1s_and_15_per_3s",
            two_limits_10_per_1s_and_15_per_3s(),
        ),
        ("bucket_30_per_1s_burst_5", bucket_30_per_1s_burst_5()),
        (
            "bucket_10_per_1s_under_2_per_1s",
            bucket_10_per_1s_under_2_per_1s(),
        ),
        ("bucket_10_per_1s_widened", bucket_10_per_1s_widened()),
        ("fixed_5_per_1s", fixed_5_per_1s()),
        ("fixed_5_per_1s_aligned", fixed_5_per_1s_aligned()),
        (
            "fixed_aligned_after_its_calls_ended",
            fixed_aligned_after_its_calls_ended(),
        ),
        (
            "fixed_5_per_1s_spent_elsewhere",
            fixed_5_per_1s_spent_elsewhere(),
        ),
        (
            "fixed_tokens_100_per_1s_aligned",
            fixed_tokens_100_per_1s_aligned(),
        ),
        ("tokens_100_per_1s", tokens_100_per_1s()),
        (
            "token_bucket_100_per_1s_burst_50",
            token_bucket_100_per_1s_burst_50(),
        ),
        ("input_and_output_tokens", input_and_output_tokens()),
        ("stated_window_refills", stated_window_refills()),
    ]
}

/// The drip rules' scenarios: SpikeArrest at 10 per 1 s (a bucket of 1,
/// one call per 100 ms): a call in flight is never paid back by the drip,
/// a completion lets it resume from its response.
pub fn spike_10_per_1s() -> Scenario {
    Build::new(10, 1000)
        .n(2, 0, Op::Take)
        .at(100, Op::Take)
        .at(150, OLDEST)
        .at(150, Op::Take)
        .at(250, Op::Take)
        .at(250, Op::Settle { pick: 0, ago: 50 })
        .at(250, Op::Take)
        .at(350, Op::Take)
        .at(360, Op::Cancel { pick: 0 })
        .at(360, Op::Take)
        .0
}

/// SpikeArrest at 30 per 1 s (a bucket of 3): the burst, one call per
/// 33.3 ms after it, a 429's pause that empties the bucket, and a lower
/// reported rate that slows the drip and never speeds it up.
pub fn spike_30_per_1s() -> Scenario {
    Build::new(30, 1000)
        .calls(3, 0)
        .at(0, Op::Take)
        .at(34, Op::Take)
        .at(40, Op::RateLimited { pause: 500 })
        .at(100, Op::Take)
        .at(540, Op::Take)
        .at(600, Op::InForce { limit: 10 })
        .at(600, Op::Take)
        .at(600, Op::InForce { limit: 20 })
        .at(700, OLDEST)
        .at(720, Op::Take)
        .at(800, Op::Full)
        .at(800, Op::Take)
        .0
}

/// A token bucket under 30 per 1 s: its burst, its drip, a call never sent
/// giving its token back, a 429 emptying it, and a lower reported limit
/// soon after the start owing the opening burst.
pub fn bucket_30_per_1s() -> Scenario {
    Build::new(30, 1000)
        .n(6, 0, Op::Take)
        .at(10, Op::Cancel { pick: 0 })
        .at(10, Op::Take)
        .n(5, 15, OLDEST)
        .at(20, Op::RateLimited { pause: 200 })
        .at(100, Op::Take)
        .at(220, Op::Take)
        .at(262, Op::Take)
        .at(300, Op::InForce { limit: 10 })
        .at(300, Op::InForce { limit: 20 })
        .at(300, Op::Take)
        .at(2000, Op::Take)
        .0
}

/// Every hand-written scenario of the drip rules, named, with its rule.
pub fn drip_all() -> Vec<(&'static str, super::drip::DripRule, Scenario)> {
    use super::drip::DripRule;
    vec![
        ("spike_10_per_1s", DripRule::Spike, spike_10_per_1s()),
        ("spike_30_per_1s", DripRule::Spike, spike_30_per_1s()),
        (
            "bucket_30_per_1s_burst_5",
            DripRule::Bucket { burst: Some(5) },
            bucket_30_per_1s(),
        ),
        (
            "bucket_30_per_1s",
            DripRule::Bucket { burst: None },
            bucket_30_per_1s(),
        ),
    ]
}
