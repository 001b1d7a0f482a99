//! What a simulation reports: per-request latencies and the configuration
//! over time.

use serde_json::Value;

use crate::engine::GroupSpec;
use crate::policy::Route;
use crate::rejection::Rejection;

/// One control decision of a run, in order (recorded when
/// `SimSettings::record_control` is set): what the control loop was told
/// and what it answered, so another driver of the same loop (the gateway)
/// can be fed the same events and checked to decide the same.
#[derive(Debug, Clone, PartialEq)]
pub enum ControlEvent {
    /// A request arrived; where it went (or `Reject`: shed).
    Admit { time_s: f64, request: u32, route: Route },
    /// Its prompt finished on a group that keeps decoding it.
    FirstToken { time_s: f64, request: u32 },
    /// Its prompt finished on a prefill group; the hand-off decision.
    Handoff { time_s: f64, request: u32, route: Option<Route> },
    /// It left (finished, or shed after admission).
    Finish { time_s: f64, request: u32 },
    /// A request moved off a stopping group to `route` (the gateway sends
    /// it with the plan: `apply_plan`'s moves).
    Migrate { time_s: f64, request: u32, route: Route },
    /// A control window; the new configuration when it changed.
    Window { time_s: f64, groups: Option<Vec<GroupSpec>> },
}

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
    /// Per request: why it was rejected; None where it completed.
    pub rejections: Vec<Option<Rejection>>,
    pub timeline: Vec<TimelineEntry>,
    /// Groups started by plan changes (each paid a switch).
    pub switches: u64,
    pub migrated_requests: u64,
    pub wall_s: f64,
    /// Empty unless `SimSettings::record_control`.
    pub control_log: Vec<ControlEvent>,
}
