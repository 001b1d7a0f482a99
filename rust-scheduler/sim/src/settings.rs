//! Simulation settings; each default is written once, here.

use tiertp_scheduler::defaults;
use tiertp_scheduler::profile::Profile;
use tiertp_scheduler::switch_cost::SwitchCost;

/// Cluster and mechanism parameters of one simulation.
#[derive(Debug, Clone, PartialEq)]
pub struct SimSettings {
    pub gpus: u32,
    pub gpus_per_node: u32,
    /// Control window of the planner (and of the baselines' control loops).
    pub window_s: f64,
    /// How long a tier's past arrival rate keeps counting as demand.
    pub demand_memory_s: f64,
    /// Stop time of a TP switch (pause → resume), without KV movement;
    /// `None`: the measured mechanism of the profile's device
    /// (`SwitchCost::for_profile`).
    pub switch_ms: Option<f64>,
    /// Bandwidth for KV hand-off and migration between groups, GB/s;
    /// `None`: as `switch_ms`.
    pub kv_gbps: Option<f64>,
    /// Static TP level for policies that use one; None = policy default.
    pub tp: Option<u32>,
    /// sglang-pd: fraction of GPUs doing prefill; None = policy default.
    pub prefill_share: Option<f64>,
    /// Record every control decision (`SimResult::control_log`).
    pub record_control: bool,
}

/// Switch cost of the naive mechanism (restart the engine at the new TP).
pub const NAIVE_SWITCH_MS: f64 = 20_000.0;

impl SimSettings {
    /// The switch and KV-transfer cost this run models: the profile
    /// device's measured mechanism, with any setting given overriding it.
    pub fn switch_cost(&self, profile: &Profile) -> SwitchCost {
        let measured = SwitchCost::for_profile(profile);
        SwitchCost {
            stop_ms: self.switch_ms.unwrap_or(measured.stop_ms),
            kv_gbps: self.kv_gbps.unwrap_or(measured.kv_gbps),
        }
    }

    pub fn new(gpus: u32) -> Self {
        Self {
            gpus,
            gpus_per_node: defaults::GPUS_PER_NODE,
            window_s: defaults::WINDOW_S,
            demand_memory_s: defaults::DEMAND_MEMORY_S,
            switch_ms: None,
            kv_gbps: None,
            tp: None,
            prefill_share: None,
            record_control: false,
        }
    }

    pub fn validate(&self) -> Result<(), String> {
        if self.gpus == 0 {
            return Err("gpus must be at least 1".into());
        }
        for (name, v) in [
            ("window_s", self.window_s),
            ("kv_gbps", self.kv_gbps.unwrap_or(1.0)),
            ("demand_memory_s", self.demand_memory_s),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return Err(format!("{name} = {v}: must be a finite number > 0"));
            }
        }
        if let Some(ms) = self.switch_ms {
            if !(ms.is_finite() && ms >= 0.0) {
                return Err(format!("switch_ms = {ms}: must be a finite number >= 0"));
            }
        }
        if let Some(tp) = self.tp {
            if !tp.is_power_of_two() || tp > self.gpus_per_node.min(8) || tp > self.gpus {
                return Err(format!(
                    "tp = {tp}: must be a power of two that fits a node of {} GPUs",
                    self.gpus_per_node
                ));
            }
        }
        if let Some(s) = self.prefill_share {
            if !(s > 0.0 && s < 1.0) {
                return Err(format!("prefill_share = {s}: must be between 0 and 1"));
            }
        }
        Ok(())
    }
}
