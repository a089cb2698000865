//! A discrete-event driver for client pacers on a fake clock, shared by the
//! pacers' property tests: greedy workers take a place, send, and get their
//! response after a random latency, and each call reaches the server
//! anywhere between its send and its response (or never).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::{Duration, Instant};

use proptest::prelude::*;

/// What happens to one call once it has a place.
#[derive(Debug, Clone)]
pub struct Fate {
    /// The permit is dropped before the call is sent.
    pub cancel: bool,
    /// From send to response (or to giving up, for a timeout).
    pub latency: Duration,
    /// Where between send and response the call reaches the server, as a
    /// fraction of the latency; `None` when it never does (failed connect,
    /// or a timeout before the request got through).
    pub transit: Option<f64>,
}

/// Random fates: latencies up to `max_latency`, some cancelled, some
/// never arriving.
pub fn fates(n: usize, max_latency: Duration) -> impl Strategy<Value = Vec<Fate>> {
    let max = u64::try_from(max_latency.as_micros()).unwrap_or(u64::MAX);
    let fate = (0u32..100, 0..=max, 0.0f64..=1.0, 0u32..100).prop_map(
        |(cancel, latency, transit, lost)| Fate {
            cancel: cancel < 8,
            latency: Duration::from_micros(latency),
            transit: (lost >= 8).then_some(transit),
        },
    );
    proptest::collection::vec(fate, 1..=n)
}

/// A pacer under test.
pub trait Client {
    /// What identifies a taken place.
    type Slot: Copy;
    /// Claims a place at `now`, or says when to look again.
    fn try_take(&mut self, now: Instant) -> Result<Self::Slot, Instant>;
    /// The call's response came at `at`; `refused` when the server said 429.
    fn complete(&mut self, slot: Self::Slot, at: Instant, refused: bool);
    /// The call was never sent.
    fn cancel(&mut self, slot: Self::Slot);
    /// The limit in force, recorded with each send.
    fn limit(&self) -> u64 {
        u64::MAX
    }
}

/// One call as it happened.
#[derive(Debug, Clone)]
pub struct Call {
    /// When the server saw it, if it did.
    pub arrival: Option<Instant>,
    /// The client's limit in force when it was sent.
    pub limit: u64,
    /// Whether the server refused it.
    pub refused: bool,
}

const ARRIVE: u8 = 0;
const RESPOND: u8 = 1;
const WAKE: u8 = 2;

/// An event: when, what kind, a tie-breaking sequence number, and two
/// arguments (a call or worker, and a worker or generation).
type Event = (Instant, u8, u64, usize, u64);

/// Events in time order; at one instant, arrivals are decided before
/// responses are read, and workers look after both.
#[derive(Default)]
struct Queue {
    heap: BinaryHeap<Reverse<Event>>,
    seq: u64,
}

impl Queue {
    fn push(&mut self, at: Instant, kind: u8, a: usize, b: u64) {
        self.seq += 1;
        self.heap.push(Reverse((at, kind, self.seq, a, b)));
    }
}

/// Runs `workers` greedy workers through `fates` from `t0`. `server`
/// decides each arrival (true: accepted). Panics if the pacer asks to be
/// woken at or before the instant it was asked (a hot loop) or leaves
/// workers waiting forever.
pub fn drive<C: Client>(
    c: &mut C,
    workers: usize,
    fates: &[Fate],
    t0: Instant,
    server: &mut dyn FnMut(Instant) -> bool,
) -> Vec<Call> {
    let mut q = Queue::default();
    let mut calls: Vec<Call> = Vec::new();
    let mut slots: Vec<C::Slot> = Vec::new();
    let mut gen = vec![0u64; workers];
    let mut blocked = vec![false; workers];
    let mut next = 0usize;
    for w in 0..workers {
        q.push(t0, WAKE, w, 0);
    }
    let mut steps = 0u64;
    while let Some(Reverse((now, kind, _, a, b))) = q.heap.pop() {
        steps += 1;
        assert!(steps < 5_000_000, "the pacer does not make progress");
        match kind {
            ARRIVE => calls[a].refused = !server(now),
            RESPOND => {
                c.complete(slots[a], now, calls[a].refused);
                wake_blocked(&mut q, &mut gen, &mut blocked, now);
                let w = b as usize;
                q.push(now, WAKE, w, gen[w]);
            }
            _ => {
                if b != gen[a] || next == fates.len() {
                    continue;
                }
                match c.try_take(now) {
                    Ok(slot) => {
                        let f = &fates[next];
                        next += 1;
                        if f.cancel {
                            c.cancel(slot);
                            wake_blocked(&mut q, &mut gen, &mut blocked, now);
                            q.push(now, WAKE, a, gen[a]);
                            continue;
                        }
                        let i = calls.len();
                        let arrival = f.transit.map(|x| now + f.latency.mul_f64(x));
                        calls.push(Call {
                            arrival,
                            limit: c.limit(),
                            refused: false,
                        });
                        slots.push(slot);
                        if let Some(at) = arrival {
                            q.push(at, ARRIVE, i, 0);
                        }
                        q.push(now + f.latency, RESPOND, i, a as u64);
                    }
                    Err(at) => {
                        assert!(at > now, "asked to look again at {at:?}, not after {now:?}");
                        blocked[a] = true;
                        q.push(at, WAKE, a, gen[a]);
                    }
                }
            }
        }
    }
    assert_eq!(next, fates.len(), "workers were left waiting forever");
    calls
}

fn wake_blocked(q: &mut Queue, gen: &mut [u64], blocked: &mut [bool], now: Instant) {
    for w in 0..gen.len() {
        if blocked[w] {
            blocked[w] = false;
            gen[w] += 1;
            q.push(now, WAKE, w, gen[w]);
        }
    }
}

/// Checks the window theorem on what the server saw: every set of arrivals
/// within less than `window` of each other is no larger than the limit in
/// force when the last-sent of them was sent.
pub fn check_windows(calls: &[Call], window: Duration) -> Result<(), String> {
    let mut arrivals: Vec<(Instant, usize)> = calls
        .iter()
        .enumerate()
        .filter_map(|(i, c)| c.arrival.map(|a| (a, i)))
        .collect();
    arrivals.sort();
    for i in 0..arrivals.len() {
        let mut last_sent = 0;
        for (j, &(a, k)) in arrivals.iter().enumerate().skip(i) {
            if a - arrivals[i].0 >= window {
                break;
            }
            last_sent = last_sent.max(k);
            let count = (j - i + 1) as u64;
            if count > calls[last_sent].limit {
                return Err(format!(
                    "{count} arrivals within {window:?} from {:?}, limit {}",
                    arrivals[i].0, calls[last_sent].limit
                ));
            }
        }
    }
    Ok(())
}
