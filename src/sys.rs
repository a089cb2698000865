//! What the operating system allows: enough file handles for the pool, and
//! an allocator that does not strand memory over a long run.

use std::ffi::{OsStr, OsString};

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

/// The glibc tunables, set by [`tune_malloc`], that keep
/// chunks larger than 128 bytes out of glibc's per-thread malloc caches.
pub const TCACHE_TUNABLES: &str = "glibc.malloc.tcache_max=128";

/// Keeps chunks larger than 128 bytes out of glibc's per-thread malloc
/// caches for this process, by starting the same binary again in place:
/// the path it was started as, the same arguments, the same environment
/// entries in the same order, with [`TCACHE_TUNABLES`] added to
/// `GLIBC_TUNABLES` (glibc reads its tunables only when a program starts)
/// and `BATCHRUN_MALLOC_TUNED` set. The pid, the standard streams, the
/// process name and the signal dispositions stay as they were.
///
/// Why: a run's threads free what other threads allocated (sled's node
/// versions are freed by whichever thread collects them, a worker's
/// response by the checkpoint writer), and chunks parked in those caches
/// kept the arenas growing through a long run while the live heap stayed
/// flat. With the caches off altogether a million-item run peaked about
/// 1.3 MiB lower, at some 5% more CPU per call; caching only chunks of up
/// to 128 bytes, the most frequent, kept most of the saving at no CPU cost
/// we could measure (the README's Scale section has the figures).
///
/// It returns, and the run goes on as it is: in the new image (which
/// `BATCHRUN_MALLOC_TUNED` marks, so that it happens once whatever the
/// loader makes of the tunables); when `GLIBC_TUNABLES` already names a
/// `glibc.malloc.tcache` tunable (that is how a user keeps glibc's
/// defaults: `GLIBC_TUNABLES=glibc.malloc.tcache_max=1032`); when the
/// kernel started no program interpreter (a static binary, or one run
/// through the loader by hand, `ld.so batchrun ...`: a loader that does not
/// report the program's own path would be started again with the run's
/// arguments and take the input file for the program); and when the exec
/// fails. Call it first thing, before any thread starts or file is opened:
/// only what the process inherited is meant to survive into the new image.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn tune_malloc() {
    use std::ffi::{CStr, CString};
    use std::os::unix::ffi::{OsStrExt, OsStringExt};
    const DONE: &str = "BATCHRUN_MALLOC_TUNED";
    if std::env::var_os(DONE).is_some() {
        return;
    }
    let current = std::env::var_os("GLIBC_TUNABLES");
    let Some(tunables) = tunables_with_tcache_limit(current.as_deref()) else {
        return;
    };
    // SAFETY: getauxval only reads the auxiliary vector the kernel passed.
    let (interpreter, started_as) = unsafe {
        (
            libc::getauxval(libc::AT_BASE),
            libc::getauxval(libc::AT_EXECFN),
        )
    };
    if interpreter == 0 || started_as == 0 {
        return;
    }
    // SAFETY: AT_EXECFN points at the NUL-terminated path given to execve,
    // on the initial stack, which lives as long as the process.
    let path = unsafe { CStr::from_ptr(started_as as *const libc::c_char) };
    let Ok(args) = std::env::args_os()
        .map(|a| CString::new(a.into_vec()))
        .collect::<Result<Vec<_>, _>>()
    else {
        return;
    };
    extern "C" {
        static environ: *const *const libc::c_char;
    }
    // Copied entry by entry, not through a map: duplicates and their order
    // (the first one wins for getenv) stay as they were.
    let mut env: Vec<CString> = Vec::new();
    // SAFETY: `environ` is the NULL-terminated array of NUL-terminated
    // entries; nothing else runs yet that could change it.
    unsafe {
        let mut entry = environ;
        while !entry.is_null() && !(*entry).is_null() {
            let e = CStr::from_ptr(*entry);
            if !e.to_bytes().starts_with(b"GLIBC_TUNABLES=") {
                env.push(e.to_owned());
            }
            entry = entry.add(1);
        }
    }
    let mut tuned = b"GLIBC_TUNABLES=".to_vec();
    tuned.extend_from_slice(tunables.as_bytes());
    let Ok(tuned) = CString::new(tuned) else {
        return;
    };
    env.push(tuned);
    env.push(CString::new(format!("{DONE}=1")).expect("no NUL"));
    // execve's arrays: the strings' pointers, then NULL.
    let pointers = |strings: &[CString]| -> Vec<*const libc::c_char> {
        strings
            .iter()
            .map(|s| s.as_ptr())
            .chain(std::iter::once(std::ptr::null()))
            .collect()
    };
    let (argv, envp) = (pointers(&args), pointers(&env));
    // SAFETY: every pointer is to a NUL-terminated string owned above, and
    // both arrays end with NULL. execve returns only when it failed; then
    // nothing has changed and the run goes on as it is.
    unsafe {
        libc::execve(path.as_ptr(), argv.as_ptr(), envp.as_ptr());
    }
}

/// Elsewhere the allocator is left as it is.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn tune_malloc() {}

/// The `GLIBC_TUNABLES` value with [`TCACHE_TUNABLES`] added to whatever
/// the current value sets; `None` when it already names a tcache tunable
/// (the user's choice stands) or is not text (left untouched).
pub fn tunables_with_tcache_limit(current: Option<&OsStr>) -> Option<OsString> {
    match current.map(|c| c.to_str()) {
        None => Some(TCACHE_TUNABLES.into()),
        Some(None) => None,
        Some(Some(c)) if c.contains("glibc.malloc.tcache") => None,
        Some(Some("")) => Some(TCACHE_TUNABLES.into()),
        Some(Some(c)) => Some(format!("{c}:{TCACHE_TUNABLES}").into()),
    }
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    #[test]
    fn the_tunable_is_added_to_what_is_set_and_a_users_choice_stands() {
        let off = Some("glibc.malloc.tcache_max=128".into());
        assert_eq!(tunables_with_tcache_limit(None), off);
        assert_eq!(tunables_with_tcache_limit(Some(OsStr::new(""))), off);
        assert_eq!(
            tunables_with_tcache_limit(Some(OsStr::new("glibc.malloc.arena_max=2"))),
            Some("glibc.malloc.arena_max=2:glibc.malloc.tcache_max=128".into())
        );
        for kept in [
            "glibc.malloc.tcache_max=1032:glibc.malloc.arena_max=2",
            "glibc.malloc.tcache_count=0",
        ] {
            assert_eq!(tunables_with_tcache_limit(Some(OsStr::new(kept))), None);
        }
        use std::os::unix::ffi::OsStrExt;
        assert_eq!(
            tunables_with_tcache_limit(Some(OsStr::from_bytes(b"\xff"))),
            None
        );
    }

    #[test]
    fn a_pool_beyond_the_hard_limit_is_refused_and_a_small_one_fits() {
        assert!(ensure_open_files(1).unwrap() > FIXED_HANDLES);
        let e = ensure_open_files(u64::MAX - FIXED_HANDLES).unwrap_err();
        assert!(e.contains("hard limit"), "{e}");
    }
}
