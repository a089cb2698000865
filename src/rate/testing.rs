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
    /// The response that just [`complete`](Self::complete)d at `at` stated
    /// its quota: `remaining` left, and when the next call fits.
    fn heard(&mut self, _remaining: u64, _reset: Duration, _at: Instant) {}
}

/// What a server stating its quota said in a response: what is left, and
/// when the next call fits.
pub type Said = (u64, Duration);

/// One call as it happened.
#[derive(Debug, Clone)]
pub struct Call {
    /// When it was sent.
    pub sent: Instant,
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
    drive_stated(c, workers, fates, t0, &mut |at| (server(at), None))
}

/// As [`drive`], against a server that may state its quota with each
/// answer: what it [`Said`] reaches the client with the response.
pub fn drive_stated<C: Client>(
    c: &mut C,
    workers: usize,
    fates: &[Fate],
    t0: Instant,
    server: &mut dyn FnMut(Instant) -> (bool, Option<Said>),
) -> Vec<Call> {
    let mut said: Vec<Option<Said>> = Vec::new();
    let mut q = Queue::default();
    let mut calls: Vec<Call> = Vec::new();
    let mut slots: Vec<C::Slot> = Vec::new();
    let mut gen = vec![0u64; workers];
    let mut blocked = vec![false; workers];
    // A worker waits for its call's answer before it takes another: a
    // wake while it waits (two wakes may carry one generation) is ignored.
    let mut busy = vec![false; workers];
    let mut next = 0usize;
    for w in 0..workers {
        q.push(t0, WAKE, w, 0);
    }
    let mut steps = 0u64;
    while let Some(Reverse((now, kind, _, a, b))) = q.heap.pop() {
        steps += 1;
        assert!(steps < 5_000_000, "the pacer does not make progress");
        match kind {
            ARRIVE => {
                let (accepted, stated) = server(now);
                calls[a].refused = !accepted;
                said[a] = stated;
            }
            RESPOND => {
                c.complete(slots[a], now, calls[a].refused);
                if let Some((remaining, reset)) = said[a] {
                    c.heard(remaining, reset, now);
                }
                wake_blocked(&mut q, &mut gen, &mut blocked, now);
                let w = b as usize;
                busy[w] = false;
                q.push(now, WAKE, w, gen[w]);
            }
            _ => {
                if b != gen[a] || busy[a] || next == fates.len() {
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
                        said.push(None);
                        calls.push(Call {
                            sent: now,
                            arrival,
                            limit: c.limit(),
                            refused: false,
                        });
                        slots.push(slot);
                        busy[a] = true;
                        blocked[a] = false;
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

/// A call as the server saw it, with its weight: (arrival, weight).
pub type Weighed = (Instant, u64);

/// The arrivals of `calls` that reached the server, with the weight each
/// was taken with, sorted by arrival.
pub fn weighed(calls: &[Call], weights: &[u64]) -> Vec<Weighed> {
    let mut a: Vec<Weighed> = calls
        .iter()
        .zip(weights)
        .filter_map(|(c, &w)| c.arrival.map(|a| (a, w)))
        .collect();
    a.sort();
    a
}

/// A reference server counting a sliding window: no span shorter than
/// `window` holds more than `quota` units.
pub fn judge_sliding(a: &[Weighed], quota: u64, window: Duration) -> Result<(), String> {
    let mut from = 0;
    let mut sum = 0u64;
    for (i, &(t, w)) in a.iter().enumerate() {
        sum += w;
        while t - a[from].0 >= window {
            sum -= a[from].1;
            from += 1;
        }
        if sum > quota {
            return Err(format!("{sum} units within {window:?} up to arrival {i}"));
        }
    }
    Ok(())
}

/// A reference server counting fixed windows `[origin + k·W, …)`.
pub fn judge_fixed(
    a: &[Weighed],
    quota: u64,
    window: Duration,
    origin: Instant,
) -> Result<(), String> {
    let mut counts = std::collections::HashMap::<i128, u64>::new();
    for &(t, w) in a {
        let d = if t >= origin {
            (t - origin).as_nanos() as i128
        } else {
            -((origin - t).as_nanos() as i128)
        };
        let k = d.div_euclid(window.as_nanos() as i128);
        let c = counts.entry(k).or_default();
        *c += w;
        if *c > quota {
            return Err(format!("{c} units in fixed window {k}"));
        }
    }
    Ok(())
}

/// A reference GCRA as nginx keeps it (the sim's level arithmetic): a
/// call of `w` units passes when `max(0, level − drained) + w ≤ burst + 1`.
pub fn judge_gcra(a: &[Weighed], rate: super::Rate, burst: u64) -> Result<(), String> {
    let unit = rate.period.as_nanos();
    let per_nano = u128::from(rate.count);
    let cap = u128::from(burst + 1) * unit;
    let mut level = 0u128;
    let mut last: Option<Instant> = None;
    for (i, &(t, w)) in a.iter().enumerate() {
        let drained = last.map_or(0, |l| (t - l).as_nanos() * per_nano);
        let next = level.saturating_sub(drained) + u128::from(w) * unit;
        if next > cap {
            return Err(format!(
                "arrival {i} refused: level {:.3} over {}",
                next as f64 / unit as f64,
                burst + 1
            ));
        }
        level = next;
        last = Some(t);
    }
    Ok(())
}

/// Greedy calls of given weights through any pacer with weights: the
/// [`Client`] face of `take(now, weight)`, remembering the weight of each
/// call sent, in the order [`drive`] records them.
pub struct Weights<S, T, C, X> {
    /// The pacer.
    pub inner: S,
    /// Weights to give calls, in turn (cycled).
    pub plan: Vec<u64>,
    /// The weight of each call sent (not cancelled), in send order.
    pub sent: Vec<u64>,
    taken: usize,
    take: T,
    complete: C,
    cancel: X,
    open: Vec<(u64, usize)>,
}

impl<S, T, C, X> Weights<S, T, C, X>
where
    T: FnMut(&mut S, Instant, u64) -> Result<u64, Instant>,
    C: FnMut(&mut S, u64, Instant),
    X: FnMut(&mut S, u64),
{
    /// Wraps `inner`.
    pub fn new(inner: S, plan: Vec<u64>, take: T, complete: C, cancel: X) -> Self {
        Weights {
            inner,
            plan,
            sent: Vec::new(),
            taken: 0,
            take,
            complete,
            cancel,
            open: Vec::new(),
        }
    }
}

impl<S, T, C, X> Client for Weights<S, T, C, X>
where
    T: FnMut(&mut S, Instant, u64) -> Result<u64, Instant>,
    C: FnMut(&mut S, u64, Instant),
    X: FnMut(&mut S, u64),
{
    type Slot = u64;

    fn try_take(&mut self, now: Instant) -> Result<u64, Instant> {
        let w = self.plan[self.taken % self.plan.len()];
        let id = (self.take)(&mut self.inner, now, w)?;
        self.taken += 1;
        self.open.push((id, self.sent.len()));
        self.sent.push(w);
        Ok(id)
    }

    fn complete(&mut self, slot: u64, at: Instant, _refused: bool) {
        (self.complete)(&mut self.inner, slot, at);
    }

    fn cancel(&mut self, slot: u64) {
        (self.cancel)(&mut self.inner, slot);
        // The driver records no call for it: forget its weight.
        if let Some(p) = self.open.iter().position(|&(id, _)| id == slot) {
            let (_, i) = self.open.remove(p);
            self.sent.remove(i);
            for o in &mut self.open {
                if o.1 > i {
                    o.1 -= 1;
                }
            }
        }
    }
}

/// nginx `limit_req` with `nodelay`: `excess` drains at `rate` a second and
/// each accepted request adds one; a request is refused when it would take
/// `excess` above `burst`, and a refused one counts nothing. The first
/// request of a new key starts at zero (as nginx's new node does).
pub struct Gcra {
    rate: f64,
    burst: f64,
    last: Option<(Instant, f64)>,
}

impl Gcra {
    /// A bucket draining `rate` a second with room for `burst` beyond one.
    pub fn new(rate: f64, burst: u64) -> Gcra {
        Gcra {
            rate,
            burst: burst as f64,
            last: None,
        }
    }

    /// Whether a request arriving `at` is accepted (and counted).
    pub fn admit(&mut self, at: Instant) -> bool {
        let excess = match self.last {
            None => 0.0,
            Some((t, e)) => {
                (e - self.rate * at.saturating_duration_since(t).as_secs_f64() + 1.0).max(0.0)
            }
        };
        if excess > self.burst + 1e-9 {
            return false;
        }
        self.last = Some((at, excess));
        true
    }

    /// As [`admit`](Self::admit), and what a server stating the bucket as
    /// a quota says with the answer, as `batchrun sim` does: the whole
    /// requests that would pass now, one after the other, and (with none)
    /// when the next one would.
    pub fn admit_stated(&mut self, at: Instant) -> (bool, Said) {
        let accepted = self.admit(at);
        let excess = self.last.map_or(0.0, |(t, e)| {
            (e - self.rate * at.saturating_duration_since(t).as_secs_f64()).max(0.0)
        });
        // A request passes while the excess it raises by one stays within
        // the burst.
        let remaining = (self.burst - excess + 1e-9).floor().max(0.0) as u64;
        let reset = match remaining {
            0 => Duration::from_secs_f64((excess + 1.0 - self.burst).max(0.0) / self.rate),
            _ => Duration::ZERO,
        };
        (accepted, (remaining, reset))
    }
}
