//! `--shard I/N`: split one input between N processes, each item by its
//! content (jobs made since 2026-12-06), so that a regenerated input with
//! rows moved keeps each row in its shard; older jobs by line number.

use std::fmt;
use std::str::FromStr;

/// The most shards one input may be split into.
pub const MAX_SHARDS: u64 = 10_000;

/// Shard `index` of `count`: the items whose content digest (or, for
/// jobs made before, line number) modulo `count` is `index - 1`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    /// 1-based.
    pub index: u64,
    /// How many shards the input is split into.
    pub count: u64,
    /// Items go to shards by their content (by line when false: a job
    /// made before keeps the split it was made with).
    pub by_content: bool,
}

impl Shard {
    /// Whether the item on `line` belongs to this shard; `digest` is its
    /// content's ([`crate::input::Item::digest`]), `None` for a row that
    /// does not parse (such rows go by line).
    pub fn takes(&self, line: u64, digest: Option<u64>) -> bool {
        let by = match digest {
            Some(d) if self.by_content => d,
            _ => line,
        };
        by % self.count == self.index - 1
    }

    /// This shard, splitting by content or (`false`) by line.
    pub fn by_content(self, by_content: bool) -> Shard {
        Shard { by_content, ..self }
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
        Ok(Shard {
            index,
            count,
            by_content: true,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_partition_the_items_by_content_or_by_line() {
        let shards: Vec<Shard> = (1..=4).map(|i| format!("{i}/4").parse().unwrap()).collect();
        for line in 1..=1000u64 {
            let digest = line.wrapping_mul(0x9E37_79B9_7F4A_7C15);
            for d in [Some(digest), None] {
                assert_eq!(shards.iter().filter(|s| s.takes(line, d)).count(), 1);
            }
            // Wherever the row goes, its shard is its content's.
            let at = |l| shards.iter().position(|s| s.takes(l, Some(digest)));
            assert_eq!(at(line), at(line + 7));
        }
        let by_line: Vec<Shard> = shards.iter().map(|s| s.by_content(false)).collect();
        assert!(by_line[0].takes(4, Some(1)) && by_line[0].takes(8, Some(2)));
        assert!(by_line[1].takes(1, Some(7)) && by_line[1].takes(5, None));
        let one: Shard = "1/1".parse().unwrap();
        assert!((1..50).all(|l| one.takes(l, Some(l * 31))));
    }

    #[test]
    fn parse_display_and_tags() {
        let s: Shard = " 2/8 ".parse().unwrap();
        assert_eq!(
            s,
            Shard {
                index: 2,
                count: 8,
                by_content: true
            }
        );
        assert_eq!(s.to_string(), "2/8");
        assert_eq!(s.tag(), "shard-2-of-8");
        assert_eq!(Shard::from_tag("shard-2-of-8"), Some(s));
        assert_eq!(Shard::from_tag("checkpoint"), None);
        for bad in ["", "1", "0/4", "5/4", "a/b", "1/0", "1/10001", "-1/4"] {
            assert!(bad.parse::<Shard>().is_err(), "{bad:?}");
        }
    }
}
