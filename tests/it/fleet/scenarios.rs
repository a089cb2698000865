//! The random scenarios the shared harness drives the fleet's script and
//! the in-process rule through (`rule.rs`): every op of
//! `batchrun::rate::scenario`, on random policies.

use batchrun::rate::policy::{TokenWeight, Unit, Used};
use batchrun::rate::scenario::{Op, Scenario, Step};
use proptest::prelude::*;

/// What a policy of tokens counts.
fn unit() -> impl Strategy<Value = Unit> {
    prop_oneof![
        Just(Unit::Tokens),
        Just(Unit::InputTokens),
        Just(Unit::OutputTokens)
    ]
}

/// A call's estimate: split into prompt and answer, or not split (a
/// `--cost` expression, counted whole by every unit).
fn weight() -> impl Strategy<Value = TokenWeight> {
    prop_oneof![
        (0u64..=200, 0u64..=100).prop_map(|(i, o)| TokenWeight::split(i, o)),
        (0u64..=250).prop_map(TokenWeight::whole),
    ]
}

/// What a response says a call used: every part, its total only (a
/// custom `--usage`), or one part (the other stays at the estimate).
fn usage() -> impl Strategy<Value = Used> {
    let part = proptest::option::of(0u64..=200);
    prop_oneof![
        (0u64..=200, 0u64..=100).prop_map(|(i, o)| Used::from(TokenWeight::split(i, o))),
        (0u64..=250).prop_map(Used::total),
        (part.clone(), part).prop_map(|(input, output)| Used {
            total: None,
            input,
            output
        }),
    ]
}

pub(super) fn op(window: u64) -> impl Strategy<Value = Op> {
    prop_oneof![
        12 => Just(Op::Take),
        8 => (0usize..8, 0..=window).prop_map(|(pick, ago)| Op::Settle { pick, ago }),
        1 => (0usize..8).prop_map(|pick| Op::Cancel { pick }),
        2 => prop_oneof![0..=window / 8, 0..=2 * window].prop_map(|pause| Op::RateLimited { pause }),
        1 => Just(Op::Full),
    ]
}

/// Steps often in one instant, else a few ms apart, now and then a window
/// or two; a limit reported in half the scenarios.
pub(super) fn scenarios() -> impl Strategy<Value = Scenario> {
    // A further limit in a third of them, two now and then.
    let further = prop_oneof![
        4 => Just(Vec::new()),
        2 => proptest::collection::vec((1u64..=8, 20u64..=3000), 1..=2),
    ];
    // A GCRA bucket in a third of them (N, W ms, burst), now and then two.
    let buckets = prop_oneof![
        4 => Just(Vec::new()),
        2 => proptest::collection::vec((1u64..=12, 20u64..=3000, 0u64..=4), 1..=2),
    ];
    // A fixed window in a sixth of them: of calls, or now and then of
    // tokens (weighed takes and settles then correct it, as a token
    // window's).
    let fixed = prop_oneof![
        10 => Just(Vec::new()),
        1 => (1u64..=8, 20u64..=3000).prop_map(|(n, w)| vec![(n, w, Unit::Calls)]),
        1 => (1u64..=200, 20u64..=3000, unit()).prop_map(|f| vec![f]),
    ];
    // Token windows (Q, W ms, of all tokens or a prompt's or an answer's)
    // in a third of them, now and then two, with weighed takes and settles
    // that correct them.
    let tokens = prop_oneof![
        4 => Just(Vec::new()),
        2 => proptest::collection::vec((1u64..=200, 20u64..=3000, unit()), 1..=2),
    ];
    // Token buckets (Q, W ms, burst, unit) in a sixth of them: weighed as
    // the token windows, a call heavier than the bucket now and then.
    let token_buckets = prop_oneof![
        5 => Just(Vec::new()),
        1 => proptest::collection::vec(
            (1u64..=300, 20u64..=3000, 0u64..=200, unit()),
            1..=2
        ),
    ];
    (
        1u64..=8,
        20u64..=1500,
        any::<bool>(),
        further,
        (buckets, fixed, tokens, token_buckets),
    )
        .prop_flat_map(
            |(limit, window, reports, further, (buckets, fixed, tokens, token_buckets))| {
                let gap = prop_oneof![3 => Just(0), 6 => 1..=window / 8, 1 => window..=2 * window];
                let inforce = (1u64..=10).prop_map(|limit| Op::InForce { limit });
                // Weighed takes now and then with no policy of tokens
                // configured, for one the server states (and a refill
                // then counts the calls out at their estimates).
                let fixed_tokens = fixed.iter().any(|f| f.2.is_tokens());
                let weighed = if tokens.is_empty() && token_buckets.is_empty() && !fixed_tokens {
                    4
                } else {
                    20
                };
                let weighed_op =
                    prop_oneof![
                        weight().prop_map(|tokens| Op::TakeTokens { tokens }),
                        (0usize..8, 0..=window, usage())
                            .prop_map(|(pick, ago, used)| Op::SettleUsed { pick, ago, used }),
                    ];
                // A policy stated in a window no policy of the scenario
                // keeps (a fleet adopts it as a key of its own), once of
                // calls at most, and one of tokens, stated again and again.
                let taken: Vec<u64> = std::iter::once(window)
                    .chain(further.iter().map(|p| p.1))
                    .chain(fixed.iter().map(|p| p.1))
                    .chain(tokens.iter().map(|t| t.1))
                    .chain(buckets.iter().map(|b| b.1))
                    .chain(token_buckets.iter().map(|b| b.1))
                    .collect();
                let periods = taken.clone();
                let stated = (
                    prop_oneof![Just(Unit::Calls), unit()],
                    1u64..=200,
                    20u64..=3000,
                    0.0..1.0f64,
                )
                    .prop_map(move |(unit, quota, mut window, used)| {
                        let quota = if unit.is_tokens() {
                            quota
                        } else {
                            quota % 8 + 1
                        };
                        while taken.contains(&window) {
                            window += 1;
                        }
                        let used = (quota as f64 * used) as u64;
                        Op::Stated {
                            quota,
                            window,
                            used,
                            unit,
                        }
                    });
                // Now and then the stated window of tokens is found to
                // refill continuously, over a period no policy keeps.
                let refill = (20u64..=3000, 0u64..=300).prop_map(move |(mut period, used)| {
                    while periods.contains(&period) {
                        period += 1;
                    }
                    Op::Refill { period, used }
                });
                // A bucket's policy said used up, now and then, when the
                // scenario keeps one: reset in whole seconds (under one,
                // a second or longer) or to the ms.
                let emptied_weight = if buckets.is_empty() { 0 } else { 2 };
                let emptied = (
                    0usize..4,
                    prop_oneof![Just(1000u64), 1u64..=3000],
                    any::<bool>(),
                )
                    .prop_map(|(bucket, reset, exact)| Op::Emptied {
                        bucket,
                        reset,
                        exact,
                    });
                // A fixed window's reset stated, now and then, when the
                // scenario keeps one: certain enough to align it, or not.
                let fixed_w = fixed.first().map_or(0, |f| f.1);
                let aligned_weight = if fixed.is_empty() { 0 } else { 2 };
                let aligned = (0..=2 * fixed_w, 0..=fixed_w / 8, 0..=fixed_w / 8).prop_map(
                    |(reset, early, late)| Op::Aligned {
                        fixed: 0,
                        reset,
                        early,
                        late,
                    },
                );
                // What a fixed window's policy has used, now and then: more
                // than the window counts (spent elsewhere) or not. Not where
                // a bucket keeps the same window (in-process reads the
                // statement against the bucket then) or the stated quota
                // is a bucket's.
                let fixed_n = fixed.first().map_or(1, |f| f.0);
                let shared = fixed
                    .first()
                    .is_some_and(|f| buckets.iter().any(|b| b.1 == f.1));
                let spent_weight = if fixed.is_empty() || shared { 0 } else { 2 };
                let spent = (0..=fixed_n).prop_map(|used| Op::Spent { fixed: 0, used });
                let op = prop_oneof![
                    40 => op(window),
                    spent_weight => spent,
                    u32::from(reports) => inforce,
                    weighed => weighed_op,
                    2 => stated,
                    1 => refill,
                    emptied_weight => emptied,
                    aligned_weight => aligned,
                ];
                proptest::collection::vec((gap, op), 1..=80).prop_map(move |steps| {
                    let mut at = 0;
                    let mut calls_once = false;
                    // A token policy stated again is the same policy with
                    // what the server says is used of it now.
                    let mut budget: Option<(u64, u64, Unit)> = None;
                    let mut refilled: Vec<u64> = Vec::new();
                    let steps = steps
                        .into_iter()
                        .filter_map(|(gap, op)| match op {
                            // Twice at most, of the budget stated, each
                            // at a period other than its window and the
                            // last (the second retimes the bucket found).
                            Op::Refill { period, used } => {
                                let (quota, w, _) = budget?;
                                if period == w || refilled.len() == 2 || refilled.contains(&period)
                                {
                                    return None;
                                }
                                refilled.push(period);
                                let used = used.min(quota.saturating_sub(1));
                                Some((gap, Op::Refill { period, used }))
                            }
                            Op::Stated {
                                unit: Unit::Calls, ..
                            } => (!std::mem::replace(&mut calls_once, true)).then_some((gap, op)),
                            Op::Stated {
                                quota,
                                window,
                                used,
                                unit,
                            } => {
                                let (quota, window, unit) =
                                    *budget.get_or_insert((quota, window, unit));
                                let used = used.min(quota.saturating_sub(1));
                                Some((
                                    gap,
                                    Op::Stated {
                                        quota,
                                        window,
                                        used,
                                        unit,
                                    },
                                ))
                            }
                            op => Some((gap, op)),
                        })
                        .map(|(gap, op)| {
                            at += gap;
                            Step { at, op }
                        })
                        .collect();
                    Scenario {
                        limit,
                        window,
                        further: further.clone(),
                        buckets: buckets.clone(),
                        fixed: fixed.clone(),
                        tokens: tokens.clone(),
                        token_buckets: token_buckets.clone(),
                        steps,
                    }
                })
            },
        )
}
