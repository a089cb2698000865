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
/// Class of the line drawn for each policy in force.
pub const POLICY_CLASS: &str = "br-policy";

const SIZE: (u32, u32) = (1100, 380);
/// Calls per second: one point per second, in this colour only.
const CALLS: RGBColor = RGBColor(0x1F, 0x77, 0xB4);
/// One colour per policy in force, in their order.
const POLICIES: [RGBColor; 4] = [
    RGBColor(0xFF, 0x7F, 0x0E),
    RGBColor(0x8C, 0x56, 0x4B),
    RGBColor(0xE3, 0x77, 0xC2),
    RGBColor(0x7F, 0x7F, 0x7F),
];
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
    classify_by(svg, tag, "fill", color, class)
}

/// Gives `class` to every `<tag …>` element whose `attr` is `color`.
fn classify_by(svg: &str, tag: &str, attr: &str, color: RGBColor, class: &str) -> String {
    let fill = format!("{attr}=\"#{:02X}{:02X}{:02X}\"", color.0, color.1, color.2);
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
    let shown = shares(secs);
    let share_max = shown
        .iter()
        .flat_map(|(_, pts)| pts.iter().map(|p| p.1))
        .fold(100.0f64, f64::max)
        * 1.1;
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(
                "Pacing: calls per second and every limit in force",
                ("sans-serif", 18),
            )
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(56)
            .right_y_label_area_size(64)
            .build_cartesian_2d(0f64..n, 0f64..calls_max)
            .map_err(err)?
            .set_secondary_coord(0f64..n, 0f64..share_max);
        chart
            .configure_mesh()
            .x_desc("seconds since the first run started")
            .y_desc("calls sent per second")
            .light_line_style(WHITE.mix(0.0))
            .draw()
            .map_err(err)?;
        chart
            .configure_secondary_axes()
            .y_desc("% of each limit in force")
            .draw()
            .map_err(err)?;
        marks(&mut chart, secs, calls_max)?;
        let xy = |i: usize, v: u32| (i as f64 + 0.5, v as f64);
        let full = [(0.0, 100.0), (n, 100.0)];
        chart
            .draw_secondary_series(LineSeries::new(full, LIMIT.stroke_width(1)))
            .map_err(err)?
            .label("a limit, full (right)")
            .legend(|(x, y)| PathElement::new([(x, y), (x + 18, y)], LIMIT.stroke_width(1)));
        for ((name, pts), color) in shown.iter().zip(POLICIES) {
            chart
                .draw_secondary_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))
                .map_err(err)?
                .label(format!("{name} (right)"))
                // A square, not a line: the lines of that colour are the data.
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 4), (x + 18, y + 4)], color.filled())
                });
        }
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
    Ok(pacing_classes(&svg))
}

/// The pacing picture with a class on each kind of mark, by its colour,
/// for the report's tooltips and styles.
fn pacing_classes(svg: &str) -> String {
    let svg = classify(svg, "circle", CALLS, SECOND_CLASS);
    let svg = classify(&svg, "rect", PAUSED, PAUSE_CLASS);
    let mut svg = classify(&svg, "rect", WAITING, PAUSE_CLASS);
    for color in POLICIES {
        svg = classify_by(&svg, "polyline", "stroke", color, POLICY_CLASS);
    }
    classify(&svg, "polygon", LIMITED, LIMITED_CLASS)
}

/// Each policy shown (at most four, in the order they first appear) and
/// its occupancy per second, in % of its limit. A timeline that shows none
/// (nothing was limited) has none.
fn shares(secs: &[Second]) -> Vec<(String, Vec<(f64, f64)>)> {
    let mut out: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    for (i, s) in secs.iter().enumerate() {
        for (name, permille) in &s.policies {
            let at = match out.iter().position(|(n, _)| n == name) {
                Some(at) => at,
                None if out.len() < POLICIES.len() => {
                    out.push((name.clone(), Vec::new()));
                    out.len() - 1
                }
                None => continue,
            };
            out[at]
                .1
                .push((i as f64 + 0.5, f64::from(*permille) / 10.0));
        }
    }
    // A learnt limit is the one in force: say so beside its policy.
    let learnt = secs.iter().rev().find_map(|s| s.limit);
    let configured = secs.iter().find_map(|s| s.limit);
    if let (Some((name, _)), Some(l), Some(c)) = (out.first_mut(), learnt, configured) {
        if l != c {
            name.push_str(&format!(", {l} learnt"));
        }
    }
    out
}

/// A line of a chart: its name, its colour, its value in a second (None
/// where that second has none).
type Series<'a> = (&'a str, RGBColor, &'a dyn Fn(&Second) -> Option<f64>);

/// A chart's drawing area on the seconds of the run.
type Chart<'a, 'b> = ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// What a line chart draws beyond its series: how far its x axis goes,
/// the highest value it must show, and the drawing.
struct Beyond<'a> {
    x_max: f64,
    y_max: f64,
    draw: &'a dyn Fn(&mut Chart<'_, '_>) -> Result<(), ChartError>,
}

/// The credits ahead: the job's pace of spending, and when they renew.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ahead {
    /// Credits spent per second of running.
    pub per_s: f64,
    /// Seconds from the timeline's last second to the renewal, if known.
    pub renewal_in: Option<f64>,
}

/// How much further than the run a projection is drawn at most: a renewal
/// weeks away would squeeze the run itself into a line.
const AHEAD_SPAN: f64 = 4.0;

/// One line chart over the run's seconds: each series a name, a colour and
/// its value per second (None where it has none).
fn lines(
    title: &str,
    y_desc: &str,
    secs: &[Second],
    series: &[Series],
    beyond: Option<Beyond<'_>>,
) -> Result<String, ChartError> {
    let mut svg = String::new();
    let n = beyond
        .as_ref()
        .map_or(0.0, |b| b.x_max)
        .max(secs.len().max(1) as f64);
    let values = || {
        series
            .iter()
            .flat_map(|(_, _, f)| secs.iter().filter_map(f))
    };
    let hi = values()
        .chain(beyond.as_ref().map(|b| b.y_max))
        .fold(f64::MIN, f64::max);
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
        if let Some(b) = &beyond {
            (b.draw)(&mut chart)?;
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
        None,
    )
}

/// The credit balance last seen, per second, and with `ahead` the
/// balance projected at the job's pace from the last one seen: to the
/// renewal (a vertical line) or to none left, whichever comes first, drawn
/// at most [`AHEAD_SPAN`] times the run's length further.
pub fn credits(secs: &[Second], ahead: Option<Ahead>) -> Result<String, ChartError> {
    let last = secs
        .iter()
        .enumerate()
        .rev()
        .find_map(|(i, s)| s.credits.map(|c| (i as f64 + 0.5, c as f64)));
    // None left, nothing to project (a credit halt ends there).
    let last = last.filter(|(_, v)| *v > 0.0);
    let line = ahead.zip(last).map(|(a, (x0, v0))| {
        let empty_in = v0.max(0.0) / a.per_s.max(1e-12);
        let until = a.renewal_in.map_or(empty_in, |r| r.max(0.0).min(empty_in));
        let span = until.min(secs.len().max(1) as f64 * AHEAD_SPAN);
        let renewal = a.renewal_in.filter(|r| *r <= span).map(|r| x0 + r);
        ((x0, v0), (x0 + span, v0 - a.per_s * span), renewal)
    });
    let draw = |chart: &mut Chart<'_, '_>| -> Result<(), ChartError> {
        let Some((from, to, renewal)) = line else {
            return Ok(());
        };
        chart
            .draw_series(DashedLineSeries::new(
                [from, to],
                6,
                4,
                CREDITS.stroke_width(2),
            ))
            .map_err(err)?
            .label("projected at the job's pace")
            .legend(|(x, y)| PathElement::new([(x, y), (x + 18, y)], CREDITS.stroke_width(1)));
        if let Some(x) = renewal {
            chart
                .draw_series(LineSeries::new(
                    [(x, 0.0), (x, from.1)],
                    LIMIT.stroke_width(1),
                ))
                .map_err(err)?
                .label("the credits renew")
                .legend(|(x, y)| PathElement::new([(x, y), (x + 18, y)], LIMIT.stroke_width(1)));
        }
        Ok(())
    };
    lines(
        "Credits remaining",
        "credits",
        secs,
        &[("credits remaining", CREDITS, &|s: &Second| {
            s.credits.map(|c| c as f64)
        })],
        line.map(|(from, to, _)| Beyond {
            x_max: to.0.ceil(),
            y_max: from.1,
            draw: &draw,
        }),
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
        assert!(latency(&[]).is_ok() && credits(&secs, None).is_ok());
    }

    #[test]
    fn every_policy_shown_has_its_line_and_its_name() {
        let secs: Vec<Second> = (0..20)
            .map(|t| Second {
                policies: vec![
                    ("10ps".to_string(), 900),
                    ("1000/1h,fixed".to_string(), (t * 10) as u32),
                ],
                ..sec(t, 0, 9)
            })
            .collect();
        let svg = pacing(&secs).unwrap();
        assert_eq!(svg.matches(&format!("class=\"{POLICY_CLASS}\"")).count(), 2);
        assert!(svg.contains("10ps (right)") && svg.contains("1000/1h,fixed (right)"));
    }

    #[test]
    fn the_credits_projection_ends_at_the_renewal_or_at_none_left() {
        let secs: Vec<Second> = (0..10)
            .map(|t| Second {
                credits: Some(1000 - 10 * t as i64),
                ..sec(t, 0, 1)
            })
            .collect();
        // 910 left at 10 a second: none left 91 s on, drawn 40 s (4x) on.
        let svg = credits(
            &secs,
            Some(Ahead {
                per_s: 10.0,
                renewal_in: None,
            }),
        )
        .unwrap();
        assert!(svg.contains("projected at the job"), "{svg}");
        assert!(!svg.contains("the credits renew"));
        // A renewal 20 s on is drawn, and the line stops there.
        let svg = credits(
            &secs,
            Some(Ahead {
                per_s: 10.0,
                renewal_in: Some(20.0),
            }),
        )
        .unwrap();
        assert!(svg.contains("the credits renew"), "{svg}");
    }
}
