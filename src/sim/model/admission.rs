//! What [`Model::admit`](super::Model::admit) answers: the verdict on one
//! metered request and the headers that go with it.

use std::time::Duration;

use axum::body::Bytes;

/// The rate headers of a response: `x-rate-limit-limit` and
/// `x-rate-limit-remaining`. Absent when the key has no rate limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateInfo {
    /// The limit in force for this key (after its cap).
    pub limit: u64,
    /// What is left in the window (or whole tokens in the bucket).
    pub remaining: u64,
}

/// One limit of a key as a response states it in a header dialect other
/// than the default (`batchrun sim --dialect`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PolicyView {
    /// Units (calls or tokens) admitted per window.
    pub limit: u64,
    /// The window (a bucket's: the period of its rate).
    pub window: Duration,
    /// Requests still admitted now.
    pub remaining: u64,
    /// When the quota resets, as the shape has it: the oldest request in a
    /// sliding window ages out, a fixed window's boundary, a bucket can take
    /// a call again (zero when it can now, or the window is empty).
    pub reset: Duration,
    /// When it is back to its initial state: a bucket drained to idle, a
    /// window at its reset. OpenAI and Anthropic state this as a token
    /// limit's reset (their buckets refill continuously).
    pub idle: Duration,
    /// What `limit` and `remaining` count: calls or tokens.
    pub unit: crate::rate::policy::Unit,
}

/// The four credit headers every metered response carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CreditView {
    /// `x-api-remaining-credits`: zero or below on a credits-exhausted 429.
    pub remaining: i64,
    /// `x-api-credits-used`.
    pub used: u64,
    /// `x-api-max-credits`: the cycle's allowance.
    pub max: u64,
    /// `x-api-renewal`: unix seconds when the cycle renews.
    pub renewal: u64,
}

/// Why a metered request was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rejection {
    /// The key is cooling down after a window overrun.
    Cooldown {
        /// Seconds left in the cooldown, rounded up.
        retry_after: u64,
    },
    /// The key already has `limit` requests in flight.
    Concurrency {
        /// The ceiling (`x-concurrency-limit`).
        limit: usize,
    },
    /// The rate model refused it.
    Rate {
        /// Seconds until it would fit, rounded up, at least 1.
        retry_after: u64,
    },
    /// The same idempotency key is still executing.
    Conflict,
    /// The account cannot pay for the call.
    Credits {
        /// This endpoint's cost.
        cost: u64,
        /// The balance that fell short.
        balance: u64,
    },
}

/// Injected faults for one admitted request, drawn at admission so that a
/// seed gives the same sequence for the same order of arrivals.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Faults {
    /// Sleep this long before answering (the request stays in flight).
    pub latency: Duration,
    /// Answer 503 instead of executing; `Some(Some(n))` adds `retry-after: n`.
    pub fail: Option<Option<u64>>,
    /// Drop the connection after executing, without a response.
    pub reset: bool,
}

/// A claim on a concurrency slot, a credit reservation and possibly an
/// idempotency key; hand it back through exactly one of `complete`, `fail` or
/// `abandon`.
#[derive(Debug)]
#[must_use = "a ticket holds a slot and credits until it is handed back"]
pub struct Ticket {
    pub(super) key: String,
    pub(super) cost: u64,
    pub(super) idem: Option<String>,
}

/// What to do with a metered request.
#[derive(Debug)]
pub enum Admission {
    /// Answer with a 4xx at once.
    Rejected {
        /// Why.
        why: Rejection,
        /// Rate headers.
        rate: Option<RateInfo>,
        /// Credit headers.
        credits: CreditView,
    },
    /// Answer with the stored response of this idempotency key.
    Replay {
        /// The stored body.
        body: Bytes,
        /// Rate headers.
        rate: Option<RateInfo>,
        /// Credit headers (nothing was charged).
        credits: CreditView,
    },
    /// Go ahead: apply the faults, execute, and hand the ticket back.
    Admitted {
        /// The claim to hand back.
        ticket: Ticket,
        /// Rate headers.
        rate: Option<RateInfo>,
        /// Faults to inject.
        faults: Faults,
    },
}

impl Admission {
    /// The same verdict without rate headers (`--secret-limit`).
    pub(super) fn without_rate(mut self) -> Self {
        match &mut self {
            Admission::Rejected { rate, .. }
            | Admission::Replay { rate, .. }
            | Admission::Admitted { rate, .. } => *rate = None,
        }
        self
    }
}
