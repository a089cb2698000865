//! Where a fleet's state lives in Redis.
//!
//! Every key of one fleet shares the prefix `batchrun:{ID}`, where `ID` is
//! either the first 32 hex digits of
//! `sha256("batchrun-fleet-v1" NUL origin NUL api_key NUL)` (the default: every
//! process on the same API key of the same API shares one budget, and the key
//! itself never reaches Redis) or `name:NAME` for `--fleet-key NAME`. The
//! braces are a Redis Cluster hash tag, so one script can touch all of them.
//!
//! | key | type | holds |
//! |---|---|---|
//! | `batchrun:{ID}:window` | sorted set | one member per call occupying the window; score = unix ms when it stops occupying |
//! | `batchrun:{ID}:leases` | sorted set | one member per call in flight; score = unix ms when its concurrency lease expires |
//! | `batchrun:{ID}:pause` | string | unix ms when the current rate-limit pause ends |
//! | `batchrun:{ID}:limit` | hash | `in_force` (server-reported limit), `learnt`, `learnt_at`, the `epoch`, and the drip rules' state (`s_*` SpikeArrest, `b_*` token bucket) |
//! | `batchrun:{ID}:told` | hash | what each process was told to pace to (`--pacer`, `--limit`), with unix ms until when that stands |
//! | `batchrun:{ID}:alert:ACCOUNT:CYCLE:ALERT` | string | which process sent alert `ALERT` of the credit account `ACCOUNT` (a hash of origin and key) in the billing cycle renewing at `CYCLE` |

use crate::rate::policy::Unit;
use crate::util::sha_hex;

/// The longest `--fleet-key`.
pub const MAX_NAME: usize = 64;

/// The Redis keys of one fleet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetKeys {
    prefix: String,
}

/// Checks a `--fleet-key` value: 1 to 64 of `A-Z a-z 0-9 . _ -`.
pub fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{name:?} must be 1 to {MAX_NAME} letters, digits, '.', '_' or '-'"
        ))
    }
}

/// Whose credits an alert is about: 16 hex digits of a hash of the API's
/// origin and the key (the key itself never reaches Redis).
pub fn account_of(origin: &str, api_key: &str) -> String {
    sha_hex(&[
        b"batchrun-account-v1",
        origin.as_bytes(),
        api_key.as_bytes(),
    ])[..16]
        .to_string()
}

impl FleetKeys {
    /// The fleet of every process calling `origin` with `api_key`.
    pub fn for_key(origin: &str, api_key: &str) -> FleetKeys {
        let id = sha_hex(&[b"batchrun-fleet-v1", origin.as_bytes(), api_key.as_bytes()]);
        FleetKeys {
            prefix: format!("batchrun:{{{}}}", &id[..32]),
        }
    }

    /// The fleet named `name` (`--fleet-key`), already checked by [`check_name`].
    pub fn named(name: &str) -> FleetKeys {
        FleetKeys {
            prefix: format!("batchrun:{{name:{name}}}"),
        }
    }

    /// `batchrun:{ID}`, the prefix of every key of the fleet.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The occupancy sorted set.
    pub fn window(&self) -> String {
        format!("{}:window", self.prefix)
    }

    /// The concurrency leases sorted set.
    pub fn leases(&self) -> String {
        format!("{}:leases", self.prefix)
    }

    /// The pause end.
    pub fn pause(&self) -> String {
        format!("{}:pause", self.prefix)
    }

    /// The limit hash (in force, learnt).
    pub fn limit(&self) -> String {
        format!("{}:limit", self.prefix)
    }

    /// What each process of the fleet was told to pace to (its pacer and
    /// limits), with how long that stands (a hash; [`super::told`]).
    pub fn told(&self) -> String {
        format!("{}:told", self.prefix)
    }

    /// When each call in flight was granted.
    pub fn sent(&self) -> String {
        format!("{}:sent", self.prefix)
    }

    /// The marker of alert `id` of the credit account `account` (see
    /// [`account_of`]) in the billing cycle renewing at `cycle` (`none`
    /// when the renewal is unknown): processes of two accounts sharing a
    /// `--fleet-key` each send their own account's alerts.
    pub fn alert(&self, account: &str, cycle: Option<u64>, id: &str) -> String {
        let cycle = cycle.map_or_else(|| "none".to_string(), |c| c.to_string());
        format!("{}:alert:{account}:{cycle}:{id}", self.prefix)
    }

    /// The window of a further limit of `count` calls per `window_ms`
    /// (`--limit` given more than once): the script reads both from the
    /// name, so processes on different further limits never share one.
    pub fn further(&self, count: u64, window_ms: u64) -> String {
        format!("{}:window:{count}:{window_ms}", self.prefix)
    }

    /// The fixed window of `count` calls per `window_ms` (`--limit
    /// N/W,fixed`): a further window the script aligns to the server's
    /// reset once one is stated (`lua/fixed.lua`).
    pub fn fixed(&self, count: u64, window_ms: u64) -> String {
        format!("{}:fixed:{count}:{window_ms}", self.prefix)
    }

    /// The token window of `quota` tokens per `window_ms` counting `unit`
    /// (`--limit Q/W,tokens`, `,input-tokens`, `,output-tokens`, after
    /// `--headroom`): a hash of each call's weight and end; the script
    /// reads all three from the name.
    pub fn tokens(&self, unit: Unit, quota: u64, window_ms: u64) -> String {
        debug_assert!(unit.is_tokens(), "a window of calls is `further`");
        format!("{}:{}:{quota}:{window_ms}", self.prefix, unit.name())
    }

    /// The fixed window of `quota` tokens per `window_ms` counting `unit`
    /// (`--limit Q/W,fixed,tokens` and the like, after `--headroom`): a
    /// token window the script aligns to the server's reset once one is
    /// stated, as a fixed window of calls (`lua/fixed.lua`).
    pub fn fixed_tokens(&self, unit: Unit, quota: u64, window_ms: u64) -> String {
        debug_assert!(unit.is_tokens(), "a fixed window of calls is `fixed`");
        format!("{}:fixed:{}:{quota}:{window_ms}", self.prefix, unit.name())
    }

    /// Whether `name` is one of this fleet's policies adopted from what a
    /// server stated: a further window of calls, a token window, or a
    /// bucket of tokens (a token window found to refill continuously).
    pub fn is_stated(&self, name: &str) -> bool {
        let Some(rest) = name.strip_prefix(&self.prefix) else {
            return false;
        };
        let mut words = Unit::ALL
            .into_iter()
            .filter(|u| u.is_tokens())
            .map(Unit::name);
        let bucket = rest.starts_with(":gcra:");
        match bucket {
            true => words.any(|word| rest.ends_with(&format!(":{word}"))),
            false => std::iter::once("window")
                .chain(words)
                .any(|word| rest.starts_with(&format!(":{word}:"))),
        }
    }

    /// The GCRA bucket of `rate` with `burst` (`--limit N/W,burst=B`,
    /// after `--headroom`), of calls or of tokens (`unit`), kept as
    /// in-process: its emission interval, its tolerance and its skew
    /// allowance, in ns, and what a bucket of tokens counts are in its
    /// name, so processes on different buckets never share one.
    pub fn bucket(&self, rate: crate::rate::Rate, burst: u64, unit: Unit) -> String {
        use crate::rate::gcra::{interval, Gcra};
        let t = interval(rate);
        let d = Gcra::new(rate, burst).allowance().as_nanos();
        let tau = t.as_nanos().saturating_mul(u128::from(burst));
        let of = match unit {
            Unit::Calls => String::new(),
            u => format!(":{}", u.name()),
        };
        format!("{}:gcra:{}:{tau}:{d}{of}", self.prefix, t.as_nanos())
    }

    /// The emission interval (ns) a bucket's key names (see
    /// [`bucket`](Self::bucket)); `None` for a key of another kind.
    pub fn interval_of(name: &str) -> Option<u128> {
        name.split(":gcra:").nth(1)?.split(':').next()?.parse().ok()
    }

    /// The keys of the pacer script, in its KEYS order.
    pub fn pacer(&self) -> [String; 5] {
        [
            self.window(),
            self.leases(),
            self.pause(),
            self.limit(),
            self.sent(),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_api_key_never_shows_and_each_key_and_origin_get_their_own_fleet() {
        let a = FleetKeys::for_key("https://api.example.com", "sk_live_123");
        assert!(!a.prefix().contains("sk_live"));
        assert_eq!(a.prefix().len(), "batchrun:{}".len() + 32);
        assert_eq!(
            a,
            FleetKeys::for_key("https://api.example.com", "sk_live_123")
        );
        assert_ne!(
            a,
            FleetKeys::for_key("https://api.example.com", "sk_live_124")
        );
        assert_ne!(
            a,
            FleetKeys::for_key("https://api.example.org", "sk_live_123")
        );
        let w = a.window();
        assert!(
            w.starts_with("batchrun:{") && w.ends_with("}:window"),
            "{w}"
        );
    }

    #[test]
    fn named_fleets_and_alert_keys() {
        let n = FleetKeys::named("nightly-backfill");
        assert_eq!(n.limit(), "batchrun:{name:nightly-backfill}:limit");
        assert_eq!(
            n.alert("ab12", Some(1_796_860_800), "pct-0.8"),
            "batchrun:{name:nightly-backfill}:alert:ab12:1796860800:pct-0.8"
        );
        assert_eq!(
            n.alert("ab12", None, "exhausted"),
            "batchrun:{name:nightly-backfill}:alert:ab12:none:exhausted"
        );
        // Two accounts on one named fleet claim apart; the key stays out.
        let (a, b) = (
            account_of("https://a.example", "k1"),
            account_of("https://b.example", "k1"),
        );
        assert_ne!(a, b);
        assert_ne!(account_of("https://a.example", "k2"), a);
        assert!(!a.contains("k1") && a.len() == 16);
        assert_eq!(n.pacer()[2], "batchrun:{name:nightly-backfill}:pause");
    }

    #[test]
    fn each_unit_of_tokens_has_keys_of_its_own_and_the_stated_ones_are_known() {
        let n = FleetKeys::named("llm");
        let keys = [Unit::Tokens, Unit::InputTokens, Unit::OutputTokens].map(|u| {
            (
                n.tokens(u, 1000, 60_000),
                n.bucket(
                    crate::rate::Rate {
                        count: 10,
                        period: std::time::Duration::from_secs(1),
                    },
                    5,
                    u,
                ),
            )
        });
        assert_eq!(keys[1].0, "batchrun:{name:llm}:input-tokens:1000:60000");
        assert!(keys[2].1.ends_with(":output-tokens"), "{}", keys[2].1);
        for (i, a) in keys.iter().enumerate() {
            // A bucket of tokens may be a window found to refill.
            assert!(n.is_stated(&a.0) && n.is_stated(&a.1), "{a:?}");
            for b in &keys[i + 1..] {
                assert!(a.0 != b.0 && a.1 != b.1, "{a:?} {b:?}");
            }
        }
        assert!(n.is_stated(&n.further(5, 1000)));
        let calls = crate::rate::Rate {
            count: 10,
            period: std::time::Duration::from_secs(1),
        };
        assert!(!n.is_stated(&n.bucket(calls, 5, Unit::Calls)));
        let interval = FleetKeys::interval_of(&n.bucket(calls, 5, Unit::Calls));
        assert_eq!(interval, Some(100_000_000));
        assert_eq!(FleetKeys::interval_of(&keys[0].0), None);
        assert!(!n.is_stated(&n.limit()));
        assert!(!FleetKeys::named("other").is_stated(&keys[0].0));
    }

    #[test]
    fn names_are_checked() {
        assert!(check_name("job_1.v2-a").is_ok());
        for bad in ["", "a b", "x}y", "ü", &"x".repeat(65)] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
    }
}
