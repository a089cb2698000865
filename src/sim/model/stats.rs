//! The counters behind `/admin/stats`.

use serde::Serialize;

/// The counters of `/admin/stats`.
///
/// The request counters partition the metered requests:
/// `requests = rejected_auth + rejected_bad_request + rejected_cooldown +
/// rejected_concurrency + rejected_rate + rejected_conflict + rejected_credits +
/// rejected_refused + accepted`, and every accepted request ends as a side effect, a replay, an
/// injected failure, an abandoned request or is still in flight. A call to
/// the batch endpoint is one accepted request, and one side effect (or
/// replay) per item it settled.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct Stats {
    /// Requests to `/v1/*`.
    pub requests: u64,
    /// Requests that passed every admission check (and count in the window).
    pub accepted: u64,
    /// Missing or empty `x-api-key` (401).
    pub rejected_auth: u64,
    /// Unreadable query, body or header (400/413), not metered.
    pub rejected_bad_request: u64,
    /// 429 during a cooldown.
    pub rejected_cooldown: u64,
    /// 429 over the concurrency ceiling.
    pub rejected_concurrency: u64,
    /// 429 from the rate model.
    pub rejected_rate: u64,
    /// 409: the same idempotency key was still executing.
    pub rejected_conflict: u64,
    /// 429 credits exhausted.
    pub rejected_credits: u64,
    /// Refused by `--refuse` (401/402/403), before admission.
    pub rejected_refused: u64,
    /// Successful executions (each charged once).
    pub side_effects: u64,
    /// Stored responses replayed for a repeated idempotency key.
    pub idempotent_replays: u64,
    /// Injected 503s (nothing executed, nothing charged).
    pub injected_failures: u64,
    /// Connections dropped after executing.
    pub resets: u64,
    /// Admitted requests whose client went away before they executed.
    pub abandoned: u64,
    /// Requests to unknown paths (404), not metered.
    pub not_found: u64,
    /// The most accepted requests of one key seen inside one window (the
    /// limit's period; 0 when there is no limit).
    pub max_in_window: u64,
    /// Requests in flight now, all keys.
    pub in_flight: u64,
    /// The most requests of one key ever in flight at once.
    pub in_flight_max: u64,
    /// Requests waiting out `--latency-in`: sent but not yet arrived, so not
    /// yet in `requests` or any window.
    pub in_transit: u64,
    /// Credits left this cycle.
    pub credits_remaining: u64,
    /// Credits spent this cycle.
    pub credits_used: u64,
    /// The cycle's allowance.
    pub max_credits: u64,
    /// Unix seconds when the cycle renews.
    pub renewal: u64,
    /// Billing cycles started after the first (renewals).
    pub renewals: u64,
    /// Distinct API keys seen.
    pub keys: u64,
    /// Per policy (in `--limit` order), the most it saw over every key.
    pub policies: Vec<super::policy::PolicyStats>,
    /// Tokens charged to successful calls, all keys.
    pub tokens_charged: u64,
}
