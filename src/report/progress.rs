//! The live progress display. On a terminal it draws an indicatif bar on
//! stderr; otherwise it writes a plain line every few seconds, which reads
//! well in cron mail and CI logs.

use std::io::IsTerminal;
use std::time::Duration;

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
    /// Waiting for credits: time to the next probe.
    pub waiting_probe_in: Option<Duration>,
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

    fn status(&self, total: u64) -> String {
        let mut parts = vec![format!("{:.0}/min", self.per_min())];
        let left = total.saturating_sub(self.done + self.failed);
        if self.done_this_run > 0 && left > 0 {
            let eta = Duration::from_secs_f64(left as f64 * 60.0 / self.per_min().max(1e-9));
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
            parts.push(format!("PAUSED {}s", p.as_secs_f64().ceil() as u64));
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

fn fmt_secs(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 3600 {
        format!("{}h{:02}m", s / 3600, (s % 3600) / 60)
    } else if s >= 60 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{s}s")
    }
}

/// Draws progress: a bar on a terminal, periodic lines otherwise.
pub struct Reporter {
    bar: Option<ProgressBar>,
    total: u64,
}

impl Reporter {
    /// A reporter for `total` items; a bar only if stderr is a terminal.
    pub fn new(total: u64) -> Reporter {
        let bar = std::io::stderr().is_terminal().then(|| {
            let b = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
            b.set_style(
                ProgressStyle::with_template("{bar:30.cyan/blue} {pos}/{len} {msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            b
        });
        Reporter { bar, total }
    }

    /// How often the caller should call [`Reporter::update`].
    pub fn tick_every(&self) -> Duration {
        if self.bar.is_some() {
            Duration::from_millis(250)
        } else {
            Duration::from_secs(10)
        }
    }

    /// Prints a line above the bar (or plainly) without garbling it.
    pub fn println(&self, line: &str) {
        match &self.bar {
            Some(b) => b.println(line),
            None => err_line(line),
        }
    }

    /// A closure that prints like [`Reporter::println`], for the alerter.
    pub fn printer(&self) -> Box<dyn Fn(&str) + Send + Sync> {
        match &self.bar {
            Some(b) => {
                let b = b.clone();
                Box::new(move |l: &str| b.println(l))
            }
            None => Box::new(err_line),
        }
    }

    /// Redraws the bar, or writes a plain progress line.
    pub fn update(&self, v: &View) {
        let msg = v.status(self.total);
        match &self.bar {
            Some(b) => {
                b.set_position(v.done + v.failed);
                b.set_message(msg);
            }
            None => err_line(&format!(
                "batchrun: {}/{} done  {msg}",
                v.done + v.failed,
                self.total
            )),
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
        assert!(s.contains("PAUSED 12s"), "{s}");
        assert!(s.contains("credits 42"), "{s}");
        assert!(s.contains("ETA 9m00s"), "{s}");
        let w = View {
            waiting_probe_in: Some(Duration::from_secs(290)),
            ..View::default()
        };
        assert!(w.status(1).contains("next probe in 4m50s"));
    }
}
