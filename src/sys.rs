//! What the operating system allows and tells: enough file handles for the
//! pool, a full disk reported as an error rather than a signal, no core
//! file holding the key, and the signals that stop a run cleanly.

use crate::exit::Signal;

/// File handles the process needs beside one per worker: stdio, the
/// checkpoint's files, the input, the outputs, the alert webhook, slack.
pub const FIXED_HANDLES: u64 = 64;

/// Raises the soft open-file limit toward the hard one so that `workers`
/// connections fit, and refuses a pool that cannot fit at all. Returns the
/// soft limit now in force.
#[cfg(unix)]
pub fn ensure_open_files(workers: u64) -> Result<u64, String> {
    let need = workers.saturating_add(FIXED_HANDLES);
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Ok(u64::MAX); // Cannot tell: let the run find out.
    }
    #[allow(clippy::unnecessary_cast)] // rlim_t is not u64 on every unix.
    let (soft, hard) = (lim.rlim_cur as u64, lim.rlim_max as u64);
    if soft >= need {
        return Ok(soft);
    }
    if hard < need {
        return Err(format!(
            "--concurrency {workers} needs about {need} open files, but the hard limit is {hard} \
             (ulimit -Hn); lower --concurrency or raise the limit"
        ));
    }
    lim.rlim_cur = need as libc::rlim_t;
    // SAFETY: setrlimit reads the struct we own; raising the soft limit up
    // to the hard one needs no privilege.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
        return Err(format!(
            "--concurrency {workers} needs about {need} open files, but the limit is {soft} \
             and could not be raised (ulimit -n)"
        ));
    }
    Ok(need)
}

/// Makes a file size limit (`ulimit -f`) fail the write that passes it,
/// instead of killing the process with SIGXFSZ: the checkpoint writer then
/// sees an error and the run halts resumably with the reason.
#[cfg(unix)]
pub fn file_size_limit_is_an_error() {
    // SAFETY: setting a signal's disposition to "ignore" installs no
    // handler and touches no memory of ours.
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
    }
}

/// Elsewhere there is no such signal.
#[cfg(not(unix))]
pub fn file_size_limit_is_an_error() {}

/// Elsewhere the limit is left to the system.
#[cfg(not(unix))]
pub fn ensure_open_files(_workers: u64) -> Result<u64, String> {
    Ok(u64::MAX)
}

/// Marks the process not dumpable (`PR_SET_DUMPABLE` 0): a crash leaves no
/// core file, and no other process of the user may ptrace it, so the API
/// key in its memory never reaches a disk that way.
#[cfg(target_os = "linux")]
pub fn forbid_core_dumps() {
    // SAFETY: prctl with PR_SET_DUMPABLE takes plain integers and touches
    // no memory of ours.
    unsafe {
        libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
    }
}

/// Elsewhere the system's core-dump settings stand.
#[cfg(not(target_os = "linux"))]
pub fn forbid_core_dumps() {}

/// This machine's host name, for alerts that page someone ("?" when the
/// system will not say).
#[cfg(unix)]
pub fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most `buf.len()` bytes into our buffer.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "?".to_string();
    }
    let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    match String::from_utf8_lossy(&buf[..end]).trim() {
        "" => "?".to_string(),
        name => name.to_string(),
    }
}

/// Elsewhere the environment's word for it.
#[cfg(not(unix))]
pub fn host_name() -> String {
    std::env::var("COMPUTERNAME").unwrap_or_else(|_| "?".to_string())
}

/// Resolves on Ctrl-C (SIGINT) or, on Unix, SIGTERM or SIGHUP: a scheduler
/// stopping the job, or the terminal it was started from closing, deserves
/// the same clean stop as a person pressing Ctrl-C. A signal whose handler
/// cannot be installed is not waited for; with none, this never resolves
/// and the run ends by itself.
pub async fn stop_signal() -> Signal {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let on = |kind: SignalKind| async move {
            match signal(kind) {
                Ok(mut s) => {
                    s.recv().await;
                }
                Err(_) => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            _ = ctrl_c => Signal::Interrupt,
            _ = on(SignalKind::terminate()) => Signal::Terminate,
            _ = on(SignalKind::hangup()) => Signal::HangUp,
        }
    }
    #[cfg(not(unix))]
    {
        ctrl_c.await;
        Signal::Interrupt
    }
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    #[cfg(target_os = "linux")]
    #[test]
    fn after_forbidding_core_dumps_the_process_is_not_dumpable() {
        forbid_core_dumps();
        // SAFETY: PR_GET_DUMPABLE reads a flag of this process.
        assert_eq!(unsafe { libc::prctl(libc::PR_GET_DUMPABLE) }, 0);
    }

    #[test]
    fn the_host_name_is_the_systems() {
        let name = host_name();
        assert!(!name.is_empty() && !name.contains('\0'), "{name:?}");
    }

    #[test]
    fn a_pool_beyond_the_hard_limit_is_refused_and_a_small_one_fits() {
        assert!(ensure_open_files(1).unwrap() > FIXED_HANDLES);
        let e = ensure_open_files(u64::MAX - FIXED_HANDLES).unwrap_err();
        assert!(e.contains("hard limit"), "{e}");
    }
}
