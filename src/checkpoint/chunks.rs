//! Per-line state in sled: two bits a line, 4096 lines to a record.
//!
//! A chunk record holds the state of 4096 consecutive lines (0 pending,
//! 1 done, 2 failed) in whichever of two forms is shorter:
//!
//! * packed: four lines to a byte, the lowest bits first, pending lines at
//!   the end left out (at most 1 KiB);
//! * runs: a `0xFF` byte (which no packed byte can be: its pairs would be
//!   the state 3), then `(state u8, length u16 LE)` for each run of lines
//!   from the chunk's first, pending lines at the end left out. A chunk
//!   whose lines are all done is 4 bytes.
//!
//! A million-line job holds 245 records. That is what sled is kept to: few,
//! small records, which one group commit rewrites one or two of. Finished
//! chunks are 4 bytes rather than 1 KiB because sled's memory follows the
//! size of what it holds: with packed records only, a million-line run grew
//! by about 3 MiB as the finished records piled up in its tree. Where each
//! finished line's result is lives in the log's index ([`super::index`]),
//! not here.

use super::{CheckpointError, ItemState};

/// Lines per chunk record.
pub const LINES_PER_CHUNK: u64 = 4096;

const BYTES: usize = (LINES_PER_CHUNK / 4) as usize;

/// The first byte of a record in runs.
const RUNS: u8 = 0xFF;

/// The states of 4096 consecutive lines (`index * 4096 ..`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    /// Which chunk: lines `index * 4096` to `index * 4096 + 4095`.
    pub index: u64,
    bits: Vec<u8>,
}

impl Chunk {
    /// An empty chunk: every line pending.
    pub fn empty(index: u64) -> Chunk {
        Chunk {
            index,
            bits: vec![0; BYTES],
        }
    }

    /// Decodes a chunk record.
    pub fn decode(key: &[u8], value: &[u8]) -> Result<Chunk, CheckpointError> {
        let bad = |why: &str| CheckpointError::Corrupt(format!("a chunk record {why}"));
        let key: [u8; 8] = key.try_into().map_err(|_| bad("has a bad key"))?;
        let mut c = Chunk::empty(u64::from_be_bytes(key));
        if let Some((&RUNS, runs)) = value.split_first() {
            if runs.len() % 3 != 0 {
                return Err(bad("ends inside a run"));
            }
            let mut line = c.index * LINES_PER_CHUNK;
            let end = line + LINES_PER_CHUNK;
            for run in runs.chunks_exact(3) {
                let state = match run[0] {
                    0 => None,
                    1 => Some(ItemState::Done),
                    2 => Some(ItemState::Failed),
                    _ => return Err(bad("holds a line in no state")),
                };
                let len = u64::from(u16::from_le_bytes([run[1], run[2]]));
                if len == 0 || line + len > end {
                    return Err(bad("holds too many lines"));
                }
                for l in line..line + len {
                    c.set(l, state);
                }
                line += len;
            }
            return Ok(c);
        }
        if value.len() > BYTES {
            return Err(bad("holds too many lines"));
        }
        // Two set bits is no state.
        if value.iter().any(|b| b & (b >> 1) & 0x55 != 0) {
            return Err(bad("holds a line in no state"));
        }
        c.bits[..value.len()].copy_from_slice(value);
        Ok(c)
    }

    /// The record's value: in runs when that is shorter than packed.
    pub fn encode(&self) -> Vec<u8> {
        let used = self.bits.iter().rposition(|&b| b != 0).map_or(0, |p| p + 1);
        let packed = &self.bits[..used];
        let state = |i: usize| (self.bits[i / 4] >> ((i % 4) * 2)) & 3;
        let lines = used * 4;
        let mut runs = vec![RUNS];
        let mut i = 0;
        while i < lines {
            let (s, start) = (state(i), i);
            while i < lines && state(i) == s {
                i += 1;
            }
            // Pending lines at the end need no run.
            if s != 0 || i < lines {
                runs.push(s);
                // At most 4096 lines: a run length always fits in a u16.
                runs.extend_from_slice(&((i - start) as u16).to_le_bytes());
            }
            if runs.len() >= used {
                return packed.to_vec();
            }
        }
        if runs.len() < used {
            runs
        } else {
            packed.to_vec()
        }
    }

    /// The record's key: the index, big-endian so that sled iterates
    /// chunks in line order.
    pub fn key(&self) -> [u8; 8] {
        self.index.to_be_bytes()
    }

    fn pos(&self, line: u64) -> Option<(usize, u32)> {
        (line / LINES_PER_CHUNK == self.index).then(|| {
            let i = line % LINES_PER_CHUNK;
            ((i / 4) as usize, (i % 4) as u32 * 2)
        })
    }

    /// A line's state (None: pending, or not in this chunk).
    pub fn get(&self, line: u64) -> Option<ItemState> {
        let (byte, shift) = self.pos(line)?;
        match (self.bits[byte] >> shift) & 3 {
            1 => Some(ItemState::Done),
            2 => Some(ItemState::Failed),
            _ => None,
        }
    }

    /// Sets a line's state; returns what it was. Lines outside the chunk
    /// are ignored.
    pub fn set(&mut self, line: u64, state: Option<ItemState>) -> Option<ItemState> {
        let old = self.get(line);
        let (byte, shift) = self.pos(line)?;
        let v = match state {
            None => 0,
            Some(ItemState::Done) => 1,
            Some(ItemState::Failed) => 2,
        };
        self.bits[byte] = (self.bits[byte] & !(3 << shift)) | (v << shift);
        old
    }

    /// Every finished line of the chunk with its state.
    pub fn finished(&self) -> impl Iterator<Item = (u64, ItemState)> + '_ {
        let base = self.index * LINES_PER_CHUNK;
        (0..LINES_PER_CHUNK).filter_map(move |i| {
            let line = base + i;
            Some((line, self.get(line)?))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_round_trip_through_a_small_record() {
        let mut c = Chunk::empty(2);
        let base = 2 * LINES_PER_CHUNK;
        assert_eq!(c.set(base, Some(ItemState::Done)), None);
        assert_eq!(c.set(base + 3, Some(ItemState::Failed)), None);
        assert_eq!(c.set(base + 9, Some(ItemState::Done)), None);
        assert_eq!(
            c.set(5, Some(ItemState::Done)),
            None,
            "not this chunk's line"
        );
        let bytes = c.encode();
        assert_eq!(bytes.len(), 3, "pending lines at the end cost nothing");
        let back = Chunk::decode(&c.key(), &bytes).unwrap();
        assert_eq!(back, c);
        assert_eq!(back.get(base + 3), Some(ItemState::Failed));
        assert_eq!(back.get(base + 2), None);
        assert_eq!(
            back.finished().collect::<Vec<_>>(),
            [
                (base, ItemState::Done),
                (base + 3, ItemState::Failed),
                (base + 9, ItemState::Done)
            ]
        );
        assert_eq!(
            c.set(base + 3, Some(ItemState::Done)),
            Some(ItemState::Failed)
        );
        assert_eq!(c.set(base + 9, None), Some(ItemState::Done));
        assert_eq!(c.encode().len(), 1);
        let full = (0..LINES_PER_CHUNK).fold(Chunk::empty(0), |mut c, l| {
            c.set(l, Some(ItemState::Failed));
            c
        });
        assert_eq!(full.encode().len(), 4, "one run");
        assert_eq!(Chunk::decode(&full.key(), &full.encode()).unwrap(), full);
        assert_eq!(c.key(), 2u64.to_be_bytes());
    }

    proptest::proptest! {
        #[test]
        fn any_chunk_comes_back_from_its_record_no_longer_than_packed(
            index in 0u64..1_000,
            // Runs of states, as a job leaves them: long stretches, gaps.
            runs in proptest::collection::vec((0u8..3, 1u64..600), 0..40),
        ) {
            let mut c = Chunk::empty(index);
            let base = index * LINES_PER_CHUNK;
            let mut line = base;
            for (state, len) in runs {
                let state = [None, Some(ItemState::Done), Some(ItemState::Failed)][state as usize];
                for l in line..(line + len).min(base + LINES_PER_CHUNK) {
                    c.set(l, state);
                }
                line += len;
            }
            let record = c.encode();
            let packed = c.bits.iter().rposition(|&b| b != 0).map_or(0, |p| p + 1);
            proptest::prop_assert!(record.len() <= packed);
            proptest::prop_assert_eq!(Chunk::decode(&c.key(), &record).unwrap(), c);
        }
    }

    #[test]
    fn a_damaged_record_is_an_error_not_a_guess() {
        let key = 0u64.to_be_bytes();
        assert!(Chunk::decode(&key[..7], &[]).is_err());
        assert!(Chunk::decode(&key, &[0b0000_0011]).is_err(), "state 3");
        assert!(Chunk::decode(&key, &[0b1100_0000]).is_err(), "state 3");
        assert!(Chunk::decode(&key, &[0; 1025]).is_err(), "too many lines");
        assert!(Chunk::decode(&key, &[0b1001_0110]).is_ok());
        assert!(Chunk::decode(&key, &[RUNS, 1]).is_err(), "cut in a run");
        assert!(Chunk::decode(&key, &[RUNS, 3, 1, 0]).is_err(), "state 3");
        assert!(Chunk::decode(&key, &[RUNS, 1, 0, 0]).is_err(), "empty run");
        let too_long = [RUNS, 1, 0x00, 0x10, 2, 1, 0];
        assert!(Chunk::decode(&key, &too_long).is_err(), "4097 lines");
        assert!(Chunk::decode(&key, &too_long[..4]).is_ok(), "4096 lines");
    }
}
