//! A fleet: many batchrun processes on one API key sharing one budget
//! through Redis (`--redis`).
//!
//! What is per key is per fleet: the window and the concurrency ceiling
//! ([`pacer::FleetPacer`] and its Lua script), the rate-limit pause,
//! the learnt limit, and the billing alerts ([`alerts`]). [`keys`] names
//! where each lives; [`shard`] splits one input between processes.
//!
//! Failure is closed: no call goes out without a slot. While Redis is out
//! of reach every operation retries with backoff, for at most
//! `--redis-timeout`; then the run halts resumably.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{ErrorKind, RedisError, RedisResult};
use tokio::time::Instant;

pub mod alerts;
pub mod keys;
mod local;
pub mod pacer;
pub mod script;
pub mod shard;
pub mod told;

pub use alerts::{AlertClaim, FleetAlerts};
pub use keys::FleetKeys;
pub use shard::Shard;

/// How long one attempt at one Redis operation may take.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long the one attempt of an operation without retries may take (a
/// halting run's last calls, a flush): a Redis that answers at all answers
/// within it.
const LAST_TRY: Duration = Duration::from_millis(500);
/// The first and the longest pause between attempts while Redis is away.
const BACKOFF_FIRST: Duration = Duration::from_millis(50);
const BACKOFF_MAX: Duration = Duration::from_secs(1);

/// What `--redis` and its companion options asked for.
#[derive(Clone)]
pub struct FleetSettings {
    /// `redis://[user:password@]HOST:PORT/DB`; may hold a password, so it is
    /// never printed (see [`describe_url`]).
    pub url: String,
    /// Share of the limit the fleet uses, in (0, 1].
    pub headroom: f64,
    /// Where the fleet's state lives.
    pub keys: FleetKeys,
    /// How long Redis may stay out of reach mid-run before the run halts.
    pub redis_timeout: Duration,
}

impl fmt::Debug for FleetSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FleetSettings")
            .field("url", &describe_url(&self.url))
            .field("headroom", &self.headroom)
            .field("keys", &self.keys)
            .field("redis_timeout", &self.redis_timeout)
            .finish()
    }
}

/// Why the fleet's Redis could not be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FleetError {
    /// `--redis` is not a URL the client can use.
    #[error("--redis: {0}")]
    BadUrl(String),
    /// Redis did not answer at start: nothing was sent.
    #[error(
        "cannot reach Redis at {at} ({why}); no request was sent: start Redis or check --redis"
    )]
    Unreachable {
        /// The URL without credentials.
        at: String,
        /// The client's error.
        why: String,
    },
    /// Redis stayed out of reach mid-run for longer than `--redis-timeout`.
    #[error("lost Redis at {at} for {} ({why}); no call goes out without a slot", humantime::format_duration(*waited))]
    Lost {
        /// The URL without credentials.
        at: String,
        /// How long it was retried.
        waited: Duration,
        /// The last error.
        why: String,
    },
    /// Redis answered at start that it cannot take writes for now (out of
    /// memory, loading its data, busy with a script, its primary down):
    /// nothing was sent, and the same command may go once it can.
    #[error("Redis at {at} cannot run the fleet's script for now ({why}); no request was sent: {remedy}")]
    Unable {
        /// The URL without credentials.
        at: String,
        /// Redis's error.
        why: String,
        /// What the operator can do.
        remedy: String,
    },
    /// Redis answered with an error that retrying cannot fix.
    #[error("Redis at {at} refused the fleet's script: {why}")]
    Refused {
        /// The URL without credentials.
        at: String,
        /// Redis's error.
        why: String,
    },
}

/// `redis://HOST:PORT/DB` without any user name or password, for messages.
pub fn describe_url(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(u) => {
            let host = u.host_str().unwrap_or("?");
            let port = u.port().map(|p| format!(":{p}")).unwrap_or_default();
            format!("{}://{host}{port}{}", u.scheme(), u.path())
        }
        Err(_) => "(unparsable URL)".to_string(),
    }
}

/// Checks `--redis` without connecting.
pub fn check_url(url: &str) -> Result<(), FleetError> {
    // The client's own error may quote the URL, password and all: say why
    // in our words instead.
    let refuse = || {
        let hint = if url.trim_start().starts_with("rediss:") {
            "TLS (rediss://) is not supported; use redis://HOST:PORT/DB"
        } else {
            "expected redis://[USER:PASSWORD@]HOST:PORT/DB"
        };
        FleetError::BadUrl(format!(
            "{} is not a usable Redis URL ({hint})",
            describe_url(url)
        ))
    };
    if url.trim_start().starts_with("rediss:") {
        return Err(refuse());
    }
    redis::Client::open(url).map(|_| ()).map_err(|_| refuse())
}

/// A connection to the fleet's Redis, shared by the pacer and the alerts.
#[derive(Clone)]
pub struct Fleet {
    conn: ConnectionManager,
    keys: FleetKeys,
    at: String,
    timeout: Duration,
    headroom: f64,
    /// A retry gave up on Redis (out of reach for `--redis-timeout`) and
    /// none has reached it since: the run is halting, and each of its last
    /// calls tries once rather than waiting the whole timeout again.
    lost: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// When Redis last stopped answering (cleared by an answer): what a
    /// halt says it was lost for, whichever call finds it.
    unanswered_since: std::sync::Arc<std::sync::Mutex<Option<Instant>>>,
}

impl fmt::Debug for Fleet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fleet")
            .field("at", &self.at)
            .field("keys", &self.keys)
            .finish()
    }
}

/// Errors worth retrying: Redis is away, restarting or busy, not wrong.
fn transient(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.kind() == ErrorKind::ReadOnly
        || unable_for_now(e).is_some()
}

/// What to do about an error by which Redis says it cannot serve for now
/// rather than that it never will (its memory full, its data loading, a
/// script running, its primary away); None for any other error.
pub fn unable_for_now(e: &RedisError) -> Option<&'static str> {
    let remedy = match e.code()? {
        "OOM" => {
            "Redis is out of memory (maxmemory): free memory or raise maxmemory, \
             then run the same command"
        }
        "LOADING" => "Redis is loading its data: run the same command once it has",
        "BUSY" => "Redis is busy running a script: run the same command once it is done",
        "MASTERDOWN" | "TRYAGAIN" | "CLUSTERDOWN" => {
            "Redis is waiting for its primary: run the same command once it is back"
        }
        _ => return None,
    };
    Some(remedy)
}

impl Fleet {
    /// Connects and checks that Redis answers. Fails at once (with
    /// [`FleetError::Unreachable`]) rather than retrying for long: at start
    /// nothing has been sent, and the operator should hear of it.
    pub async fn connect(s: &FleetSettings) -> Result<Fleet, FleetError> {
        let at = describe_url(&s.url);
        check_url(&s.url)?;
        let client = redis::Client::open(s.url.as_str())
            .map_err(|_| FleetError::BadUrl(format!("{at} is not a usable Redis URL")))?;
        let cfg = ConnectionManagerConfig::new()
            .set_connection_timeout(ATTEMPT_TIMEOUT)
            .set_response_timeout(ATTEMPT_TIMEOUT)
            .set_number_of_retries(1)
            .set_factor(50)
            .set_max_delay(500);
        let unreachable = |why: String| FleetError::Unreachable {
            at: at.clone(),
            why,
        };
        let conn = tokio::time::timeout(
            ATTEMPT_TIMEOUT * 3,
            ConnectionManager::new_with_config(client, cfg),
        )
        .await
        .map_err(|_| unreachable("timed out".into()))?
        .map_err(|e| unreachable(e.to_string()))?;
        let mut c = conn.clone();
        let pong: RedisResult<String> =
            tokio::time::timeout(ATTEMPT_TIMEOUT, redis::cmd("PING").query_async(&mut c))
                .await
                .unwrap_or_else(|_| Err(RedisError::from((ErrorKind::IoError, "timed out"))));
        pong.map_err(|e| unreachable(e.to_string()))?;
        Ok(Fleet {
            conn,
            keys: s.keys.clone(),
            at,
            timeout: s.redis_timeout,
            headroom: s.headroom,
            lost: Default::default(),
            unanswered_since: Default::default(),
        })
    }

    /// The eviction policy of a Redis that may evict the fleet's keys
    /// (a `maxmemory` set, with any `maxmemory-policy` but `noeviction`: the
    /// fleet's keys carry expiries, so even the `volatile-*` policies may
    /// take them). `None` when it will not evict, or will not say (a
    /// managed Redis may refuse `CONFIG`).
    pub async fn eviction_policy(&self) -> Option<String> {
        let get = |name: &'static str| {
            let mut c = self.conn.clone();
            async move {
                let r: RedisResult<Vec<String>> = tokio::time::timeout(
                    ATTEMPT_TIMEOUT,
                    redis::cmd("CONFIG")
                        .arg("GET")
                        .arg(name)
                        .query_async(&mut c),
                )
                .await
                .unwrap_or_else(|_| Err(RedisError::from((ErrorKind::IoError, "timed out"))));
                r.ok().and_then(|v| v.into_iter().nth(1))
            }
        };
        let max = get("maxmemory").await?;
        let policy = get("maxmemory-policy").await?;
        (max != "0" && policy != "noeviction").then_some(policy)
    }

    /// The fleet's keys.
    pub fn keys(&self) -> &FleetKeys {
        &self.keys
    }

    /// Where Redis is, without credentials.
    pub fn at(&self) -> &str {
        &self.at
    }

    /// The share of the limit the fleet uses.
    pub fn headroom(&self) -> f64 {
        self.headroom
    }

    /// How long an operation is retried while Redis is away.
    pub fn redis_timeout(&self) -> Duration {
        self.timeout
    }

    /// Whether an operation gave up on Redis (out of reach for
    /// `--redis-timeout`) and none has reached it since.
    pub fn is_lost(&self) -> bool {
        self.lost.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// A handle on the connection (cheap: it is shared).
    pub fn conn(&self) -> ConnectionManager {
        self.conn.clone()
    }

    /// Runs `op` until it succeeds, retrying with backoff and jitter while
    /// Redis is out of reach, for at most `within`. `on_retry` hears of the
    /// first failure (once per call), so the caller can say so.
    pub async fn retry<T, F, Fut>(
        &self,
        within: Duration,
        mut op: F,
        mut on_retry: impl FnMut(&RedisError),
    ) -> Result<T, FleetError>
    where
        F: FnMut(ConnectionManager) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        use std::sync::atomic::Ordering::Relaxed;
        let started = Instant::now();
        let timeout = within;
        let mut pause = BACKOFF_FIRST;
        let mut warned = false;
        loop {
            // Another operation giving up on Redis ends this one's retries
            // too: the run is halting.
            let within = match self.lost.load(Relaxed) {
                true => Duration::ZERO,
                false => within,
            };
            // No attempt outlasts the time left: the halt comes after
            // --redis-timeout, not an attempt's timeout past it.
            let bound = match within.is_zero() {
                true => LAST_TRY,
                false => ATTEMPT_TIMEOUT.min(within.saturating_sub(started.elapsed())),
            };
            let attempt = tokio::time::timeout(bound, op(self.conn.clone()))
                .await
                .unwrap_or_else(|_| {
                    Err(RedisError::from((
                        ErrorKind::IoError,
                        "no answer within the attempt timeout",
                    )))
                });
            let since = || {
                self.unanswered_since
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
            };
            let e = match attempt {
                Ok(v) => {
                    self.lost.store(false, Relaxed);
                    *since() = None;
                    return Ok(v);
                }
                Err(e) if transient(&e) => e,
                Err(e) => {
                    return Err(FleetError::Refused {
                        at: self.at.clone(),
                        why: e.to_string(),
                    })
                }
            };
            if !warned {
                warned = true;
                on_retry(&e);
            }
            let first = *since().get_or_insert(started);
            let waited = started.elapsed();
            if waited >= within {
                self.lost.store(true, Relaxed);
                // Whole tenths: what a person reads against --redis-timeout.
                // At least the timeout: this operation, or the one whose
                // giving up ended its retries, waited that long, even where
                // an answer in between moved `first` later.
                let ms = first.elapsed().max(waited).max(timeout).as_millis() as u64;
                return Err(FleetError::Lost {
                    at: self.at.clone(),
                    waited: Duration::from_millis(ms - ms % 100),
                    why: e.to_string(),
                });
            }
            let jittered = pause.mul_f64(0.5 + fastrand::f64() * 0.5);
            tokio::time::sleep(jittered.min(within - waited)).await;
            pause = (pause * 2).min(BACKOFF_MAX);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_described_without_credentials() {
        assert_eq!(
            describe_url("redis://user:s3cret@cache.internal:6380/2"),
            "redis://cache.internal:6380/2"
        );
        assert_eq!(describe_url("redis://127.0.0.1/"), "redis://127.0.0.1/");
        assert!(!describe_url("nonsense s3cret").contains("s3cret"));
        let s = FleetSettings {
            url: "redis://:s3cret@h:1/0".into(),
            headroom: 1.0,
            keys: FleetKeys::named("x"),
            redis_timeout: Duration::from_secs(60),
        };
        assert!(!format!("{s:?}").contains("s3cret"));
    }

    #[test]
    fn bad_urls_are_refused_without_echoing_a_password() {
        let e = check_url("http://:s3cret@h:1/0").unwrap_err().to_string();
        assert!(e.starts_with("--redis: "), "{e}");
        assert!(!e.contains("s3cret"), "{e}");
        assert!(check_url("redis://127.0.0.1:6379/0").is_ok());
    }

    #[tokio::test]
    async fn an_unreachable_redis_fails_at_once_with_a_clear_error() {
        // A port that was just free: nothing listens there.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let s = FleetSettings {
            url: format!("redis://127.0.0.1:{port}/0"),
            headroom: 1.0,
            keys: FleetKeys::named("t"),
            redis_timeout: Duration::from_secs(60),
        };
        let t0 = std::time::Instant::now();
        let e = Fleet::connect(&s).await.unwrap_err();
        assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
        assert!(matches!(e, FleetError::Unreachable { .. }), "{e:?}");
        assert!(e.to_string().contains(&format!("127.0.0.1:{port}")), "{e}");
    }
}
