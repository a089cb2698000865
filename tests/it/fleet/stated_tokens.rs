//! Policies of tokens a server states, followed by a fleet: what another
//! client spent, the headroom, Anthropic's input and output budgets kept
//! apart, and a stated quota a told policy keeps already.

use std::time::Duration;

use batchrun::fleet::pacer::FleetPacer;
use batchrun::fleet::{Fleet, FleetKeys, FleetSettings};
use batchrun::pace::{PaceNote, Pacer, Weight};
use batchrun::rate::policy::{TokenWeight, Unit, Used};

use super::pacer::{fleet_on, pacer, pacing};
use super::support::{fleet_name, Redis};

/// A response stating a budget of 1000 tokens a minute, `left` of it left.
fn tokens_left(left: u64) -> reqwest::header::HeaderMap {
    let mut h = reqwest::header::HeaderMap::new();
    h.insert(
        "ratelimit-policy",
        r#""tok";q=1000;w=60;qu="tokens""#.parse().unwrap(),
    );
    h.insert(
        "ratelimit",
        format!(r#""tok";r={left};t=30"#).parse().unwrap(),
    );
    h
}

/// A token budget the fleet adopted, of which a later response says more
/// is spent than the fleet counts: the rest was spent elsewhere (another
/// client on the key) and counts in the fleet's window, for every process,
/// as in-process. Said again within the second, it is not asked again.
#[tokio::test(flavor = "multi_thread")]
async fn tokens_another_client_spent_count_in_the_fleets_window() {
    let redis = Redis::start();
    let name = fleet_name("elsewhere");
    let a = pacer(fleet_on(&redis, &name).await, "50/1s");
    let said = tokens_left;
    let note = a.observe(&said(1000)).await;
    assert!(
        matches!(&note, Some(PaceNote::Heard(_))),
        "adopted: {note:?}"
    );
    let key = FleetKeys::named(&name).tokens(Unit::Tokens, 1000, 60_000);
    let mut c = redis.conn();
    let counted = |c: &mut redis::Connection| counted_in(c, &key);
    assert_eq!(counted(&mut c), 0, "nothing used when adopted");
    a.observe(&said(300)).await;
    assert_eq!(counted(&mut c), 700, "700 spent elsewhere");
    a.observe(&said(100)).await;
    assert_eq!(counted(&mut c), 700, "asked again only a second on");
    // Every process paces to it: 300 left, a call of 400 waits (the 700
    // end a minute on), one of 300 goes.
    let b = pacer(fleet_on(&redis, &name).await, "50/1s");
    b.observe(&said(300)).await;
    let weighing = |tokens| Weight {
        calls: 1,
        tokens: TokenWeight::whole(tokens),
    };
    let wait = Duration::from_millis(300);
    let heavy = tokio::time::timeout(wait, b.take_weighted(weighing(400))).await;
    assert!(heavy.is_err(), "a call of 400 tokens went with 300 left");
    let fits = tokio::time::timeout(Duration::from_secs(5), b.take_weighted(weighing(300))).await;
    assert!(matches!(fits, Ok(Ok(_))), "a call of 300 waited");
}

/// The tokens each call holds in token window `key`, summed.
fn counted_in(c: &mut redis::Connection, key: &str) -> u64 {
    let v: Vec<String> = redis::cmd("HVALS").arg(key).query(c).unwrap();
    v.iter()
        .filter_map(|e| e.split(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// Anthropic's input and output budgets, adopted from its headers, each
/// count their own part of a call, as in-process: two calls of 40 prompt
/// and 10 answer tokens fit the 100 input tokens together (their totals,
/// 100, would leave no room), a prompt of 30 more waits, and a response
/// saying only what its prompt used corrects the input window and leaves
/// the output window at its estimate.
#[tokio::test(flavor = "multi_thread")]
async fn anthropic_input_and_output_budgets_each_count_their_own_part() {
    let redis = Redis::start();
    let name = fleet_name("split");
    let a = pacer(fleet_on(&redis, &name).await, "50/1s");
    let mut h = reqwest::header::HeaderMap::new();
    for (k, v) in [
        ("anthropic-ratelimit-input-tokens-limit", "100"),
        ("anthropic-ratelimit-input-tokens-remaining", "100"),
        ("anthropic-ratelimit-output-tokens-limit", "50"),
        ("anthropic-ratelimit-output-tokens-remaining", "50"),
    ] {
        h.insert(k, v.parse().unwrap());
    }
    a.observe(&h).await;
    a.observe(&h).await;
    let keys = FleetKeys::named(&name);
    let (input, output) = (
        keys.tokens(Unit::InputTokens, 100, 60_000),
        keys.tokens(Unit::OutputTokens, 50, 60_000),
    );
    let weighing = |i, o| Weight {
        calls: 1,
        tokens: TokenWeight::split(i, o),
    };
    let soon = Duration::from_secs(5);
    let first = tokio::time::timeout(soon, a.take_weighted(weighing(40, 10))).await;
    let second = tokio::time::timeout(soon, a.take_weighted(weighing(40, 10))).await;
    let (Ok(Ok(first)), Ok(Ok(_second))) = (first, second) else {
        panic!("two calls of 40 input tokens waited under a budget of 100");
    };
    let mut c = redis.conn();
    assert_eq!(
        (counted_in(&mut c, &input), counted_in(&mut c, &output)),
        (80, 20)
    );
    let wait = Duration::from_millis(300);
    let third = tokio::time::timeout(wait, a.take_weighted(weighing(30, 0))).await;
    assert!(
        third.is_err(),
        "a prompt of 30 went with 20 input tokens left"
    );
    let said = Used {
        total: None,
        input: Some(15),
        output: None,
    };
    first.complete_used(tokio::time::Instant::now(), Some(said));
    a.flush().await;
    assert_eq!(
        (counted_in(&mut c, &input), counted_in(&mut c, &output)),
        (55, 20)
    );
    let third = tokio::time::timeout(soon, a.take_weighted(weighing(30, 0))).await;
    assert!(
        matches!(third, Ok(Ok(_))),
        "a prompt of 30 waited with 45 left"
    );
}

/// A fleet told a bucket of 100 tokens of `unit` a minute with a burst of
/// 100 (`--limit 100/1m,output-tokens,burst=100`), its share `headroom`.
async fn told_a_bucket(redis: &Redis, name: &str, headroom: f64, unit: Unit) -> FleetPacer {
    let fleet = Fleet::connect(&FleetSettings {
        url: redis.url.clone(),
        headroom,
        keys: FleetKeys::named(name),
        redis_timeout: Duration::from_secs(5),
    })
    .await
    .expect("connect");
    let told = batchrun::rate::Rate {
        count: 100,
        period: Duration::from_secs(60),
    };
    FleetPacer::with_limits(fleet, pacing("50/1s"), &[], &[(told, 100, unit)], &[])
}

/// Anthropic's output tokens stated: `quota` a minute, `left` of it left.
fn output_tokens(quota: u64, left: u64) -> reqwest::header::HeaderMap {
    let mut h = reqwest::header::HeaderMap::new();
    h.insert(
        "anthropic-ratelimit-output-tokens-limit",
        quota.to_string().parse().unwrap(),
    );
    h.insert(
        "anthropic-ratelimit-output-tokens-remaining",
        left.to_string().parse().unwrap(),
    );
    h
}

/// The keys the fleet `name` adopted from what a server stated.
pub(super) fn listed(redis: &Redis, name: &str) -> Option<String> {
    redis::cmd("HGET")
        .arg(FleetKeys::named(name).limit())
        .arg("stated")
        .query(&mut redis.conn())
        .unwrap()
}

/// The told bucket keeps Anthropic's stated 100 output tokens a minute
/// already: the statement is not adopted as a window of its own, which
/// would pace the burst over a minute, but what it says another client
/// spent fills the told bucket (as in-process): of 60 said spent, 20 are
/// the fleet's own answer, 40 were spent elsewhere, and the 41 left of
/// the bucket's 101 take an answer of 30, not one of 50. A stated quota
/// below the told one is adopted.
#[tokio::test(flavor = "multi_thread")]
async fn a_stated_quota_a_told_bucket_keeps_corrects_it_and_is_not_adopted() {
    let redis = Redis::start();
    let name = fleet_name("told-bucket");
    let a = told_a_bucket(&redis, &name, 1.0, Unit::OutputTokens).await;
    assert_eq!(a.observe(&output_tokens(100, 100)).await, None);
    assert_eq!(listed(&redis, &name), None, "the told bucket keeps it");
    let answer = |o| Weight {
        calls: 1,
        tokens: TokenWeight::split(0, o),
    };
    let wait = Duration::from_millis(300);
    let own = tokio::time::timeout(wait, a.take_weighted(answer(20))).await;
    assert!(matches!(own, Ok(Ok(_))), "the bucket was empty");
    a.observe(&output_tokens(100, 40)).await;
    let heavy = tokio::time::timeout(wait, a.take_weighted(answer(50))).await;
    assert!(heavy.is_err(), "an answer of 50 went with 40 left");
    let fits = tokio::time::timeout(Duration::from_secs(5), a.take_weighted(answer(30))).await;
    assert!(
        matches!(fits, Ok(Ok(_))),
        "an answer of 30 waited with 40 left"
    );
    adopts_80_a_minute(&a, &redis, &name, output_tokens(80, 80)).await;
}

/// Under `--headroom 0.8` the fleet keeps 80 of a stated 100: the told
/// bucket's rate is scaled, its burst of 100 is not, so it does not keep
/// the share and the stated quota is adopted (80 a minute).
#[tokio::test(flavor = "multi_thread")]
async fn a_told_bucket_whose_burst_passes_the_headroom_share_does_not_keep_it() {
    let redis = Redis::start();
    let name = fleet_name("told-bucket-headroom");
    let a = told_a_bucket(&redis, &name, 0.8, Unit::OutputTokens).await;
    adopts_80_a_minute(&a, &redis, &name, output_tokens(100, 100)).await;
}

/// Reading `stated`, fleet `name` adopts a window of 80 output tokens a
/// minute, and says so.
async fn adopts_80_a_minute(
    a: &FleetPacer,
    redis: &Redis,
    name: &str,
    stated: reqwest::header::HeaderMap,
) {
    let note = a.observe(&stated).await;
    assert!(matches!(note, Some(PaceNote::Heard(_))), "{note:?}");
    let key = FleetKeys::named(name).tokens(Unit::OutputTokens, 80, 60_000);
    let list = listed(redis, name);
    assert!(list.as_ref().is_some_and(|l| l.contains(&key)), "{list:?}");
}

/// With `--headroom 0.9` the fleet keeps 900 of a stated 1000 tokens: the
/// other 100 are left for other traffic, so what the server says was spent
/// counts against the fleet's 900 only beyond them.
#[tokio::test(flavor = "multi_thread")]
async fn tokens_spent_elsewhere_within_the_headroom_are_not_counted_again() {
    let redis = Redis::start();
    let name = fleet_name("elsewhere-headroom");
    let fleet = Fleet::connect(&FleetSettings {
        url: redis.url.clone(),
        headroom: 0.9,
        keys: FleetKeys::named(&name),
        redis_timeout: Duration::from_secs(5),
    })
    .await
    .expect("connect");
    let a = pacer(fleet, "50/1s");
    let said = tokens_left;
    a.observe(&said(1000)).await;
    let key = FleetKeys::named(&name).tokens(Unit::Tokens, 900, 60_000);
    a.observe(&said(300)).await;
    let counted = counted_in(&mut redis.conn(), &key);
    // 700 spent, 100 of them within the headroom: 300 left of the 900.
    assert_eq!(counted, 600);
}

/// OpenAI's stated 100 tokens a minute with nothing left, full again in
/// 30 s, kept by a told bucket: it refills continuously, so the fleet is
/// not held until the reset; the bucket, filled by what was said, takes
/// a call of 1 token within its skew allowance, as in-process.
#[tokio::test(flavor = "multi_thread")]
async fn a_told_bucket_said_to_be_empty_refills_without_a_hold() {
    let redis = Redis::start();
    let name = fleet_name("told-bucket-empty");
    let a = told_a_bucket(&redis, &name, 1.0, Unit::Tokens).await;
    let mut empty = reqwest::header::HeaderMap::new();
    for (k, v) in [
        ("x-ratelimit-limit-tokens", "100"),
        ("x-ratelimit-remaining-tokens", "0"),
        ("x-ratelimit-reset-tokens", "30s"),
    ] {
        empty.insert(k, v.parse().unwrap());
    }
    assert_eq!(a.observe(&empty).await, None);
    let one = Weight {
        calls: 1,
        tokens: TokenWeight::whole(1),
    };
    let soon = tokio::time::timeout(Duration::from_secs(5), a.take_weighted(one)).await;
    assert!(matches!(soon, Ok(Ok(_))), "held for the reset");
}
