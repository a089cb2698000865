use super::*;
use proptest::prelude::*;
use reqwest::header::{HeaderName, HeaderValue};

/// 2023-08-09 14:29:23 UTC, GitHub's documented reset minus 100 s.
const NOW: Duration = Duration::from_secs(1_691_591_263);

fn map(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (n, v) in pairs {
        h.insert(
            HeaderName::from_bytes(n.as_bytes()).unwrap(),
            HeaderValue::from_str(v).unwrap(),
        );
    }
    h
}

fn secs(s: u64) -> Option<Duration> {
    Some(Duration::from_secs(s))
}

fn policy(
    name: &str,
    unit: Unit,
    quota: Option<u64>,
    window: Option<Duration>,
    remaining: Option<u64>,
    reset_in: Option<Duration>,
) -> Announced {
    Announced {
        name: name.into(),
        unit,
        quota,
        window,
        remaining,
        reset_in,
        reset_exact: false,
        reset_dated: false,
    }
}

#[test]
fn no_rate_headers_announce_nothing() {
    assert!(read(&HeaderMap::new(), NOW).is_empty());
    assert!(read(&map(&[("content-type", "application/json")]), NOW).is_empty());
}

#[test]
fn ietf_current_draft_names_policies_and_their_state() {
    // draft-ietf-httpapi-ratelimit-headers, section 1 and 4 examples.
    let h = map(&[
        (
            "ratelimit-policy",
            r#""burst";q=100;w=60,"daily";q=1000;w=86400"#,
        ),
        ("ratelimit", r#""daily";r=50;t=30"#),
    ]);
    assert_eq!(
        read(&h, NOW),
        vec![
            policy("burst", Unit::Calls, Some(100), secs(60), None, None),
            policy(
                "daily",
                Unit::Calls,
                Some(1000),
                secs(86400),
                Some(50),
                secs(30)
            ),
        ]
    );
}

#[test]
fn ietf_quota_units_are_kept() {
    let h = map(&[(
        "ratelimit-policy",
        r#""peruser";q=65535;qu="content-bytes";w=10, "tok";q=5000;qu="tokens";w=60"#,
    )]);
    let units: Vec<_> = read(&h, NOW).into_iter().map(|a| a.unit).collect();
    assert_eq!(units, [Unit::Other, Unit::Tokens]);
}

#[test]
fn a_ratelimit_field_alone_gives_what_is_left() {
    let h = map(&[("ratelimit", r#""default";r=0;t=7"#)]);
    assert_eq!(
        read(&h, NOW),
        vec![policy("default", Unit::Calls, None, None, Some(0), secs(7))]
    );
}

#[test]
fn ietf_older_form_with_policies() {
    let h = map(&[
        ("ratelimit-limit", "10"),
        ("ratelimit-remaining", "1"),
        ("ratelimit-reset", "7"),
        ("ratelimit-policy", "10;w=1, 1000;w=3600"),
    ]);
    assert_eq!(
        read(&h, NOW),
        vec![
            policy("policy 1", Unit::Calls, Some(10), secs(1), Some(1), secs(7)),
            policy("policy 2", Unit::Calls, Some(1000), secs(3600), None, None),
        ]
    );
    // The earliest draft: the policies follow the limit in RateLimit-Limit.
    let h = map(&[
        ("ratelimit-limit", "10, 10;w=1, 50;w=60"),
        ("ratelimit-remaining", "9"),
    ]);
    let got = read(&h, NOW);
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(
        (got[0].quota, got[0].window, got[0].remaining),
        (Some(10), secs(1), Some(9))
    );
    assert_eq!((got[1].quota, got[1].window), (Some(50), secs(60)));
    // No policy at all: the limit, without a window.
    let h = map(&[
        ("ratelimit-limit", "100"),
        ("ratelimit-remaining", "0"),
        ("ratelimit-reset", "30"),
    ]);
    assert_eq!(
        read(&h, NOW),
        vec![policy(
            "ratelimit",
            Unit::Calls,
            Some(100),
            None,
            Some(0),
            secs(30)
        )]
    );
}

#[test]
fn github_resets_are_epoch_seconds() {
    // docs.github.com, "Rate limits for the REST API".
    let h = map(&[
        ("x-ratelimit-limit", "5000"),
        ("x-ratelimit-remaining", "4999"),
        ("x-ratelimit-used", "1"),
        ("x-ratelimit-reset", "1691591363"),
        ("x-ratelimit-resource", "core"),
    ]);
    assert_eq!(
        read(&h, NOW),
        vec![policy(
            "core",
            Unit::Calls,
            Some(5000),
            None,
            Some(4999),
            secs(100)
        )]
    );
}

#[test]
fn x_ratelimit_resets_may_be_deltas_and_batchrun_spells_it_its_way() {
    let h = map(&[
        ("x-ratelimit-limit", "60"),
        ("x-ratelimit-remaining", "0"),
        ("x-ratelimit-reset", "42"),
    ]);
    assert_eq!(
        read(&h, NOW),
        vec![policy(
            "x-ratelimit",
            Unit::Calls,
            Some(60),
            None,
            Some(0),
            secs(42)
        )]
    );
    let h = map(&[
        ("x-rate-limit-limit", "20"),
        ("x-rate-limit-remaining", "3"),
    ]);
    assert_eq!(
        read(&h, NOW),
        vec![policy(
            "x-rate-limit",
            Unit::Calls,
            Some(20),
            None,
            Some(3),
            None
        )]
    );
    // A reset in epoch milliseconds, and one already past.
    assert_eq!(
        reset_secs(1_691_591_263_500, NOW),
        Duration::from_millis(500)
    );
    assert_eq!(reset_secs(1_600_000_000, NOW), Duration::ZERO);
    // The year 3000, in epoch seconds: far off, not 1971 in milliseconds.
    assert_eq!(
        reset_secs(32_503_680_000, NOW),
        Duration::from_secs(32_503_680_000) - NOW
    );
    // The end of the year 9999, in epoch seconds: far off, not 1978 in
    // milliseconds (a quota said used up for good was read as reset). A
    // millisecond epoch of a day ago is still milliseconds, and past.
    assert_eq!(
        reset_secs(253_402_300_799, NOW),
        Duration::from_secs(253_402_300_799) - NOW
    );
    let yesterday = (NOW - Duration::from_secs(86_000)).as_millis() as u64;
    assert_eq!(reset_secs(yesterday, NOW), Duration::ZERO);
}

#[test]
fn openai_requests_and_tokens_with_go_durations() {
    // platform.openai.com, "Rate limits": headers.
    let h = map(&[
        ("x-ratelimit-limit-requests", "60"),
        ("x-ratelimit-limit-tokens", "150000"),
        ("x-ratelimit-remaining-requests", "59"),
        ("x-ratelimit-remaining-tokens", "149984"),
        ("x-ratelimit-reset-requests", "1s"),
        ("x-ratelimit-reset-tokens", "6m0s"),
    ]);
    assert_eq!(
        read(&h, NOW),
        vec![
            policy("requests", Unit::Calls, Some(60), None, Some(59), secs(1)),
            policy(
                "tokens",
                Unit::Tokens,
                Some(150000),
                None,
                Some(149984),
                secs(360)
            ),
        ]
    );
    // Finer than whole seconds: exact, where whole seconds may be rounded.
    let h = map(&[
        ("x-ratelimit-limit-requests", "60"),
        ("x-ratelimit-remaining-requests", "0"),
        ("x-ratelimit-reset-requests", "97ms"),
    ]);
    assert!(read(&h, NOW)[0].reset_exact);
}

#[test]
fn go_durations() {
    let ms = |m| Some(Duration::from_millis(m));
    assert_eq!(fields::go_duration("20ms"), ms(20));
    assert_eq!(fields::go_duration("1m30.5s"), ms(90_500));
    assert_eq!(fields::go_duration("2h0m0s"), ms(7_200_000));
    assert_eq!(fields::go_duration("0.25"), ms(250));
    for bad in ["", "s", "1x", "1.2.3s", "-1s", "1e400s", "NaN"] {
        assert_eq!(fields::go_duration(bad), None, "{bad}");
    }
}

#[test]
fn anthropic_resets_are_rfc3339() {
    // docs.anthropic.com, "Rate limits": response headers.
    let h = map(&[
        ("anthropic-ratelimit-requests-limit", "50"),
        ("anthropic-ratelimit-requests-remaining", "0"),
        ("anthropic-ratelimit-requests-reset", "2023-08-09T14:28:03Z"),
        ("anthropic-ratelimit-input-tokens-limit", "40000"),
        ("anthropic-ratelimit-input-tokens-remaining", "39000"),
        (
            "anthropic-ratelimit-input-tokens-reset",
            "2023-08-09T16:27:53.5+02:00",
        ),
    ]);
    assert_eq!(
        read(&h, NOW),
        vec![
            policy("requests", Unit::Calls, Some(50), None, Some(0), secs(20)),
            policy(
                "input-tokens",
                Unit::InputTokens,
                Some(40000),
                None,
                Some(39000),
                Some(Duration::from_millis(10_500))
            ),
        ]
    );
}

/// Anthropic states `tokens` as the most restrictive of its input and
/// output limits: beside both it is left out (read as all of a call's
/// tokens, it held prompts and answers together to the output quota);
/// alone, or beside one of them, it is a quota of all tokens.
#[test]
fn anthropics_tokens_beside_input_and_output_tokens_is_left_out() {
    let reset = "2023-08-09T14:28:03Z";
    let mut fields = vec![
        ("anthropic-ratelimit-tokens-limit", "8000"),
        ("anthropic-ratelimit-tokens-remaining", "7000"),
        ("anthropic-ratelimit-tokens-reset", reset),
    ];
    let alone = read(&map(&fields), NOW);
    assert_eq!(
        alone.iter().map(|a| a.unit).collect::<Vec<_>>(),
        [Unit::Tokens]
    );
    fields.extend([
        ("anthropic-ratelimit-input-tokens-limit", "40000"),
        ("anthropic-ratelimit-input-tokens-remaining", "39000"),
        ("anthropic-ratelimit-input-tokens-reset", reset),
    ]);
    // Beside the input limit alone, it may be the only word of the output
    // one: kept.
    let units: Vec<Unit> = read(&map(&fields), NOW).iter().map(|a| a.unit).collect();
    assert_eq!(units, [Unit::Tokens, Unit::InputTokens]);
    fields.extend([
        ("anthropic-ratelimit-output-tokens-limit", "8000"),
        ("anthropic-ratelimit-output-tokens-remaining", "7000"),
        ("anthropic-ratelimit-output-tokens-reset", reset),
    ]);
    let split = read(&map(&fields), NOW);
    let said: Vec<_> = split
        .iter()
        .map(|a| (a.name.as_str(), a.unit, a.quota))
        .collect();
    assert_eq!(
        said,
        [
            ("input-tokens", Unit::InputTokens, Some(40000)),
            ("output-tokens", Unit::OutputTokens, Some(8000)),
        ]
    );
}

#[test]
fn garbage_is_left_out() {
    let h = map(&[
        (
            "ratelimit-policy",
            r#"q=100, "a";q=x;w=60, 1.5;w=2, "b";q=0"#,
        ),
        ("x-ratelimit-limit", "lots"),
        ("x-ratelimit-reset-requests", "soon"),
        ("x-ratelimit-limit-requests", "0"),
        ("anthropic-ratelimit-tokens-reset", "tomorrow"),
    ]);
    // "a" has only a window, "b" a zero quota: neither is a limit.
    assert_eq!(read(&h, NOW), vec![]);
}

fn header_name() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "ratelimit-policy",
        "ratelimit",
        "ratelimit-limit",
        "ratelimit-remaining",
        "ratelimit-reset",
        "x-ratelimit-limit",
        "x-ratelimit-remaining",
        "x-ratelimit-reset",
        "x-ratelimit-resource",
        "x-rate-limit-limit",
        "x-rate-limit-remaining",
        "x-ratelimit-limit-requests",
        "x-ratelimit-remaining-tokens",
        "x-ratelimit-reset-requests",
        "x-ratelimit-reset-tokens",
        "anthropic-ratelimit-requests-limit",
        "anthropic-ratelimit-requests-remaining",
        "anthropic-ratelimit-requests-reset",
        "anthropic-ratelimit-output-tokens-reset",
        "anthropic-ratelimit-input-tokens-limit",
        "anthropic-ratelimit-tokens-remaining",
    ])
}

/// Values built from the characters the syntaxes care about, plus any byte.
fn header_value() -> impl Strategy<Value = Vec<u8>> {
    let piece = prop_oneof![
        Just(b"\"".to_vec()),
        Just(b";".to_vec()),
        Just(b",".to_vec()),
        Just(b"=".to_vec()),
        Just(b"q=".to_vec()),
        Just(b"w=".to_vec()),
        Just(b"\\".to_vec()),
        Just(b"Z".to_vec()),
        Just(b"+99:99".to_vec()),
        Just(b"2024-02-30T25:61:61".to_vec()),
        Just(b"ms".to_vec()),
        Just(b"18446744073709551615".to_vec()),
        Just(b"99999999999999999999".to_vec()),
        "[0-9.]{1,25}".prop_map(String::into_bytes),
        any::<u8>().prop_map(|b| vec![b]),
    ];
    proptest::collection::vec(piece, 0..12).prop_map(|v| v.concat())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn no_header_value_makes_it_panic(
        pairs in proptest::collection::vec((header_name(), header_value()), 0..8),
        now in any::<u64>(),
    ) {
        let mut h = HeaderMap::new();
        for (n, v) in pairs {
            if let Ok(v) = HeaderValue::from_bytes(&v) {
                h.append(HeaderName::from_static(n), v);
            }
        }
        for a in read(&h, Duration::from_secs(now)) {
            prop_assert!(a.quota != Some(0));
            prop_assert!(a.window.is_none_or(|w| w <= MAX_WINDOW));
            prop_assert!(a.reset_in.is_none_or(|r| r <= MAX_QUOTA_RESET));
        }
    }
}

/// Every line of each header, in order (a header sent twice keeps both).
fn lines(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (n, v) in pairs {
        h.append(
            HeaderName::from_bytes(n.as_bytes()).unwrap(),
            HeaderValue::from_str(v).unwrap(),
        );
    }
    h
}

/// A header sent twice (a proxy's line and the API's): the tighter line
/// governs whichever came first, and a list field's lines are one list.
#[test]
fn a_header_sent_twice_is_read_as_its_tighter_line() {
    for (a, b) in [("1000", "5"), ("5", "1000")] {
        let h = lines(&[
            ("x-rate-limit-limit", a),
            ("x-rate-limit-limit", b),
            ("x-rate-limit-remaining", b),
            ("x-rate-limit-remaining", a),
            ("x-rate-limit-reset", "10"),
            ("x-rate-limit-reset", "60"),
        ]);
        let want = policy(
            "x-rate-limit",
            Unit::Calls,
            Some(5),
            None,
            Some(5),
            secs(60),
        );
        assert_eq!(read(&h, NOW), vec![want], "{a} then {b}");
        assert_eq!(crate::wire::limit_in_force(&h), Some(5), "{a} then {b}");
    }
    let h = lines(&[
        ("x-ratelimit-limit-requests", "500"),
        ("x-ratelimit-limit-requests", "60"),
        ("x-ratelimit-remaining-requests", "59"),
        ("x-ratelimit-reset-requests", "1s"),
        ("x-ratelimit-reset-requests", "6m0s"),
    ]);
    let got = read(&h, NOW);
    assert_eq!((got[0].quota, got[0].reset_in), (Some(60), secs(360)));
    let h = lines(&[
        ("ratelimit-policy", "\"burst\";q=100;w=1"),
        ("ratelimit-policy", "\"daily\";q=1000;w=86400"),
        ("ratelimit", "\"burst\";r=90;t=1"),
        ("ratelimit", "\"burst\";r=3;t=1, \"daily\";r=7;t=600"),
    ]);
    let got = read(&h, NOW);
    let burst = policy("burst", Unit::Calls, Some(100), secs(1), Some(3), secs(1));
    let daily = policy(
        "daily",
        Unit::Calls,
        Some(1000),
        secs(86400),
        Some(7),
        secs(600),
    );
    assert_eq!(got, vec![burst, daily]);
    // The older IETF form, its limit first on each line.
    let h = lines(&[
        ("ratelimit-limit", "1000"),
        ("ratelimit-limit", "10, 10;w=1"),
        ("ratelimit-remaining", "8"),
    ]);
    let got = read(&h, NOW);
    assert!(
        got.iter()
            .any(|p| p.quota == Some(10) && p.remaining == Some(8)),
        "{got:?}"
    );
}

/// A policy whose window cannot be read is left out, not read as a quota
/// of the told window (`q=1;w=1e99` was one call a second); an RFC 3339
/// reset with a lowercase `t` (or a space) between date and time is read.
#[test]
fn an_unreadable_window_is_left_out_and_every_rfc3339_spelling_is_read() {
    let h = map(&[("ratelimit-policy", r#""z";q=1;w=1e99, "ok";q=50;w=60"#)]);
    let got = read(&h, NOW);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!((got[0].name.as_str(), got[0].quota), ("ok", Some(50)));
    for reset in [
        "2023-08-09t14:29:23z",
        "2023-08-09 14:29:23Z",
        "2023-08-09T14:29:23Z",
    ] {
        let h = map(&[
            ("anthropic-ratelimit-requests-limit", "50"),
            ("anthropic-ratelimit-requests-remaining", "0"),
            ("anthropic-ratelimit-requests-reset", reset),
        ]);
        assert_eq!(read(&h, NOW)[0].reset_in, secs(100), "{reset}");
    }
}

/// An Anthropic reset is an instant: measured from the response's own
/// `Date` (the server's clock as it answered) it holds neither the way
/// back nor a skew between the clocks; a `Date` more than a day off this
/// clock is no clock to trust, and this one is used.
#[test]
fn an_anthropic_reset_is_measured_from_the_responses_date() {
    let said = |date: &str| {
        let h = map(&[
            ("date", date),
            ("anthropic-ratelimit-tokens-limit", "40000"),
            ("anthropic-ratelimit-tokens-remaining", "39000"),
            ("anthropic-ratelimit-tokens-reset", "2023-08-09T14:28:03Z"),
        ]);
        let a = read(&h, NOW).remove(0);
        (a.reset_in, a.reset_dated)
    };
    // Stamped 3 s before this clock read it.
    assert_eq!(said("Wed, 09 Aug 2023 14:27:40 GMT"), (secs(23), true));
    assert_eq!(said("Fri, 09 Aug 2024 14:27:40 GMT"), (secs(20), false));
    assert_eq!(said("not a date"), (secs(20), false));
}

/// An epoch reset (GitHub's `X-RateLimit-Reset`, in seconds or ms) is an
/// instant on the server's clock too: a server an hour ahead of this one,
/// whose quota resets 5 s after its own `Date`, holds for 5 s, not an
/// hour and 5 s; a server behind this clock, not for nothing. Without a
/// `Date`, this clock.
#[test]
fn an_epoch_reset_is_measured_from_the_responses_date() {
    let said = |date: Option<&str>, reset: &str| {
        let mut pairs = vec![
            ("x-ratelimit-limit", "60"),
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", reset),
        ];
        pairs.extend(date.map(|d| ("date", d)));
        read(&map(&pairs), NOW).remove(0).reset_in
    };
    // NOW is 14:27:43 here; an hour ahead, the server's clock says 15:27:43.
    let ahead = Some("Wed, 09 Aug 2023 15:27:43 GMT");
    let at = NOW.as_secs() + 3600 + 5;
    assert_eq!(said(ahead, &at.to_string()), secs(5));
    assert_eq!(said(ahead, &(at * 1000).to_string()), secs(5));
    let behind = Some("Wed, 09 Aug 2023 13:27:43 GMT");
    assert_eq!(
        said(behind, &(NOW.as_secs() - 3600 + 5).to_string()),
        secs(5)
    );
    assert_eq!(said(None, &(NOW.as_secs() + 5).to_string()), secs(5));
}

/// An epoch reset measured from a whole-second `Date` may be read up to a
/// second long, whatever its own grain: an IETF `t` in epoch milliseconds
/// (a fraction of a second) read a second long was given a millisecond's
/// margin, and a fixed window aligned to it freed its calls up to a second
/// before the server's window ended (a review found it). Marked as
/// measured from `Date`, the margins of an alignment hold the true reset.
#[test]
fn a_reset_measured_from_date_is_marked_and_its_margins_hold_the_truth() {
    // The server's clock reads NOW + 999 ms as it answers; its `Date` says
    // NOW, truncated; this clock agrees with the server's.
    let server = NOW + Duration::from_millis(999);
    let boundary = NOW + Duration::from_millis(7_500);
    let t = boundary.as_millis().to_string();
    let h = map(&[
        ("date", "Wed, 09 Aug 2023 14:27:43 GMT"),
        ("ratelimit-policy", r#""p";q=100;w=60"#),
        ("ratelimit", &format!(r#""p";r=50;t={t}"#)),
    ]);
    let p = read(&h, server).remove(0);
    assert!(p.reset_dated);
    let reset = p.reset_in.unwrap();
    let (early, late) = crate::rate::fixed::margins(reset, p.reset_dated, Duration::ZERO);
    let truth = boundary - server;
    assert!(
        truth + early >= reset && truth <= reset + late,
        "{reset:?} {truth:?}"
    );
    // A delta is not measured from `Date`; nor an epoch with no `Date`.
    let delta = map(&[
        ("date", "Wed, 09 Aug 2023 14:27:43 GMT"),
        ("x-ratelimit-limit", "60"),
        ("x-ratelimit-reset", "30"),
    ]);
    assert!(!read(&delta, NOW).remove(0).reset_dated);
    let epoch = (NOW.as_secs() + 30).to_string();
    let undated = map(&[("x-ratelimit-limit", "60"), ("x-ratelimit-reset", &epoch)]);
    assert!(!read(&undated, NOW).remove(0).reset_dated);
    let dated = map(&[
        ("date", "Wed, 09 Aug 2023 14:27:43 GMT"),
        ("x-ratelimit-limit", "60"),
        ("x-ratelimit-reset", &epoch),
    ]);
    assert!(read(&dated, NOW).remove(0).reset_dated);
}
