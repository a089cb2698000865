//! The value parsers of the command line's options: each turns one
//! argument into its value, or says why it cannot.

use std::time::Duration;

pub(super) fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s)
        .map_err(|e| format!("{s:?} is not a duration such as 30s, 5m, 6h: {e}"))
}

pub(super) fn parse_positive_duration(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d.is_zero() {
        return Err("must be longer than zero".into());
    }
    Ok(d)
}

pub(super) fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (n, unit) = t.split_at(split);
    let n: usize = n
        .parse()
        .map_err(|_| format!("{s:?} is not a size such as 1MiB"))?;
    let mult = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1_000,
        "kib" => 1 << 10,
        "m" | "mb" => 1_000_000,
        "mib" => 1 << 20,
        "g" | "gb" => 1_000_000_000,
        "gib" => 1 << 30,
        _ => {
            return Err(format!(
                "{s:?}: unknown unit (B, KiB, MiB, GiB, KB, MB, GB)"
            ))
        }
    };
    match n.checked_mul(mult) {
        Some(v) if v >= 1 => Ok(v),
        _ => Err(format!("{s:?} must be at least 1 byte and fit in memory")),
    }
}

pub(super) fn parse_header(s: &str) -> Result<(String, String), String> {
    let (name, value) = s
        .split_once(':')
        .ok_or_else(|| format!("{s:?} is not 'Name: value'"))?;
    let name = name.trim();
    if name.is_empty() || reqwest::header::HeaderName::from_bytes(name.as_bytes()).is_err() {
        return Err(format!("{name:?} is not a valid header name"));
    }
    Ok((name.to_string(), value.trim().to_string()))
}

/// Credit alert thresholds, as fractions of the cycle's allowance used.
#[derive(Debug, Clone, PartialEq)]
pub struct Thresholds(pub Vec<f64>);

pub(super) fn parse_thresholds(s: &str) -> Result<Thresholds, String> {
    crate::credits::parse_thresholds(s).map(Thresholds)
}

pub(super) fn parse_webhook(s: &str) -> Result<String, String> {
    crate::credits::check_webhook_url(s).map(|()| s.to_string())
}

pub(super) fn parse_headroom(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(f) if f > 0.0 && f <= 1.0 => Ok(f),
        _ => Err(format!("{s:?} must be a fraction in (0, 1], such as 0.9")),
    }
}

pub(super) fn parse_fleet_key(s: &str) -> Result<String, String> {
    crate::fleet::keys::check_name(s).map(|()| s.to_string())
}

/// `--usage`: a JSON pointer (`/usage/total_tokens`), or empty for none.
pub(super) fn parse_usage(s: &str) -> Result<String, String> {
    if s.is_empty() || s.starts_with('/') {
        Ok(s.to_string())
    } else {
        Err(format!("{s:?} is not a JSON pointer: it starts with / (such as /usage/total_tokens), or is empty for none"))
    }
}

/// `--cost`: a usage error naming the expression when it cannot be read.
pub(super) fn parse_cost(s: &str) -> Result<crate::cost::CostExpr, String> {
    s.parse()
        .map_err(|e: crate::cost::CostParseError| e.to_string())
}
