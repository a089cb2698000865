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
