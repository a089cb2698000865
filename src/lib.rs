//! batchrun: push a file of items through a metered, rate-limited API as fast as
//! the plan allows without tripping it, stop cleanly when credits run out, and
//! resume exactly where it stopped.
//!
//! The pipeline, in the order a run meets it: [`input`] streams items,
//! [`template`] turns each into a request, [`pacer`] decides when it may go,
//! [`runner`] drives the worker pool, [`classify`] reads each response,
//! [`credits`] meters the balance, [`checkpoint`] records every item in sled and
//! [`report`] shows progress and the summary. [`sim`] is the built-in rehearsal
//! server every test runs against.

pub mod checkpoint;
pub mod classify;
pub mod cli;
pub mod credits;
pub mod input;
pub mod pacer;
pub mod rate;
pub mod report;
pub mod runner;
pub mod sim;
pub mod template;
pub mod wire;
