//! What the control loop observes per tier: arrival rate and mean lengths
//! over a sliding horizon of recent windows.

use std::collections::VecDeque;

use crate::tiers::TierId;

/// Per-tier load the estimator plans for.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TierStats {
    /// Requests per second.
    pub arrival_rate: f64,
    pub mean_prompt_tokens: f64,
    pub mean_output_tokens: f64,
}

impl TierStats {
    pub fn new(arrival_rate: f64, mean_prompt_tokens: f64, mean_output_tokens: f64) -> Self {
        Self {
            arrival_rate,
            mean_prompt_tokens,
            mean_output_tokens,
        }
    }

    /// Checks the numbers are usable; the message names the field.
    pub fn validate(&self) -> Result<(), String> {
        for (field, v, min) in [
            ("arrival_rate", self.arrival_rate, 0.0),
            ("mean_prompt_tokens", self.mean_prompt_tokens, 1.0),
            ("mean_output_tokens", self.mean_output_tokens, 1.0),
        ] {
            if !v.is_finite() || v < min {
                return Err(format!("{field} = {v}: must be a finite number >= {min}"));
            }
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Copy)]
struct Arrival {
    time_s: f64,
    prompt_tokens: u32,
    output_tokens: u32,
}

/// Records arrivals and summarises them per tier. The rate is the larger of
/// the rate over the last `horizon_s` (reacts to a burst within a window or
/// two) and over the last `memory_s` (so a bursty tier that pauses for a few
/// seconds keeps its GPUs); mean lengths come from the longer span. Tiers with
/// no arrivals report rate 0 and the prior lengths.
#[derive(Debug, Clone)]
pub struct ArrivalObserver {
    horizon_s: f64,
    memory_s: f64,
    prior: TierStats,
    per_tier: Vec<VecDeque<Arrival>>,
}

impl ArrivalObserver {
    /// `prior` supplies the lengths used for a tier that has seen nothing
    /// yet; `memory_s` below `horizon_s` is raised to it (no memory).
    pub fn new(num_tiers: usize, horizon_s: f64, memory_s: f64, prior: TierStats) -> Self {
        assert!(horizon_s > 0.0, "horizon must be positive");
        Self {
            horizon_s,
            memory_s: memory_s.max(horizon_s),
            prior,
            per_tier: vec![VecDeque::new(); num_tiers],
        }
    }

    pub fn record(&mut self, tier: TierId, time_s: f64, prompt_tokens: u32, output_tokens: u32) {
        self.per_tier[tier].push_back(Arrival {
            time_s,
            prompt_tokens,
            output_tokens,
        });
    }

    /// Stats at `now`; arrivals older than the memory are dropped.
    pub fn snapshot(&mut self, now_s: f64) -> Vec<TierStats> {
        let cutoff = now_s - self.memory_s;
        let (horizon, memory, prior) = (self.horizon_s, self.memory_s, self.prior);
        self.per_tier
            .iter_mut()
            .map(|q| {
                while q.front().is_some_and(|a| a.time_s <= cutoff) {
                    q.pop_front();
                }
                if q.is_empty() {
                    return TierStats {
                        arrival_rate: 0.0,
                        ..prior
                    };
                }
                let n = q.len() as f64;
                let recent = q.iter().rev().take_while(|a| a.time_s > now_s - horizon).count() as f64;
                let prompt: f64 = q.iter().map(|a| f64::from(a.prompt_tokens)).sum();
                let output: f64 = q.iter().map(|a| f64::from(a.output_tokens)).sum();
                TierStats {
                    arrival_rate: (recent / horizon).max(n / memory),
                    mean_prompt_tokens: (prompt / n).max(1.0),
                    mean_output_tokens: (output / n).max(1.0),
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_and_means_over_the_horizon() {
        let mut o = ArrivalObserver::new(2, 2.0, 2.0, TierStats::new(0.0, 512.0, 128.0));
        o.record(0, 0.5, 100, 10);
        o.record(0, 1.5, 300, 30);
        o.record(0, 2.5, 200, 20);
        let s = o.snapshot(3.0);
        assert_eq!(s[0], TierStats::new(1.0, 250.0, 25.0));
        assert_eq!(s[1], TierStats::new(0.0, 512.0, 128.0));
    }

    #[test]
    fn memory_keeps_a_paused_burst_visible() {
        let mut o = ArrivalObserver::new(1, 2.0, 10.0, TierStats::new(0.0, 512.0, 128.0));
        for k in 0..40 {
            o.record(0, 1.0 + f64::from(k) * 0.025, 100, 10);
        }
        // A burst of 40 in one second: the short horizon sees 20/s.
        assert_eq!(o.snapshot(2.0)[0].arrival_rate, 20.0);
        // Five seconds of silence: the short horizon sees nothing, the
        // 10-second memory still 4/s.
        assert_eq!(o.snapshot(7.0)[0].arrival_rate, 4.0);
        // Past the memory the tier is idle.
        assert_eq!(o.snapshot(12.0)[0].arrival_rate, 0.0);
    }
}
