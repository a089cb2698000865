//! What a running job publishes for `batchrun status`: the checkpoint is
//! the run's alone while it runs, so progress goes to a small file beside it.

use std::path::{Path, PathBuf};

/// What a running job publishes for `batchrun status`, which cannot open
/// the checkpoint while the run holds it.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Progress {
    /// The job id.
    pub job: String,
    /// The input, as an absolute path.
    pub input: String,
    /// Items in the input.
    pub total: u64,
    /// Items done (all runs).
    pub done: u64,
    /// Items failed (all runs).
    pub failed: u64,
    /// Calls this run.
    pub requests: u64,
    /// Rate-limit 429s this run.
    pub rate_limited: u64,
    /// The last credit balance seen.
    pub credits_remaining: Option<i64>,
    /// The running process.
    pub pid: u32,
    /// When this was written (unix seconds).
    pub updated_unix: u64,
    /// When this was written (unix ms): a run's duration so far, against
    /// `started_unix_ms`, where whole seconds would read as nothing (or
    /// less than nothing) within the second the run started.
    #[serde(default)]
    pub updated_unix_ms: u64,
    /// When this run started (unix ms).
    #[serde(default)]
    pub started_unix_ms: u64,
    /// Items done by this run.
    #[serde(default)]
    pub done_this_run: u64,
    /// Calls the job's earlier runs sent.
    #[serde(default)]
    pub requests_before: u64,
    /// Rate-limit 429s of the job's earlier runs.
    #[serde(default)]
    pub rate_limited_before: u64,
    /// The run waits for a top-up (`--wait-for-credits`): its pace says
    /// nothing of when it ends.
    #[serde(default)]
    pub waiting_for_credits: bool,
    /// When the credits renew (unix seconds), as last seen.
    #[serde(default)]
    pub renewal: Option<u64>,
}

/// Where job `job` of a run in `state_dir` publishes its progress.
pub fn progress_path(state_dir: &Path, job: &str) -> PathBuf {
    state_dir.join(format!("running-{job}.json"))
}

impl Progress {
    /// Writes it atomically (a temporary file renamed into place), so a
    /// reader never sees half of it.
    pub fn publish(&self, state_dir: &Path) -> std::io::Result<()> {
        let path = progress_path(state_dir, &self.job);
        let tmp = path.with_extension(format!("json.{}.tmp", std::process::id()));
        std::fs::write(&tmp, serde_json::to_vec(self)?)?;
        std::fs::rename(tmp, path)
    }
}
