//! A secret limit's shape, learnt by the default pacer from the sim's 429s.

use crate::common::*;

/// The calls per window of the bucket a run said the server keeps
/// (`the server keeps a bucket: N calls per window ...`), and the rest of
/// that line.
fn bucket_said(stderr: &str) -> (u64, &str) {
    let said = stderr
        .lines()
        .find_map(|l| l.split("the server keeps a bucket: ").nth(1))
        .unwrap_or_else(|| panic!("no bucket said: {stderr}"));
    let per_window = said
        .split(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count in {said}"));
    (per_window, said)
}

/// SpikeArrest at 30 a second, stating nothing (a bucket of 3).
fn spike_arrest(name: &str) -> Scenario {
    Scenario::new(name)
        .with_sim(&[
            "--model",
            "spike-arrest",
            "--limit",
            "30ps",
            "--secret-limit",
            "--latency",
            "1ms..3ms",
        ])
        .numbers(120)
}

#[tokio::test(flavor = "multi_thread")]
async fn told_only_the_rate_of_a_secret_bucket_nothing_is_refused() {
    // The start's first window goes on the even pace, the window after it
    // at the told rate one call at a time: a bucket at that rate with a
    // burst refuses none of it, and there is nothing to learn.
    let s = spike_arrest("told-bucket-rate");
    let r = s.run(&["--limit", "30/1s", "--concurrency", "5"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.summary["rate_limited"], 0, "{}", r.stderr);
    assert!(!r.stderr.contains("the server keeps"), "{}", r.stderr);
    assert!(
        !r.stderr.contains("a limit the server does not state"),
        "{}",
        r.stderr
    );
    assert_each_item_once(&s.out_path(), 120);
    assert_side_effects(&s.sim().stats().await, 120);
}

#[tokio::test(flavor = "multi_thread")]
async fn told_twice_a_secret_buckets_rate_it_learns_the_bucket_and_remembers_it() {
    // Told 60/1s, the start is refused; the ramp after it is refused near
    // the rate, and the bucket that fits both is kept, not a window's
    // count of what was accepted.
    let s = spike_arrest("learn-bucket");
    let r = s.run(&["--limit", "60/1s", "--concurrency", "5"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let limited = r.summary["rate_limited"].as_u64().unwrap();
    assert!((1..=5).contains(&limited), "{limited} 429s: {}", r.stderr);
    let (per_window, said) = bucket_said(&r.stderr);
    // Its even pace (a tenth under the limit) at the rate, or just under.
    assert!((27..=33).contains(&per_window), "{said}");
    assert_each_item_once(&s.out_path(), 120);
    assert_side_effects(&s.sim().stats().await, 120);
    // The shape is in the checkpoint: the same command again says so
    // before it would send anything.
    let again = s.run(&["--limit", "60/1s", "--concurrency", "5"]);
    assert_eq!(again.code, 0, "{}", again.stderr);
    assert_eq!(again.summary["requests"], 0);
    let first_line = again.stderr.lines().next().unwrap_or_default();
    assert!(
        first_line.contains(&format!(
            "learnt earlier: a bucket of {per_window}/1s with burst "
        )),
        "{first_line}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn told_three_times_a_secret_buckets_rate_it_fits_the_rate_and_the_burst() {
    // nginx's rule at 30 a second with a burst of 5, stating nothing,
    // told 90/1s: one refusal cannot tell the burst from the rate, so the
    // even pace ramps up until it is refused too, and the bucket that
    // answers both as the server did is kept. (Learnt from the accepted
    // count alone, it was about 8 calls a window.)
    let s = Scenario::new("fit-bucket")
        .with_sim(&[
            "--limit",
            "30/1s,burst=5",
            "--secret-limit",
            "--cooldown",
            "1s",
            "--latency",
            "1ms..3ms",
        ])
        .numbers(120);
    let r = s.run(&["--limit", "90/1s", "--concurrency", "5"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let (per_window, said) = bucket_said(&r.stderr);
    // Paced evenly at a tenth under the limit per window: at most 30 a
    // second, and at least 27 (the fit keeps 2 ms from each spacing).
    assert!((29..=33).contains(&per_window), "{said}");
    let limited = r.summary["rate_limited"].as_u64().unwrap();
    assert!(limited <= 3, "{limited} 429s: {}", r.stderr);
    let stats = s.sim().stats().await;
    assert_each_item_once(&s.out_path(), 120);
    assert_side_effects(&stats, 120);
    // Remembered: the next run starts from the fitted bucket.
    let again = s.run(&["--limit", "90/1s", "--concurrency", "5"]);
    assert_eq!(again.code, 0, "{}", again.stderr);
    let first_line = again.stderr.lines().next().unwrap_or_default();
    assert!(
        first_line.contains(&format!("learnt earlier: a bucket of {per_window}/1s")),
        "{first_line}"
    );
}

/// A server that states 1000 a second in every answer and keeps 5 in any
/// second (a gateway's limit in front of the API's stated quota), with
/// `Retry-After: 1` on its 429s; it counts what it refused.
async fn states_more_than_it_keeps() -> (String, std::sync::Arc<std::sync::Mutex<u64>>) {
    use axum::http::{HeaderMap, StatusCode};
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};
    let sent: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let refused: Arc<Mutex<u64>> = Arc::default();
    let count = refused.clone();
    let app = axum::Router::new().fallback(move || {
        let (sent, refused) = (sent.clone(), refused.clone());
        async move {
            let now = Instant::now();
            let mut sent = sent.lock().unwrap();
            sent.retain(|t| now.duration_since(*t) < Duration::from_secs(1));
            let mut h = HeaderMap::new();
            h.insert("x-ratelimit-limit", "1000".parse().unwrap());
            if sent.len() >= 5 {
                *refused.lock().unwrap() += 1;
                h.insert("retry-after", "1".parse().unwrap());
                return (
                    StatusCode::TOO_MANY_REQUESTS,
                    h,
                    "{\"error\":\"slow down\"}",
                );
            }
            sent.push(now);
            (StatusCode::OK, h, "{\"ok\":true}")
        }
    });
    (format!("http://{}/v1/x", serve(app).await), count)
}

/// A limit the server states above the one told (1000 a second, told 40)
/// does not switch learning off: its 429s come from a lower limit it keeps
/// unstated, which is learnt as a secret one is. It took a 429 in every
/// second of the run, for good.
#[tokio::test(flavor = "multi_thread")]
async fn a_limit_stated_above_the_told_one_leaves_a_lower_secret_one_to_learn() {
    let (url, refused) = states_more_than_it_keeps().await;
    let s = Scenario::new("stated-above").numbers(40);
    let r = s.run(&["--limit", "40/1s", "--url", &url, "--json-body"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stderr.contains("pacing to the 5 calls per window"),
        "{}",
        r.stderr
    );
    let limited = r.summary["rate_limited"].as_u64().unwrap();
    assert_eq!(limited, *refused.lock().unwrap());
    assert!(limited <= 3, "{limited} 429s: {}", r.stderr);
    assert_eq!(r.summary["done"], 40, "{}", r.summary);
}

/// The sim stating only its quota of 100 per 5 s (the IETF fields) and
/// keeping 10 a second unstated beside it (one process's test and a
/// fleet's).
pub const STATED_5S_SECRET_1S: &[&str] = &[
    "--limit",
    "10/1s",
    "--limit",
    "100/5s",
    "--secret-first",
    "--dialect",
    "ietf",
    "--cooldown",
    "1s",
    "--latency",
    "1ms..3ms",
];

/// A server stating only its quota of 100 per 5 s (the IETF fields) and
/// keeping 10 a second unstated beside it: the 429s come with that quota's
/// room left, so they are the unstated limit's, learnt as a secret one is.
/// It took 22-32 429s in 100 calls, learning nothing, while anything was
/// stated.
#[tokio::test(flavor = "multi_thread")]
async fn a_quota_stated_for_a_longer_window_leaves_a_secret_one_to_learn() {
    let s = Scenario::new("stated-longer")
        .with_sim(STATED_5S_SECRET_1S)
        .numbers(60);
    let r = s.run(&["--limit", "30/1s", "--concurrency", "5"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let limited = r.summary["rate_limited"].as_u64().unwrap();
    assert!(limited <= 3, "{limited} 429s: {}", r.stderr);
    let stats = s.sim().stats().await;
    assert_eq!(stats["rejected_rate"], limited, "{stats}");
    assert_each_item_once(&s.out_path(), 60);
    assert_side_effects(&stats, 60);
}
