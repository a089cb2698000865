//! What the model is told to simulate, already validated by `sim::SimArgs`.

use std::collections::HashMap;
use std::time::Duration;

use serde::Serialize;

use crate::rate::policy::PolicySpec;
use crate::rate::{Limit, Rate};

/// Which server-side rate model limits each key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ModelKind {
    /// APIVerve-style: at most L accepted requests in any sliding window W,
    /// and an overrun starts a cooldown for the key.
    #[default]
    Window,
    /// Apigee SpikeArrest: a token bucket of 10% of messagesPerPeriod,
    /// dripping one token per period/messagesPerPeriod, no queue, no cooldown.
    #[value(alias = "spike")]
    SpikeArrest,
}

/// How the sim's responses state the limits (`batchrun sim --dialect`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Dialect {
    /// `x-rate-limit-limit` and `x-rate-limit-remaining` of the first limit.
    #[default]
    Batchrun,
    /// `RateLimit-Policy` (every limit, named) and `RateLimit` (each one's
    /// remaining and reset), the current IETF draft.
    Ietf,
    /// `RateLimit-Limit`, `-Remaining`, `-Reset` of the tightest limit, and
    /// `RateLimit-Policy: L;w=W, …`, the older IETF draft.
    IetfOld,
    /// `X-RateLimit-Limit`, `-Remaining`, `-Reset` (delta seconds) of the
    /// tightest limit.
    XRatelimit,
    /// As GitHub: `X-RateLimit-*` with the reset in epoch seconds, `-Used`
    /// and `-Resource`.
    Github,
    /// As OpenAI: `x-ratelimit-{limit,remaining,reset}-requests`, the reset
    /// a Go duration.
    Openai,
    /// As Anthropic: `anthropic-ratelimit-requests-{limit,remaining,reset}`,
    /// the reset an RFC 3339 instant.
    Anthropic,
    /// No rate headers at all (the limits are kept, as with
    /// `--secret-limit`, but `retry-after` still goes out on a 429).
    None,
    /// As nginx's `limit_req` in front of an API, left as installed: no
    /// rate headers, and a rate refusal is nginx's own 503 page, with no
    /// `retry-after` and none of the API's headers.
    Nginx,
}

/// Everything the model needs to know, already validated.
#[derive(Debug, Clone)]
pub struct Config {
    /// Rate model for every key.
    pub kind: ModelKind,
    /// Every policy each key is held to (`--limit`, repeatable; none: no
    /// limit). A request must fit each; key caps lower the first, and the
    /// default headers state the first.
    pub policies: Vec<PolicySpec>,
    /// How responses state the limits.
    pub dialect: Dialect,
    /// Requests in flight per key before 429 with `x-concurrency-limit`.
    pub concurrency: usize,
    /// Cooldown after a window overrun; zero disables it.
    pub cooldown: Duration,
    /// Per-key caps below the plan's limit (`--key-cap KEY=N`).
    pub key_caps: HashMap<String, u64>,
    /// The cycle's base allowance (`--credits`).
    pub credits: u64,
    /// Credits per successful call unless the endpoint has its own cost.
    pub default_cost: u64,
    /// Per-endpoint costs (`--cost NAME=N`).
    pub costs: HashMap<String, u64>,
    /// Length of a billing cycle.
    pub renewal_in: Duration,
    /// How long an idempotency key's stored response is kept.
    pub idempotency_ttl: Duration,
    /// Injected latency, uniform in `[lo, hi]`.
    pub latency: Option<(Duration, Duration)>,
    /// Probability that an admitted request gets a 503 instead of executing.
    pub fail_rate: f64,
    /// Probability that the connection is dropped after executing.
    pub reset_rate: f64,
    /// Seed of the fault dice.
    pub seed: u64,
    /// Transit-in latency, uniform in `[lo, hi]`: a request counts as arrived
    /// (in the window, in flight) only after it.
    pub latency_in: Option<(Duration, Duration)>,
    /// Enforce the limit but never send the rate headers.
    pub secret_limit: bool,
    /// Enforce the first policy but never state it (the others stated).
    pub secret_first: bool,
    /// Say every Retry-After as an HTTP-date, not delay seconds.
    pub retry_after_date: bool,
    /// Finish a call whose client went away.
    pub keep_working: bool,
    /// Answer every metered request with a rate-limit 429 and
    /// `retry-after: 1`.
    pub rate_limit_forever: bool,
    /// Put the request's API key in every response body.
    pub echo_key: bool,
    /// Items refused before admission (`--refuse`).
    pub refuse: Vec<super::refusals::Refusal>,
    /// Items per call the batch endpoint takes at most (`--max-batch`);
    /// a larger batch is a 413.
    pub max_batch: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            kind: ModelKind::Window,
            policies: vec![PolicySpec::sliding(Limit::Rate(Rate {
                count: 60,
                period: Duration::from_secs(60),
            }))],
            dialect: Dialect::Batchrun,
            concurrency: 5,
            cooldown: Duration::from_secs(50),
            key_caps: HashMap::new(),
            credits: 100_000,
            default_cost: 1,
            costs: HashMap::new(),
            renewal_in: Duration::from_secs(30 * 86_400),
            idempotency_ttl: Duration::from_secs(86_400),
            latency: None,
            fail_rate: 0.0,
            reset_rate: 0.0,
            seed: 0,
            latency_in: None,
            secret_limit: false,
            secret_first: false,
            retry_after_date: false,
            rate_limit_forever: false,
            echo_key: false,
            keep_working: false,
            refuse: Vec::new(),
            max_batch: 100,
        }
    }
}
