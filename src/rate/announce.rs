//! What a response's headers say about the limits the server keeps, in
//! every common dialect, normalized to one list of [`Announced`] policies.
//!
//! Pure: the caller passes the unix time the response arrived, which epoch
//! and RFC 3339 resets are measured from. Nothing here panics on any header
//! value; what cannot be read is left out.
//!
//! The dialects (docs/pacing.md, "Header dialects"):
//! - IETF `RateLimit-Policy` / `RateLimit` (draft-ietf-httpapi-ratelimit-headers,
//!   current form: named policies with `q`, `w`, `qu`; `r`, `t`);
//! - the older IETF form `RateLimit-Limit` / `-Remaining` / `-Reset`, with
//!   `RateLimit-Policy: 10;w=1, 1000;w=3600`;
//! - `X-RateLimit-Limit` / `-Remaining` / `-Reset` (reset in epoch seconds,
//!   as GitHub, or delta seconds, told apart by size), and batchrun's own
//!   `x-rate-limit-*` spelling;
//! - OpenAI's `x-ratelimit-{limit,remaining,reset}-{requests,tokens}` with
//!   Go-style durations (`6m0s`, `1s`, `20ms`);
//! - Anthropic's `anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{limit,remaining,reset}`
//!   with RFC 3339 resets.

use std::time::Duration;

use reqwest::header::HeaderMap;

mod fields;
#[cfg(test)]
mod tests;

use super::retry_after::MAX_QUOTA_RESET;
pub(crate) use fields::go_duration;
use fields::{members, Item};

/// What an announced quota counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unit {
    /// Requests: what batchrun paces.
    Calls,
    /// Tokens, input and output together: paced as a policy of tokens.
    Tokens,
    /// A prompt's tokens alone (Anthropic's `input-tokens`).
    InputTokens,
    /// An answer's tokens alone (Anthropic's `output-tokens`).
    OutputTokens,
    /// Anything else (content bytes, concurrent requests, …).
    Other,
}

impl Unit {
    /// What a policy of tokens kept for it counts; calls for any other.
    pub fn counted(self) -> crate::rate::policy::Unit {
        use crate::rate::policy::Unit as Counted;
        match self {
            Unit::Tokens => Counted::Tokens,
            Unit::InputTokens => Counted::InputTokens,
            Unit::OutputTokens => Counted::OutputTokens,
            Unit::Calls | Unit::Other => Counted::Calls,
        }
    }

    /// Whether it counts tokens of any kind.
    pub fn is_tokens(self) -> bool {
        self.counted().is_tokens()
    }
}

/// How long a quota with nothing left and a reset of nothing (or already
/// past) holds calls: the second a reset in whole seconds may be early by.
pub const RESET_NOW: Duration = Duration::from_secs(1);

/// A stated reset, a reset of nothing (`t=0`, whole seconds rounded down,
/// an instant already past by the server's clock) read as [`RESET_NOW`]:
/// the quota is back, or within the second.
pub fn reset_or_now(reset: Duration) -> Duration {
    match reset.is_zero() {
        true => RESET_NOW,
        false => reset,
    }
}

/// One limit a server says it keeps, whatever the dialect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Announced {
    /// The policy's name ("default", "requests", "input-tokens", …).
    pub name: String,
    /// What the quota counts.
    pub unit: Unit,
    /// The quota per window, when stated (a `RateLimit` field alone gives
    /// only what is left).
    pub quota: Option<u64>,
    /// The window, when stated.
    pub window: Option<Duration>,
    /// What is left of the quota, when stated.
    pub remaining: Option<u64>,
    /// How long until the quota resets, when stated.
    pub reset_in: Option<Duration>,
    /// Whether the reset is stated finer than whole seconds (OpenAI's
    /// durations, `20ms`, `1.5s`), which every other dialect rounds to (so
    /// up to a second late).
    pub reset_exact: bool,
    /// Whether the reset, an instant, was measured from the response's own
    /// `Date` (the server's clock as it answered), so that neither the way
    /// back nor a skew between the clocks is in it; `Date` is whole
    /// seconds, so it may be read up to a second long.
    pub reset_dated: bool,
}

impl Announced {
    fn new(name: &str, unit: Unit) -> Announced {
        Announced {
            name: name.to_string(),
            unit,
            quota: None,
            window: None,
            remaining: None,
            reset_in: None,
            reset_exact: false,
            reset_dated: false,
        }
    }

    /// How long nothing left of this policy holds calls, for its reset
    /// `reset`, the policy counting over `window` (its own, or the window
    /// it is read against when it states none). Any window's quota (and a
    /// bucket's, stated as a quota per window) is back within W of the call
    /// this response answers; a reset in whole seconds that says no more
    /// than that, rounded up (and a second more for an instant read
    /// against a whole-second `Date`), holds no longer than `window`: the
    /// rounding alone held a 100 ms window a second, a 1 s window two. A
    /// reset to the millisecond holds as stated, and so does a longer one,
    /// which says the server's window is longer than the one it is read
    /// against.
    pub fn hold(&self, reset: Duration, window: Duration) -> Duration {
        let whole = Duration::from_secs(window.as_secs() + u64::from(window.subsec_nanos() > 0));
        let most = whole.saturating_add(Duration::from_secs(u64::from(self.reset_dated)));
        match self.reset_exact || reset > most {
            true => reset,
            false => reset.min(window),
        }
    }

    /// Whether it says anything at all.
    fn says_something(&self) -> bool {
        self.quota.is_some() || self.remaining.is_some()
    }
}

/// A reset value larger than this many seconds is an epoch, not a delta:
/// ten years, far beyond any window and far before any date a server sends.
pub const EPOCH_AFTER_SECS: u64 = 10 * 365 * 86_400;

/// The longest window a statement is taken at (ten years): longer is no
/// window a server keeps but a garbled value, and the pacer's arithmetic
/// on it would overflow the clock. Such a policy is read as stating no
/// window.
pub const MAX_WINDOW: Duration = Duration::from_secs(EPOCH_AFTER_SECS);

/// Every policy the headers announce, in any dialect, as of `now_unix`
/// (the response's arrival, as unix time). Several dialects on one
/// response are all read; the caller decides which it paces to. An
/// instant a server states (an epoch reset, an RFC 3339 one) is measured
/// from the response's `Date` where it has a sane one ([`server_now`]).
pub fn read(h: &HeaderMap, now_unix: Duration) -> Vec<Announced> {
    let mut out = Vec::new();
    let clock = Clock::of(h, now_unix);
    ietf(h, clock, &mut out);
    for prefix in ["x-ratelimit", "x-rate-limit"] {
        x_ratelimit(h, prefix, clock, &mut out);
    }
    for unit in ["requests", "tokens"] {
        openai(h, unit, &mut out);
    }
    anthropic(h, clock, &mut out);
    out.into_iter().map(bounded).collect()
}

/// The reset a response states with nothing else of its quota
/// (`X-RateLimit-Reset` alone, or the older IETF `RateLimit-Reset`), as of
/// `now_unix`: a 429 saying only when its quota is back. The latest, when
/// several; None when none is stated.
pub fn reset_alone(h: &HeaderMap, now_unix: Duration) -> Option<Duration> {
    let clock = Clock::of(h, now_unix);
    ["x-ratelimit-reset", "x-rate-limit-reset", "ratelimit-reset"]
        .into_iter()
        .filter_map(|n| clock.resets(h, n).0)
        .max()
}

/// What a stated instant is measured from: unix time, and whether it is
/// the response's `Date` ([`server_now`]).
#[derive(Clone, Copy)]
struct Clock(Duration, bool);

impl Clock {
    /// The clock of the response `h` read at `now_unix`: its `Date` where
    /// it has a sane one ([`server_now`]), else this clock's time.
    fn of(h: &HeaderMap, now_unix: Duration) -> Clock {
        let server = server_now(h, now_unix);
        Clock(server.unwrap_or(now_unix), server.is_some())
    }

    /// A reset `v` in seconds (or an epoch, [`reset_secs`]), and whether it
    /// was an instant measured from the response's `Date`: whole seconds,
    /// so up to a second long.
    fn reset(self, v: u64) -> (Duration, bool) {
        let r = reset_secs(v, self.0);
        (r, self.1 && v > EPOCH_AFTER_SECS)
    }

    /// The latest reset the lines of header `name` say (as [`latest`]),
    /// and whether any was an instant measured from the response's `Date`.
    fn resets(self, h: &HeaderMap, name: &str) -> (Option<Duration>, bool) {
        let said: Vec<(Duration, bool)> = each(h, name)
            .filter_map(|t| Some(self.reset(t.parse().ok()?)))
            .collect();
        let latest = said.iter().map(|r| r.0).max();
        (latest, said.iter().any(|r| r.1))
    }
}

/// The response's `Date` as unix time, where it is sane (within a day of
/// this clock's `now_unix`): the instants a server states (an epoch reset,
/// an RFC 3339 one, an HTTP-date `Retry-After`) are on its clock, and
/// measured from its `Date` they are not moved by a skew between the two
/// clocks (a server an hour ahead held a run an hour for a reset 5 s
/// off). `Date` is truncated to the second, so a reset so measured may be
/// read up to a second long, never short.
pub fn server_now(h: &HeaderMap, now_unix: Duration) -> Option<Duration> {
    text(h, "date")
        .and_then(|d| httpdate::parse_http_date(d).ok())
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .filter(|&d| d.max(now_unix) - d.min(now_unix) < Duration::from_secs(86_400))
}

/// A statement within what the pacer can act on: a window of at most
/// [`MAX_WINDOW`], and a reset at most a year and a day away (as a
/// 429's `Retry-After`, [`MAX_QUOTA_RESET`]): a reset further off halts the
/// run as a used-up quota all the same, and one of billions of years
/// would overflow the clock that says when.
fn bounded(mut a: Announced) -> Announced {
    a.window = a.window.filter(|w| *w <= MAX_WINDOW);
    a.reset_in = a.reset_in.map(|r| r.min(MAX_QUOTA_RESET));
    a
}

// A header sent more than once (a proxy and the API behind it each setting
// it) is read whole: a list field's lines joined, as HTTP combines them;
// of several numbers the least quota or remaining and the latest reset, so
// that the tighter statement governs, whichever line came first.

/// Every line of the header `name`, trimmed (those that are text).
fn each<'a>(h: &'a HeaderMap, name: &str) -> impl Iterator<Item = &'a str> {
    h.get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .map(str::trim)
}

/// The first line of `name`: for a name, which one line says.
fn text<'a>(h: &'a HeaderMap, name: &str) -> Option<&'a str> {
    each(h, name).next()
}

/// A list field's lines joined with commas, as one line.
fn list(h: &HeaderMap, name: &str) -> Option<String> {
    let lines: Vec<&str> = each(h, name).collect();
    (!lines.is_empty()).then(|| lines.join(", "))
}

/// The least number the lines of `name` say (a quota, what is left).
fn whole(h: &HeaderMap, name: &str) -> Option<u64> {
    each(h, name).filter_map(|v| v.parse().ok()).min()
}

/// The latest reset the lines of `name` say, each read by `read`.
fn latest(h: &HeaderMap, name: &str, read: impl Fn(&str) -> Option<Duration>) -> Option<Duration> {
    each(h, name).filter_map(read).max()
}

/// A positive quota: a quota of zero is no limit one could pace to.
fn quota(v: Option<u64>) -> Option<u64> {
    v.filter(|&q| q > 0)
}

/// Seconds that are either a delta or an epoch (told apart by size);
/// milliseconds since the epoch are recognized too: any value beyond 10^11,
/// which in seconds would be past the year 5000 and in milliseconds is
/// 1973. (A hundred times the delta bound, its first try, read a reset in
/// the year 3000, in seconds, as milliseconds of 1971: already past.) Such
/// a value that as milliseconds lies more than a day past, is seconds of
/// a far future (`253402300799`, the end of the year 9999): a quota
/// used up for good, not one reset long ago.
pub fn reset_secs(v: u64, now_unix: Duration) -> Duration {
    const MS_EPOCH_AFTER: u64 = 100_000_000_000;
    const DAY: Duration = Duration::from_secs(86_400);
    let long_past = Duration::from_millis(v) + DAY < now_unix;
    if v > MS_EPOCH_AFTER && !long_past {
        Duration::from_millis(v).saturating_sub(now_unix)
    } else if v > EPOCH_AFTER_SECS {
        Duration::from_secs(v).saturating_sub(now_unix)
    } else {
        Duration::from_secs(v)
    }
}

/// A unit named by `qu` (IETF): requests unless said otherwise.
fn ietf_unit(qu: Option<&str>) -> Unit {
    match qu.map(str::to_ascii_lowercase).as_deref() {
        None | Some("requests") | Some("request") => Unit::Calls,
        Some(u) => unit_named(u),
    }
}

/// Both IETF forms.
fn ietf(h: &HeaderMap, clock: Clock, out: &mut Vec<Announced>) {
    let start = out.len();
    // `RateLimit-Policy`: named (current draft) or bare quotas (older). An
    // early draft listed the policies after the limit in `RateLimit-Limit`
    // instead (`10, 10;w=1, 1000;w=3600`).
    let policies = match list(h, "ratelimit-policy") {
        Some(p) => members(&p),
        None => each(h, "ratelimit-limit")
            .flat_map(members)
            .filter(|m| m.int("w").is_some())
            .collect(),
    };
    for (i, m) in policies.into_iter().enumerate() {
        // A window that cannot be read is no window of the told limit's.
        if m.unreadable("w") {
            continue;
        }
        let (name, q) = match &m.item {
            Item::Name(n) => (n.clone(), m.int("q")),
            Item::Int(q) => (format!("policy {}", i + 1), Some(*q)),
            Item::Other => continue,
        };
        let mut a = Announced::new(&name, ietf_unit(m.text("qu")));
        a.quota = quota(q);
        a.window = m.int("w").filter(|&w| w > 0).map(Duration::from_secs);
        if a.says_something() {
            out.push(a);
        }
    }
    ietf_left(h, clock, out, start);
    // The older `RateLimit-Limit` / `-Remaining` / `-Reset` (delta seconds).
    let limit = each(h, "ratelimit-limit")
        .filter_map(|line| match members(line).first().map(|m| &m.item) {
            Some(Item::Int(q)) => Some(*q),
            _ => None,
        })
        .min();
    let remaining = whole(h, "ratelimit-remaining");
    if limit.is_none() && remaining.is_none() {
        return;
    }
    let (reset_in, dated) = clock.resets(h, "ratelimit-reset");
    // The policy of that quota, if `RateLimit-Policy` listed it.
    let listed = out[start..]
        .iter_mut()
        .find(|a| a.quota.is_some() && a.quota == limit && a.remaining.is_none());
    match listed {
        Some(a) => {
            a.remaining = remaining;
            a.reset_in = reset_in;
            a.reset_dated |= dated;
        }
        None => {
            let mut a = Announced::new("ratelimit", Unit::Calls);
            a.quota = quota(limit);
            a.remaining = remaining;
            a.reset_in = reset_in;
            a.reset_dated = dated;
            push(out, a);
        }
    }
}

/// `RateLimit: "name";r=..;t=..` (current draft): what is left of the
/// policies read from `out[start..]`, or of policies named only there.
fn ietf_left(h: &HeaderMap, clock: Clock, out: &mut Vec<Announced>, start: usize) {
    for m in list(h, "ratelimit")
        .as_deref()
        .map(members)
        .unwrap_or_default()
    {
        let Item::Name(name) = &m.item else { continue };
        let remaining = m.int("r");
        let reset = m.int("t").map(|t| clock.reset(t));
        let (reset_in, dated) = (reset.map(|r| r.0), reset.is_some_and(|r| r.1));
        match out[start..].iter_mut().find(|a| &a.name == name) {
            // Named twice (two lines): the least left, the latest reset.
            Some(a) if a.remaining.is_some() => {
                a.remaining = a.remaining.min(remaining).or(remaining);
                a.reset_in = a.reset_in.max(reset_in);
                a.reset_dated |= dated;
            }
            Some(a) => {
                a.remaining = remaining;
                a.reset_in = reset_in;
                a.reset_dated |= dated;
            }
            None => {
                let mut a = Announced::new(name, Unit::Calls);
                a.remaining = remaining;
                a.reset_in = reset_in;
                a.reset_dated = dated;
                if a.says_something() {
                    out.push(a);
                }
            }
        }
    }
}

/// `X-RateLimit-*` (GitHub and many others) or `x-rate-limit-*`.
fn x_ratelimit(h: &HeaderMap, prefix: &str, clock: Clock, out: &mut Vec<Announced>) {
    let limit = whole(h, &format!("{prefix}-limit"));
    let remaining = whole(h, &format!("{prefix}-remaining"));
    if limit.is_none() && remaining.is_none() {
        return;
    }
    // GitHub names the resource the quota is for ("core", "search").
    let name = text(h, &format!("{prefix}-resource"))
        .filter(|r| !r.is_empty())
        .unwrap_or(prefix);
    let mut a = Announced::new(name, Unit::Calls);
    a.quota = quota(limit);
    a.remaining = remaining;
    (a.reset_in, a.reset_dated) = clock.resets(h, &format!("{prefix}-reset"));
    push(out, a);
}

/// OpenAI: `x-ratelimit-limit-requests`, `-remaining-`, `-reset-`.
fn openai(h: &HeaderMap, unit: &str, out: &mut Vec<Announced>) {
    let limit = whole(h, &format!("x-ratelimit-limit-{unit}"));
    let remaining = whole(h, &format!("x-ratelimit-remaining-{unit}"));
    if limit.is_none() && remaining.is_none() {
        return;
    }
    let mut a = Announced::new(unit, unit_named(unit));
    a.quota = quota(limit);
    a.remaining = remaining;
    a.reset_in = latest(h, &format!("x-ratelimit-reset-{unit}"), go_duration);
    // Whole seconds may be rounded (up, as the sim does from a second on).
    a.reset_exact = a.reset_in.is_some_and(|d| d.subsec_nanos() != 0);
    push(out, a);
}

/// Anthropic: `anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{limit,remaining,reset}`.
fn anthropic(h: &HeaderMap, clock: Clock, out: &mut Vec<Announced>) {
    // The instants are measured from the response's `Date` where it has a
    // sane one: both the server's.
    let Clock(since, dated) = clock;
    let start = out.len();
    for unit in ["requests", "tokens", "input-tokens", "output-tokens"] {
        let limit = whole(h, &format!("anthropic-ratelimit-{unit}-limit"));
        let remaining = whole(h, &format!("anthropic-ratelimit-{unit}-remaining"));
        if limit.is_none() && remaining.is_none() {
            continue;
        }
        let mut a = Announced::new(unit, unit_named(unit));
        a.quota = quota(limit);
        a.remaining = remaining;
        a.reset_in = latest(h, &format!("anthropic-ratelimit-{unit}-reset"), |t| {
            fields::rfc3339_unix(t).map(|at| at.saturating_sub(since))
        });
        a.reset_dated = dated && a.reset_in.is_some();
        push(out, a);
    }
    // `tokens` is the most restrictive of the input and output limits
    // (Anthropic's documentation): where both are stated apart, it adds
    // nothing, and read as all of a call's tokens it would hold the
    // prompt and the answer together to the lesser quota. Beside one of
    // them alone (a proxy passing some headers on), it is kept: it may be
    // the only statement of the other.
    let stated = |unit| out[start..].iter().any(|a| a.unit == unit);
    if stated(Unit::InputTokens) && stated(Unit::OutputTokens) {
        let stated = out.split_off(start);
        out.extend(stated.into_iter().filter(|a| a.unit != Unit::Tokens));
    }
}

/// Keeps `a` when it says anything (a zero quota and no remaining do not).
fn push(out: &mut Vec<Announced>, a: Announced) {
    if a.says_something() {
        out.push(a);
    }
}

/// A unit named in a header or a `qu`: requests, tokens, or a prompt's or
/// an answer's tokens alone.
fn unit_named(unit: &str) -> Unit {
    match unit {
        u if u.contains("input") && u.contains("token") => Unit::InputTokens,
        u if u.contains("output") && u.contains("token") => Unit::OutputTokens,
        u if u.contains("token") => Unit::Tokens,
        "requests" | "request" => Unit::Calls,
        _ => Unit::Other,
    }
}
