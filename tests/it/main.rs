//! One integration-test binary (it links once), one module per concern.

mod common;
mod credits;
mod run;
mod scale;
mod sim;
