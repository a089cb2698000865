//! batchrun: push a file of items through a metered, rate-limited API as fast as
//! the plan allows without tripping it, stop cleanly when credits run out, and
//! resume exactly where it stopped.
//!
//! The pipeline, in the order a run meets it: [`settings`] validates the
//! options, [`input`] streams items, [`request`] renders each into a call
//! that a [`transport`] sends, [`pace`] decides when it may go (over the
//! pure rules of [`rate`]), [`run`] drives the worker pool, [`classify`]
//! reads each response, [`credits`] owns the balance and its alerts,
//! [`checkpoint`] records every item in sled and [`report`] shows progress
//! and the summary. [`exit`] is the exit-code contract. [`fleet`] shares one
//! key's limit between processes through Redis; [`sim`] is the built-in
//! rehearsal server, which the run knows nothing of; [`status`] is the
//! read-only `status` and `plans` commands. `docs/design.md` has the one
//! module map.

pub mod checkpoint;
pub mod classify;
pub mod cli;
pub mod cost;
pub mod credits;
pub mod exit;
pub mod fleet;
pub mod input;
pub mod manual;
pub mod pace;
pub mod rate;
pub mod report;
pub mod request;
pub mod run;
pub mod secret;
pub mod settings;
pub mod sim;
pub mod status;
pub mod sys;
pub mod template;
pub mod transport;
pub mod util;
pub mod wire;
