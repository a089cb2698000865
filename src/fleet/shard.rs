//! `--shard I/N`: split one input between N processes by line number.

use std::fmt;
use std::str::FromStr;

/// The most shards one input may be split into.
pub const MAX_SHARDS: u64 = 10_000;

/// Shard `index` of `count`: the items whose line number modulo `count` is
/// `index - 1`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    /// 1-based.
    pub index: u64,
    /// How many shards the input is split into.
    pub count: u64,
}

impl Shard {
    /// Whether the item on `line` belongs to this shard.
    pub fn takes(&self, line: u64) -> bool {
        line % self.count == self.index - 1
    }

    /// `shard-I-of-N`: the shard's checkpoint directory and output suffix.
    pub fn tag(&self) -> String {
        format!("shard-{}-of-{}", self.index, self.count)
    }

    /// Reads a shard back from its [`Shard::tag`].
    pub fn from_tag(tag: &str) -> Option<Shard> {
        let rest = tag.strip_prefix("shard-")?;
        let (i, n) = rest.split_once("-of-")?;
        format!("{i}/{n}").parse().ok()
    }
}

impl fmt::Display for Shard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

impl FromStr for Shard {
    type Err = String;

    fn from_str(s: &str) -> Result<Shard, String> {
        let bad = || format!("{s:?} is not a shard I/N with 1 <= I <= N <= {MAX_SHARDS}");
        let (i, n) = s.trim().split_once('/').ok_or_else(bad)?;
        let index: u64 = i.trim().parse().map_err(|_| bad())?;
        let count: u64 = n.trim().parse().map_err(|_| bad())?;
        if index == 0 || count == 0 || index > count || count > MAX_SHARDS {
            return Err(bad());
        }
        Ok(Shard { index, count })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_partition_the_lines() {
        let shards: Vec<Shard> = (1..=4).map(|i| format!("{i}/4").parse().unwrap()).collect();
        for line in 1..=1000 {
            assert_eq!(shards.iter().filter(|s| s.takes(line)).count(), 1, "{line}");
        }
        assert!(shards[0].takes(4) && shards[0].takes(8));
        assert!(shards[1].takes(1) && shards[1].takes(5));
        let one: Shard = "1/1".parse().unwrap();
        assert!((1..50).all(|l| one.takes(l)));
    }

    #[test]
    fn parse_display_and_tags() {
        let s: Shard = " 2/8 ".parse().unwrap();
        assert_eq!(s, Shard { index: 2, count: 8 });
        assert_eq!(s.to_string(), "2/8");
        assert_eq!(s.tag(), "shard-2-of-8");
        assert_eq!(Shard::from_tag("shard-2-of-8"), Some(s));
        assert_eq!(Shard::from_tag("checkpoint"), None);
        for bad in ["", "1", "0/4", "5/4", "a/b", "1/0", "1/10001", "-1/4"] {
            assert!(bad.parse::<Shard>().is_err(), "{bad:?}");
        }
    }
}
