//! The report's charts, drawn from the run's timeline with plotters' SVG
//! backend: the pacing picture, latency and credits over time.
//!
//! plotters writes bare SVG elements; the elements a reader (or a test)
//! counts are drawn in colours used for nothing else and then given a class
//! (`br-second`, `br-pause`, `br-429`), so they can be found in the file.

use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

use super::timeline::{pause, Second};

/// Class of the point drawn for each second of the run.
pub const SECOND_CLASS: &str = "br-second";
/// Class of the band drawn for each pause.
pub const PAUSE_CLASS: &str = "br-pause";
/// Class of the marker drawn for each second that got a rate-limit 429.
pub const LIMITED_CLASS: &str = "br-429";

const SIZE: (u32, u32) = (1100, 380);
/// Calls per second: one point per second, in this colour only.
const CALLS: RGBColor = RGBColor(0x1F, 0x77, 0xB4);
const OCCUPANCY: RGBColor = RGBColor(0xFF, 0x7F, 0x0E);
const LIMIT: RGBColor = RGBColor(0xD6, 0x27, 0x28);
/// A rate-limit pause's band.
const PAUSED: RGBColor = RGBColor(0xFD, 0xD4, 0x9E);
/// A wait for credits' band.
const WAITING: RGBColor = RGBColor(0xC7, 0xE9, 0xC0);
/// A 429's marker.
const LIMITED: RGBColor = RGBColor(0xB2, 0x18, 0x2B);
const P50: RGBColor = RGBColor(0x2C, 0xA0, 0x2C);
const P99: RGBColor = RGBColor(0x94, 0x67, 0xBD);
const CREDITS: RGBColor = RGBColor(0x17, 0xBE, 0xCF);

/// A chart could not be drawn (plotters' error, as text).
#[derive(Debug, thiserror::Error)]
#[error("drawing a chart: {0}")]
pub struct ChartError(String);

fn err<E: std::fmt::Display>(e: E) -> ChartError {
    ChartError(e.to_string())
}

/// A pause: its first second (from the run's start), its length in
/// seconds, and its cause ([`pause`] bits of its first second).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pause {
    /// Offset of its first second.
    pub from: usize,
    /// Seconds it lasted.
    pub len: usize,
    /// Why: [`pause::RATE_LIMIT`] or [`pause::CREDITS`] (or both).
    pub cause: u8,
}

/// The pauses of a timeline: each run of consecutive seconds in which the
/// run was paused (every worker held by a 429, or waiting for credits) is
/// one pause. A concurrency 429 holds one worker only: it is not a pause.
pub fn pauses(secs: &[Second]) -> Vec<Pause> {
    let mask = pause::RATE_LIMIT | pause::CREDITS;
    let mut out: Vec<Pause> = Vec::new();
    for (i, s) in secs.iter().enumerate() {
        let cause = s.pause & mask;
        if cause == 0 {
            continue;
        }
        match out.last_mut() {
            // Contiguous seconds (the timeline's seconds follow one
            // another within a run; a gap between runs ends a pause).
            Some(p) if p.from + p.len == i && secs[i - 1].t + 1 == s.t => {
                p.len += 1;
                p.cause |= cause;
            }
            _ => out.push(Pause {
                from: i,
                len: 1,
                cause,
            }),
        }
    }
    out
}

/// Gives `class` to every `<tag …>` element whose fill is `color`.
fn classify(svg: &str, tag: &str, color: RGBColor, class: &str) -> String {
    let fill = format!("fill=\"#{:02X}{:02X}{:02X}\"", color.0, color.1, color.2);
    let open = format!("<{tag} ");
    let mut out = String::with_capacity(svg.len() + 1024);
    let mut rest = svg;
    while let Some(at) = rest.find(&open) {
        out.push_str(&rest[..at]);
        let el = &rest[at..];
        let end = el.find('>').unwrap_or(el.len());
        if el[..end].contains(&fill) {
            out.push_str(&format!("<{tag} class=\"{class}\" "));
        } else {
            out.push_str(&open);
        }
        rest = &el[open.len()..];
    }
    out.push_str(rest);
    out
}

fn max_of(secs: &[Second], f: impl Fn(&Second) -> u32) -> u32 {
    secs.iter().map(f).max().unwrap_or(0)
}

/// The pacing picture's marks on its primary axes: a band per pause (under
/// the lines, so drawn first) and a triangle at the top over each second
/// that got a rate-limit 429.
fn marks(
    chart: &mut ChartContext<'_, SVGBackend<'_>, Cartesian2d<RangedCoordf64, RangedCoordf64>>,
    secs: &[Second],
    calls_max: f64,
) -> Result<(), ChartError> {
    for p in pauses(secs) {
        let color = match p.cause & pause::RATE_LIMIT {
            0 => WAITING,
            _ => PAUSED,
        };
        let (x0, x1) = (p.from as f64, (p.from + p.len) as f64);
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [(x0, 0.0), (x1, calls_max)],
                color.filled(),
            )))
            .map_err(err)?;
    }
    let limited = secs
        .iter()
        .enumerate()
        .filter(|(_, s)| s.rate_limited > 0)
        .map(|(i, _)| TriangleMarker::new((i as f64 + 0.5, calls_max * 0.97), 5, LIMITED.filled()));
    chart.draw_series(limited).map_err(err)?;
    Ok(())
}

/// The pacing picture: calls sent per second (one point per second, left
/// axis), the window's occupancy and the limit in force (right axis), the
/// pauses as bands and the seconds that got a 429 marked at the top.
pub fn pacing(secs: &[Second]) -> Result<String, ChartError> {
    let mut svg = String::new();
    let n = secs.len().max(1) as f64;
    let calls_max = (max_of(secs, |s| s.sent) as f64 * 1.15).max(1.0);
    let window_max =
        (max_of(secs, |s| s.occupancy.max(s.limit.unwrap_or(0))) as f64 * 1.1).max(1.0);
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(
                "Pacing: calls per second and the window against the limit",
                ("sans-serif", 18),
            )
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(56)
            .right_y_label_area_size(64)
            .build_cartesian_2d(0f64..n, 0f64..calls_max)
            .map_err(err)?
            .set_secondary_coord(0f64..n, 0f64..window_max);
        chart
            .configure_mesh()
            .x_desc("seconds since the first run started")
            .y_desc("calls sent per second")
            .light_line_style(WHITE.mix(0.0))
            .draw()
            .map_err(err)?;
        chart
            .configure_secondary_axes()
            .y_desc("calls in the window")
            .draw()
            .map_err(err)?;
        marks(&mut chart, secs, calls_max)?;
        let xy = |i: usize, v: u32| (i as f64 + 0.5, v as f64);
        let limit = secs
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.limit.map(|l| xy(i, l)));
        chart
            .draw_secondary_series(LineSeries::new(limit, LIMIT.stroke_width(2)))
            .map_err(err)?
            .label("limit in force (right)")
            .legend(|(x, y)| PathElement::new([(x, y), (x + 18, y)], LIMIT.stroke_width(2)));
        let occ = secs.iter().enumerate().map(|(i, s)| xy(i, s.occupancy));
        chart
            .draw_secondary_series(LineSeries::new(occ, OCCUPANCY.stroke_width(2)))
            .map_err(err)?
            .label("window occupancy (right)")
            .legend(|(x, y)| PathElement::new([(x, y), (x + 18, y)], OCCUPANCY.stroke_width(2)));
        let sent: Vec<(f64, f64)> = secs
            .iter()
            .enumerate()
            .map(|(i, s)| xy(i, s.sent))
            .collect();
        chart
            .draw_series(LineSeries::new(sent.iter().copied(), CALLS.mix(0.6)))
            .map_err(err)?
            .label("calls sent per second (left)")
            .legend(|(x, y)| PathElement::new([(x, y), (x + 18, y)], CALLS));
        chart
            .draw_series(sent.iter().map(|&p| Circle::new(p, 2, CALLS.filled())))
            .map_err(err)?;
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(err)?;
        root.present().map_err(err)?;
    }
    let svg = classify(&svg, "circle", CALLS, SECOND_CLASS);
    let svg = classify(&svg, "rect", PAUSED, PAUSE_CLASS);
    let svg = classify(&svg, "rect", WAITING, PAUSE_CLASS);
    Ok(classify(&svg, "polygon", LIMITED, LIMITED_CLASS))
}

/// A line of a chart: its name, its colour, its value in a second (None
/// where that second has none).
type Series<'a> = (&'a str, RGBColor, &'a dyn Fn(&Second) -> Option<f64>);

/// One line chart over the run's seconds: each series a name, a colour and
/// its value per second (None where it has none).
fn lines(
    title: &str,
    y_desc: &str,
    secs: &[Second],
    series: &[Series],
) -> Result<String, ChartError> {
    let mut svg = String::new();
    let n = secs.len().max(1) as f64;
    let values = || {
        series
            .iter()
            .flat_map(|(_, _, f)| secs.iter().filter_map(f))
    };
    let hi = values().fold(f64::MIN, f64::max);
    let lo = values().fold(f64::MAX, f64::min).min(0.0);
    let hi = if hi > lo {
        hi + (hi - lo) * 0.1
    } else {
        lo + 1.0
    };
    {
        let root = SVGBackend::with_string(&mut svg, (SIZE.0, 300)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(64)
            .build_cartesian_2d(0f64..n, lo..hi)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("seconds since the first run started")
            .y_desc(y_desc)
            .light_line_style(WHITE.mix(0.0))
            .draw()
            .map_err(err)?;
        for (name, color, f) in series {
            let pts = secs
                .iter()
                .enumerate()
                .filter_map(|(i, s)| f(s).map(|v| (i as f64 + 0.5, v)));
            let color = *color;
            chart
                .draw_series(LineSeries::new(pts, color.stroke_width(2)))
                .map_err(err)?
                .label(*name)
                .legend(move |(x, y)| {
                    PathElement::new([(x, y), (x + 18, y)], color.stroke_width(2))
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(err)?;
        root.present().map_err(err)?;
    }
    Ok(svg)
}

/// Latency p50 and p99 per second, in milliseconds.
pub fn latency(secs: &[Second]) -> Result<String, ChartError> {
    let ms = |us: Option<u32>| us.map(|u| u as f64 / 1000.0);
    lines(
        "Latency per second",
        "milliseconds",
        secs,
        &[
            ("p50", P50, &|s: &Second| ms(s.p50_us)),
            ("p99", P99, &|s: &Second| ms(s.p99_us)),
        ],
    )
}

/// The credit balance last seen, per second.
pub fn credits(secs: &[Second]) -> Result<String, ChartError> {
    lines(
        "Credits remaining",
        "credits",
        secs,
        &[("credits remaining", CREDITS, &|s: &Second| {
            s.credits.map(|c| c as f64)
        })],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sec(t: u64, pause: u8, sent: u32) -> Second {
        Second {
            t,
            pause,
            sent,
            limit: Some(10),
            ..Second::default()
        }
    }

    #[test]
    fn consecutive_paused_seconds_are_one_pause_and_a_gap_ends_one() {
        let r = pause::RATE_LIMIT;
        let secs = [
            sec(1, 0, 3),
            sec(2, r, 0),
            sec(3, r | pause::CONCURRENCY, 0),
            sec(4, pause::CONCURRENCY, 1),
            sec(5, pause::CREDITS, 0),
            sec(9, pause::CREDITS, 0),
        ];
        let p = pauses(&secs);
        let spans: Vec<(usize, usize)> = p.iter().map(|p| (p.from, p.len)).collect();
        assert_eq!(spans, [(1, 2), (4, 1), (5, 1)]);
    }

    #[test]
    fn the_pacing_chart_has_a_point_per_second_and_a_band_per_pause() {
        let secs: Vec<Second> = (0..30)
            .map(|t| {
                sec(
                    t,
                    if (10..13).contains(&t) {
                        pause::RATE_LIMIT
                    } else {
                        0
                    },
                    5,
                )
            })
            .collect();
        let svg = pacing(&secs).unwrap();
        assert_eq!(
            svg.matches(&format!("class=\"{SECOND_CLASS}\"")).count(),
            30
        );
        assert_eq!(svg.matches(&format!("class=\"{PAUSE_CLASS}\"")).count(), 1);
        assert!(latency(&[]).is_ok() && credits(&secs).is_ok());
    }
}
