//! OpenAI's and Anthropic's token quotas, stated without a window, kept by
//! a fleet: adopted as a window of a minute, then found to refill
//! continuously and kept as a bucket by every process, as in-process.

use std::time::Duration;

use batchrun::fleet::pacer::FleetPacer;
use batchrun::fleet::FleetKeys;
use batchrun::pace::{PaceNote, Pacer, Weight};
use batchrun::rate::policies::Heard;
use batchrun::rate::policy::{TokenWeight, Unit, Used};

use super::pacer::{fleet_on, pacer, pacing};
use super::support::{fleet_name, Redis};

/// OpenAI's statement of 1,000 tokens, `used` of them used, full again
/// in `reset_ms`.
fn openai(used: u64, reset_ms: u64) -> reqwest::header::HeaderMap {
    let mut h = reqwest::header::HeaderMap::new();
    for (k, v) in [
        ("x-ratelimit-limit-tokens", "1000".to_string()),
        ("x-ratelimit-remaining-tokens", (1000 - used).to_string()),
        ("x-ratelimit-reset-tokens", format!("{reset_ms}ms")),
    ] {
        h.insert(k, v.parse().unwrap());
    }
    h
}

/// A statement of a bucket refilling 1,000 tokens a minute, `used` used
/// (OpenAI's resets are to the millisecond: used, here, other than a
/// multiple of 50, whose resets of whole seconds say less).
fn refilling(used: u64) -> reqwest::header::HeaderMap {
    openai(used, used * 60)
}

fn tokens(n: u64) -> Weight {
    Weight {
        calls: 1,
        tokens: TokenWeight::whole(n),
    }
}

/// Whether `notes` say the quota was found to refill over about a minute.
fn says_refills(notes: &[PaceNote]) -> bool {
    notes.iter().any(|n| {
        matches!(n, PaceNote::Heard(Heard::Refills { quota: 1000, period, .. })
            if (59.0..61.0).contains(&period.as_secs_f64()))
    })
}

/// Process `a` hears eight statements of a minute's refill (101 to 451
/// used) and finds it: the fleet keeps the quota as a bucket.
async fn finds_the_refill(a: &FleetPacer) {
    let mut notes = Vec::new();
    for used in (101..=451).step_by(50) {
        notes.extend(a.observe(&refilling(used)).await);
    }
    notes.extend(std::iter::from_fn(|| a.note()));
    assert!(says_refills(&notes), "{notes:?}");
}

/// Eight statements whose resets keep proportion with what is used (a
/// minute's refill of it) show process A a bucket: the fleet keeps the
/// quota as one from then on, filled with what the window held (101 said
/// used, and B's call of 100 out) and then to the 451 said used, in place
/// of the window of a minute. The other processes adopted the window
/// before. B, whose call came back using 10 before it knew, is told by
/// its next correction (the window is not made again), passes the bucket
/// and settles that call again: the bucket gives back 90, so a call of
/// 700 waits and one of 600 goes. D, told the quota is used up before
/// it knew, asks, and does not hold the fleet until the reset a minute
/// on: the bucket's next token is back within a fraction of a second.
/// Nor does a process joining later, which never adopts the window.
#[tokio::test(flavor = "multi_thread")]
async fn a_windowless_token_quota_that_refills_is_kept_as_a_bucket_by_every_process() {
    let redis = Redis::start();
    let name = fleet_name("refill");
    let a = pacer(fleet_on(&redis, &name).await, "50/1s");
    let b = pacer(fleet_on(&redis, &name).await, "50/1s");
    let d = pacer(fleet_on(&redis, &name).await, "50/1s");
    let keys = FleetKeys::named(&name);
    let window = keys.tokens(Unit::Tokens, 1000, 60_000);
    let mut c = redis.conn();
    let exists = |c: &mut redis::Connection, k: &str| -> bool {
        redis::cmd("EXISTS").arg(k).query::<i64>(c).unwrap() == 1
    };
    let mut notes = Vec::new();
    notes.extend(a.observe(&refilling(101)).await);
    b.observe(&refilling(151)).await;
    d.observe(&refilling(151)).await;
    d.observe(&refilling(201)).await;
    assert!(exists(&mut c, &window), "the window adopted");
    let soon = Duration::from_secs(5);
    let out = tokio::time::timeout(soon, b.take_weighted(tokens(100))).await;
    let Ok(Ok(out)) = out else {
        panic!("B's call of 100 waited")
    };
    for used in (151..=451).step_by(50) {
        notes.extend(a.observe(&refilling(used)).await);
    }
    notes.extend(std::iter::from_fn(|| a.note()));
    assert!(says_refills(&notes), "{notes:?}");
    let bucket = listed_bucket(&redis, &name);
    assert!(
        !exists(&mut c, &window),
        "the window kept beside the bucket"
    );

    let ten = Used {
        total: Some(10),
        input: None,
        output: None,
    };
    out.complete_used(tokio::time::Instant::now(), Some(ten));
    b.flush().await;
    b.observe(&refilling(501)).await;
    b.flush().await;
    assert!(!exists(&mut c, &window), "B made the window again");
    let held: Vec<String> = redis::cmd("HKEYS").arg(&bucket).query(&mut c).unwrap();
    assert!(
        !held.iter().any(|f| f.starts_with("c:")),
        "B's call held at its estimate: {held:?}"
    );
    let wait = Duration::from_millis(300);
    let heavy = tokio::time::timeout(wait, b.take_weighted(tokens(700))).await;
    assert!(heavy.is_err(), "a call of 700 went with 361 of 1000 used");
    let fits = tokio::time::timeout(soon, b.take_weighted(tokens(600))).await;
    assert!(matches!(fits, Ok(Ok(_))), "a call of 600 waited");

    // Used up, full again in a minute: the bucket's level paces it, not
    // a hold until the reset.
    d.observe(&openai(1000, 60_220)).await;
    let next = tokio::time::timeout(soon, a.take_weighted(tokens(1))).await;
    assert!(
        matches!(next, Ok(Ok(_))),
        "D held the fleet until the reset"
    );
    let late = pacer(fleet_on(&redis, &name).await, "50/1s");
    for used in [701, 751] {
        late.observe(&refilling(used)).await;
    }
    late.observe(&openai(1000, 60_220)).await;
    let next = tokio::time::timeout(soon, a.take_weighted(tokens(1))).await;
    assert!(matches!(next, Ok(Ok(_))), "a late process held the fleet");
    assert!(!exists(&mut c, &window), "the window adopted again");
}

/// Resets that keep no proportion with what is used (a window's: the
/// same reset whatever the use) are no refill: the window stays.
#[tokio::test(flavor = "multi_thread")]
async fn a_windowless_quota_whose_resets_keep_no_proportion_stays_a_window() {
    let redis = Redis::start();
    let name = fleet_name("no-refill");
    let a = pacer(fleet_on(&redis, &name).await, "50/1s");
    let mut notes = Vec::new();
    for used in (101..=801).step_by(50) {
        notes.extend(a.observe(&openai(used, 30_500)).await);
    }
    notes.extend(std::iter::from_fn(|| a.note()));
    assert!(!says_refills(&notes), "{notes:?}");
    let window = FleetKeys::named(&name).tokens(Unit::Tokens, 1000, 60_000);
    let held: i64 = redis::cmd("EXISTS")
        .arg(&window)
        .query(&mut redis.conn())
        .unwrap();
    assert_eq!(held, 1);
}

/// End to end, as in-process (`policies.rs`): Anthropic's token bucket of
/// 6,000 a minute, stated without a window, against 130 prompts of about
/// 50 tokens run through a fleet under `--limit none`. Kept as a window
/// of a minute, the last 630 tokens waited out the minute (the fleet ran
/// 3.4-4.2x the ideal time on such jobs); found to refill, they go at its
/// refill, about 6 s.
#[tokio::test(flavor = "multi_thread")]
async fn a_fleet_paces_a_stated_token_bucket_at_its_refill() {
    let redis = Redis::start();
    let name = fleet_name("refill-run");
    let fleet = ["--redis", &redis.url, "--fleet-key", &name];
    crate::policies::a_token_bucket_stated_in_is_paced_at_its_refill("anthropic", "none", &fleet)
        .await;
}

/// A process told the window the server states (`--limit 1000/1m,tokens`)
/// keeps it: another process finding the quota to refill has the fleet
/// keep the bucket beside it, not in its place, for the told process. What
/// the server says is used still reaches the told window under the
/// adopted one's name: with 950 of 1,000 said used, a call of 400 waits
/// (the fleet refused its corrections for good, and the bucket, which
/// knew only 551, let it go).
#[tokio::test(flavor = "multi_thread")]
async fn a_told_window_stays_beside_the_bucket_found() {
    let redis = Redis::start();
    let name = fleet_name("refill-told");
    let told = batchrun::fleet::pacer::FleetPacer::with_limits(
        fleet_on(&redis, &name).await,
        pacing("50/1s"),
        &[],
        &[],
        &[(
            batchrun::rate::Rate {
                count: 1000,
                period: Duration::from_secs(60),
            },
            Unit::Tokens,
            batchrun::rate::policy::Shape::Sliding,
        )],
    );
    let a = pacer(fleet_on(&redis, &name).await, "50/1s");
    finds_the_refill(&a).await;
    let soon = Duration::from_secs(5);
    let out = tokio::time::timeout(soon, told.take_weighted(tokens(100))).await;
    assert!(matches!(out, Ok(Ok(_))), "the told process's call waited");
    let window = FleetKeys::named(&name).tokens(Unit::Tokens, 1000, 60_000);
    let mut c = redis.conn();
    let counted: Vec<String> = redis::cmd("HVALS").arg(&window).query(&mut c).unwrap();
    assert_eq!(counted.len(), 1, "the told window does not hold the call");
    told.observe(&refilling(950)).await;
    told.flush().await;
    let wait = Duration::from_millis(500);
    let heavy = tokio::time::timeout(wait, told.take_weighted(tokens(400))).await;
    assert!(
        heavy.is_err(),
        "a call of 400 went with 950 of 1,000 said used"
    );
}

/// A process joining after the fleet found the refill, whose first
/// statement says the quota is used up (full again in a minute), learns
/// the bucket and holds nothing: one statement of its own is no evidence
/// against the refill, and the bucket's next token is back in a fraction
/// of a second. It held the whole fleet until the reset.
#[tokio::test(flavor = "multi_thread")]
async fn a_process_joining_after_the_refill_told_it_is_used_up_holds_nothing() {
    let redis = Redis::start();
    let name = fleet_name("refill-late-empty");
    let a = pacer(fleet_on(&redis, &name).await, "50/1s");
    finds_the_refill(&a).await;
    let late = pacer(fleet_on(&redis, &name).await, "50/1s");
    late.observe(&openai(1000, 60_220)).await;
    let soon = Duration::from_secs(5);
    let next = tokio::time::timeout(soon, a.take_weighted(tokens(1))).await;
    assert!(
        matches!(next, Ok(Ok(_))),
        "the fleet was held until the reset"
    );
}

/// Anthropic's statement of 1,000 tokens, `used` of them used, its reset
/// an RFC 3339 instant in whole seconds (rounded up) read against `Date`.
fn anthropic(used: u64) -> reqwest::header::HeaderMap {
    let date = 1_796_637_600; // 2026-12-07T10:00:00Z
    let reset = date + (used * 60).div_ceil(1000);
    let instant = |secs: u64| {
        let t = std::time::UNIX_EPOCH + Duration::from_secs(secs);
        humantime::format_rfc3339_seconds(t).to_string()
    };
    let mut h = reqwest::header::HeaderMap::new();
    for (k, v) in [
        ("anthropic-ratelimit-tokens-limit", "1000".to_string()),
        (
            "anthropic-ratelimit-tokens-remaining",
            (1000 - used).to_string(),
        ),
        ("anthropic-ratelimit-tokens-reset", instant(reset)),
        (
            "date",
            httpdate::fmt_http_date(std::time::UNIX_EPOCH + Duration::from_secs(date)),
        ),
    ] {
        h.insert(k, v.parse().unwrap());
    }
    h
}

/// The bucket the fleet `name` lists now.
fn listed_bucket(redis: &Redis, name: &str) -> String {
    let listed = super::stated_tokens::listed(redis, name).unwrap_or_default();
    let bucket = listed.split_whitespace().find(|k| k.contains(":gcra:"));
    bucket
        .unwrap_or_else(|| panic!("no bucket: {listed}"))
        .to_string()
}

/// Anthropic's resets are whole seconds: the refill found from the first
/// statements is loose (about 64 s for a minute's), as in-process, where
/// later statements narrow it and the bucket is retimed. The fleet
/// retimes too: once the statements show a refill a hundredth faster,
/// the bucket is swapped for one at the narrower period, its level kept,
/// and the old one goes; takes go on passing the new one, those of a
/// process still passing the window and of one adopting it later too.
#[tokio::test(flavor = "multi_thread")]
async fn a_bucket_found_from_whole_seconds_is_retimed_as_the_statements_narrow() {
    let redis = Redis::start();
    let name = fleet_name("retime");
    let a = pacer(fleet_on(&redis, &name).await, "50/1s");
    // B adopts the window first and hears nothing more.
    let b = pacer(fleet_on(&redis, &name).await, "50/1s");
    b.observe(&anthropic(51)).await;
    let mut notes = Vec::new();
    for used in (101..=451).step_by(50) {
        notes.extend(a.observe(&anthropic(used)).await);
    }
    notes.extend(std::iter::from_fn(|| a.note()));
    let found = notes
        .iter()
        .any(|n| matches!(n, PaceNote::Heard(Heard::Refills { .. })));
    assert!(found, "{notes:?}");
    let first = listed_bucket(&redis, &name);
    for used in [601, 751, 901] {
        a.observe(&anthropic(used)).await;
    }
    let now = listed_bucket(&redis, &name);
    let interval = |k: &str| FleetKeys::interval_of(k).unwrap() as f64;
    let faster = interval(&first) / interval(&now);
    assert!(faster > 1.02, "{first} -> {now}");
    let gone: i64 = redis::cmd("EXISTS")
        .arg(&first)
        .query(&mut redis.conn())
        .unwrap();
    assert_eq!(gone, 0, "the first bucket kept beside the second");
    let soon = Duration::from_secs(5);
    let next = tokio::time::timeout(soon, a.take_weighted(tokens(1))).await;
    assert!(matches!(next, Ok(Ok(_))), "a take after the retime waited");
    // B, still passing the window, and C, adopting it only now, are told
    // the bucket in force, not the one gone (which their takes would
    // make again).
    let c = pacer(fleet_on(&redis, &name).await, "50/1s");
    c.observe(&anthropic(951)).await;
    for p in [&b, &c] {
        let next = tokio::time::timeout(soon, p.take_weighted(tokens(1))).await;
        assert!(matches!(next, Ok(Ok(_))), "a take after the retime waited");
    }
    let gone: i64 = redis::cmd("EXISTS")
        .arg(&first)
        .query(&mut redis.conn())
        .unwrap();
    assert_eq!(gone, 0, "the first bucket made again");
    assert_eq!(listed_bucket(&redis, &name), now);
}
