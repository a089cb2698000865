//! How many earlier lines of the input hold the same content as each item:
//! part of its Idempotency-Key when keys follow content (`run/keys.rs`).
//!
//! Counting every content in a map would cost memory per line (tens of
//! MB for a million items). The scan instead passes every content through
//! a Bloom filter sized from the file (a bit per byte of input, at most
//! 16 MiB, dropped after the scan): a content the filter has seen before
//! may repeat, and only those are counted as the feeder reads. A false
//! positive only counts a unique content, whose count stays 0, so the
//! repeats are exact.

use std::collections::{HashMap, HashSet};

/// The most bits the scan's filter takes (16 MiB).
const MOST_BITS: u64 = 1 << 27;

/// Hashes a content is set at in the filter.
const HASHES: u64 = 4;

/// The scan's half: finds the contents that may repeat.
pub(super) struct Repeats {
    bits: Vec<u64>,
    maybe: HashSet<u64>,
}

impl Repeats {
    /// A filter for an input of `len` bytes.
    pub(super) fn sized(len: u64) -> Repeats {
        let bits = len.clamp(1 << 12, MOST_BITS);
        Repeats {
            bits: vec![0; usize::try_from(bits / 64).unwrap_or(1).max(1)],
            maybe: HashSet::new(),
        }
    }

    /// A content `digest` read by the scan.
    pub(super) fn see(&mut self, digest: u64) {
        let n = self.bits.len() as u64 * 64;
        let step = digest.rotate_left(32) | 1;
        let mut seen = true;
        for i in 0..HASHES {
            let bit = digest.wrapping_add(i.wrapping_mul(step)) % n;
            if let Some(word) = self.bits.get_mut((bit / 64) as usize) {
                seen &= *word & (1 << (bit % 64)) != 0;
                *word |= 1 << (bit % 64);
            }
        }
        if seen {
            self.maybe.insert(digest);
        }
    }

    /// The feeder's half, the filter dropped.
    pub(super) fn counter(self) -> Counter {
        Counter {
            maybe: self.maybe,
            seen: HashMap::new(),
        }
    }
}

/// Counts, in file order, the earlier lines of each content.
#[derive(Debug, Default)]
pub(super) struct Counter {
    maybe: HashSet<u64>,
    seen: HashMap<u64, u32>,
}

impl Counter {
    /// [`next`](Self::next) for an item whose content's digest `digest`
    /// gives: asked for only when some content may repeat.
    pub(super) fn of(&mut self, digest: impl FnOnce() -> u64) -> u32 {
        match self.maybe.is_empty() {
            true => 0,
            false => self.next(digest()),
        }
    }

    /// The lines of content `digest` before this one; call for every item
    /// of the input, in order (finished ones and other shards' included).
    pub(super) fn next(&mut self, digest: u64) -> u32 {
        if !self.maybe.contains(&digest) {
            return 0;
        }
        let n = self.seen.entry(digest).or_default();
        let before = *n;
        *n = n.saturating_add(1);
        before
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Whatever the contents and however small the filter, each item's
        /// count is the number of earlier items with its content.
        #[test]
        fn counts_are_exact(contents in prop::collection::vec(1u64..40, 0..300), len in 0u64..20_000) {
            let mut r = Repeats::sized(len);
            for &d in &contents {
                r.see(d);
            }
            let mut c = r.counter();
            for (i, &d) in contents.iter().enumerate() {
                let before = contents[..i].iter().filter(|&&e| e == d).count() as u32;
                prop_assert_eq!(c.next(d), before);
            }
        }
    }
}
