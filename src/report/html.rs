//! `batchrun report`: one self-contained HTML file for an input's latest
//! job (its charts inline SVG, its style inline, nothing fetched to view
//! it), or with `--format svg` the pacing picture alone.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;

use super::charts;
use super::timeline::{self, Second};
use crate::checkpoint::{JobMeta, RunRecord, Store};

/// What `batchrun report` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Format {
    /// The whole report, one HTML file.
    #[default]
    Html,
    /// The pacing picture alone, one SVG file.
    Svg,
}

/// Where the report goes when no `-o` is given: `<input stem>.report.html`
/// (or `.report.svg`) beside the input, a shard's tag before `.report`.
pub fn default_path(input: &Path, shard: Option<crate::fleet::Shard>, format: Format) -> PathBuf {
    let stem = input.file_stem().unwrap_or_default().to_string_lossy();
    let ext = match format {
        Format::Html => "html",
        Format::Svg => "svg",
    };
    let tag = shard.map(|s| format!(".{}", s.tag())).unwrap_or_default();
    input.with_file_name(format!("{stem}{tag}.report.{ext}"))
}

/// A checkpoint the report cannot read: in use by a run, or damaged (said
/// once, with the way forward), or out of reach.
fn unopened(state_dir: &Path, e: crate::checkpoint::CheckpointError) -> anyhow::Error {
    match e {
        crate::checkpoint::CheckpointError::Locked(_) => anyhow::anyhow!(
            "the checkpoint in {} is in use by a run: report once it has ended",
            state_dir.display()
        ),
        e if crate::checkpoint::is_damage(&e) => anyhow::anyhow!(
            "{}",
            crate::checkpoint::damage_advice(state_dir, &e, "Nothing was written")
        ),
        e => anyhow::Error::new(e).context(format!(
            "cannot open the checkpoint in {}",
            state_dir.display()
        )),
    }
}

/// The job of `input` (its canonical path; `None` for a pipe, whose state
/// dir holds only its own jobs) in `state_dir` that ran last.
fn latest_job(state_dir: &Path, input: Option<&str>) -> anyhow::Result<JobMeta> {
    // Opening a store makes one: a report must leave no state behind.
    if !crate::checkpoint::held(state_dir) {
        anyhow::bail!(
            "no checkpoint in {} (was the job run with another --state-dir?)",
            state_dir.display()
        );
    }
    let store = Store::open_to_read(state_dir).map_err(|e| unopened(state_dir, e))?;
    let last_ran = |m: &JobMeta| {
        m.last_run()
            .map_or(0, |r| r.started_unix_ms)
            .max(m.last_active_unix_ms)
            .max(m.created_unix * 1000)
    };
    let jobs = match input {
        Some(i) => store.jobs_for_input(i),
        None => store.jobs(),
    }
    .map_err(|e| unopened(state_dir, e))?;
    jobs.into_iter().max_by_key(last_ran).with_context(|| {
        format!(
            "no job for {} in {}",
            input.unwrap_or("the pipe"),
            state_dir.display()
        )
    })
}

/// Writes the report of `input`'s latest job (found in `state_dir`) to
/// `out`; returns what it wrote, for the line the command prints.
pub fn write(
    state_dir: &Path,
    input: Option<&str>,
    out: &Path,
    format: Format,
) -> anyhow::Result<String> {
    // `-o` naming the input, or a file of the checkpoint, by mistake would
    // replace it with HTML.
    if input.is_some_and(|i| crate::util::same_file(out, Path::new(i))) {
        anyhow::bail!(
            "{} is the input file: the report would replace it; name another with -o",
            out.display()
        );
    }
    // The sidecars beside the outputs (`.NAME.owner`, `.NAME.keys`) say
    // whose the outputs are and which keys a lost checkpoint sends again.
    let name = out.file_name().map(|n| n.to_string_lossy().into_owned());
    if name.is_some_and(|n| n.starts_with('.') && (n.ends_with(".owner") || n.ends_with(".keys"))) {
        anyhow::bail!(
            "{} is one of batchrun's records beside a job's outputs: the report would replace it; name another with -o",
            out.display()
        );
    }
    if crate::util::within(state_dir, out) {
        anyhow::bail!(
            "{} is inside the checkpoint ({}): the report would damage it; name another with -o",
            out.display(),
            state_dir.display()
        );
    }
    let meta = latest_job(state_dir, input)?;
    if holds_results(out, &meta) {
        anyhow::bail!(
            "{} holds a job's results: the report would replace them; name another with -o",
            out.display()
        );
    }
    // Anything else already there (a joblog, a CSV, notes) is the user's:
    // only a report, or nothing, is replaced.
    if !replaceable(out) {
        anyhow::bail!(
            "{} exists and is not a report: the report would replace it; name another with -o, or remove it first",
            out.display()
        );
    }
    let tl = timeline::path(state_dir, &meta.id);
    let (secs, unread) = match timeline::read(&tl) {
        Ok(s) => (s, None),
        // A job run before timelines were kept still has its runs table.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => (Vec::new(), None),
        // So does one whose timeline was lost (a full disk left it empty;
        // another version's): the charts go, not the report.
        Err(e) => (Vec::new(), Some(e)),
    };
    let body = match format {
        Format::Svg => charts::pacing(&secs)?,
        Format::Html => page(&meta, &secs)?,
    };
    std::fs::write(out, body).with_context(|| format!("writing {}", out.display()))?;
    let unread = unread.map_or(String::new(), |e| {
        format!("; its timeline could not be read ({e}): the runs table only")
    });
    Ok(format!(
        "report of job {} ({} seconds of timeline, {} run(s)): {}{unread}",
        meta.id,
        secs.len(),
        meta.runs.len(),
        out.display()
    ))
}

/// Whether writing the report to `out` loses nothing: it names no file, an
/// empty one, or an earlier report (HTML or SVG, as this module writes
/// them).
fn replaceable(out: &Path) -> bool {
    use std::io::Read as _;
    let Ok(file) = std::fs::File::open(out) else {
        // Nothing there, or not a file this could read: the write says.
        return true;
    };
    let mut head = Vec::with_capacity(16);
    if file.take(16).read_to_end(&mut head).is_err() {
        return true;
    }
    head.is_empty() || head.starts_with(b"<!DOCTYPE html>") || head.starts_with(b"<svg ")
}

/// Whether `out` is an output a run wrote: it has an owner record beside
/// it, or it is (a link to) the job's `--out` or `--failures` as last
/// written.
fn holds_results(out: &Path, meta: &JobMeta) -> bool {
    let owned = crate::util::owner_path(out).exists();
    let theirs = meta.outputs.as_ref().is_some_and(|o| {
        crate::util::same_file(out, Path::new(&o.out))
            || crate::util::same_file(out, Path::new(&o.failures))
    });
    owned || theirs
}

/// Text made safe inside HTML (element content and quoted attributes).
fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c => o.push(c),
        }
    }
    o
}

/// A unix time in ms, as RFC 3339 (UTC, to the second).
fn when(ms: Option<u64>) -> String {
    ms.map_or("-".into(), |ms| {
        crate::util::rfc3339(ms / 1000).unwrap_or_else(|| format!("unix time {}", ms / 1000))
    })
}

const STYLE: &str = "body{font-family:sans-serif;margin:24px;color:#222;max-width:1140px}\
table{border-collapse:collapse;margin:8px 0 24px}td,th{border:1px solid #ccc;padding:4px 10px;text-align:right}\
th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}\
figure{margin:0 0 24px}figcaption{color:#555;font-size:90%}.none{color:#777}";

/// The whole page.
fn page(meta: &JobMeta, secs: &[Second]) -> anyhow::Result<String> {
    let mut h = String::new();
    let title = format!("batchrun report: {}", input_label(meta));
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>{}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n<h1>{}</h1>\n",
        esc(&title),
        esc(&title)
    );
    let c = meta.counts();
    let _ = writeln!(
        h,
        "<p>Job <code>{}</code> on <code>{}</code>: {} done, {} failed, {} pending of {}; {} requests, {} rate-limited, {} retries over every run. Last run: {}{}.</p>",
        esc(&meta.id),
        esc(&meta.input),
        c.done,
        c.failed,
        meta.total.saturating_sub(c.done + c.failed),
        meta.total,
        meta.requests,
        meta.rate_limited,
        meta.retries,
        esc(meta.last_state.as_deref().unwrap_or("never finished")),
        meta.halt_reason.as_deref().map(|r| format!(" ({})", esc(r))).unwrap_or_default()
    );
    if secs.is_empty() {
        h.push_str("<p class=\"none\">No timeline was kept for this job: no charts.</p>\n");
    } else {
        let ps = charts::pauses(secs);
        let _ = writeln!(
            h,
            "<h2>Pacing</h2>\n<figure id=\"pacing\">{}<figcaption>{} seconds recorded from {}; {} pause(s) (orange bands: every worker held by a rate-limit 429; green: waiting for credits); red triangles: seconds that got a 429.</figcaption></figure>",
            charts::pacing(secs)?,
            secs.len(),
            when(secs.first().map(|s| s.t * 1000)),
            ps.len()
        );
        let _ = writeln!(
            h,
            "<h2>Latency</h2>\n<figure id=\"latency\">{}</figure>\n<h2>Credits</h2>\n<figure id=\"credits\">{}<figcaption>{}</figcaption></figure>",
            charts::latency(secs)?,
            charts::credits(secs, ahead(meta, secs))?,
            esc(&credits_note(meta, secs))
        );
        outcomes(secs, &mut h);
    }
    // A killed run's record lags the checkpoint by up to a second.
    let c = meta.counts();
    let runs: Vec<RunRecord> = (meta.runs.iter())
        .map(|r| r.caught_up(c.done, c.failed))
        .collect();
    runs_table(&runs, meta.last_active_unix_ms, &mut h);
    h.push_str("</body>\n</html>\n");
    Ok(h)
}

/// Credits spent per second of running: the balance's falls between
/// consecutive seconds, over those seconds (a top-up or a renewal, a rise,
/// counts as none spent; the time between runs is not running).
fn burn_per_s(secs: &[Second]) -> Option<f64> {
    let (mut spent, mut seconds) = (0i64, 0u64);
    for w in secs.windows(2) {
        if let (Some(a), Some(b), true) = (w[0].credits, w[1].credits, w[1].t == w[0].t + 1) {
            spent += (a - b).max(0);
            seconds += 1;
        }
    }
    (seconds > 0 && spent > 0).then(|| spent as f64 / seconds as f64)
}

/// The job's pace of spending and the renewal, for the credits chart's
/// projection.
fn ahead(meta: &JobMeta, secs: &[Second]) -> Option<charts::Ahead> {
    let per_s = burn_per_s(secs)?;
    let last_t = secs.last()?.t as f64;
    let renewal_in = meta
        .meter
        .last
        .and_then(|l| l.renewal)
        .map(|r| r as f64 - last_t);
    Some(charts::Ahead { per_s, renewal_in })
}

/// The balance last seen, the renewal, and how long the balance lasts at
/// the pace the job spent it, against the renewal.
fn credits_note(meta: &JobMeta, secs: &[Second]) -> String {
    let Some(last) = meta.meter.last else {
        return "No metered response seen: the credit balance is unknown.".into();
    };
    let mut note = format!(
        "Last seen: {} of {} remaining; {}.",
        last.remaining,
        last.max,
        crate::credits::describe_renewal(last.renewal)
    );
    if let (Some(burn), true) = (burn_per_s(secs), last.remaining > 0) {
        let lasts = (last.remaining as f64 / burn).round() as u64;
        let _ = write!(
            note,
            " At this job's pace ({:.1} credits a second of running) they last {} of running",
            burn,
            humantime::format_duration(Duration::from_secs(lasts))
        );
        let ends = meta.last_active_unix_ms / 1000 + lasts;
        note.push_str(match last.renewal {
            Some(r) if ends < r => ", so they run out before the renewal if it keeps running.",
            Some(_) => ": enough until the renewal.",
            None => ".",
        });
    }
    note
}

/// Calls by what they got back, over the timeline.
fn outcomes(secs: &[Second], h: &mut String) {
    let sum = |f: fn(&Second) -> u32| secs.iter().map(|s| f(s) as u64).sum::<u64>();
    let rows: [(&str, u64); 7] = [
        ("sent", sum(|s| s.sent)),
        ("2xx", sum(|s| s.ok)),
        ("429 rate limit", sum(|s| s.rate_limited)),
        ("429 credits exhausted", sum(|s| s.credits_exhausted)),
        ("other 4xx", sum(|s| s.client_error)),
        ("5xx", sum(|s| s.server_error)),
        ("no response", sum(|s| s.no_response)),
    ];
    h.push_str("<h2>Outcomes</h2>\n<table id=\"outcomes\"><tr><th>calls</th><th>count</th></tr>\n");
    for (name, n) in rows {
        let _ = writeln!(h, "<tr><td>{name}</td><td>{n}</td></tr>");
    }
    h.push_str("</table>\n");
}

/// The job's runs, oldest first.
fn runs_table(runs: &[RunRecord], last_active_ms: u64, h: &mut String) {
    h.push_str("<h2>Runs</h2>\n");
    if runs.is_empty() {
        h.push_str("<p class=\"none\">No run recorded.</p>\n");
        return;
    }
    h.push_str("<table id=\"runs\"><tr><th>start</th><th>end</th><th>duration</th><th>state</th><th>exit code</th><th>done</th><th>failed</th><th>requests</th><th>429s</th></tr>\n");
    for r in runs {
        // A killed run lasted until the job's last call.
        let dur = r.duration_s(last_active_ms.max(r.started_unix_ms));
        let _ = writeln!(
            h,
            "<tr><td>{}</td><td>{}</td><td>{dur:.1} s</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            when(Some(r.started_unix_ms)),
            r.ended_unix_ms.map_or("never ended".into(), |e| when(Some(e))),
            esc(r.state.as_deref().unwrap_or("-")),
            r.exit_code.map_or("-".into(), |c| c.to_string()),
            r.done,
            r.failed,
            r.requests,
            r.rate_limited
        );
    }
    h.push_str("</table>\n");
}

/// The input's file name as the job knows it, else its path.
fn input_label(meta: &JobMeta) -> &str {
    match meta.input_name.is_empty() {
        true => &meta.input,
        false => &meta.input_name,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_burn_counts_falls_over_running_seconds_only() {
        let s = |t, c| Second {
            t,
            credits: Some(c),
            ..Second::default()
        };
        // 100 -> 90 -> 80, a top-up to 500, then a gap between runs.
        let secs = [s(1, 100), s(2, 90), s(3, 80), s(4, 500), s(50, 10)];
        assert_eq!(burn_per_s(&secs), Some(20.0 / 3.0));
        assert_eq!(burn_per_s(&secs[..1]), None);
    }

    #[test]
    fn text_is_escaped_and_the_default_path_sits_beside_the_input() {
        assert_eq!(
            esc("<a href=\"x\">&'"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;"
        );
        assert_eq!(
            default_path(Path::new("/d/items.jsonl"), None, Format::Html),
            Path::new("/d/items.report.html")
        );
        assert_eq!(
            default_path(Path::new("items.csv"), None, Format::Svg),
            Path::new("items.report.svg")
        );
        let shard = "2/3".parse().ok();
        assert_eq!(
            default_path(Path::new("/d/items.jsonl"), shard, Format::Html),
            Path::new("/d/items.shard-2-of-3.report.html")
        );
    }
}
