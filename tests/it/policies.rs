//! Policies of every shape end to end: the real binary told a limit's
//! shape (`--limit 30/1s,burst=5`, several `--limit`, a token budget)
//! against a real `batchrun sim` keeping the same shapes, judged by the
//! sim's per-policy stats (`policies[i]`: `max_in_window`,
//! `max_in_fixed_window`, `max_excess`); and a limit the server states in
//! each dialect, told three times too much.

use std::time::Instant;

use crate::common::*;

/// The sim's stats of its `i`th policy (in `--limit` order).
fn policy(stats: &serde_json::Value, i: usize) -> &serde_json::Value {
    &stats["policies"][i]
}

fn at_most(v: &serde_json::Value, field: &str, bound: u64) {
    let got = v[field]
        .as_u64()
        .unwrap_or_else(|| panic!("no {field} in {v}"));
    assert!(got <= bound, "{field} {got} > {bound}: {v}");
}

#[tokio::test(flavor = "multi_thread")]
async fn told_a_bucket_and_its_burst_it_sends_the_burst_then_the_rate() {
    // nginx `rate=30r/s burst=5`, kept by the sim as a GCRA bucket.
    let s = Scenario::new("policies-bucket")
        .with_sim(&[
            "--limit",
            "30/1s,burst=5",
            "--concurrency",
            "10",
            "--latency",
            "1ms..5ms",
        ])
        .numbers(96);
    let t0 = Instant::now();
    let r = s.run(&["--limit", "30/1s,burst=5", "--concurrency", "10"]);
    let took = t0.elapsed().as_secs_f64();
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(!r.stderr.contains("--cost is not"), "{}", r.stderr);
    assert_eq!(r.summary["rate_limited"], 0, "{}", r.summary);
    let stats = s.sim().stats().await;
    assert_eq!(stats["rejected_rate"], 0, "{stats}");
    at_most(policy(&stats, 0), "max_excess", 5);
    // Ideal: (96 − 6) / 30 = 3 s; paced to the bucket, not the window.
    assert!((2.8..4.5).contains(&took), "took {took:.2} s");
    assert_each_item_once(&s.out_path(), 96);
    assert_side_effects(&stats, 96);
}

#[tokio::test(flavor = "multi_thread")]
async fn told_a_fixed_window_it_keeps_the_sims_fixed_window() {
    let s = Scenario::new("policies-fixed")
        .with_sim(&["--limit", "20/1s,fixed", "--concurrency", "10"])
        .numbers(60);
    let r = s.run(&["--limit", "20/1s,fixed", "--concurrency", "10"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.summary["rate_limited"], 0, "{}", r.summary);
    let stats = s.sim().stats().await;
    assert_eq!(stats["rejected_rate"], 0, "{stats}");
    at_most(policy(&stats, 0), "max_in_fixed_window", 20);
    assert_each_item_once(&s.out_path(), 60);
    assert_side_effects(&stats, 60);
}

#[tokio::test(flavor = "multi_thread")]
async fn several_limits_of_several_shapes_are_each_kept() {
    let limits = ["20/1s", "30/2s,fixed", "25/1s,burst=10"];
    let mut sim = vec!["--concurrency", "10", "--latency", "1ms..20ms"];
    let mut told = vec!["--concurrency", "10"];
    for l in limits {
        sim.extend(["--limit", l]);
        told.extend(["--limit", l]);
    }
    sim.extend(["--cooldown", "1s"]);
    let s = Scenario::new("policies-several").with_sim(&sim).numbers(70);
    let r = s.run(&told);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.summary["rate_limited"], 0, "{}", r.summary);
    let stats = s.sim().stats().await;
    assert_eq!(stats["rejected_rate"], 0, "{stats}");
    at_most(policy(&stats, 0), "max_in_window", 20);
    at_most(policy(&stats, 1), "max_in_fixed_window", 30);
    at_most(policy(&stats, 2), "max_excess", 10);
    assert_each_item_once(&s.out_path(), 70);
    assert_side_effects(&stats, 70);
}

/// Interrupted once the longer of two windows is full, the same command
/// waits for that window, not only for the shortest one (the run before
/// waited 1 s plus the stamp's margin, and was refused).
#[tokio::test(flavor = "multi_thread")]
async fn a_resume_counts_the_last_runs_calls_in_every_window() {
    let limits = ["--limit", "50/1s,sliding", "--limit", "20/8s,sliding"];
    let sim = [&limits[..], &["--cooldown", "1s"]].concat();
    let s = Scenario::new("resume-windows").with_sim(&sim).numbers(25);
    let r = s
        .signal_when(&limits, |st| st["side_effects"] == 20, libc::SIGINT)
        .await;
    assert_eq!(r.code, 130, "{}", r.stderr);
    let r = s.run(&limits);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.summary["rate_limited"], 0, "{}", r.summary);
    let stats = s.sim().stats().await;
    assert_eq!(stats["rejected_rate"], 0, "{stats}");
    at_most(policy(&stats, 1), "max_in_window", 20);
    assert_each_item_once(&s.out_path(), 25);
}

/// A limit added on the rerun (the user learnt of the API's 20/8s after
/// the first run filled it): the rerun counts the calls the job's timeline
/// shows sent within that window, and is not refused.
#[tokio::test(flavor = "multi_thread")]
async fn a_limit_added_on_a_resume_counts_the_calls_already_sent_within_it() {
    let sim = ["--limit", "50/1s", "--limit", "20/8s", "--cooldown", "1s"];
    let s = Scenario::new("resume-added").with_sim(&sim).numbers(25);
    let first = ["--limit", "50/1s,sliding"];
    let r = s
        .signal_when(&first, |st| st["side_effects"] == 20, libc::SIGINT)
        .await;
    assert_eq!(r.code, 130, "{}", r.stderr);
    let r = s.run(&["--limit", "50/1s,sliding", "--limit", "20/8s,sliding"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.summary["rate_limited"], 0, "{}", r.summary);
    assert_each_item_once(&s.out_path(), 25);
}

/// Told the sim's budget of 400 tokens a second, 60 prompts through 10
/// calls at once, estimated by `cost` (none: what each request asks).
async fn a_token_budget_is_never_exceeded(name: &str, cost: &[&str]) {
    // The sim checks each call's max_tokens + prompt/4 against 400 tokens
    // a second and charges what its answer's usage says.
    let s = Scenario::new(name)
        .with_sim(&[
            "--limit",
            "1000/1s",
            "--limit",
            "400/1s,tokens",
            "--concurrency",
            "10",
        ])
        .input("prompts.jsonl", &prompts(60));
    let t0 = Instant::now();
    let mut args = vec!["--limit", "1000/1s", "--limit", "400/1s,tokens"];
    args.extend(cost);
    args.extend(["--json-body", "--concurrency", "10"]);
    let r = s.run(&args);
    let took = t0.elapsed().as_secs_f64();
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.summary["rate_limited"], 0, "{}", r.summary);
    let stats = s.sim().stats().await;
    assert_eq!(stats["rejected_rate"], 0, "{stats}");
    at_most(policy(&stats, 1), "max_in_window", 400);
    // Paced by tokens, not calls: the charge beyond the first second's
    // budget takes its time at 400 a second.
    let charged = stats["tokens_charged"].as_u64().unwrap();
    assert!(charged > 800, "{stats}");
    let ideal = (charged - 400) as f64 / 400.0;
    assert!(took >= ideal * 0.9, "took {took:.2} s, ideal {ideal:.2} s");
    assert_each_item_once(&s.out_path(), 60);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_token_budget_paced_by_estimate_and_usage_is_never_exceeded() {
    let cost = ["--cost", "max_tokens + chars(prompt)/4"];
    a_token_budget_is_never_exceeded("policies-tokens", &cost).await;
}

/// Without `--cost` each call is estimated at what it requests (its
/// `max_tokens` and its prompt), as OpenAI's limiter and the sim reckon
/// it. Counted at zero until its answer came back, a call sent as the
/// window filled was refused, once in every window.
#[tokio::test(flavor = "multi_thread")]
async fn a_token_budget_is_kept_without_cost_from_what_each_request_asks() {
    a_token_budget_is_never_exceeded("policies-tokens-asked", &[]).await;
}

/// A policy of tokens told with no `--cost` says at start how calls are
/// estimated, so that a job whose items say it otherwise gives `--cost`.
#[tokio::test(flavor = "multi_thread")]
async fn a_token_policy_told_without_cost_is_said_at_start() {
    let s = Scenario::new("policies-uncosted")
        .with_sim(&["--limit", "400/1s,tokens"])
        .input("prompts.jsonl", &prompts(3));
    let r = s.run(&[
        "--limit",
        "1000/1s",
        "--limit",
        "400/1s,tokens",
        "--json-body",
    ]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stderr
            .contains("a token policy is told and --cost is not: each call is estimated at what its request asks")
            && r.stderr.contains("--usage /usage/total_tokens")
            && r.stderr.contains("give --cost"),
        "{}",
        r.stderr
    );
}

/// Items of a CSV whose `--body` template makes the chat request: the
/// guess reads the body sent (its `max_tokens` and the message rendered
/// from `text`). It read the item, guessed 0, and a call sent as the token
/// window filled was refused in every window.
#[tokio::test(flavor = "multi_thread")]
async fn a_token_budget_is_kept_for_requests_a_body_template_makes() {
    let rows: String = (1..=40)
        .map(|i| format!("{i},{}\n", "word ".repeat(i % 7 * 4 + 1).trim_end()))
        .collect();
    let s = Scenario::new("policies-tokens-body")
        .with_sim(&["--limit", "1000/1s", "--limit", "400/1s,tokens"])
        .input("prompts.csv", &format!("n,text\n{rows}"));
    let body = r#"{{"model": "m", "max_tokens": 40, "messages": [{{"role": "user", "content": "{text}"}}]}}"#;
    let r = s.run(&[
        "--limit",
        "1000/1s",
        "--limit",
        "400/1s,tokens",
        "--body",
        body,
        "--concurrency",
        "10",
    ]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.summary["rate_limited"], 0, "{}", r.summary);
    let stats = s.sim().stats().await;
    assert_eq!(stats["rejected_rate"], 0, "{stats}");
    assert!(stats["tokens_charged"].as_u64().unwrap() > 800, "{stats}");
    assert_eq!(r.summary["done"], 40, "{}", r.summary);
    assert_side_effects(&stats, 40);
}

/// `--limit none` against a server stating only a quota of tokens (an LLM
/// endpoint limiting tokens alone): pacing is handed over to it from the
/// first response, as to a stated quota of calls. It never was: calls went
/// on unpaced into a 429 in every window.
#[tokio::test(flavor = "multi_thread")]
async fn a_server_stating_only_tokens_is_paced_to_them_without_a_limit() {
    let s = Scenario::new("policies-tokens-only")
        .with_sim(&["--limit", "400/1s,tokens", "--dialect", "ietf"])
        .input("prompts.jsonl", &prompts(60));
    let r = s.run(&["--limit", "none", "--json-body", "--concurrency", "4"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    // Four calls of at most 74 tokens each go before the first answer:
    // none of them can overrun 400.
    assert_eq!(r.summary["rate_limited"], 0, "{}", r.summary);
    let stats = s.sim().stats().await;
    assert_eq!(stats["rejected_rate"], 0, "{stats}");
    assert!(stats["tokens_charged"].as_u64().unwrap() > 800, "{stats}");
    assert_each_item_once(&s.out_path(), 60);
}

/// `n` items of a prompt of 50 tokens (200 characters) and `max_tokens`.
fn prompts_of_50(n: u64, max_tokens: u64) -> String {
    let prompt = "word ".repeat(40);
    (1..=n)
        .map(|i| {
            format!("{{\"n\": {i}, \"max_tokens\": {max_tokens}, \"prompt\": \"{prompt}\"}}\n")
        })
        .collect()
}

/// OpenAI and Anthropic state their token limits without a window, and
/// keep them as buckets refilling continuously, their reset the time until
/// full (to the millisecond, or an RFC 3339 instant in whole seconds). Kept
/// as a sliding minute, 6,630 tokens against a bucket of 6,000 a minute
/// sent the 6,000 and then waited out the minute; the resets keep
/// proportion with what is used, so it is found to be a bucket and the
/// last 630 go at its refill, about 6 s. Told a rate of calls, or
/// `--limit none` (pacing handed over to the only quota stated); `more`
/// arguments besides (a fleet's).
pub(crate) async fn a_token_bucket_stated_in_is_paced_at_its_refill(
    dialect: &str,
    told: &str,
    more: &[&str],
) {
    // 50 tokens of prompt and 1 of answer at most: charged about what is
    // estimated.
    let items = prompts_of_50(130, 1);
    let s = Scenario::new(&format!("policies-{dialect}-bucket"))
        .with_sim(&["--limit", "6000/1m,tokens,burst=5999", "--dialect", dialect])
        .input("prompts.jsonl", &items);
    let t0 = Instant::now();
    let mut args = vec!["--limit", told, "--json-body", "--concurrency", "10"];
    args.extend(more);
    let r = s.run(&args);
    let took = t0.elapsed().as_secs_f64();
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.summary["rate_limited"], 0, "{}", r.summary);
    assert!(
        r.stderr.contains("\"tokens\" of 6000 refills continuously"),
        "{}",
        r.stderr
    );
    let stats = s.sim().stats().await;
    assert_eq!(stats["rejected_rate"], 0, "{stats}");
    assert!(stats["tokens_charged"].as_u64().unwrap() > 6000, "{stats}");
    // A window would hold the last calls for the rest of the minute.
    assert!(took < 30.0, "took {took:.1} s");
    assert_each_item_once(&s.out_path(), 130);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_token_bucket_stated_as_openai_does_is_paced_at_its_refill() {
    a_token_bucket_stated_in_is_paced_at_its_refill("openai", "1000/1s", &[]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_token_bucket_stated_as_anthropic_does_is_paced_at_its_refill_without_a_limit() {
    a_token_bucket_stated_in_is_paced_at_its_refill("anthropic", "none", &[]).await;
}

/// Anthropic limits input and output tokens apart, each a bucket, and
/// states `tokens` as the more restrictive of the two. Read as one quota
/// of all tokens, a prompt of 50 and an answer of 10 weighed 60 against
/// the 1,000 output tokens a minute (16 calls a minute where 100 fit),
/// and the two statements took turns at the one policy. Kept apart, each
/// counts its part: the output bucket is found and its last tokens go at
/// its refill, with no 429.
#[tokio::test(flavor = "multi_thread")]
async fn anthropics_input_and_output_token_limits_are_kept_apart() {
    let items = prompts_of_50(110, 20);
    let s = Scenario::new("policies-anthropic-split")
        .with_sim(&[
            "--limit",
            "1000/1m",
            "--limit",
            "8000/1m,input-tokens,burst=7999",
            "--limit",
            "1000/1m,output-tokens,burst=999",
            "--dialect",
            "anthropic",
        ])
        .input("prompts.jsonl", &items);
    let r = s.run(&["--limit", "none", "--json-body", "--concurrency", "10"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.summary["rate_limited"], 0, "{}", r.summary);
    assert!(
        r.stderr
            .contains("\"output-tokens\" of 1000 refills continuously"),
        "{}",
        r.stderr
    );
    assert!(r.stderr.contains("\"input-tokens\""), "{}", r.stderr);
    assert!(!r.stderr.contains("\"tokens\""), "{}", r.stderr);
    let stats = s.sim().stats().await;
    assert_eq!(stats["rejected_rate"], 0, "{stats}");
    assert_each_item_once(&s.out_path(), 110);
    assert_side_effects(&stats, 110);
}

/// Told three times the limit the sim states in `dialect`, with more
/// calls in flight than the limit: only the first flight (sent before any
/// response said the limit) may be refused.
async fn a_stated_limit_is_kept_after_the_first_response(dialect: &str) {
    let s = Scenario::new(&format!("policies-stated-{dialect}"))
        .with_sim(&[
            "--limit",
            "10/1s",
            "--dialect",
            dialect,
            "--concurrency",
            "20",
            "--latency",
            "20ms..40ms",
            "--cooldown",
            "1s",
        ])
        .numbers(30);
    let r = s.run(&["--limit", "30/1s", "--concurrency", "12"]);
    assert_eq!(r.code, 0, "{dialect}: {}", r.stderr);
    let refused = r.summary["rate_limited"].as_u64().unwrap();
    assert!(refused <= 12, "{dialect}: {refused} 429s: {}", r.summary);
    let stats = s.sim().stats().await;
    let sim_refused =
        stats["rejected_rate"].as_u64().unwrap() + stats["rejected_cooldown"].as_u64().unwrap();
    assert!(sim_refused <= 12, "{dialect}: {stats}");
    assert_each_item_once(&s.out_path(), 30);
    assert_side_effects(&stats, 30);
}

/// GitHub answers its rate limit with a 403, the quota stated used up and
/// no `Retry-After` (the reset says when). A job started while another
/// client's calls fill the key's window (here a run with a checkpoint of
/// its own elsewhere) gets them for its first calls: they are rate limits,
/// waited out to the reset. They stopped the run as "the API rejected the
/// key" (exit 1).
#[tokio::test(flavor = "multi_thread")]
async fn githubs_403_for_its_rate_limit_is_waited_out_not_taken_for_the_key() {
    let s = Scenario::new("policies-github-403")
        .with_sim(&[
            "--limit",
            "10/2s,fixed",
            "--dialect",
            "github",
            "--cooldown",
            "0s",
        ])
        .numbers(10);
    let told = ["--limit", "10/2s,fixed"];
    let elsewhere = TempDir::new("policies-github-403-elsewhere");
    let first = finish(run_cmd(s.sim(), &elsewhere, s.input_path(), &told));
    assert_eq!(first.code, 0, "{}", first.stderr);
    let next = s.dir().path().join("next.jsonl");
    std::fs::write(&next, "{\"n\": 11}\n{\"n\": 12}\n{\"n\": 13}\n").unwrap();
    let r = s.run_for(&next, &[told[0], told[1], "--concurrency", "3"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(!r.stderr.contains("rejected the key"), "{}", r.stderr);
    assert_eq!(r.summary["done"], 3, "{}", r.summary);
    let stats = s.sim().stats().await;
    let refused = stats["rejected_rate"].as_u64().unwrap();
    assert!(refused >= 1, "the window was full: {stats}");
    assert_eq!(r.summary["status_counts"]["403"], refused, "{}", r.summary);
    assert_eq!(r.summary["rate_limited"], refused, "{}", r.summary);
    assert_side_effects(&stats, 13);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_limit_stated_in_batchruns_dialect_is_kept() {
    a_stated_limit_is_kept_after_the_first_response("batchrun").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_limit_stated_in_the_ietf_dialect_is_kept() {
    a_stated_limit_is_kept_after_the_first_response("ietf").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_limit_stated_in_the_old_ietf_dialect_is_kept() {
    a_stated_limit_is_kept_after_the_first_response("ietf-old").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_limit_stated_in_x_ratelimit_headers_is_kept() {
    a_stated_limit_is_kept_after_the_first_response("x-ratelimit").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_limit_stated_in_githubs_dialect_is_kept() {
    a_stated_limit_is_kept_after_the_first_response("github").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_limit_stated_in_openais_dialect_is_kept() {
    a_stated_limit_is_kept_after_the_first_response("openai").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_limit_stated_in_anthropics_dialect_is_kept() {
    a_stated_limit_is_kept_after_the_first_response("anthropic").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn shapes_where_they_cannot_be_kept_and_bad_costs_are_usage_errors() {
    let s = Scenario::new("policies-refused").numbers(3);
    for (extra, says) in [
        (
            &["--limit", "30/1s,burst=5", "--pacer", "bucket"][..],
            "window pacer",
        ),
        (&["--limit", "30/1s,sideways"][..], "sideways"),
        (
            &["--limit", "30/1s,tokens", "--cost", "max_tokens +"][..],
            "max_tokens +",
        ),
    ] {
        let mut args = vec!["--url", "http://127.0.0.1:1/v1/echo"];
        args.extend_from_slice(extra);
        let r = s.run(&args);
        assert_eq!(r.code, 2, "{extra:?}: {}", r.stderr);
        assert!(r.stderr.contains(says), "{extra:?}: {}", r.stderr);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_item_its_cost_cannot_be_read_from_fails_naming_its_line() {
    let s = Scenario::new("policies-cost-row")
        .with_sim(&["--limit", "100/1s"])
        .input("in.jsonl", "{\"n\": 1, \"max_tokens\": 5}\n{\"n\": 2}\n");
    let r = s.run(&[
        "--limit",
        "100/1s",
        "--limit",
        "1000/1m,tokens",
        "--cost",
        "max_tokens",
    ]);
    assert_eq!(r.summary["done"], 1, "{} {}", r.summary, r.stderr);
    let failures = std::fs::read_to_string(s.failures_path()).unwrap();
    assert!(failures.contains("in.jsonl:2"), "{failures}");
    assert!(failures.contains("max_tokens"), "{failures}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_item_heavier_than_a_bucket_of_tokens_admits_fails_unsent_and_the_rest_run() {
    // The sim's bucket admits 21 tokens at once: a call estimated at 50 is
    // refused every time it is sent, so it is failed before it is.
    let limits = ["--limit", "100/1s", "--limit", "100/1s,burst=20,tokens"];
    let s = Scenario::new("policies-too-heavy")
        .with_sim(&limits)
        .input(
            "in.jsonl",
            "{\"n\": 1, \"max_tokens\": 5}\n{\"n\": 2, \"max_tokens\": 50}\n{\"n\": 3, \"max_tokens\": 5}\n",
        );
    let mut args = limits.to_vec();
    args.extend(["--cost", "max_tokens", "--json-body"]);
    let r = s.run(&args);
    assert_eq!(r.summary["done"], 2, "{} {}", r.summary, r.stderr);
    assert_eq!(r.summary["failed"], 1, "{}", r.summary);
    assert_eq!(r.summary["rate_limited"], 0, "{}", r.summary);
    let failures = std::fs::read_to_string(s.failures_path()).unwrap();
    assert!(failures.contains("in.jsonl:2"), "{failures}");
    assert!(failures.contains("admits at once (21)"), "{failures}");
    let stats = s.sim().stats().await;
    assert_eq!(stats["requests"], 2, "nothing sent for line 2: {stats}");
}

/// The same, the quota stated by the server only (OpenAI's headers): the
/// heavy item is failed once the quota is known, at the latest after its
/// own first 429, not sent into 429s until `--max-wait` (30 minutes).
async fn an_item_heavier_than_a_stated_token_quota_fails(name: &str, cost: &[&str]) {
    let sim = [
        "--limit",
        "100/1s",
        "--limit",
        "1000/5s,tokens",
        "--dialect",
        "openai",
        "--cooldown",
        "0s",
    ];
    let s = Scenario::new(name).with_sim(&sim).input(
        "in.jsonl",
        "{\"n\": 1, \"max_tokens\": 5000}\n{\"n\": 2, \"max_tokens\": 50}\n{\"n\": 3, \"max_tokens\": 50}\n",
    );
    let mut args = vec!["--limit", "100/1s"];
    args.extend(cost);
    // Sent into 429s again and again, it would halt (75) after this.
    args.extend(["--json-body", "-c", "1", "--max-wait", "20s"]);
    let r = s.run(&args);
    assert_eq!(r.code, 3, "{}", r.stderr);
    assert_eq!(r.summary["done"], 2, "{}", r.summary);
    assert_eq!(r.summary["failed"], 1, "{}", r.summary);
    assert!(
        r.summary["rate_limited"].as_u64() <= Some(1),
        "{}",
        r.summary
    );
    let failures = std::fs::read_to_string(s.failures_path()).unwrap();
    assert!(failures.contains("in.jsonl:1"), "{failures}");
    assert!(
        failures.contains("the server's limit 1000/1m,tokens (stated) admits at once (1000)"),
        "{failures}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_item_heavier_than_a_stated_token_quota_fails_once_the_quota_is_known() {
    let cost = ["--cost", "max_tokens"];
    an_item_heavier_than_a_stated_token_quota_fails("policies-too-heavy-stated", &cost).await;
}

/// The same under `--limit none`, against a server stating only its quota
/// of tokens: pacing is handed over to that quota, which an item costing
/// more than it never fits. It was sent into 429s until `--max-wait`.
#[tokio::test(flavor = "multi_thread")]
async fn an_item_heavier_than_a_token_quota_handed_over_to_fails_unsent() {
    let sim = ["--limit", "1000/5s,tokens", "--dialect", "openai"];
    let s = Scenario::new("policies-too-heavy-handed").with_sim(&sim).input(
        "in.jsonl",
        "{\"n\": 1, \"max_tokens\": 50}\n{\"n\": 2, \"max_tokens\": 5000}\n{\"n\": 3, \"max_tokens\": 50}\n",
    );
    let args = [
        "--limit",
        "none",
        "--cost",
        "max_tokens",
        "--json-body",
        "-c",
        "1",
    ];
    let r = s.run(&[&args[..], &["--max-wait", "20s"]].concat());
    the_second_of_three_failed_unsent(&s, &r, "admits at once (1000)");
}

/// Of three items, the second failed unsent for `why`, the others done,
/// with no 429.
fn the_second_of_three_failed_unsent(s: &Scenario, r: &Finished, why: &str) {
    assert_eq!(r.code, 3, "{}", r.stderr);
    assert_eq!(r.summary["done"], 2, "{}", r.summary);
    assert_eq!(r.summary["failed"], 1, "{}", r.summary);
    assert_eq!(r.summary["rate_limited"], 0, "{}", r.summary);
    let failures = std::fs::read_to_string(s.failures_path()).unwrap();
    assert!(
        failures.contains("in.jsonl:2") && failures.contains(why),
        "{failures}"
    );
}

/// Estimated at what it asks (no `--cost`): its `max_tokens` alone, which
/// a server keeping the told quota counts in full, is more than the quota,
/// so it fails unsent. Sent, it was refused every second until
/// `--max-wait`, each 429 teaching a lower call limit that slowed the rest.
#[tokio::test(flavor = "multi_thread")]
async fn an_item_asking_more_than_a_told_token_quota_fails_unsent() {
    let limits = ["--limit", "100/1s", "--limit", "1000/5s,tokens"];
    let s = Scenario::new("policies-too-heavy-asked").with_sim(&limits).input(
        "in.jsonl",
        "{\"n\": 1, \"max_tokens\": 50}\n{\"n\": 2, \"max_tokens\": 5000}\n{\"n\": 3, \"max_tokens\": 50}\n",
    );
    let mut args = limits.to_vec();
    args.extend(["--json-body", "-c", "1", "--max-wait", "20s"]);
    let r = s.run(&args);
    let why = "more than --limit 1000/5s,tokens admits at once (1000)";
    the_second_of_three_failed_unsent(&s, &r, why);
    assert_side_effects(&s.sim().stats().await, 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_daily_quota_used_up_halts_resumably_and_says_when_it_resets() {
    let s = Scenario::new("policies-daily")
        .with_sim(&["--limit", "5/1d", "--dialect", "github"])
        .numbers(8);
    let r = s.run(&["--limit", "5/1d", "--concurrency", "1"]);
    assert_eq!(r.code, 75, "{}", r.stderr);
    assert_eq!(r.summary["done"], 5, "{}", r.summary);
    assert_eq!(r.summary["rate_limited"], 0, "{}", r.summary);
    assert!(r.stderr.contains("used up until"), "{}", r.stderr);
    assert!(r.stderr.contains("--wait-for-quota"), "{}", r.stderr);
    // Its own halt: the quota and when it resets, not "the pacer is
    // unavailable".
    let why = r.summary["halt_reason"].as_str().unwrap_or_default();
    assert!(
        why.contains("quota") && why.contains("is used up until"),
        "{}",
        r.summary
    );
    assert!(!why.contains("unavailable"), "{}", r.summary);
}

/// A server that states no quota but answers its 429 with a Retry-After
/// of most of a day has a daily limit used up: the run halts resumably at
/// once and says when it resets, as for a stated quota, and running it
/// again executes nothing twice.
#[tokio::test(flavor = "multi_thread")]
async fn a_429_asking_for_a_day_halts_as_a_used_up_quota() {
    // In both forms of Retry-After: delay seconds, and the HTTP-date.
    for form in ["--cooldown", "--retry-after-date"] {
        a_day_asked_for_halts(form).await;
    }
}

async fn a_day_asked_for_halts(form: &str) {
    let mut sim = vec!["--limit", "5/1d", "--secret-limit", "--cooldown", "1s"];
    if form == "--retry-after-date" {
        sim.push(form);
    }
    let s = Scenario::new(&format!("policies-retry-day{form}"))
        .with_sim(&sim)
        .numbers(8);
    let r = s.run(&["--limit", "100/1s", "--concurrency", "1"]);
    assert_eq!(r.code, 75, "{}", r.stderr);
    assert_eq!(r.summary["done"], 5, "{}", r.summary);
    // Its 429 is the quota's, not a pause's (as a credits 429 is).
    assert_eq!(r.summary["status_counts"]["429"], 1, "{}", r.summary);
    assert_eq!(r.summary["rate_limited"], 0, "{}", r.summary);
    let why = r.summary["halt_reason"].as_str().unwrap_or_default();
    assert!(
        why.contains("quota is used up until")
            && why.contains("as a 429 said (its Retry-After or reset)"),
        "{}",
        r.summary
    );
    assert!(why.contains("--wait-for-quota"), "{}", r.summary);
    let again = s.run(&["--limit", "100/1s", "--concurrency", "1"]);
    assert_eq!(again.code, 75, "{}", again.stderr);
    assert_eq!(again.summary["done"], 5, "{}", again.summary);
    let stats = s.sim().stats().await;
    assert_eq!(stats["side_effects"], 5, "nothing executed twice: {stats}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rehearsal_of_a_bucket_told_its_burst_sees_no_429() {
    let s = Scenario::new("policies-rehearsal").numbers(40);
    let out = bin()
        .arg(s.input_path())
        .args(["--sim", "--limit", "30/1s,burst=5", "-c", "5", "--json"])
        .arg("--state-dir")
        .arg(s.state_dir())
        .env_remove("BATCHRUN_URL")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["done"], 40, "{summary}");
    assert_eq!(summary["rate_limited"], 0, "{summary}");
}
