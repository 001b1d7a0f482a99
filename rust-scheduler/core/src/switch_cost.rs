//! What stopping and re-forming TP groups costs, the model the planner's
//! commit rule and the simulator share:
//! `stop_ms + live KV bytes / (kv_gbps · 10⁹) · 10³` per switch.
//!
//! - GPU profiles: the published mechanism's measurements (EVALUATION.md,
//!   "Mechanisms"): 0.5 GB of KV migrated in 0.88 s / 245 ≈ 3.6 ms and 5 GB
//!   in 9.25 s / 376 ≈ 24.6 ms; a line through both gives ≈ 1.3 ms of fixed
//!   stop time and ≈ 214 GB/s.
//! - CPU profiles (`gpu = "cpu"`): `tiertp bench switch` on this project's
//!   CPU workers (tiny-llama, 2 KB of KV per token): 22.1 ms at 8,192 live
//!   tokens and 53.8 ms at 32,768, i.e. ≈ 11.5 ms fixed and 1.29 µs per
//!   token ≈ 1.6 GB/s.

use crate::profile::Profile;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SwitchCost {
    /// Pause → resume with no KV to move.
    pub stop_ms: f64,
    /// KV migration bandwidth between the old and new groups.
    pub kv_gbps: f64,
}

impl SwitchCost {
    pub const GPU_MEASURED: SwitchCost = SwitchCost {
        stop_ms: 1.3,
        kv_gbps: 214.0,
    };
    pub const CPU_MEASURED: SwitchCost = SwitchCost {
        stop_ms: 11.5,
        kv_gbps: 1.6,
    };

    /// The measured mechanism of the profile's device.
    pub fn for_profile(profile: &Profile) -> Self {
        if profile.gpu == "cpu" {
            Self::CPU_MEASURED
        } else {
            Self::GPU_MEASURED
        }
    }

    /// Milliseconds to move `bytes` of KV, stop time excluded.
    pub fn transfer_ms(&self, bytes: f64) -> f64 {
        bytes / (self.kv_gbps * 1e9) * 1e3
    }

    /// Milliseconds one switch that moves `bytes` of KV stops its groups.
    pub fn switch_ms(&self, bytes: f64) -> f64 {
        self.stop_ms + self.transfer_ms(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_model_reproduces_the_published_points() {
        let m = SwitchCost::GPU_MEASURED;
        assert!((m.switch_ms(0.5e9) - 3.6).abs() < 0.2);
        assert!((m.switch_ms(5e9) - 24.6).abs() < 0.5);
    }

    #[test]
    fn cpu_model_reproduces_the_bench() {
        let m = SwitchCost::CPU_MEASURED;
        let bytes = |tokens: f64| tokens * 2048.0;
        assert!((m.switch_ms(bytes(8192.0)) - 22.1).abs() < 1.0);
        assert!((m.switch_ms(bytes(32768.0)) - 53.8).abs() < 1.5);
    }
}
