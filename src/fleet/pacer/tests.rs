use super::*;
use reqwest::header::HeaderMap;

#[test]
fn leases_follow_the_timeout_within_bounds() {
    assert_eq!(
        lease_for(Duration::from_millis(200)),
        Duration::from_secs(3)
    );
    assert_eq!(lease_for(Duration::from_secs(2)), Duration::from_secs(6));
    assert_eq!(lease_for(Duration::from_secs(30)), Duration::from_secs(15));
}

#[test]
fn headroom_scales_down_and_never_to_zero() {
    assert_eq!(scaled(60, 1.0), 60);
    assert_eq!(scaled(60, 0.9), 54);
    assert_eq!(scaled(10, 0.7), 7);
    assert_eq!(scaled(5, 0.1), 1);
}

#[test]
fn the_script_names_every_op_the_pacer_sends() {
    for op in [
        "'take'",
        "'settle'",
        "'beat'",
        "'pause'",
        "'inforce'",
        "'full'",
        "'adopt'",
        "'start'",
    ] {
        assert!(SCRIPT.contains(&format!("op == {op}")), "{op}");
    }
    // The drip rules' ops are `spike_<verb>` and `bucket_<verb>`.
    for verb in ["'take'", "'settle'", "'pause'", "'inforce'"] {
        assert!(SCRIPT.contains(&format!("verb == {verb}")), "{verb}");
    }
    assert!(SCRIPT.contains("redis.call('TIME')"));
}

/// The fleet's even pace (a bare rate's refused burst) leaves the same
/// allowance for latency as the in-process one, and ramps from the same
/// share of its rate.
#[test]
fn the_scripts_even_pace_allows_the_in_process_skew_and_ramp() {
    let skew = format!("local EVEN_SKEW = {}\n", crate::rate::learn::SKEW);
    assert!(SCRIPT.contains(&skew), "{skew}");
    let ramp = format!("local RAMP_FROM = {}\n", crate::rate::learn::RAMP_FROM);
    assert!(SCRIPT.contains(&ramp), "{ramp}");
}

/// A window adopted for a stated quota counts no more answered calls than
/// in-process: a billion-call quota nearly used up is a bound, not a
/// script that blocks Redis.
#[test]
fn the_script_seeds_an_adopted_window_as_far_as_in_process() {
    let bound = format!(
        "local MAX_PREFILL = {}\n",
        crate::rate::policies::MAX_PREFILL
    );
    assert!(SCRIPT.contains(&bound), "{bound}");
}

fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (n, v) in pairs {
        h.insert(
            reqwest::header::HeaderName::from_bytes(n.as_bytes()).unwrap(),
            reqwest::header::HeaderValue::from_str(v).unwrap(),
        );
    }
    h
}

/// What a server states binds the fleet, switching learning from 429s off,
/// unless it is a quota of the primary window above the configured one or
/// one of another window: a limit kept unstated beside that (a second's,
/// beside an hour's) is learnt from 429s, but for one while the stated
/// quota is used up (`explains`), as in-process.
#[test]
fn a_quota_stated_above_the_configured_one_leaves_learning_on() {
    use face::Said;
    let second = Duration::from_secs(1);
    let said = |pairs: &[(&str, &str)]| Said::of(&headers(pairs), second, &[], &[]);
    let thousand = said(&[("x-ratelimit-limit", "1000")]);
    assert!(!thousand.binds(40));
    assert!(thousand.binds(1000) && thousand.binds(2000) && thousand.binds(0));
    assert!(said(&[("x-ratelimit-remaining", "3")]).binds(40));
    let other_window = said(&[("ratelimit-policy", r#""h";q=5000;w=3600"#)]);
    assert!(!other_window.binds(40));
    assert_eq!(other_window.explains, None);
    let used_up = said(&[
        ("ratelimit-policy", r#""h";q=5000;w=3600"#),
        ("ratelimit", r#""h";r=0;t=900"#),
    ]);
    assert_eq!(used_up.explains, Some(Duration::from_secs(900)));
    // With no reset, as in-process: its window (here the fleet's second);
    // a reset of nothing, a second.
    let no_reset = said(&[("x-ratelimit-limit", "5"), ("x-ratelimit-remaining", "0")]);
    assert_eq!(no_reset.explains, Some(second));
    let zero = said(&[
        ("ratelimit-policy", r#""h";q=5;w=3600"#),
        ("ratelimit", r#""h";r=0;t=0"#),
    ]);
    assert_eq!(zero.explains, Some(Duration::from_secs(1)));
}

#[test]
fn the_fleet_reads_a_limit_of_its_window_in_every_dialect() {
    use face::Said;
    let second = Duration::from_secs(1);
    let said = |pairs: &[(&str, &str)]| Said::of(&headers(pairs), second, &[], &[]);
    let twenty = Said {
        limit: Some(20),
        told: true,
        used_up: false,
        others: Vec::new(),
        spent: Vec::new(),
        ..Said::default()
    };
    assert_eq!(
        said(&[("ratelimit-policy", r#""default";q=20;w=1"#)]),
        twenty
    );
    assert_eq!(said(&[("x-ratelimit-limit", "20")]), twenty);
    assert_eq!(said(&[("x-rate-limit-limit", "20")]), twenty);
    assert_eq!(said(&[("ratelimit-limit", "20")]), twenty);
    // What is left alone says the limit is no secret; nothing left holds.
    assert_eq!(
        said(&[("x-rate-limit-remaining", "0")]),
        Said {
            limit: None,
            told: true,
            used_up: true,
            others: Vec::new(),
            spent: Vec::new(),
            ..Said::default()
        }
    );
    assert_eq!(
        said(&[
            ("anthropic-ratelimit-requests-limit", "20"),
            ("anthropic-ratelimit-requests-remaining", "0"),
            ("anthropic-ratelimit-requests-reset", "2023-08-09T14:28:03Z"),
        ]),
        Said {
            used_up: true,
            // A reset already past: the quota is back within the second.
            explains: Some(Duration::from_secs(1)),
            ..twenty
        }
    );
    // The lowest of two policies of the window wins.
    let two = said(&[(
        "ratelimit-policy",
        r#""a";q=30;w=1,"b";q=20;w=1,"hour";q=5;w=3600"#,
    )]);
    assert_eq!((two.limit, two.told, two.used_up), (Some(20), true, false));
    assert_eq!(said(&[]), Said::default());
}

/// The policies a fleet adopts (`heard.rs`): a window of calls other than
/// its own, with what is used of it, and tokens, per minute when no window
/// is stated; never the primary window's own.
#[test]
fn the_fleet_reads_the_policies_of_other_windows_and_of_tokens() {
    use face::Said;
    let second = Duration::from_secs(1);
    let others = |pairs: &[(&str, &str)]| {
        let s = Said::of(&headers(pairs), second, &[], &[]);
        let o: Vec<(Unit, u64, u64, u64)> = s
            .others
            .iter()
            .map(|p| (p.unit, p.quota, p.window.as_secs(), p.used))
            .collect();
        (s.limit, s.told, o)
    };
    assert_eq!(
        others(&[
            ("ratelimit-policy", r#""s";q=20;w=1,"hour";q=500;w=3600"#),
            ("ratelimit", r#""hour";r=440;t=900"#),
        ]),
        (Some(20), true, vec![(Unit::Calls, 500, 3600, 60)])
    );
    // A window of another length alone leaves a limit of the fleet's own
    // window unstated.
    assert_eq!(
        others(&[("ratelimit-policy", r#""hour";q=5;w=3600"#)]),
        (None, false, vec![(Unit::Calls, 5, 3600, 0)])
    );
    assert_eq!(
        others(&[
            ("x-ratelimit-limit-requests", "20"),
            ("x-ratelimit-limit-tokens", "150000"),
            ("x-ratelimit-remaining-tokens", "149000"),
        ]),
        (Some(20), true, vec![(Unit::Tokens, 150000, 60, 1000)])
    );
    assert_eq!(
        others(&[("ratelimit-policy", r#""t";q=900;w=10;qu="tokens""#)]),
        (None, false, vec![(Unit::Tokens, 900, 10, 0)])
    );
    // Anthropic's input and output tokens, each adopted as what it counts.
    assert_eq!(
        others(&[
            ("anthropic-ratelimit-input-tokens-limit", "20000"),
            ("anthropic-ratelimit-input-tokens-remaining", "19000"),
            ("anthropic-ratelimit-output-tokens-limit", "4000"),
            ("anthropic-ratelimit-output-tokens-remaining", "4000"),
        ]),
        (
            None,
            false,
            vec![
                (Unit::InputTokens, 20000, 60, 1000),
                (Unit::OutputTokens, 4000, 60, 0)
            ]
        )
    );
}

/// A policy of any kind with nothing left and a reset holds the fleet
/// until then: what is said of it, in delta seconds or as an instant.
#[test]
fn a_used_up_policy_with_a_reset_is_said_with_its_reset() {
    use face::Said;
    let second = Duration::from_secs(1);
    let spent = |pairs: &[(&str, &str)]| -> Vec<u64> {
        let s = Said::of(&headers(pairs), second, &[], &[]);
        s.spent.iter().map(|(_, r)| r.as_secs()).collect()
    };
    assert_eq!(
        spent(&[
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", "3600")
        ]),
        [3600]
    );
    assert_eq!(
        spent(&[
            ("ratelimit-policy", r#""day";q=500;w=86400,"s";q=9;w=1"#),
            ("ratelimit", r#""day";r=0;t=7200,"s";r=4;t=1"#),
        ]),
        [7200]
    );
    // Something left, or no reset: nothing to hold for here.
    assert!(spent(&[("x-ratelimit-remaining", "3"), ("x-ratelimit-reset", "60")]).is_empty());
    assert!(spent(&[("x-ratelimit-remaining", "0")]).is_empty());
}

/// The resets a fixed window may be aligned to: a policy of calls stated
/// with its window, and one of tokens (a minute's when stated with none);
/// never one of content bytes or concurrent requests, which pace nothing
/// (a review found them read as calls, aligning a fixed window of calls
/// to a reset of bytes).
#[test]
fn only_policies_of_calls_and_tokens_say_a_reset_to_align_to() {
    use crate::rate::policy::Unit;
    use face::Said;
    let second = Duration::from_secs(1);
    let resets = |pairs: &[(&str, &str)]| {
        let s = Said::of(&headers(pairs), second, &[], &[]);
        (s.resets.iter())
            .map(|&(u, w, r, _)| (u, w.as_secs(), r.as_secs()))
            .collect::<Vec<_>>()
    };
    let policy = r#""m";q=5;w=60,"t";q=900;w=60;qu="tokens",
        "b";q=65535;w=10;qu="content-bytes","c";q=4;qu="concurrent-requests""#;
    assert_eq!(
        resets(&[
            ("ratelimit-policy", &policy.replace('\n', "")),
            (
                "ratelimit",
                r#""m";r=1;t=40,"t";r=9;t=30,"b";r=9;t=7,"c";r=1;t=3"#
            ),
        ]),
        [(Unit::Calls, 60, 40), (Unit::Tokens, 60, 30)]
    );
    assert_eq!(
        resets(&[
            ("x-ratelimit-limit-tokens", "9000"),
            ("x-ratelimit-remaining-tokens", "10"),
            ("x-ratelimit-reset-tokens", "12s"),
        ]),
        [(Unit::Tokens, 60, 12)]
    );
}
