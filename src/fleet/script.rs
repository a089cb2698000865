//! The fleet's script (`lua/*.lua`, one script) and how it is called: the arguments
//! every run starts with, built here alone so that the pacer, the probe at
//! join and the tests of the script agree.

use std::time::Duration;

use super::Fleet;
use crate::rate::exact::stale_grace;
use crate::rate::policy::TokenWeight;

/// The script every fleet process runs: one script in eight files, joined
/// in this order (each file's header has its part of the contract).
pub const SCRIPT: &str = concat!(
    include_str!("lua/common.lua"),
    include_str!("lua/gcra.lua"),
    include_str!("lua/fixed.lua"),
    include_str!("lua/tokens.lua"),
    include_str!("lua/stated.lua"),
    include_str!("lua/window.lua"),
    include_str!("lua/drip.lua"),
    include_str!("lua/tail.lua"),
);

/// The arguments every run of [`SCRIPT`] starts with (see its header),
/// built here alone so that the pacer and the tests of the script agree.
#[derive(Debug, Clone, Copy)]
pub struct ScriptArgs {
    /// The window (W).
    pub window: Duration,
    /// How long an in-flight call occupies the window past its permit.
    pub hold: Duration,
    /// How long a concurrency lease lasts unless renewed.
    pub lease: Duration,
}

impl ScriptArgs {
    /// An invocation of `script` (which is [`SCRIPT`]) for `op` on `keys`,
    /// with the common arguments filled in. `clock`: `None` to run on
    /// Redis's own clock, as every process of a fleet must; a test passes
    /// its fake clock, in unix ms.
    pub fn invoke<'a>(
        &self,
        script: &'a redis::Script,
        keys: &[String],
        op: &str,
        clock: Option<u64>,
    ) -> redis::ScriptInvocation<'a> {
        let mut inv = script.prepare_invoke();
        for k in keys {
            inv.key(k);
        }
        // Rounded up: the script compares whole milliseconds with it.
        let grace = stale_grace(self.window).as_micros().div_ceil(1000);
        inv.arg(op)
            .arg(millis(self.window))
            .arg(millis(self.hold))
            .arg(millis(self.lease))
            .arg(u64::try_from(grace).unwrap_or(u64::MAX))
            .arg(clock.map_or(String::new(), |c| c.to_string()));
        inv
    }
}

/// A call's tokens as the script reads them (`weight_of` in
/// `lua/common.lua`): all of them, its prompt's and its answer's, so that
/// each window or bucket of tokens takes the part it counts.
pub fn tokens_arg(w: TokenWeight) -> String {
    format!("{},{},{}", w.total, w.input, w.output)
}

/// The weight [`tokens_arg`] wrote, or `None` for anything else.
pub fn parse_tokens_arg(s: &str) -> Option<TokenWeight> {
    let mut parts = s.split(',').map(str::parse::<u64>);
    let w = TokenWeight {
        total: parts.next()?.ok()?,
        input: parts.next()?.ok()?,
        output: parts.next()?.ok()?,
    };
    parts.next().is_none().then_some(w)
}

/// Runs the script once, harmlessly, at join: a user without the rights
/// to run it (an ACL without `EVALSHA`/`EVAL`) or a Redis that takes no
/// writes (a read-only replica) is a configuration error to hear of before
/// any call, not a stall that "run the same command" could never cure.
pub async fn probe(fleet: &Fleet) -> Result<(), super::FleetError> {
    let script = redis::Script::new(SCRIPT);
    let args = ScriptArgs {
        window: Duration::from_secs(1),
        hold: Duration::from_secs(1),
        lease: Duration::from_secs(1),
    };
    let mut conn = fleet.conn();
    let inv = args.invoke(&script, &fleet.keys().pacer(), "probe", None);
    let answer: redis::RedisResult<i64> =
        match tokio::time::timeout(PROBE_WITHIN, inv.invoke_async(&mut conn)).await {
            Ok(r) => r,
            Err(_) => Err(redis::RedisError::from((
                redis::ErrorKind::IoError,
                "timed out",
            ))),
        };
    answer
        .map(|_| ())
        .map_err(|e| match super::unable_for_now(&e) {
            Some(remedy) => super::FleetError::Unable {
                at: fleet.at().to_string(),
                why: e.to_string(),
                remedy: remedy.to_string(),
            },
            None => super::FleetError::Refused {
                at: fleet.at().to_string(),
                why: format!(
                    "{e}. The fleet needs a writable primary and a user allowed to run scripts \
             (EVAL, EVALSHA, SCRIPT LOAD) on its keys; no request was sent"
                ),
            },
        })
}

/// How long the probe at join may take.
const PROBE_WITHIN: Duration = Duration::from_secs(5);

/// Whole milliseconds of `d`, as the script takes them.
pub(super) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_weight_goes_to_the_script_and_back_in_parts() {
        let w = TokenWeight::split(40, 7);
        assert_eq!(tokens_arg(w), "47,40,7");
        assert_eq!(parse_tokens_arg(&tokens_arg(w)), Some(w));
        for bad in ["", "47", "47,40", "47,40,7,1", "47,x,7", "-1,0,0"] {
            assert_eq!(parse_tokens_arg(bad), None, "{bad:?}");
        }
    }
}
