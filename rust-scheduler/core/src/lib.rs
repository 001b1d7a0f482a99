//! tiertp global scheduler core.
//!
//! Everything the control loop needs, free of any Python or async runtime:
//! performance profiles, tier configuration, arrival statistics, the goodput
//! estimator, the weighted greedy planner, the FCFS dispatcher and the per-GPU
//! batch policy. The PyO3 bindings, the gateway and the simulator all call
//! into this crate; none of them keeps a copy of a policy.

pub mod batch_policy;
pub mod bench;
pub mod control;
pub mod defaults;
pub mod dispatcher;
pub mod estimator;
pub mod live_view;
pub mod plan;
mod plan_json;
pub mod planner;
pub mod profile;
pub mod prompt_lengths;
pub mod quantiles;
pub mod rate_shape;
pub mod stats;
pub mod switch_cost;
#[cfg(test)]
mod test_support;
pub mod tiers;
pub mod topology;
