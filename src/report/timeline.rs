//! The run's timeline: one fixed 56-byte record per second of the run, in
//! `timeline-<job>.bin` in the state directory, appended as the run goes
//! (flushed on every tick of the recording loop), so a killed run keeps its
//! picture up to its last second. Runs of the job follow one another in
//! the file; `batchrun report` and the tests read it back with [`read`].
//!
//! 56 bytes a second is 4.6 MiB for a 24-hour run (86,400 records), and
//! the file never holds more than its seconds (and a record naming each
//! policy shown, when the set changes): it is bounded by the run's length,
//! whatever its rate. Counts are per second and saturate at 65,535.
//!
//! A record, little-endian: `t` (u32 unix seconds); `sent`, `ok`,
//! `rate_limited`, `credits_exhausted`, `client_error`, `server_error`,
//! `no_response`, `in_flight` (u16 each); `pause` (u8, [`pause`] bits); a
//! u8 of flags (1: a limit is known, 2: credits are known); 2 bytes unused;
//! `limit` and `occupancy` (u32); `p50_us` and `p99_us` (u32, 0 when no
//! call came back that second); `credits` (i64); then, for each of up to
//! four policies in force, its highest occupancy in the second in
//! thousandths of its limit (u16 each, 65,535 where no policy is shown).
//!
//! A record whose `t` is 0 names a policy instead: byte 4 its slot (0-3),
//! byte 5 the name's length, then the name (`30ps,burst=5`), which the
//! seconds after it are shown against (an empty name clears the slot).

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::calls::Answer;

/// The file's first bytes: its kind and layout version.
pub const MAGIC: &[u8; 8] = b"BRTL\x02\0\0\0";
/// Bytes per second of the run.
pub const RECORD: usize = 56;
/// Policies a second shows the occupancy of.
pub const SLOTS: usize = 4;
/// A slot with no policy.
const NO_SHARE: u16 = u16::MAX;
/// The most empty seconds filled in at once (a machine suspended for
/// hours must not write hours of zeros in one tick).
const MAX_GAP: u64 = 3600;

/// Why the run was paused in a second: bits of [`Second::pause`].
pub mod pause {
    /// Every worker paused by a rate-limit 429.
    pub const RATE_LIMIT: u8 = 1;
    /// Waiting for credits (or the reserve).
    pub const CREDITS: u8 = 2;
    /// A concurrency 429 held back one worker.
    pub const CONCURRENCY: u8 = 4;
}

/// One second of the run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Second {
    /// The second (unix time).
    pub t: u64,
    /// Calls sent.
    pub sent: u32,
    /// Calls answered 2xx.
    pub ok: u32,
    /// Rate-limit 429s.
    pub rate_limited: u32,
    /// 429s that said the credits are gone.
    pub credits_exhausted: u32,
    /// Other 4xx.
    pub client_error: u32,
    /// 5xx.
    pub server_error: u32,
    /// Calls that got no response (timeout, connection).
    pub no_response: u32,
    /// Calls in flight at its end.
    pub in_flight: u32,
    /// [`pause`] bits.
    pub pause: u8,
    /// The limit in force (the learnt one, else the configured one).
    pub limit: Option<u32>,
    /// Calls sent within the limit's window up to this second.
    pub occupancy: u32,
    /// Median latency of its calls, in microseconds.
    pub p50_us: Option<u32>,
    /// 99th-percentile latency of its calls, in microseconds.
    pub p99_us: Option<u32>,
    /// The credit balance last seen.
    pub credits: Option<i64>,
    /// Each policy in force shown (as `--limit` spells it) and its highest
    /// occupancy in the second, in thousandths of its limit.
    pub policies: Vec<(String, u32)>,
}

fn sat16(n: u32) -> [u8; 2] {
    (n.min(u16::MAX as u32) as u16).to_le_bytes()
}

impl Second {
    fn encode(&self, shares: &[u16; SLOTS]) -> [u8; RECORD] {
        let mut b = [0u8; RECORD];
        b[0..4].copy_from_slice(&(self.t.min(u32::MAX as u64) as u32).to_le_bytes());
        let counts = [
            self.sent,
            self.ok,
            self.rate_limited,
            self.credits_exhausted,
            self.client_error,
            self.server_error,
            self.no_response,
            self.in_flight,
        ];
        for (i, n) in counts.iter().enumerate() {
            b[4 + 2 * i..6 + 2 * i].copy_from_slice(&sat16(*n));
        }
        b[20] = self.pause;
        b[21] = u8::from(self.limit.is_some()) | (u8::from(self.credits.is_some()) << 1);
        b[24..28].copy_from_slice(&self.limit.unwrap_or(0).to_le_bytes());
        b[28..32].copy_from_slice(&self.occupancy.to_le_bytes());
        b[32..36].copy_from_slice(&self.p50_us.unwrap_or(0).to_le_bytes());
        b[36..40].copy_from_slice(&self.p99_us.unwrap_or(0).to_le_bytes());
        b[40..48].copy_from_slice(&self.credits.unwrap_or(0).to_le_bytes());
        for (i, v) in shares.iter().enumerate() {
            b[48 + 2 * i..50 + 2 * i].copy_from_slice(&v.to_le_bytes());
        }
        b
    }

    /// The second, and its policies' shares by slot.
    fn decode(b: &[u8; RECORD]) -> (Second, [u16; SLOTS]) {
        let u16_at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]) as u32;
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let some = |v: u32| (v > 0).then_some(v);
        let mut credits = [0u8; 8];
        credits.copy_from_slice(&b[40..48]);
        let shares = std::array::from_fn(|i| u16_at(48 + 2 * i) as u16);
        let second = Second {
            t: u32_at(0) as u64,
            sent: u16_at(4),
            ok: u16_at(6),
            rate_limited: u16_at(8),
            credits_exhausted: u16_at(10),
            client_error: u16_at(12),
            server_error: u16_at(14),
            no_response: u16_at(16),
            in_flight: u16_at(18),
            pause: b[20],
            limit: (b[21] & 1 != 0).then(|| u32_at(24)),
            occupancy: u32_at(28),
            p50_us: some(u32_at(32)),
            p99_us: some(u32_at(36)),
            credits: (b[21] & 2 != 0).then(|| i64::from_le_bytes(credits)),
            policies: Vec::new(),
        };
        (second, shares)
    }
}

/// The record naming slot `slot`'s policy `name` (cut to 50 bytes).
fn name_record(slot: usize, name: &str) -> [u8; RECORD] {
    let mut b = [0u8; RECORD];
    let mut end = name.len().min(RECORD - 6);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    b[4] = slot as u8;
    b[5] = end as u8;
    b[6..6 + end].copy_from_slice(&name.as_bytes()[..end]);
    b
}

/// Whether a record names a policy ([`name_record`]: second 0), not a
/// second.
fn names_a_policy(c: &[u8; RECORD]) -> bool {
    c[0..4] == [0; 4]
}

/// Where job `job` keeps its timeline.
pub fn path(state_dir: &Path, job: &str) -> PathBuf {
    state_dir.join(format!("timeline-{job}.bin"))
}

/// Every second recorded, oldest first, each with the policies it shows.
/// A torn last record (a kill in the middle of a write) is left out.
pub fn read(path: &Path) -> std::io::Result<Vec<Second>> {
    let mut bytes = Vec::new();
    File::open(path)?.read_to_end(&mut bytes)?;
    if !bytes.starts_with(MAGIC) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "{} is not a batchrun timeline of this version",
                path.display()
            ),
        ));
    }
    let mut names: [Option<String>; SLOTS] = Default::default();
    let mut out = Vec::new();
    for c in bytes[MAGIC.len()..].chunks_exact(RECORD) {
        let c: &[u8; RECORD] = c.try_into().unwrap_or(&[0; RECORD]);
        if names_a_policy(c) {
            let (slot, len) = (c[4] as usize, (c[5] as usize).min(RECORD - 6));
            if let Some(n) = names.get_mut(slot) {
                let name = String::from_utf8_lossy(&c[6..6 + len]).into_owned();
                *n = (!name.is_empty()).then_some(name);
            }
            continue;
        }
        let (mut s, shares) = Second::decode(c);
        s.policies = names
            .iter()
            .zip(shares)
            .filter(|(_, v)| *v != NO_SHARE)
            .filter_map(|(n, v)| n.clone().map(|n| (n, v as u32)))
            .collect();
        out.push(s);
    }
    Ok(out)
}

/// The calls sent in each recorded second from `since` (unix seconds) on,
/// oldest first, read from the end of the file: a resume counts them in a
/// policy the last run kept no record of, and a week-long timeline is not
/// read whole for it. A missing timeline holds none.
pub fn sent_since(path: &Path, since: u64) -> std::io::Result<Vec<(u64, u32)>> {
    use std::io::{Seek, SeekFrom};
    let mut file = match File::open(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        other => other?,
    };
    let mut magic = [0u8; MAGIC.len()];
    if file.read_exact(&mut magic).is_err() || &magic != MAGIC {
        return Ok(Vec::new());
    }
    // A torn last record (a kill mid-write) is left out.
    let records = (file.metadata()?.len().saturating_sub(MAGIC.len() as u64)) / RECORD as u64;
    const BLOCK: u64 = 1024;
    let mut out = Vec::new();
    let mut end = records;
    'blocks: while end > 0 {
        let start = end.saturating_sub(BLOCK);
        file.seek(SeekFrom::Start(MAGIC.len() as u64 + start * RECORD as u64))?;
        let mut bytes = vec![0u8; ((end - start) as usize) * RECORD];
        file.read_exact(&mut bytes)?;
        for c in bytes.rchunks_exact(RECORD) {
            let c: &[u8; RECORD] = c.try_into().unwrap_or(&[0; RECORD]);
            if names_a_policy(c) {
                continue;
            }
            let (s, _) = Second::decode(c);
            if s.t < since {
                break 'blocks;
            }
            out.push((s.t, s.sent));
        }
        end = start;
    }
    out.reverse();
    Ok(out)
}

/// What a tick of the recording loop shows the timeline besides the events.
#[derive(Debug, Clone, Default)]
pub struct Moment {
    /// The pacer holds every worker (a rate-limit pause).
    pub paused: bool,
    /// The run waits for credits.
    pub waiting_credits: bool,
    /// The limit the pacer learnt, if it did.
    pub learnt: Option<u64>,
    /// The last balance seen.
    pub credits: Option<i64>,
    /// How full each policy the pacer keeps is (empty when it keeps none:
    /// the configured limit is counted from the calls sent instead).
    pub policies: Vec<crate::rate::Occupancy>,
    /// The credits' burn-rate forecast, once there is one.
    pub projection: Option<crate::credits::Projection>,
}

/// The timeline being written.
pub struct Timeline {
    w: BufWriter<File>,
    /// The second being gathered.
    cur: Second,
    latencies: Vec<u32>,
    in_flight: u32,
    last: Moment,
    /// The configured limit and its window, in whole seconds (at least 1).
    limit: Option<(u64, u64)>,
    /// The configured limit as `--limit` spells it.
    limit_name: Option<String>,
    /// Calls sent per second within the window, for the occupancy.
    recent: VecDeque<(u64, u32)>,
    /// The policy named in each slot, as last written.
    names: [Option<String>; SLOTS],
    /// Each slot's highest share in the second being gathered.
    peaks: [u16; SLOTS],
}

impl Timeline {
    /// Opens (or appends to) the timeline at `path`; `now_s` is the first
    /// second, `limit` the configured count and window.
    pub fn open(
        path: &Path,
        limit: Option<(u64, Duration)>,
        now_s: u64,
    ) -> std::io::Result<Timeline> {
        set_aside_other_layout(path)?;
        let f = OpenOptions::new().create(true).append(true).open(path)?;
        let len = f.metadata()?.len();
        // A record cut short (a full disk, a kill mid-write) is dropped:
        // appended after, every later record would be read askew.
        let head = MAGIC.len() as u64;
        let whole = head + len.saturating_sub(head) / RECORD as u64 * RECORD as u64;
        if len > head && len != whole {
            f.set_len(whole)?;
        }
        let new = len == 0;
        let mut w = BufWriter::with_capacity(16 * 1024, f);
        if new {
            w.write_all(MAGIC)?;
        }
        Ok(Timeline {
            w,
            cur: Second {
                t: now_s,
                ..Second::default()
            },
            latencies: Vec::new(),
            in_flight: 0,
            last: Moment::default(),
            limit: limit.map(|(n, w)| (n, w.as_secs_f64().ceil().max(1.0) as u64)),
            limit_name: limit
                .map(|(count, period)| crate::rate::Rate { count, period }.to_string()),
            recent: VecDeque::new(),
            names: Default::default(),
            peaks: [NO_SHARE; SLOTS],
        })
    }

    /// The configured limit's occupancy as the calls sent count it (in
    /// whole seconds): what stands for the policies of a pacer that keeps
    /// none of its own.
    pub fn counted(&self) -> Option<crate::rate::Occupancy> {
        let (n, w) = self.limit?;
        let t = self.cur.t;
        let before: u32 = self
            .recent
            .iter()
            .filter(|(s, _)| s + w > t)
            .map(|(_, n)| n)
            .sum();
        Some(crate::rate::Occupancy {
            policy: self.limit_name.clone()?,
            limit: self.last.learnt.unwrap_or(n),
            used: u64::from(before + self.cur.sent),
        })
    }

    /// A call went out.
    pub fn sent(&mut self, now_s: u64) -> std::io::Result<()> {
        self.roll(now_s)?;
        self.cur.sent += 1;
        self.in_flight += 1;
        Ok(())
    }

    /// A call came back (or failed to).
    pub fn answered(
        &mut self,
        a: Answer,
        latency: Option<Duration>,
        now_s: u64,
    ) -> std::io::Result<()> {
        self.roll(now_s)?;
        self.in_flight = self.in_flight.saturating_sub(1);
        let c = &mut self.cur;
        match a {
            Answer::Status(s) if (200..300).contains(&s) => c.ok += 1,
            Answer::Status(429) => c.rate_limited += 1,
            Answer::CreditsExhausted(_) => c.credits_exhausted += 1,
            Answer::Status(s) if s >= 500 => c.server_error += 1,
            Answer::Status(_) => c.client_error += 1,
            Answer::Failure(_) => c.no_response += 1,
        }
        if let Some(l) = latency {
            self.latencies
                .push(l.as_micros().min(u32::MAX as u128) as u32);
        }
        Ok(())
    }

    /// A 429 paused the run (or, for concurrency, one worker).
    pub fn rate_limited(&mut self, concurrency: bool, now_s: u64) -> std::io::Result<()> {
        self.roll(now_s)?;
        self.cur.pause |= match concurrency {
            true => pause::CONCURRENCY,
            false => pause::RATE_LIMIT,
        };
        Ok(())
    }

    /// A tick: the gauges read, the seconds past written and flushed.
    pub fn tick(&mut self, m: Moment, now_s: u64) -> std::io::Result<()> {
        self.roll(now_s)?;
        self.cur.pause |= pause_of(&m);
        self.share(&m.policies)?;
        self.last = m;
        self.w.flush()
    }

    /// Each policy's occupancy into its slot's peak, naming a slot whose
    /// policy changed first.
    fn share(&mut self, policies: &[crate::rate::Occupancy]) -> std::io::Result<()> {
        for slot in 0..SLOTS {
            let p = policies.get(slot);
            if self.names[slot].as_deref() != p.map(|p| p.policy.as_str()) {
                self.w
                    .write_all(&name_record(slot, p.map_or("", |p| &p.policy)))?;
                self.names[slot] = p.map(|p| p.policy.clone());
                self.peaks[slot] = NO_SHARE;
            }
            if let Some(p) = p {
                let peak = &mut self.peaks[slot];
                *peak = match *peak {
                    NO_SHARE => share_of(p),
                    v => v.max(share_of(p)),
                };
            }
        }
        Ok(())
    }

    /// The run is over: its last second too is written.
    pub fn end(&mut self, m: Moment, now_s: u64) -> std::io::Result<()> {
        self.tick(m, now_s)?;
        self.close()?;
        self.w.flush()
    }

    /// Closes the seconds before `now_s` (empty ones included).
    fn roll(&mut self, now_s: u64) -> std::io::Result<()> {
        if now_s <= self.cur.t {
            return Ok(());
        }
        self.close()?;
        // close() moved on to the next second: from there to now, empty.
        let gap_from = self.cur.t.max(now_s.saturating_sub(MAX_GAP));
        for t in gap_from..now_s {
            self.cur.t = t;
            self.cur.pause = pause_of(&self.last);
            self.close()?;
        }
        self.cur.t = now_s;
        self.cur.pause = pause_of(&self.last);
        Ok(())
    }

    /// Writes the second gathered and starts the next one empty.
    fn close(&mut self) -> std::io::Result<()> {
        let t = self.cur.t;
        self.recent.push_back((t, self.cur.sent));
        let window = self.limit.map_or(1, |(_, w)| w);
        while self.recent.front().is_some_and(|(s, _)| *s + window <= t) {
            self.recent.pop_front();
        }
        self.latencies.sort_unstable();
        let q = |q: f64| {
            let n = self.latencies.len();
            (n > 0).then(|| self.latencies[((q * n as f64).ceil() as usize).clamp(1, n) - 1])
        };
        let limit = self.last.learnt.or(self.limit.map(|(n, _)| n));
        let done = Second {
            in_flight: self.in_flight,
            limit: limit.map(|l| l.min(u32::MAX as u64) as u32),
            occupancy: self.recent.iter().map(|(_, n)| n).sum(),
            p50_us: q(0.5),
            p99_us: q(0.99),
            credits: self.last.credits,
            ..std::mem::take(&mut self.cur)
        };
        self.latencies.clear();
        // A second no tick looked at (its ticks came before it) shows what
        // the last tick saw.
        for (slot, peak) in self.peaks.iter_mut().enumerate() {
            if *peak == NO_SHARE {
                if let Some(p) = self.last.policies.get(slot) {
                    *peak = share_of(p);
                }
            }
        }
        self.w.write_all(&done.encode(&self.peaks))?;
        self.peaks = [NO_SHARE; SLOTS];
        self.cur.t = t + 1;
        Ok(())
    }
}

/// A timeline of another layout is renamed `<name>.old` rather than
/// appended to (which would garble it) or replaced (which would lose it).
fn set_aside_other_layout(path: &Path) -> std::io::Result<()> {
    let mut head = [0u8; 8];
    let n = match File::open(path) {
        Ok(mut f) => f.read(&mut head)?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    if n == 0 || head == *MAGIC {
        return Ok(());
    }
    let mut old = path.as_os_str().to_owned();
    old.push(".old");
    std::fs::rename(path, old)
}

/// A policy's occupancy in thousandths of its limit.
fn share_of(p: &crate::rate::Occupancy) -> u16 {
    (p.used.saturating_mul(1000) / p.limit.max(1)).min(NO_SHARE as u64 - 1) as u16
}

fn pause_of(m: &Moment) -> u8 {
    let mut p = 0;
    if m.paused {
        p |= pause::RATE_LIMIT;
    }
    if m.waiting_credits {
        p |= pause::CREDITS;
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(tag: &str) -> PathBuf {
        let p = std::env::temp_dir().join(format!("batchrun-tl-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_file(&p);
        p
    }

    /// What keeping the timeline costs a call (docs/performance.md):
    /// `cargo test --release --lib timeline_cost -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn timeline_cost() {
        let p = tmp("cost");
        let calls = 2_000_000u64;
        let mut tl = Timeline::open(&p, Some((600, Duration::from_secs(6))), 0).unwrap();
        // Two policies in force, as the window pacer reports them.
        let at = Moment {
            policies: ["600/6s", "90000/1m,tokens"]
                .map(|p| crate::rate::Occupancy {
                    policy: p.to_string(),
                    limit: 1000,
                    used: 500,
                })
                .to_vec(),
            ..Moment::default()
        };
        let took = std::time::Instant::now();
        for i in 0..calls {
            // 50,000 calls a second of the run, a tick every 250 ms of it.
            let t = i / 50_000;
            tl.sent(t).unwrap();
            tl.answered(
                Answer::Status(200),
                Some(Duration::from_micros(900 + i % 300)),
                t,
            )
            .unwrap();
            if i % 12_500 == 0 {
                tl.tick(at.clone(), t).unwrap();
            }
        }
        tl.end(Moment::default(), calls / 50_000).unwrap();
        let ns = took.elapsed().as_nanos() as f64 / calls as f64;
        println!("timeline: {ns:.1} ns per call");
        let _ = std::fs::remove_file(&p);
    }

    #[test]
    fn a_record_reads_back_as_written() {
        let s = Second {
            t: 1_796_000_000,
            sent: 70_000,
            ok: 9,
            rate_limited: 2,
            in_flight: 4,
            pause: pause::RATE_LIMIT | pause::CREDITS,
            limit: Some(600),
            occupancy: 590,
            p50_us: Some(12_000),
            p99_us: Some(40_000),
            credits: Some(-3),
            ..Second::default()
        };
        let shares = [5, 1000, 65_534, NO_SHARE];
        let back = Second::decode(&s.encode(&shares));
        assert_eq!(
            back,
            (Second { sent: 65_535, ..s }, shares),
            "counts saturate"
        );
    }

    /// Read from the end, block by block, past the records naming
    /// policies: the same seconds as the whole file read, from `since` on.
    #[test]
    fn the_calls_sent_since_a_second_read_from_the_end_agree_with_the_whole_file() {
        let p = tmp("since");
        let mut tl = Timeline::open(&p, None, 1000).unwrap();
        for t in 1000..3500u64 {
            for _ in 0..t % 4 {
                tl.sent(t).unwrap();
            }
            if t % 700 == 0 {
                // A policy shown anew writes a record naming it.
                let m = Moment {
                    policies: vec![crate::rate::Occupancy {
                        policy: format!("{t}/1h"),
                        limit: 10,
                        used: 1,
                    }],
                    ..Moment::default()
                };
                tl.tick(m, t).unwrap();
            }
        }
        tl.end(Moment::default(), 3500).unwrap();
        drop(tl);
        // A torn last record, as a kill mid-write leaves.
        let len = std::fs::metadata(&p).unwrap().len();
        OpenOptions::new()
            .write(true)
            .open(&p)
            .unwrap()
            .set_len(len - 20)
            .unwrap();
        let whole = read(&p).unwrap();
        for since in [0, 1000, 1001, 2300, 2450, 3498, 3499, 4000] {
            let want: Vec<(u64, u32)> = (whole.iter())
                .filter(|s| s.t >= since)
                .map(|s| (s.t, s.sent))
                .collect();
            assert_eq!(sent_since(&p, since).unwrap(), want, "since {since}");
        }
        // 3500's record was torn.
        let tail = sent_since(&p, 3000).unwrap();
        assert_eq!(
            (tail[0].0, tail[tail.len() - 1].0, tail.len()),
            (3000, 3499, 500)
        );
        assert_eq!(tail[1], (3001, 1));
        assert_eq!(sent_since(&tmp("none"), 0).unwrap(), []);
    }

    #[test]
    fn a_record_cut_short_is_dropped_before_the_next_run_appends() {
        let p = tmp("cut");
        let mut tl = Timeline::open(&p, None, 100).unwrap();
        tl.sent(100).unwrap();
        tl.end(Moment::default(), 101).unwrap();
        drop(tl);
        let before = read(&p).unwrap();
        // The disk filled mid-record.
        let len = std::fs::metadata(&p).unwrap().len();
        let f = OpenOptions::new().write(true).open(&p).unwrap();
        f.set_len(len - 20).unwrap();
        drop(f);
        let mut tl = Timeline::open(&p, None, 200).unwrap();
        tl.sent(200).unwrap();
        tl.end(Moment::default(), 200).unwrap();
        drop(tl);
        let after = read(&p).unwrap();
        let ts: Vec<u64> = after.iter().map(|s| s.t).collect();
        assert_eq!(ts, [100, 200], "{after:?}");
        assert_eq!(after[0], before[0]);
        assert_eq!(after[1].sent, 1);
    }

    #[test]
    fn one_record_per_second_gaps_filled_and_appended_across_opens() {
        let p = tmp("seconds");
        let ms = |n| Some(Duration::from_millis(n));
        let mut tl = Timeline::open(&p, Some((10, Duration::from_secs(3))), 100).unwrap();
        tl.sent(100).unwrap();
        tl.sent(100).unwrap();
        tl.answered(Answer::Status(200), ms(10), 100).unwrap();
        tl.rate_limited(false, 101).unwrap();
        tl.answered(Answer::Status(429), ms(2), 101).unwrap();
        let m = Moment {
            credits: Some(50),
            ..Moment::default()
        };
        tl.tick(m.clone(), 101).unwrap();
        tl.sent(104).unwrap();
        tl.end(m, 104).unwrap();
        drop(tl);
        let mut tl = Timeline::open(&p, None, 200).unwrap();
        tl.end(Moment::default(), 200).unwrap();
        let s = read(&p).unwrap();
        let ts: Vec<u64> = s.iter().map(|s| s.t).collect();
        assert_eq!(ts, [100, 101, 102, 103, 104, 200]);
        assert_eq!((s[0].sent, s[0].ok, s[0].in_flight), (2, 1, 1));
        assert_eq!(s[0].p50_us, Some(10_000));
        assert_eq!((s[1].rate_limited, s[1].pause), (1, pause::RATE_LIMIT));
        assert_eq!(s[2].credits, Some(50));
        assert_eq!(s[2].occupancy, 2, "the 3 s window still holds second 100");
        assert_eq!(s[3].occupancy, 0);
        assert_eq!((s[4].sent, s[4].limit), (1, Some(10)));
        assert_eq!(s[5].limit, None);
        let _ = std::fs::remove_file(&p);
    }

    #[test]
    fn each_second_shows_its_policies_peak_by_name_and_a_change_renames() {
        let p = tmp("policies");
        let occ = |policy: &str, limit, used| crate::rate::Occupancy {
            policy: policy.to_string(),
            limit,
            used,
        };
        let at = |policies| Moment {
            policies,
            ..Moment::default()
        };
        let mut tl = Timeline::open(&p, None, 100).unwrap();
        tl.tick(
            at(vec![occ("10ps", 10, 4), occ("900/1m,tokens", 900, 90)]),
            100,
        )
        .unwrap();
        tl.tick(
            at(vec![occ("10ps", 10, 9), occ("900/1m,tokens", 900, 45)]),
            100,
        )
        .unwrap();
        // A stated policy joins; the tokens one gives way to it in slot 1.
        tl.tick(
            at(vec![occ("10ps", 10, 2), occ("50/1s (stated)", 50, 50)]),
            101,
        )
        .unwrap();
        tl.end(at(vec![occ("10ps", 10, 1)]), 103).unwrap();
        let s = read(&p).unwrap();
        let ts: Vec<u64> = s.iter().map(|s| s.t).collect();
        assert_eq!(ts, [100, 101, 102, 103]);
        let shown = |i: usize| -> Vec<(&str, u32)> {
            s[i].policies
                .iter()
                .map(|(n, v)| (n.as_str(), *v))
                .collect()
        };
        assert_eq!(
            shown(0),
            [("10ps", 900), ("900/1m,tokens", 100)],
            "the peaks"
        );
        assert_eq!(shown(1), [("10ps", 200), ("50/1s (stated)", 1000)]);
        assert_eq!(
            shown(2),
            [("10ps", 200), ("50/1s (stated)", 1000)],
            "a quiet second shows the last tick"
        );
        assert_eq!(shown(3), [("10ps", 100)]);
        let _ = std::fs::remove_file(&p);
    }

    #[test]
    fn a_timeline_of_another_layout_is_set_aside_not_garbled() {
        let p = tmp("layout");
        std::fs::write(&p, b"BRTL\x01\0\0\0old").unwrap();
        Timeline::open(&p, None, 5)
            .unwrap()
            .end(Moment::default(), 5)
            .unwrap();
        assert_eq!(read(&p).unwrap().len(), 1);
        let mut old = p.clone().into_os_string();
        old.push(".old");
        assert_eq!(std::fs::read(&old).unwrap(), b"BRTL\x01\0\0\0old");
        let _ = std::fs::remove_file(&p);
        let _ = std::fs::remove_file(&old);
    }
}
