//! The values of options that are more than a number or a string: parsed
//! by clap, validated into [`super::Settings`], read by the layers below.
//! A leaf: it imports nothing of the crate, so every layer may use it.

use std::io::IsTerminal;
use std::time::Duration;

/// The bound `--max-failures` sets.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum MaxFailures {
    /// At most this many failed items in this run.
    Count(u64),
    /// At most this share of the items finished in this run (checked once
    /// twenty have finished, so one early failure is not 100%).
    Percent(f64),
}

impl std::str::FromStr for MaxFailures {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim();
        if let Some(p) = t.strip_suffix('%') {
            return match p.trim().parse::<f64>() {
                Ok(v) if (0.0..=100.0).contains(&v) => Ok(MaxFailures::Percent(v)),
                _ => Err(format!("{s:?} is not a percentage from 0% to 100%")),
            };
        }
        t.parse::<u64>()
            .map(MaxFailures::Count)
            .map_err(|_| format!("{s:?} is not a count (10) or a percentage (5%)"))
    }
}

/// How the run talks on stderr.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Style {
    /// Draw a bar (stderr is a terminal); otherwise timestamped lines.
    pub bar: bool,
    /// Colours in the bar.
    pub color: bool,
    /// Only the summary, alerts and errors (`-q`).
    pub quiet: bool,
    /// How often a plain progress line is written.
    pub log_every: Duration,
}

impl Style {
    /// The style for this process: a bar only on a terminal; colours per
    /// `--color` (`auto` also honours NO_COLOR).
    pub fn detect(color: ColorChoice, quiet: bool, log_every: Duration) -> Style {
        let tty = std::io::stderr().is_terminal();
        let color = match color {
            ColorChoice::Always => true,
            ColorChoice::Never => false,
            ColorChoice::Auto => {
                tty && !std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty())
            }
        };
        Style {
            bar: tty && !quiet,
            color,
            quiet,
            log_every,
        }
    }
}

impl Default for Style {
    fn default() -> Self {
        Style {
            bar: false,
            color: false,
            quiet: false,
            log_every: Duration::from_secs(60),
        }
    }
}

/// `--color`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Default)]
pub enum ColorChoice {
    /// On a terminal, unless NO_COLOR is set.
    #[default]
    Auto,
    /// Always.
    Always,
    /// Never.
    Never,
}

/// The results file's format (`--out-format`, else `--out`'s extension).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Default)]
pub enum OutFormat {
    /// One JSON object per line (the default).
    #[default]
    Jsonl,
    /// A header, then one row per item: line, status, the input's own
    /// columns, the body as JSON text.
    Csv,
}

impl OutFormat {
    /// The format asked for, else the one `out`'s extension names.
    pub fn for_out(asked: Option<OutFormat>, out: &std::path::Path) -> OutFormat {
        asked.unwrap_or_else(|| match out.extension().and_then(|e| e.to_str()) {
            Some(e) if e.eq_ignore_ascii_case("csv") => OutFormat::Csv,
            _ => OutFormat::Jsonl,
        })
    }
}
