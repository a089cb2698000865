//! The run's timeline: one fixed 48-byte record per second of the run, in
//! `timeline-<job>.bin` in the state directory, appended as the run goes
//! (flushed on every tick of the recording loop), so a killed run keeps its
//! picture up to its last second. Runs of the job follow one another in
//! the file; `batchrun report` and the tests read it back with [`read`].
//!
//! 48 bytes a second is 4.0 MiB for a 24-hour run (86,400 records), and
//! the file never holds more than its seconds: it is bounded by the run's
//! length, whatever its rate. Counts are per second and saturate at 65,535.
//!
//! A record, little-endian: `t` (u32 unix seconds); `sent`, `ok`,
//! `rate_limited`, `credits_exhausted`, `client_error`, `server_error`,
//! `no_response`, `in_flight` (u16 each); `pause` (u8, [`pause`] bits); a
//! u8 of flags (1: a limit is known, 2: credits are known); 2 bytes unused;
//! `limit` and `occupancy` (u32); `p50_us` and `p99_us` (u32, 0 when no
//! call came back that second); `credits` (i64).

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::calls::Answer;

/// The file's first bytes: its kind and layout version.
pub const MAGIC: &[u8; 8] = b"BRTL\x01\0\0\0";
/// Bytes per second of the run.
pub const RECORD: usize = 48;
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
}

fn sat16(n: u32) -> [u8; 2] {
    (n.min(u16::MAX as u32) as u16).to_le_bytes()
}

impl Second {
    fn encode(&self) -> [u8; RECORD] {
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
        b
    }

    fn decode(b: &[u8; RECORD]) -> Second {
        let u16_at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]) as u32;
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let some = |v: u32| (v > 0).then_some(v);
        let mut credits = [0u8; 8];
        credits.copy_from_slice(&b[40..48]);
        Second {
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
        }
    }
}

/// Where job `job` keeps its timeline.
pub fn path(state_dir: &Path, job: &str) -> PathBuf {
    state_dir.join(format!("timeline-{job}.bin"))
}

/// Every second recorded, oldest first. A torn last record (a kill in the
/// middle of a write) is left out.
pub fn read(path: &Path) -> std::io::Result<Vec<Second>> {
    let mut bytes = Vec::new();
    File::open(path)?.read_to_end(&mut bytes)?;
    if !bytes.starts_with(MAGIC) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{} is not a batchrun timeline", path.display()),
        ));
    }
    Ok(bytes[MAGIC.len()..]
        .chunks_exact(RECORD)
        .map(|c| Second::decode(c.try_into().unwrap_or(&[0; RECORD])))
        .collect())
}

/// What a tick of the recording loop shows the timeline besides the events.
#[derive(Debug, Clone, Copy, Default)]
pub struct Moment {
    /// The pacer holds every worker (a rate-limit pause).
    pub paused: bool,
    /// The run waits for credits.
    pub waiting_credits: bool,
    /// The limit the pacer learnt, if it did.
    pub learnt: Option<u64>,
    /// The last balance seen.
    pub credits: Option<i64>,
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
    /// Calls sent per second within the window, for the occupancy.
    recent: VecDeque<(u64, u32)>,
}

impl Timeline {
    /// Opens (or appends to) the timeline at `path`; `now_s` is the first
    /// second, `limit` the configured count and window.
    pub fn open(
        path: &Path,
        limit: Option<(u64, Duration)>,
        now_s: u64,
    ) -> std::io::Result<Timeline> {
        let f = OpenOptions::new().create(true).append(true).open(path)?;
        let new = f.metadata()?.len() == 0;
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
            recent: VecDeque::new(),
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
        self.last = m;
        self.cur.pause |= pause_of(m);
        self.w.flush()
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
            self.cur.pause = pause_of(self.last);
            self.close()?;
        }
        self.cur.t = now_s;
        self.cur.pause = pause_of(self.last);
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
        self.w.write_all(&done.encode())?;
        self.cur.t = t + 1;
        Ok(())
    }
}

fn pause_of(m: Moment) -> u8 {
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
                tl.tick(Moment::default(), t).unwrap();
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
        let back = Second::decode(&s.encode());
        assert_eq!(back, Second { sent: 65_535, ..s }, "counts saturate");
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
        tl.tick(m, 101).unwrap();
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
}
