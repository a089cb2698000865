//! Lenient readers for the value syntaxes the dialects use: structured-field
//! lists (RFC 8941, as far as rate-limit headers need), Go durations, and
//! RFC 3339 instants.

use std::time::Duration;

/// A list member's item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Item {
    /// A string or token: a policy's name.
    Name(String),
    /// An integer: a quota (the older IETF form).
    Int(u64),
    /// Anything else (a decimal, a byte sequence, nothing).
    Other,
}

/// One list member with its parameters (`;key=value`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Member {
    pub(super) item: Item,
    params: Vec<(String, String)>,
}

impl Member {
    fn param(&self, key: &str) -> Option<&str> {
        self.params
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(key))
            .map(|(_, v)| v.as_str())
    }

    /// A parameter as a whole number.
    pub(super) fn int(&self, key: &str) -> Option<u64> {
        self.param(key)?.parse().ok()
    }

    /// Whether the parameter `key` is there but no whole number.
    pub(super) fn unreadable(&self, key: &str) -> bool {
        self.param(key).is_some() && self.int(key).is_none()
    }

    /// A parameter as text (quotes removed).
    pub(super) fn text(&self, key: &str) -> Option<&str> {
        self.param(key)
    }
}

/// Splits `s` on `sep` outside double quotes (a backslash escapes inside).
fn split_outside_quotes(s: &str, sep: char) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut quoted, mut escaped, mut from) = (false, false, 0);
    for (i, c) in s.char_indices() {
        if escaped {
            escaped = false;
        } else if quoted && c == '\\' {
            escaped = true;
        } else if c == '"' {
            quoted = !quoted;
        } else if c == sep && !quoted {
            parts.push(&s[from..i]);
            from = i + c.len_utf8();
        }
    }
    parts.push(&s[from..]);
    parts
}

/// A bare item's text: a quoted string unquoted, anything else trimmed.
fn bare(s: &str) -> String {
    let t = s.trim();
    match t.strip_prefix('"').and_then(|r| r.strip_suffix('"')) {
        Some(inner) => inner.replace("\\\"", "\"").replace("\\\\", "\\"),
        None => t.to_string(),
    }
}

/// The members of a structured-field list, leniently: what is not a
/// member is skipped.
pub(super) fn members(s: &str) -> Vec<Member> {
    split_outside_quotes(s, ',')
        .into_iter()
        .filter(|m| !m.trim().is_empty())
        .map(|m| {
            let mut parts = split_outside_quotes(m, ';').into_iter();
            let head = parts.next().unwrap_or_default().trim();
            let item = if head.starts_with('"') {
                Item::Name(bare(head))
            } else if let Ok(q) = head.parse::<u64>() {
                Item::Int(q)
            } else if head.starts_with(|c: char| c.is_ascii_alphabetic() || c == '*') {
                Item::Name(head.to_string())
            } else {
                Item::Other
            };
            let params = parts
                .filter_map(|p| {
                    let (k, v) = p.split_once('=').unwrap_or((p, "?1"));
                    let k = k.trim();
                    (!k.is_empty()).then(|| (k.to_string(), bare(v)))
                })
                .collect();
            Member { item, params }
        })
        .collect()
}

/// A Go-style duration (`6m0s`, `1s`, `20ms`, `1h2m3.5s`); a bare number
/// is seconds. `None` for anything else.
pub(crate) fn go_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    if s.is_empty() {
        return None;
    }
    if let Ok(secs) = s.parse::<f64>() {
        return Duration::try_from_secs_f64(secs).ok();
    }
    let mut total = Duration::ZERO;
    let mut rest = s;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let n: f64 = rest[..num_len].parse().ok()?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 1e-3,
            "us" | "µs" | "μs" => 1e-6,
            "ns" => 1e-9,
            _ => return None,
        };
        rest = &rest[unit_len..];
        total = total.checked_add(Duration::try_from_secs_f64(n * scale).ok()?)?;
    }
    Some(total)
}

/// An RFC 3339 instant (`2024-06-01T12:00:30Z`, with fractional seconds
/// or a `+02:00` offset) as time since the unix epoch.
pub(super) fn rfc3339_unix(s: &str) -> Option<Duration> {
    let s = s.trim();
    if !s.is_ascii() || s.len() < 20 {
        return None;
    }
    // The offset: `Z`, or `±HH:MM` at the end.
    let (local, offset_secs): (&str, i64) = if let Some(l) = s.strip_suffix(['Z', 'z']) {
        (l, 0)
    } else {
        let (l, off) = s.split_at(s.len() - 6);
        let sign = match off.as_bytes()[0] {
            b'+' => 1,
            b'-' => -1,
            _ => return None,
        };
        let (hh, mm) = off[1..].split_once(':')?;
        let secs = hh.parse::<i64>().ok()? * 3600 + mm.parse::<i64>().ok()? * 60;
        (l, sign * secs)
    };
    // RFC 3339 allows a lowercase `t` between date and time (and a space).
    let local = match local.as_bytes().get(10) {
        Some(b't') => format!("{}T{}", &local[..10], &local[11..]),
        _ => local.to_string(),
    };
    let at = humantime::parse_rfc3339_weak(&local).ok()?;
    let unix = at.duration_since(std::time::UNIX_EPOCH).ok()?;
    // Local time minus the offset is UTC.
    if offset_secs >= 0 {
        unix.checked_sub(Duration::from_secs(offset_secs.unsigned_abs()))
    } else {
        unix.checked_add(Duration::from_secs(offset_secs.unsigned_abs()))
    }
}
