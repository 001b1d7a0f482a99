//! What a simulation reports: per-request latencies and the configuration
//! over time.

use serde_json::Value;

use crate::engine::GroupSpec;

#[derive(Debug, Clone, PartialEq)]
pub struct TimelineEntry {
    pub time_s: f64,
    pub groups: Vec<GroupSpec>,
}

#[derive(Debug, Clone)]
pub struct SimResult {
    pub policy: String,
    pub settings: Value,
    pub num_gpus: u32,
    pub sim_end_s: f64,
    /// Per request, in trace order; NaN where rejected.
    pub ttft_ms: Vec<f64>,
    pub tpot_ms: Vec<f64>,
    pub finish_s: Vec<f64>,
    pub rejected: Vec<bool>,
    pub timeline: Vec<TimelineEntry>,
    /// Groups started by plan changes (each paid a switch).
    pub switches: u64,
    pub migrated_requests: u64,
    pub wall_s: f64,
}
