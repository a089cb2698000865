//! Copying an input that can be read only once (standard input, a FIFO,
//! `<(cmd)`) into a regular file, since a run reads its input several times.

use std::ffi::{OsStr, OsString};
use std::fs::{self, File, OpenOptions};
use std::io::{self, IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::bytes::{io_reason, HashingReader};
use super::{display, is_stdin, label, InputError};

/// Size of each read from the source while spooling.
const CHUNK: usize = 64 * 1024;

/// An input ready to be read as many times as the run needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spooled {
    /// Where to read the input from: the copy [`spool`] made, or the path as
    /// given when it already was a regular file.
    pub path: PathBuf,
    /// Whether `path` is a copy (the original could be read only once).
    pub spooled: bool,
    /// For a copy, the lowercase hex SHA-256 of its content: the same value
    /// [`super::fingerprint`] and [`super::scan`] give it, and the stem of its
    /// file name. `None` for a regular file, which `spool` does not read.
    pub sha256: Option<String>,
    /// For a copy, whether its last line ends without a newline: what a
    /// writer that died mid-line leaves, its last item cut short.
    pub unterminated: bool,
}

/// Makes `path` readable more than once: `-` (standard input) or anything that
/// is not a regular file (a FIFO, a character device, the `/dev/fd/N` of
/// `<(cmd)`) is copied once into `spool_dir`; a regular file is returned as
/// is, unread.
///
/// The copy is named `<sha256 of content>[.<original extension>]`, so
/// [`super::detect_format`] still works on it when the original had an
/// extension (`items.jsonl` as a FIFO); standard input and `<(cmd)` have none
/// and need `--format`. It is written under a name unique to this process,
/// fsynced, then renamed into place, so a crash never leaves a truncated file
/// under a content name. `spool_dir` is created if needed (mode 0700: the
/// items may be private); the copies are left there for the caller to remove.
///
/// How a run should use it: detect the format on the path as the user gave it
/// (clearer messages), spool before the scan, then scan, feed and write output
/// from [`Spooled::path`] only. The run finds a pipe's job by
/// [`Spooled::sha256`] (the same content, or that content with rows appended,
/// resumes it; other content makes a job of its own) and removes the copy
/// when it ends. Error messages from later reads name the spooled path, so
/// the caller may want to say which input it stands for.
///
/// # Errors
///
/// [`InputError::Io`], naming the input (`standard input` for `-`), when it
/// does not exist, is a directory, is an interactive terminal, cannot be read,
/// or cannot be written into `spool_dir`.
pub fn spool(path: &Path, spool_dir: &Path) -> Result<Spooled, InputError> {
    if is_stdin(path) {
        let stdin = io::stdin();
        // Reading a terminal would wait silently for typed items; a missing
        // pipe is the likelier mistake.
        if stdin.is_terminal() {
            return Err(io_error(
                path,
                "is a terminal; pipe the items in (cmd | batchrun ... -) or name a file".to_owned(),
            ));
        }
        return copy_in(stdin.lock(), path, None, spool_dir);
    }
    let meta = fs::metadata(path).map_err(|e| io_error(path, io_reason(&e)))?;
    if meta.is_file() {
        return Ok(Spooled {
            path: path.to_owned(),
            spooled: false,
            sha256: None,
            unterminated: false,
        });
    }
    if meta.is_dir() {
        return Err(io_error(path, "is a directory, not a file".to_owned()));
    }
    // For a FIFO this blocks until a writer opens the other end, as any
    // reader of it would.
    let source = File::open(path).map_err(|e| io_error(path, io_reason(&e)))?;
    copy_in(source, path, path.extension(), spool_dir)
}

/// Whether `path` is a copy [`spool`] made (`spool/<sha256>[.ext]`): a
/// job's input that was a pipe, the copy removed when its run ended.
pub fn is_spooled_copy(path: &Path) -> bool {
    let in_spool = path.parent().and_then(Path::file_name) == Some(OsStr::new("spool"));
    let hashed = path.file_stem().is_some_and(|s| {
        s.len() == 64 && s.to_string_lossy().bytes().all(|b| b.is_ascii_hexdigit())
    });
    in_spool && hashed
}

fn io_error(path: &Path, reason: String) -> InputError {
    InputError::Io {
        path: label(path),
        reason,
    }
}

fn spool_error(path: &Path, spool_dir: &Path, err: &io::Error) -> InputError {
    io_error(
        path,
        format!(
            "cannot copy it into {}: {}",
            display(spool_dir),
            io_reason(err)
        ),
    )
}

/// Copies `source` into `spool_dir` under its content name.
fn copy_in(
    source: impl Read,
    path: &Path,
    ext: Option<&OsStr>,
    spool_dir: &Path,
) -> Result<Spooled, InputError> {
    create_dir(spool_dir).map_err(|e| spool_error(path, spool_dir, &e))?;
    sweep_partials(spool_dir);
    let partial = spool_dir.join(partial_name());
    let finished = write_partial(source, &partial, path, spool_dir).and_then(|(sha256, last)| {
        let mut name = OsString::from(&sha256);
        if let Some(ext) = ext {
            name.push(".");
            name.push(ext);
        }
        let target = spool_dir.join(name);
        // Same name, same content: replacing an earlier copy is harmless.
        fs::rename(&partial, &target).map_err(|e| spool_error(path, spool_dir, &e))?;
        Ok((target, sha256, last))
    });
    let (target, sha256, last) = match finished {
        Ok(done) => done,
        Err(e) => {
            let _ = fs::remove_file(&partial);
            return Err(e);
        }
    };
    // Makes the rename itself durable. Best effort: some file systems refuse
    // to fsync a directory, and the copy is already complete and synced.
    if let Ok(dir) = File::open(spool_dir) {
        let _ = dir.sync_all();
    }
    // Named before the lock: naming reads the list too.
    let name = label(path);
    super::SPOOLED_AS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push((target.clone(), name));
    Ok(Spooled {
        path: target,
        spooled: true,
        sha256: Some(sha256),
        unterminated: last.is_some_and(|b| b != b'\n'),
    })
}

/// A name no other spool in flight can take: this process's id and a
/// counter, dot-prefixed so it is not mistaken for a finished copy.
fn partial_name() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!(".partial-{}-{n}", std::process::id())
}

/// Removes the partial copies that processes killed while spooling left
/// (`.partial-PID-N` of a PID no longer running): they hold the items.
fn sweep_partials(spool_dir: &Path) {
    let Ok(entries) = fs::read_dir(spool_dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let pid = name
            .strip_prefix(".partial-")
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<i32>().ok());
        // SAFETY: signal 0 sends nothing; it only asks whether the process
        // exists.
        let gone = pid.is_some_and(|pid| {
            pid > 0
                && unsafe { libc::kill(pid, 0) } != 0
                && io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
        });
        if gone {
            let _ = fs::remove_file(e.path());
        }
    }
}

fn create_dir(dir: &Path) -> io::Result<()> {
    let mut builder = fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir)
}

/// Writes all of `source` to the new file `partial` and syncs it; returns the
/// content's SHA-256 and its last byte. Read and write failures are told
/// apart because only the latter is about the spool directory.
fn write_partial(
    source: impl Read,
    partial: &Path,
    path: &Path,
    spool_dir: &Path,
) -> Result<(String, Option<u8>), InputError> {
    let mut options = OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut out = options
        .open(partial)
        .map_err(|e| spool_error(path, spool_dir, &e))?;
    let mut source = HashingReader::new(source);
    let mut buf = vec![0u8; CHUNK];
    let mut last = None;
    loop {
        let n = match source.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(io_error(path, format!("read error: {}", io_reason(&e)))),
        };
        let chunk = buf.get(..n).unwrap_or_default();
        last = chunk.last().copied().or(last);
        out.write_all(chunk)
            .map_err(|e| spool_error(path, spool_dir, &e))?;
    }
    out.sync_all()
        .map_err(|e| spool_error(path, spool_dir, &e))?;
    Ok((source.finish(), last))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::input::test_support::{read_all, TempDir, TempFile};
    use crate::input::{detect_format, fingerprint, Format};
    use sha2::{Digest, Sha256};
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    use std::thread::{self, JoinHandle};

    fn sha_hex(bytes: &[u8]) -> String {
        Sha256::digest(bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    fn mkfifo(path: &Path) {
        let c = CString::new(path.as_os_str().as_bytes()).unwrap();
        // SAFETY: `c` is a valid NUL-terminated path that outlives the call.
        let rc = unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
        assert_eq!(
            rc,
            0,
            "mkfifo {}: {}",
            path.display(),
            io::Error::last_os_error()
        );
    }

    /// Writes `bytes` into `sink` from another thread, as the other end of a
    /// pipe would; opening a FIFO for writing blocks until its reader opens.
    fn feed(sink: impl FnOnce() -> File + Send + 'static, bytes: Vec<u8>) -> JoinHandle<()> {
        thread::spawn(move || {
            let mut out = sink();
            out.write_all(&bytes).expect("write into the pipe");
        })
    }

    fn write_end(path: &Path) -> impl FnOnce() -> File + Send + 'static {
        let path = path.to_owned();
        move || {
            OpenOptions::new()
                .write(true)
                .open(path)
                .expect("open fifo")
        }
    }

    fn entries(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    /// More than a pipe's buffer, so the writer has to wait for the reader.
    fn many_lines(tag: &str) -> Vec<u8> {
        (0..5000)
            .map(|i| format!("{{\"id\":{i},\"tag\":\"{tag}\"}}\n"))
            .collect::<String>()
            .into_bytes()
    }

    #[test]
    fn a_copy_whose_last_line_has_no_newline_says_so() {
        let dir = TempDir::new("spool-unterminated");
        let copy = |bytes: &'static [u8]| {
            copy_in(bytes, Path::new("-"), None, dir.path())
                .unwrap()
                .unterminated
        };
        assert!(copy(b"n,name\n1,a\n2,b"), "cut short");
        assert!(!copy(b"n,name\n1,a\n2,b\n"));
        assert!(!copy(b""), "nothing at all is no cut line");
    }

    #[test]
    fn regular_file_is_returned_unread_and_uncopied() {
        let f = TempFile::new("plain.jsonl", b"{}\n");
        let dir = TempDir::new("spool-unused");
        let s = spool(f.path(), dir.path()).unwrap();
        assert_eq!(
            s,
            Spooled {
                path: f.path().to_owned(),
                spooled: false,
                sha256: None,
                unterminated: false,
            }
        );
        assert!(!dir.path().exists(), "no copy, no spool directory");
    }

    #[test]
    fn fifo_is_copied_once_under_its_content_hash_keeping_the_extension() {
        let root = TempDir::new("fifo");
        fs::create_dir(root.path()).unwrap();
        let fifo = root.path().join("items.jsonl");
        mkfifo(&fifo);
        let spool_dir = root.path().join("spool/nested");
        let bytes = many_lines("a");

        let writer = feed(write_end(&fifo), bytes.clone());
        let s = spool(&fifo, &spool_dir).unwrap();
        writer.join().unwrap();

        let hash = sha_hex(&bytes);
        assert!(s.spooled);
        assert_eq!(s.sha256.as_deref(), Some(hash.as_str()));
        assert_eq!(s.path, spool_dir.join(format!("{hash}.jsonl")));
        assert_eq!(fs::read(&s.path).unwrap(), bytes);
        assert_eq!(fingerprint(&s.path).unwrap(), hash);
        assert_eq!(detect_format(&s.path, None).ok(), Some(Format::Jsonl));
        let items = read_all(&s.path, Format::Jsonl).unwrap();
        assert_eq!(items.len(), 5000);
        assert_eq!(
            items[4999].value,
            serde_json::json!({"id": 4999, "tag": "a"})
        );

        // The same content again lands on the same file, so a re-run finds
        // the same job; other content gets its own.
        let writer = feed(write_end(&fifo), bytes.clone());
        let again = spool(&fifo, &spool_dir).unwrap();
        writer.join().unwrap();
        assert_eq!(again, s);
        let other_bytes = many_lines("b");
        let writer = feed(write_end(&fifo), other_bytes.clone());
        let other = spool(&fifo, &spool_dir).unwrap();
        writer.join().unwrap();
        assert_ne!(other.path, s.path);
        assert_eq!(fs::read(&other.path).unwrap(), other_bytes);
        // No partial file is left behind.
        let mut want = vec![
            format!("{hash}.jsonl"),
            format!("{}.jsonl", sha_hex(&other_bytes)),
        ];
        want.sort();
        assert_eq!(entries(&spool_dir), want);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn process_substitution_is_copied_without_extension() {
        use std::os::fd::FromRawFd;
        let mut fds = [0; 2];
        // SAFETY: `fds` has room for the two descriptors pipe2 writes.
        // O_CLOEXEC keeps processes spawned by parallel tests from holding
        // the write end open, which would delay our end of file.
        let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
        assert_eq!(rc, 0, "pipe2: {}", io::Error::last_os_error());
        // SAFETY: both descriptors are fresh and each is owned by one File.
        let (read_end, write_end) =
            unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) };
        let dev_fd = PathBuf::from(format!("/dev/fd/{}", fds[0]));
        let spool_dir = TempDir::new("procsub");
        let bytes = b"id,name\n1,a\n".to_vec();

        let writer = feed(move || write_end, bytes.clone());
        let s = spool(&dev_fd, spool_dir.path()).unwrap();
        writer.join().unwrap();
        drop(read_end);

        assert!(s.spooled);
        assert_eq!(s.path, spool_dir.path().join(sha_hex(&bytes)));
        assert_eq!(fs::read(&s.path).unwrap(), bytes);
        let err = detect_format(&dev_fd, None).unwrap_err();
        assert!(
            err.to_string().starts_with(&format!(
                "{}: cannot tell the input format",
                dev_fd.display()
            )),
            "{err}"
        );
        let items = read_all(&s.path, Format::Csv).unwrap();
        assert_eq!(items[0].value, serde_json::json!({"id": "1", "name": "a"}));
    }

    #[test]
    fn char_device_is_spooled_too() {
        let spool_dir = TempDir::new("devnull");
        let s = spool(Path::new("/dev/null"), spool_dir.path()).unwrap();
        assert!(s.spooled);
        assert_eq!(s.path, spool_dir.path().join(sha_hex(b"")));
        assert_eq!(fs::read(&s.path).unwrap(), b"");
    }

    #[test]
    fn partial_copies_of_processes_gone_are_swept_and_a_live_ones_kept() {
        let spool_dir = TempDir::new("partials");
        // A process that has ended: its copy is litter holding the items.
        let mut gone = std::process::Command::new("true").spawn().unwrap();
        let gone_pid = gone.id();
        gone.wait().unwrap();
        let dead = spool_dir.path().join(format!(".partial-{gone_pid}-0"));
        let live = spool_dir
            .path()
            // A number this process's own spools never reach in a test run.
            .join(format!(".partial-{}-{}", std::process::id(), u64::MAX));
        fs::create_dir_all(spool_dir.path()).unwrap();
        for p in [&dead, &live] {
            fs::write(p, b"{\"secret\": 1}\n").unwrap();
        }
        spool(Path::new("/dev/null"), spool_dir.path()).unwrap();
        assert!(!dead.exists(), "the dead process's partial copy is swept");
        assert!(live.exists(), "a running spool's own is left alone");
    }

    #[test]
    fn errors_name_the_input() {
        let spool_dir = TempDir::new("errs");
        let missing = std::env::temp_dir().join("batchrun-spool-surely-missing.jsonl");
        assert_eq!(
            spool(&missing, spool_dir.path()).unwrap_err().to_string(),
            format!("{}: no such file", missing.display())
        );
        let tmp = std::env::temp_dir();
        assert_eq!(
            spool(&tmp, spool_dir.path()).unwrap_err().to_string(),
            format!("{}: is a directory, not a file", tmp.display())
        );

        // A spool directory that cannot be made: its parent is a file.
        let blocker = TempFile::new("not-a-dir", b"");
        let bad_dir = blocker.path().join("spool");
        let msg = spool(Path::new("/dev/null"), &bad_dir)
            .unwrap_err()
            .to_string();
        let want = format!("/dev/null: cannot copy it into {}: ", bad_dir.display());
        assert!(msg.starts_with(&want), "{msg}");
    }
}
