use super::*;

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
    ] {
        assert!(SCRIPT.contains(&format!("op == {op}")), "{op}");
    }
    // The drip rules' ops are `spike_<verb>` and `bucket_<verb>`.
    for verb in ["'take'", "'settle'", "'pause'", "'inforce'"] {
        assert!(SCRIPT.contains(&format!("verb == {verb}")), "{verb}");
    }
    assert!(SCRIPT.contains("redis.call('TIME')"));
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

#[test]
fn the_fleet_reads_a_limit_of_its_window_in_every_dialect() {
    use face::Said;
    let second = Duration::from_secs(1);
    let said = |pairs: &[(&str, &str)]| Said::of(&headers(pairs), second);
    let twenty = Said {
        limit: Some(20),
        told: true,
        used_up: false,
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
        }
    );
    // Tokens are not calls: only the requests' quota is the window's.
    assert_eq!(
        said(&[
            ("x-ratelimit-limit-requests", "20"),
            ("x-ratelimit-limit-tokens", "150000"),
        ]),
        twenty
    );
    assert_eq!(
        said(&[
            ("anthropic-ratelimit-requests-limit", "20"),
            ("anthropic-ratelimit-requests-remaining", "0"),
            ("anthropic-ratelimit-requests-reset", "2023-08-09T14:28:03Z"),
        ]),
        Said {
            used_up: true,
            ..twenty
        }
    );
    // The lowest of two policies of the window wins; one of another
    // window is not the fleet's to follow (its 429s teach the window).
    assert_eq!(
        said(&[(
            "ratelimit-policy",
            r#""a";q=30;w=1,"b";q=20;w=1,"hour";q=5;w=3600"#
        )]),
        twenty
    );
    assert_eq!(
        said(&[("ratelimit-policy", r#""hour";q=5;w=3600"#)]),
        Said::default()
    );
    assert_eq!(said(&[]), Said::default());
}
