//! Leaf helpers every layer may use: they import nothing of the crate.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sha2::{Digest, Sha256};

/// A boxed, sendable future: what the object-safe traits (`Transport`,
/// `Pacer`) return.
pub use futures_util::future::BoxFuture;

/// The lowercase hex SHA-256 of `parts`, each followed by a NUL so that
/// `["ab", "c"]` and `["a", "bc"]` differ.
pub fn sha_hex(parts: &[&[u8]]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p);
        h.update([0u8]);
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// A unix time in whole seconds as RFC 3339 (UTC), or `None` past the year
/// 9999, where humantime's formatter errors out (and `to_string` would
/// panic): a damaged record or a garbled header must not.
pub fn rfc3339(secs: u64) -> Option<String> {
    // Last second of 9999-12-31.
    const MAX_SECS: u64 = 253_402_300_799;
    if secs > MAX_SECS {
        return None;
    }
    let t = UNIX_EPOCH.checked_add(Duration::from_secs(secs))?;
    Some(humantime::format_rfc3339_seconds(t).to_string())
}

/// Wall-clock time since the epoch (zero if the clock is before it).
pub fn unix_now() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

/// Whether `a` and `b` are one file: one path once resolved, or two
/// names (hard links) of one inode.
pub fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    if resolved(a) == resolved(b) {
        return true;
    }
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        _ => false,
    }
}

/// A path made absolute and resolved as far as it exists, so two spellings
/// of one file compare equal even before the file is created.
pub fn resolved(p: &Path) -> PathBuf {
    resolved_within(p, 8)
}

/// [`resolved`], following at most `links` dangling symlinks: a link to a
/// file not made yet stands for that file (`--failures` linked to where
/// `--out` will be).
fn resolved_within(p: &Path, links: u32) -> PathBuf {
    if let Ok(c) = std::fs::canonicalize(p) {
        return c;
    }
    if let (Some(links), Ok(target)) = (links.checked_sub(1), std::fs::read_link(p)) {
        let base = p.parent().unwrap_or(Path::new(""));
        return resolved_within(&base.join(target), links);
    }
    let parent = p.parent().filter(|d| !d.as_os_str().is_empty());
    let dir = parent.map_or_else(|| PathBuf::from("."), Path::to_path_buf);
    let dir = std::fs::canonicalize(&dir).unwrap_or(dir);
    match p.file_name() {
        Some(name) => dir.join(name),
        None => dir,
    }
}

/// Whether `file` is inside `dir`: by its path (made there, or to be), or
/// as a hard link to one of the files under it.
pub fn within(dir: &Path, file: &Path) -> bool {
    resolved(file).starts_with(resolved(dir)) || holds_file(dir, file)
}

/// Where the record of who wrote the output `p` lives: `.NAME.owner`
/// beside it.
pub fn owner_path(p: &Path) -> PathBuf {
    let name = p
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    p.with_file_name(format!(".{name}.owner"))
}

/// Whether `file`, if it exists, is one of the files under `dir` (by inode,
/// so a hard link under another name counts too).
fn holds_file(dir: &Path, file: &Path) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    let Ok(m) = std::fs::metadata(file) else {
        return false;
    };
    let key = (m.dev(), m.ino());
    // A checkpoint is a few levels deep at most.
    let mut todo = vec![(dir.to_path_buf(), 0u8)];
    while let Some((d, depth)) = todo.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let Ok(meta) = entry.metadata() else { continue };
            if meta.is_dir() && depth < 4 {
                todo.push((entry.path(), depth + 1));
            } else if (meta.dev(), meta.ino()) == key {
                return true;
            }
        }
    }
    false
}

/// An input path as its jobs record it: canonical, or, for an input since
/// deleted or moved away, absolute as given (its checkpoint still knows
/// it: `status` and `report` read no input).
pub fn recorded_path(p: &Path) -> std::io::Result<PathBuf> {
    match std::fs::canonicalize(p) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => std::path::absolute(p),
        other => other,
    }
}

/// `raw` as compact JSON text when it is valid JSON: its whitespace between
/// tokens taken out, everything else as the server wrote it. Parsing it
/// into a value and writing that out would round an integer beyond 64 bits
/// (or a decimal's last digits) to the nearest float.
pub fn compact_json(raw: &[u8]) -> Option<String> {
    serde_json::from_slice::<serde::de::IgnoredAny>(raw).ok()?;
    let mut out = Vec::with_capacity(raw.len());
    let (mut in_string, mut escaped) = (false, false);
    for &b in raw {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
        } else if b == b'"' {
            in_string = true;
        } else if matches!(b, b' ' | b'\t' | b'\n' | b'\r') {
            continue;
        }
        out.push(b);
    }
    // Valid JSON is valid UTF-8, and only ASCII whitespace was taken out.
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::compact_json;

    #[test]
    fn json_is_compacted_as_written_and_anything_else_is_none() {
        let raw = b"{\n  \"id\": 12345678901234567890123,\n  \"pi\": 3.14159265358979323846,\n  \"s\": \"a \\\" b\\\\\", \"t\": \" x \"\n}\r\n";
        assert_eq!(
            compact_json(raw).as_deref(),
            Some(
                r#"{"id":12345678901234567890123,"pi":3.14159265358979323846,"s":"a \" b\\","t":" x "}"#
            )
        );
        assert_eq!(compact_json(b"[1, 2]").as_deref(), Some("[1,2]"));
        assert_eq!(compact_json(b"not json"), None);
        assert_eq!(compact_json(b"{\"a\": 1"), None);
        assert_eq!(compact_json(b""), None);
    }
}
