//! One integration-test binary (it links once), one module per concern.

mod batch;
mod batch_faults;
mod common;
mod crash;
mod credits;
mod damage;
mod dialects;
mod fleet;
mod identity;
mod learning;
mod metrics;
mod nightly;
mod operator;
mod pacing;
mod policies;
mod pool;
mod report;
mod report_html;
mod reruns;
mod run;
mod scale;
mod sim;
mod sim_modes;
mod sim_shapes;
mod transport;
mod trust;
