//! Leaf helpers every layer may use: they import nothing of the crate.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sha2::{Digest, Sha256};

/// A boxed, sendable future: what the object-safe traits (`Transport`,
/// `Pacer`) return.
pub use futures_util::future::BoxFuture;

/// The lowercase hex SHA-256 of `parts`, each followed by a NUL so that
/// `["ab", "c"]` and `["a", "bc"]` differ.
pub fn sha_hex(parts: &[&[u8]]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p);
        h.update([0u8]);
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// Wall-clock time since the epoch (zero if the clock is before it).
pub fn unix_now() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}
