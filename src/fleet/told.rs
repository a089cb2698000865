//! What each process of a fleet was told to pace to (`--pacer`, every
//! `--limit`), so that a process told otherwise than the others hears of
//! it when it joins: each process passes its own limits to the fleet's
//! rule, so a fleet told two limits keeps neither for the whole fleet
//! (the higher one's processes fill the window past the lower one).
//!
//! Each process keeps its description in the fleet's `told` hash, with
//! the unix ms until which it stands, renewed while it runs; a process
//! ending cleanly takes its own out. A process killed leaves its record
//! for at most [`STANDS_FOR`].

use std::time::Duration;

use redis::AsyncCommands as _;

use super::Fleet;
use crate::util::unix_now;

/// How long a description stands without being renewed.
pub const STANDS_FOR: Duration = Duration::from_secs(60);
/// How often a running process renews its own.
const RENEW_EVERY: Duration = Duration::from_secs(20);

/// This process's record in the fleet, renewed until it is dropped or
/// [`Told::leave`] takes it out.
pub struct Told {
    fleet: Fleet,
    /// This process's field: its pid, a tab, its description (processes
    /// told alike keep a field each, so one leaving does not take out
    /// another's).
    mine: String,
    renewal: tokio::task::JoinHandle<()>,
}

/// The field of `description` for this process.
fn field_of(description: &str) -> String {
    format!("{}\t{description}", std::process::id())
}

/// The description a field holds.
fn description_of(field: &str) -> &str {
    field.split_once('\t').map_or(field, |(_, d)| d)
}

impl Told {
    /// Records `mine` in `fleet` and returns it, with the other
    /// descriptions on record there. Redis failing here only loses the
    /// warning: the run goes on.
    pub async fn join(fleet: &Fleet, description: &str) -> (Told, Vec<String>) {
        let others = others(fleet, description).await.unwrap_or_default();
        let mine = field_of(description);
        let _ = renew(fleet, &mine).await;
        let (f, m) = (fleet.clone(), mine.clone());
        let renewal = tokio::spawn(async move {
            let mut tick = tokio::time::interval(RENEW_EVERY);
            tick.tick().await;
            loop {
                tick.tick().await;
                let _ = renew(&f, &m).await;
            }
        });
        let told = Told {
            fleet: fleet.clone(),
            mine,
            renewal,
        };
        (told, others)
    }

    /// Takes this process's record out (the run ended): a process joining
    /// after it is not warned of it. Not tried when the run gave up on
    /// Redis: the halt would wait for it, and the record expires anyway.
    pub async fn leave(self) {
        self.renewal.abort();
        if self.fleet.is_lost() {
            return;
        }
        let mut c = self.fleet.conn();
        let key = self.fleet.keys().told();
        let _ = tokio::time::timeout(
            Duration::from_secs(1),
            c.hdel::<_, _, i64>(&key, &self.mine),
        )
        .await;
    }
}

impl Drop for Told {
    fn drop(&mut self) {
        self.renewal.abort();
    }
}

/// The descriptions other than `mine` that still stand (one each, however
/// many processes were told it), the stale fields taken out.
async fn others(fleet: &Fleet, mine: &str) -> redis::RedisResult<Vec<String>> {
    let key = fleet.keys().told();
    let mut c = fleet.conn();
    let all: Vec<(String, u64)> = within(c.hgetall(&key)).await?;
    let now = unix_now().as_millis() as u64;
    let (live, stale): (Vec<_>, Vec<_>) = all.into_iter().partition(|(_, until)| *until > now);
    if !stale.is_empty() {
        let stale: Vec<String> = stale.into_iter().map(|(d, _)| d).collect();
        let _: i64 = within(c.hdel(&key, stale)).await?;
    }
    let mut others: Vec<String> = live
        .iter()
        .map(|(field, _)| description_of(field).to_string())
        .filter(|d| d != mine)
        .collect();
    others.sort();
    others.dedup();
    Ok(others)
}

/// Keeps the field `mine` on record for [`STANDS_FOR`] from now.
async fn renew(fleet: &Fleet, mine: &str) -> redis::RedisResult<()> {
    let key = fleet.keys().told();
    let mut c = fleet.conn();
    let until = unix_now().as_millis() as u64 + STANDS_FOR.as_millis() as u64;
    let _: i64 = within(c.hset(&key, mine, until)).await?;
    within(c.pexpire(&key, STANDS_FOR.as_millis() as i64 * 2)).await
}

/// `op`, given a second at most.
async fn within<T>(
    op: impl std::future::Future<Output = redis::RedisResult<T>>,
) -> redis::RedisResult<T> {
    tokio::time::timeout(Duration::from_secs(1), op)
        .await
        .unwrap_or_else(|_| {
            Err(redis::RedisError::from((
                redis::ErrorKind::IoError,
                "timed out",
            )))
        })
}
