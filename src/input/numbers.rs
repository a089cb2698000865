//! Numbers of a JSON line that would be sent as another number: serde_json
//! keeps an integer in 64 bits and anything else as an f64, and sends the
//! f64's shortest spelling. An integer too wide for 64 bits, or a decimal
//! with more digits than an f64 holds (`1234567890123456.78`, sent as
//! `1234567890123456.8`), would reach the API changed, so the line is
//! refused instead, naming the number. A spelling that changes and a value
//! that does not (`1e2` sent as `100.0`, `1.50` as `1.5`) is the same
//! number to whoever reads it, and goes.

/// A number literal of a line that would be sent as another value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Rounded<'a> {
    /// Its column in the line, from 1.
    pub column: usize,
    /// The literal as written.
    pub literal: &'a str,
    /// What would be sent in its place; `None` for an integer too wide for
    /// 64 bits (sent as the nearest f64).
    pub sent: Option<String>,
}

/// The first number literal of the JSON `text`, outside strings, that
/// would be sent as another value. `text` is valid JSON.
pub(super) fn first_rounded(text: &str) -> Option<Rounded<'_>> {
    let b = text.as_bytes();
    let (mut i, mut in_string) = (0, false);
    while i < b.len() {
        match (in_string, b[i]) {
            (true, b'\\') => i += 1,
            (_, b'"') => in_string = !in_string,
            (false, c) if c == b'-' || c.is_ascii_digit() => {
                let start = i;
                while i < b.len() && matches!(b[i], b'0'..=b'9' | b'.' | b'e' | b'E' | b'+' | b'-')
                {
                    i += 1;
                }
                let literal = &text[start..i];
                if let Some(r) = rounded(literal, start + 1) {
                    return Some(r);
                }
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    None
}

/// `literal` at `column`, if it would be sent as another value.
fn rounded(literal: &str, column: usize) -> Option<Rounded<'_>> {
    let integer = !literal.contains(['.', 'e', 'E']);
    if integer {
        let fits = literal.parse::<i64>().is_ok() || literal.parse::<u64>().is_ok();
        return (!fits).then_some(Rounded {
            column,
            literal,
            sent: None,
        });
    }
    // The double nearest the literal (Rust's parse is correctly rounded)
    // and its shortest spelling, as serde_json prints it: when that is the
    // literal's value, a double holds the literal. (serde_json's own parse,
    // without its `float_roundtrip` feature, may land one unit of the 17th
    // digit off; judged by it, one float in ten of a computed column would
    // be refused. Turning the feature on would change the digests, and so
    // the shards, of such items in jobs under way.)
    let f: f64 = literal.parse().ok().filter(|f: &f64| f.is_finite())?;
    let sent = serde_json::to_string(&f).ok()?;
    let same = matches!((decimal(literal), decimal(&sent)), (Some(a), Some(b)) if a == b);
    (!same).then_some(Rounded {
        column,
        literal,
        sent: Some(sent),
    })
}

/// The value of a JSON number literal as (negative, significant digits,
/// exponent): digits × 10^exponent, no leading or trailing zero in the
/// digits; zero is `(false, "", 0)`. `None` for an exponent beyond i64.
fn decimal(literal: &str) -> Option<(bool, String, i64)> {
    let (negative, rest) = match literal.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, literal),
    };
    let (mantissa, exponent) = match rest.find(['e', 'E']) {
        Some(at) => (&rest[..at], rest[at + 1..].parse::<i64>().ok()?),
        None => (rest, 0),
    };
    let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let all = format!("{whole}{fraction}");
    let digits = all.trim_start_matches('0');
    let significant = digits.trim_end_matches('0');
    if significant.is_empty() {
        return Some((false, String::new(), 0));
    }
    let trailing = (digits.len() - significant.len()) as i64;
    let exponent = exponent
        .checked_sub(fraction.len() as i64)?
        .checked_add(trailing)?;
    Some((negative, significant.to_string(), exponent))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn first(text: &str) -> Option<(usize, String, Option<String>)> {
        first_rounded(text).map(|r| (r.column, r.literal.to_string(), r.sent))
    }

    #[test]
    fn a_decimal_an_f64_cannot_hold_is_found_with_what_would_be_sent() {
        assert_eq!(
            first(r#"{"amount": 1234567890123456.78}"#),
            Some((
                12,
                "1234567890123456.78".into(),
                Some("1234567890123456.8".into())
            ))
        );
        assert_eq!(
            first(r#"[1, "9007199254740993.5", 0.30000000000000000001]"#),
            Some((27, "0.30000000000000000001".into(), Some("0.3".into())))
        );
        assert_eq!(
            first(r#"{"n": -9007199254740993.5}"#).map(|f| f.2),
            Some(Some("-9007199254740994.0".into()))
        );
        // Too small for a double, however its exponent is written.
        for tiny in ["1e-400", "1e-99999999999999999999"] {
            assert_eq!(
                first(&format!("[{tiny}]")),
                Some((2, tiny.into(), Some("0.0".into()))),
                "{tiny}"
            );
        }
    }

    #[test]
    fn another_spelling_of_the_same_value_goes() {
        for ok in [
            r#"{"a": 1e2, "b": 1.50, "c": 0.1, "d": -0.0, "e": 2.5E-3, "f": 100}"#,
            r#"[1.7976931348623157e308, 5e-324, 0.000001, 123456789.125, 1E+2]"#,
            r#"{"id": 18446744073709551615, "x": -9223372036854775808}"#,
            // 17 digits a double holds, which serde_json's own parse reads
            // one unit off (a review found one float in ten so refused).
            r#"[956.0342718892493, 0.1000000000000000000000000000000000000000000000000000]"#,
        ] {
            assert_eq!(first(ok), None, "{ok}");
        }
    }

    #[test]
    fn an_integer_too_wide_for_64_bits_is_found() {
        assert_eq!(
            first(r#"{"a": [1.5, {"id": 123456789012345678901234567890}]}"#),
            Some((20, "123456789012345678901234567890".into(), None))
        );
        assert_eq!(first(r#"{"note": "123456789012345678901234567890"}"#), None);
    }
}
