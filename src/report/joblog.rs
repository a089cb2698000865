//! `--joblog FILE`: one tab-separated line per call as it completes, the
//! GNU parallel convention (a header line, then `Line Starttime JobRuntime
//! Status Attempt Outcome`), appended across resumes so one file holds
//! every call the job made.
//!
//! Each line is handed to the system as it is written, before the call's
//! result reaches the checkpoint (the recording loop hears of the answer
//! first): a run killed with -9 loses no line of a result its checkpoint
//! holds, which a resume never calls again. (Flushed once a second, the
//! last second's lines were lost.)

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::calls::{Answer, CallId};

/// The header, written once, when the file is new or empty.
pub const HEADER: &str = "Line\tStarttime\tJobRuntime\tStatus\tAttempt\tOutcome";

/// An open job log.
pub struct JobLog {
    path: PathBuf,
    w: BufWriter<File>,
    /// A write failed: said once, then the log is given up (the run goes on).
    broken: bool,
}

/// Whether the file at `path` begins with the joblog's header line.
fn starts_as_joblog(path: &Path) -> std::io::Result<bool> {
    use std::io::{BufRead as _, Read as _};
    let mut first = String::new();
    let file = File::open(path)?.take(HEADER.len() as u64 + 2);
    // Not UTF-8 (a binary file): no joblog either.
    if std::io::BufReader::new(file).read_line(&mut first).is_err() {
        return Ok(false);
    }
    Ok(first.trim_end_matches(['\n', '\r']) == HEADER)
}

/// Whether the non-empty file at `path` ends with a newline.
fn ends_a_line(path: &Path) -> std::io::Result<bool> {
    use std::io::{Read as _, Seek as _, SeekFrom};
    let mut f = File::open(path)?;
    f.seek(SeekFrom::End(-1))?;
    let mut last = [0u8];
    f.read_exact(&mut last)?;
    Ok(last[0] == b'\n')
}

impl JobLog {
    /// Opens `path` for appending, writing the header if it is new or
    /// empty. A file that holds something else (its first line is not the
    /// header: notes, a CSV, a mistyped path) is refused, not appended to.
    pub fn open(path: &Path) -> std::io::Result<JobLog> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        let f = OpenOptions::new().create(true).append(true).open(path)?;
        let empty = f.metadata()?.len() == 0;
        if !empty && !starts_as_joblog(path)? {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "it holds something else than a joblog (its first line is not the joblog's \
                 header); name another file, or remove it first",
            ));
        }
        let torn = !empty && !ends_a_line(path)?;
        let mut w = BufWriter::with_capacity(64 * 1024, f);
        if empty {
            writeln!(w, "{HEADER}")?;
        }
        // A line cut short (a full disk, a kill mid-write) ends here, or
        // the next line would be appended to it, one line of both.
        if torn {
            writeln!(w)?;
        }
        Ok(JobLog {
            path: path.to_path_buf(),
            w,
            broken: false,
        })
    }

    /// One completed call: it started `latency` before `now_unix` (a call
    /// that never left has no latency and a runtime of 0). Returns a line
    /// for the operator the first time a write fails.
    pub fn call(
        &mut self,
        id: CallId,
        answer: Answer,
        latency: Option<Duration>,
        now_unix: Duration,
    ) -> Option<String> {
        if self.broken {
            return None;
        }
        let took = latency.unwrap_or_default();
        let start = now_unix.saturating_sub(took);
        let r = writeln!(
            self.w,
            "{}\t{}.{:03}\t{:.3}\t{}\t{}\t{}",
            id.line,
            start.as_secs(),
            start.subsec_millis(),
            took.as_secs_f64(),
            status(answer),
            id.attempt,
            outcome(answer)
        )
        .and_then(|()| self.w.flush());
        self.failed(r)
    }

    /// Puts what is buffered on disk (every tick, and at the end).
    pub fn flush(&mut self) -> Option<String> {
        if self.broken {
            return None;
        }
        let r = self.w.flush();
        self.failed(r)
    }

    fn failed(&mut self, r: std::io::Result<()>) -> Option<String> {
        let e = r.err()?;
        self.broken = true;
        Some(format!(
            "batchrun: warning: writing the job log {} failed ({e}); the run goes on without it",
            self.path.display()
        ))
    }
}

/// The HTTP status, or `-` for a call that got no response.
fn status(a: Answer) -> String {
    match a {
        Answer::Status(s) | Answer::CreditsExhausted(s) => s.to_string(),
        Answer::Failure(_) => "-".to_string(),
    }
}

/// What the call's answer was, in one word.
pub fn outcome(a: Answer) -> String {
    match a {
        Answer::Status(s) if (200..300).contains(&s) => "ok".into(),
        Answer::Status(429) => "rate_limited".into(),
        Answer::CreditsExhausted(_) => "credits_exhausted".into(),
        Answer::Status(s) if (400..500).contains(&s) => "client_error".into(),
        Answer::Status(s) if s >= 500 => "server_error".into(),
        Answer::Status(_) => "other".into(),
        Answer::Failure(_) => a.key(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::FailureKind;

    #[test]
    fn one_line_per_call_and_one_header_across_reopens() {
        let dir = std::env::temp_dir().join(format!("batchrun-joblog-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = dir.join("calls.tsv");
        let id = |line, attempt| CallId { line, attempt };
        let now = Duration::from_millis(1_700_000_000_250);
        let mut log = JobLog::open(&path).unwrap();
        let ms = |n| Some(Duration::from_millis(n));
        assert!(log
            .call(id(3, 1), Answer::Status(200), ms(50), now)
            .is_none());
        log.call(id(4, 1), Answer::Status(429), ms(2), now);
        log.flush();
        drop(log);
        let mut log = JobLog::open(&path).unwrap();
        log.call(id(4, 2), Answer::Failure(FailureKind::Connect), None, now);
        log.flush();
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines,
            [
                HEADER,
                "3\t1700000000.200\t0.050\t200\t1\tok",
                "4\t1700000000.248\t0.002\t429\t1\trate_limited",
                "4\t1700000000.250\t0.000\t-\t2\tconnect",
            ]
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A line a full disk cut short stays a line of its own: the next
    /// call's was appended to it, one line of seven fields.
    #[test]
    fn a_line_cut_short_is_ended_before_the_next() {
        let dir = std::env::temp_dir().join(format!("batchrun-joblog-cut-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("calls.tsv");
        std::fs::write(&path, format!("{HEADER}\n3\t1700000")).unwrap();
        let mut log = JobLog::open(&path).unwrap();
        let now = Duration::from_millis(1_700_000_000_250);
        let id = CallId {
            line: 4,
            attempt: 1,
        };
        log.call(
            id,
            Answer::Status(200),
            Some(Duration::from_millis(50)),
            now,
        );
        log.flush();
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines,
            [HEADER, "3\t1700000", "4\t1700000000.200\t0.050\t200\t1\tok"]
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_file_that_is_no_joblog_is_refused_and_left_as_it_was() {
        let dir = std::env::temp_dir().join(format!("batchrun-joblog-no-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("notes.txt");
        std::fs::write(&path, "my notes\n").unwrap();
        let e = JobLog::open(&path).err().expect("refused");
        assert!(
            e.to_string().contains("something else than a joblog"),
            "{e}"
        );
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "my notes\n");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn outcomes_name_the_class_of_answer() {
        assert_eq!(outcome(Answer::Status(201)), "ok");
        assert_eq!(outcome(Answer::CreditsExhausted(429)), "credits_exhausted");
        assert_eq!(outcome(Answer::Status(404)), "client_error");
        assert_eq!(outcome(Answer::Status(503)), "server_error");
        assert_eq!(outcome(Answer::Failure(FailureKind::Timeout)), "timeout");
    }
}
