//! The run's side of a fleet (`--redis`, `--shard`): join it before any
//! call.

use crate::exit::RunError;
use crate::fleet::{Fleet, FleetSettings, Shard};
use crate::report::err_line;

/// Connects to the fleet's Redis, if the run is part of a fleet, and runs
/// the fleet's script once. Redis out of reach, or refusing the script, is
/// a fatal error before any request is sent.
pub async fn join(
    fleet: Option<&FleetSettings>,
    shard: Option<Shard>,
) -> Result<Option<Fleet>, RunError> {
    let Some(f) = fleet else {
        if let Some(s) = shard {
            err_line(&format!(
                "batchrun: shard {s} without --redis: this process paces to the whole limit by itself; \
                 give each shard its part of it (--limit) or share it (--redis)"
            ));
        }
        return Ok(None);
    };
    let fleet = Fleet::connect(f)
        .await
        .map_err(|e| RunError::Fatal(anyhow::Error::new(e)))?;
    crate::fleet::script::probe(&fleet)
        .await
        .map_err(|e| RunError::Fatal(anyhow::Error::new(e)))?;
    if let Some(policy) = fleet.eviction_policy().await {
        err_line(&format!(
            "batchrun: fleet: warning: Redis at {} may evict keys (maxmemory-policy {policy}); \
             should it evict the fleet's, the fleet notices, holds one window and puts its calls \
             back, but a Redis of its own with noeviction keeps the pace steady",
            fleet.at()
        ));
    }
    let share = if f.headroom < 1.0 {
        format!(" ({:.0}% of it)", f.headroom * 100.0)
    } else {
        String::new()
    };
    err_line(&format!(
        "batchrun: fleet: sharing the limit{share} (every --limit, token windows included), the concurrency ceiling and the alerts of this key \
         with every process on {} (keys {}:*)",
        fleet.at(),
        fleet.keys().prefix()
    ));
    Ok(Some(fleet))
}
