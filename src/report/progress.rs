//! The live progress display. On a terminal it draws an indicatif bar on
//! stderr; otherwise (cron mail, systemd's journal, CI logs) it writes one
//! line per event with an ISO-8601 timestamp, and a progress line every
//! `--log-every`.

use crate::settings::values::Style;
use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::err_line;

/// A snapshot of the run for the progress display.
#[derive(Debug, Clone, Default)]
pub struct View {
    /// Items done so far (all runs).
    pub done: u64,
    /// Items failed so far.
    pub failed: u64,
    /// Items done by this run.
    pub done_this_run: u64,
    /// Seconds since this run started.
    pub elapsed: Duration,
    /// Rate-limit 429s this run.
    pub rate_limited: u64,
    /// Last known credit balance.
    pub credits: Option<i64>,
    /// Time left in a fleet-wide pause, if one is in force.
    pub paused_for: Option<Duration>,
    /// Time left in a hold for a quota a response said used up, if one is
    /// in force.
    pub held_for: Option<Duration>,
    /// Waiting for credits: time to the next probe.
    pub waiting_probe_in: Option<Duration>,
    /// The pace the limit allows, items per minute (None when unlimited).
    pub steady_per_min: Option<f64>,
    /// Items per minute over the last minute of this run, when measured.
    pub recent_per_min: Option<f64>,
}

impl View {
    /// Items done per minute by this run.
    pub fn per_min(&self) -> f64 {
        let secs = self.elapsed.as_secs_f64();
        if secs <= 0.0 {
            0.0
        } else {
            self.done_this_run as f64 * 60.0 / secs
        }
    }

    /// The rate the rest of the run will go at: the limit's steady pace,
    /// unless the last minute was slower (a slow API, too few workers). The
    /// opening burst never counts: it is not repeated.
    pub fn expected_per_min(&self) -> f64 {
        match (self.steady_per_min, self.recent_per_min) {
            (Some(s), Some(r)) => s.min(r),
            (Some(s), None) => s,
            (None, Some(r)) => r,
            (None, None) => self.per_min(),
        }
    }

    fn status(&self, total: u64) -> String {
        let rate = self.expected_per_min();
        let mut parts = vec![format!("{}/min", fmt_rate(rate))];
        let left = total.saturating_sub(self.done + self.failed);
        // Waiting for a top-up, the rest waits on the account, not a pace.
        if left > 0 && rate > 0.0 && self.waiting_probe_in.is_none() {
            // A pause in force holds every call first: the rest goes after
            // it. A quota's hold is at least as long: the pace may count
            // it already (a window's end), so it is not added to it.
            let eta = Duration::try_from_secs_f64(left as f64 * 60.0 / rate)
                .unwrap_or(Duration::MAX)
                .max(self.held_for.unwrap_or_default())
                .saturating_add(self.paused_for.unwrap_or_default());
            parts.push(format!("ETA {}", fmt_secs(eta)));
        }
        if let Some(c) = self.credits {
            parts.push(format!("credits {c}"));
        }
        if self.failed > 0 {
            parts.push(format!("failed {}", self.failed));
        }
        if self.rate_limited > 0 {
            parts.push(format!("429s {}", self.rate_limited));
        }
        if let Some(p) = self.paused_for {
            parts.push(waiting("PAUSED", p, SystemTime::now()));
        }
        // Holds of a few seconds are the pace's own (a bucket's next unit, a
        // window's end): not said.
        let long = |h: &Duration| *h >= SAID_HOLD && Some(*h) > self.paused_for;
        if let Some(h) = self.held_for.filter(long) {
            parts.push(waiting("HELD for a quota", h, SystemTime::now()));
        }
        if let Some(w) = self.waiting_probe_in {
            parts.push(format!(
                "WAITING FOR CREDITS, next probe in {}",
                fmt_secs(w)
            ));
        }
        parts.join("  ")
    }
}

fn fmt_rate(per_min: f64) -> String {
    if per_min >= 10.0 || per_min == 0.0 {
        format!("{per_min:.0}")
    } else {
        format!("{per_min:.2}")
    }
}

/// The shortest quota's hold the progress line says: shorter ones are the
/// pace's own (a bucket's next unit, a window's last seconds).
const SAID_HOLD: Duration = Duration::from_secs(10);

/// A wait of `p` from `now` (a pause, or a quota's hold, as `what` says):
/// its seconds and its end, the time of day, with the date when it ends on
/// another day (a quota waited for).
fn waiting(what: &str, p: Duration, now: SystemTime) -> String {
    let stamp = |t: SystemTime| humantime::format_rfc3339_seconds(t).to_string();
    let (today, end) = (stamp(now), stamp(now + p));
    let until = match today[..10] == end[..10] {
        true => end[11..19].to_string(),
        false => format!("{} {}", &end[..10], &end[11..19]),
    };
    format!(
        "{what} {}s (until {until} UTC)",
        p.as_secs_f64().ceil() as u64
    )
}

/// A duration as "1h05m", "3m07s" or "12s"; days past a day.
pub fn fmt_secs(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 86_400 {
        format!("{}d{:02}h", s / 86_400, (s % 86_400) / 3600)
    } else if s >= 3600 {
        format!("{}h{:02}m", s / 3600, (s % 3600) / 60)
    } else if s >= 60 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{s}s")
    }
}

/// A line as the logs carry it: an ISO-8601 UTC timestamp, then the text.
pub fn stamped(line: &str) -> String {
    format!(
        "{} {line}",
        humantime::format_rfc3339_seconds(SystemTime::now())
    )
}

/// Draws progress: a bar on a terminal, timestamped lines otherwise.
pub struct Reporter {
    bar: Option<ProgressBar>,
    total: u64,
    style: Style,
    /// (seconds into the run, done this run), one per tick, for the rate
    /// over the last minute.
    samples: Mutex<VecDeque<(f64, u64)>>,
    last_line: Mutex<Option<Duration>>,
}

impl Reporter {
    /// A reporter for `total` items.
    pub fn new(total: u64, style: Style) -> Reporter {
        let bar = style.bar.then(|| {
            let b = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
            let template = if style.color {
                "{bar:30.cyan/blue} {pos}/{len} {msg}"
            } else {
                "{bar:30} {pos}/{len} {msg}"
            };
            b.set_style(
                ProgressStyle::with_template(template)
                    .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            b
        });
        Reporter {
            bar,
            total,
            style,
            samples: Mutex::new(VecDeque::new()),
            last_line: Mutex::new(None),
        }
    }

    /// How often the caller should call [`Reporter::update`].
    pub fn tick_every(&self) -> Duration {
        if self.bar.is_some() {
            Duration::from_millis(250)
        } else {
            Duration::from_secs(1)
        }
    }

    /// Prints a note above the bar (or as a timestamped line). `-q` keeps
    /// it to itself.
    pub fn println(&self, line: &str) {
        if !self.style.quiet {
            self.say(line);
        }
    }

    /// Prints a line whatever `-q` says: alerts and errors.
    pub fn say(&self, line: &str) {
        match &self.bar {
            Some(b) => b.println(line),
            None => err_line(&stamped(line)),
        }
    }

    /// A closure that prints like [`Reporter::say`], for the alerter.
    pub fn printer(&self) -> Box<dyn Fn(&str) + Send + Sync> {
        match &self.bar {
            Some(b) => {
                let b = b.clone();
                Box::new(move |l: &str| b.println(l))
            }
            None => Box::new(|l: &str| err_line(&stamped(l))),
        }
    }

    /// Adds the rate over the last minute to `v`. A pause starts the
    /// measurement afresh: it is shown with its end, and counting it again
    /// in the rate would promise a run slower than the one that follows.
    fn measure(&self, v: &mut View) {
        let mut s = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        if v.paused_for.is_some() || v.waiting_probe_in.is_some() {
            s.clear();
            return;
        }
        let now = v.elapsed.as_secs_f64();
        s.push_back((now, v.done_this_run));
        while s.len() > 2 && s.front().is_some_and(|&(t, _)| now - t > 60.0) {
            s.pop_front();
        }
        if let Some(&(t0, d0)) = s.front() {
            // Ten seconds of data at least; the very start is the burst.
            if now - t0 >= 10.0 {
                v.recent_per_min = Some((v.done_this_run - d0) as f64 * 60.0 / (now - t0));
            }
        }
    }

    /// Redraws the bar, or writes a progress line every `--log-every`.
    pub fn update(&self, v: &View) {
        let mut v = v.clone();
        self.measure(&mut v);
        let msg = v.status(self.total);
        match &self.bar {
            Some(b) => {
                b.set_position(v.done + v.failed);
                b.set_message(msg);
            }
            None if self.style.quiet => {}
            None => {
                let mut last = self.last_line.lock().unwrap_or_else(|p| p.into_inner());
                if last.is_some_and(|l| v.elapsed < l + self.style.log_every) {
                    return;
                }
                *last = Some(v.elapsed);
                err_line(&stamped(&format!(
                    "batchrun: {}/{} done  {msg}",
                    v.done + v.failed,
                    self.total
                )));
            }
        }
    }

    /// Removes the bar before the summary is printed.
    pub fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pause_into_another_day_gives_its_date() {
        // 2026-12-06T12:00:00Z.
        let noon = std::time::UNIX_EPOCH + Duration::from_secs(1_796_558_400);
        assert_eq!(
            waiting("PAUSED", Duration::from_secs(90), noon),
            "PAUSED 90s (until 12:01:30 UTC)"
        );
        assert_eq!(
            waiting("PAUSED", Duration::from_secs(2 * 86_400), noon),
            "PAUSED 172800s (until 2026-12-08 12:00:00 UTC)"
        );
    }

    #[test]
    fn status_shows_pause_countdown_and_waiting() {
        let v = View {
            done: 10,
            done_this_run: 10,
            elapsed: Duration::from_secs(60),
            paused_for: Some(Duration::from_millis(11_200)),
            credits: Some(42),
            rate_limited: 1,
            ..View::default()
        };
        let s = v.status(100);
        assert!(s.contains("10/min"), "{s}");
        let waiting = View {
            waiting_probe_in: Some(Duration::from_secs(60)),
            ..v.clone()
        };
        assert!(
            !waiting.status(100).contains("ETA"),
            "{}",
            waiting.status(100)
        );
        assert!(s.contains("PAUSED 12s (until "), "{s}");
        assert!(s.contains("credits 42"), "{s}");
        // 90 left at 10 a minute, after the pause's 11.2 s.
        assert!(s.contains("ETA 9m11s"), "{s}");
        let w = View {
            waiting_probe_in: Some(Duration::from_secs(290)),
            ..View::default()
        };
        assert!(w.status(1).contains("next probe in 4m50s"));
    }

    /// A quota a response said used up holds every call until it resets:
    /// the ETA is at least the hold and the line says so. It showed the
    /// limit's pace alone ("ETA 1s" while held for 6 minutes).
    #[test]
    fn a_quotas_hold_is_shown_and_counted_in_the_eta() {
        let v = View {
            done: 1,
            done_this_run: 1,
            elapsed: Duration::from_secs(1),
            steady_per_min: Some(600.0),
            held_for: Some(Duration::from_secs(360)),
            ..View::default()
        };
        let s = v.status(21);
        assert!(s.contains("ETA 6m00s"), "{s}");
        assert!(s.contains("HELD for a quota 360s (until "), "{s}");
        // A pause as long or longer says it alone, and comes first.
        let both = View {
            paused_for: Some(Duration::from_secs(400)),
            ..v.clone()
        };
        let s = both.status(21);
        assert!(s.contains("ETA 12m40s") && !s.contains("HELD"), "{s}");
        // A hold of a few seconds is the pace's own: not said. Nor is a
        // hold the pace takes longer than added to it.
        let short = View {
            held_for: Some(Duration::from_secs(2)),
            ..v.clone()
        };
        assert!(!short.status(21).contains("HELD"), "{}", short.status(21));
        let slow = View {
            steady_per_min: Some(1.0),
            ..v
        };
        assert!(
            slow.status(21).contains("ETA 20m00s"),
            "{}",
            slow.status(21)
        );
    }

    #[test]
    fn the_eta_follows_the_steady_pace_not_the_opening_burst() {
        // 60 done in the first 5 s (the burst) of a 1 per hour limit.
        let v = View {
            done: 60,
            done_this_run: 60,
            elapsed: Duration::from_secs(5),
            steady_per_min: Some(1.0 / 60.0),
            ..View::default()
        };
        let s = v.status(80);
        assert!(s.contains("ETA 20h00m"), "{s}");
        // A slow API below the limit: the last minute's rate wins.
        let v = View {
            done: 10,
            done_this_run: 10,
            elapsed: Duration::from_secs(120),
            steady_per_min: Some(600.0),
            recent_per_min: Some(5.0),
            ..View::default()
        };
        assert!(v.status(20).contains("ETA 2m00s"), "{}", v.status(20));
    }

    #[test]
    fn a_long_pause_does_not_slow_the_eta_that_follows_it() {
        let r = Reporter::new(100, Style::default());
        let at = |secs: u64, done: u64, paused: bool| View {
            done,
            done_this_run: done,
            elapsed: Duration::from_secs(secs),
            steady_per_min: Some(600.0),
            paused_for: paused.then_some(Duration::from_secs(1)),
            ..View::default()
        };
        // Ten done, then a 49 s pause, then going again at the limit's pace.
        let mut v = at(0, 0, false);
        r.measure(&mut v);
        r.measure(&mut at(1, 10, true));
        r.measure(&mut at(49, 10, true));
        let mut v = at(51, 30, false);
        r.measure(&mut v);
        assert_eq!(v.recent_per_min, None, "too little since the pause");
        assert_eq!(v.expected_per_min(), 600.0);
        let mut v = at(61, 130, false);
        r.measure(&mut v);
        let recent = v.recent_per_min.expect("measured since the pause");
        assert!((recent - 600.0).abs() < 1.0, "{recent}");
    }
}
