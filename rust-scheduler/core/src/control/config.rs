//! The control loop's settings; each default is written once, here.

use crate::planner::PlannerConfig;
use crate::stats::TierStats;

#[derive(Debug, Clone, PartialEq)]
pub struct ControlConfig {
    pub planner: PlannerConfig,
    /// Control window: how often the loop re-plans (DESIGN.md §1).
    pub window_s: f64,
    /// Arrival-rate horizon, in windows: reacts to a burst within a window
    /// or two.
    pub horizon_windows: f64,
    /// How long a tier's past arrival rate keeps counting as demand.
    pub memory_s: f64,
    /// Prompt and output lengths assumed for a tier before it has seen a
    /// request.
    pub prior_prompt_tokens: f64,
    pub prior_output_tokens: f64,
}

impl Default for ControlConfig {
    fn default() -> Self {
        Self {
            planner: PlannerConfig::default(),
            window_s: crate::defaults::WINDOW_S,
            horizon_windows: 2.0,
            memory_s: crate::defaults::DEMAND_MEMORY_S,
            prior_prompt_tokens: crate::defaults::PRIOR_PROMPT_TOKENS,
            prior_output_tokens: crate::defaults::PRIOR_OUTPUT_TOKENS,
        }
    }
}

impl ControlConfig {
    pub fn prior(&self) -> TierStats {
        TierStats::new(0.0, self.prior_prompt_tokens, self.prior_output_tokens)
    }

    pub fn horizon_s(&self) -> f64 {
        self.horizon_windows * self.window_s
    }

    pub fn validate(&self) -> Result<(), String> {
        for (name, v, min) in [
            ("window_s", self.window_s, f64::MIN_POSITIVE),
            ("horizon_windows", self.horizon_windows, f64::MIN_POSITIVE),
            ("memory_s", self.memory_s, 0.0),
            ("prior_prompt_tokens", self.prior_prompt_tokens, 1.0),
            ("prior_output_tokens", self.prior_output_tokens, 1.0),
        ] {
            if !(v.is_finite() && v >= min) {
                return Err(format!("{name} = {v}: must be a finite number >= {min}"));
            }
        }
        Ok(())
    }
}
