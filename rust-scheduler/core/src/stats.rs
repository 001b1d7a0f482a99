//! What the control loop observes per tier: arrival rate, how it varies
//! across windows, and mean lengths over a sliding horizon of recent windows.

use std::collections::VecDeque;

use crate::rate_shape::RateShape;
use crate::tiers::TierId;

/// Per-tier load the estimator plans for.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TierStats {
    /// Requests per second.
    pub arrival_rate: f64,
    pub mean_prompt_tokens: f64,
    pub mean_output_tokens: f64,
    /// How the rate varies across control windows (steady unless observed).
    pub rate_shape: RateShape,
}

impl TierStats {
    /// Stats of a steady tier.
    pub fn new(arrival_rate: f64, mean_prompt_tokens: f64, mean_output_tokens: f64) -> Self {
        Self {
            arrival_rate,
            mean_prompt_tokens,
            mean_output_tokens,
            rate_shape: RateShape::steady(),
        }
    }

    pub fn with_rate_shape(self, rate_shape: RateShape) -> Self {
        Self { rate_shape, ..self }
    }

    /// Requests per second a capacity of `capacity_rps` serves of this
    /// tier's demand scaled by `scale` (see `rate_shape`).
    pub fn served(&self, scale: f64, capacity_rps: f64) -> f64 {
        self.rate_shape.served(self.arrival_rate * scale, capacity_rps)
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
/// seconds keeps its GPUs); mean lengths come from the longer span, and so
/// does the rate's shape: the arrival counts of the full `window_s` windows
/// since the tier's oldest remembered arrival. Tiers with no arrivals report
/// rate 0 and the prior lengths.
#[derive(Debug, Clone)]
pub struct ArrivalObserver {
    horizon_s: f64,
    memory_s: f64,
    window_s: f64,
    prior: TierStats,
    per_tier: Vec<VecDeque<Arrival>>,
}

impl ArrivalObserver {
    /// `prior` supplies the lengths used for a tier that has seen nothing
    /// yet; `memory_s` below `horizon_s` is raised to it (no memory).
    pub fn new(num_tiers: usize, horizon_s: f64, memory_s: f64, window_s: f64, prior: TierStats) -> Self {
        assert!(horizon_s > 0.0, "horizon must be positive");
        assert!(window_s > 0.0, "window must be positive");
        Self {
            horizon_s,
            memory_s: memory_s.max(horizon_s),
            window_s,
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
        let (horizon, memory, window, prior) = (self.horizon_s, self.memory_s, self.window_s, self.prior);
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
                    rate_shape: RateShape::from_counts(&window_counts(q, now_s, window)),
                }
            })
            .collect()
    }
}

/// Arrivals per full window, from the window of the oldest arrival in `q`
/// to the last one that ended by `now_s` (the one in progress is partial).
fn window_counts(q: &VecDeque<Arrival>, now_s: f64, window_s: f64) -> Vec<f64> {
    let Some(first) = q.front() else { return Vec::new() };
    let start = (first.time_s / window_s).floor();
    let end = (now_s / window_s).floor();
    let n = (end - start).max(0.0) as usize;
    let mut counts = vec![0.0; n];
    for a in q {
        let k = ((a.time_s / window_s).floor() - start) as usize;
        if k < n {
            counts[k] += 1.0;
        }
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_and_means_over_the_horizon() {
        let mut o = ArrivalObserver::new(2, 2.0, 2.0, 1.0, TierStats::new(0.0, 512.0, 128.0));
        o.record(0, 0.5, 100, 10);
        o.record(0, 1.5, 300, 30);
        o.record(0, 2.5, 200, 20);
        let s = o.snapshot(3.0);
        assert_eq!(s[0], TierStats::new(1.0, 250.0, 25.0), "too few windows for a shape");
        assert_eq!(s[1], TierStats::new(0.0, 512.0, 128.0));
    }

    #[test]
    fn memory_keeps_a_paused_burst_visible() {
        let mut o = ArrivalObserver::new(1, 2.0, 10.0, 1.0, TierStats::new(0.0, 512.0, 128.0));
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

    #[test]
    fn shape_of_steady_and_bursty_tiers() {
        let prior = TierStats::new(0.0, 512.0, 128.0);
        let mut o = ArrivalObserver::new(2, 2.0, 30.0, 1.0, prior);
        for k in 0..200 {
            // Tier 0: 10/s, evenly spread.
            o.record(0, f64::from(k) * 0.1, 100, 10);
        }
        for w in 0..20 {
            // Tier 1: 20 arrivals in every fifth window, none in between.
            if w % 5 == 0 {
                for k in 0..20 {
                    o.record(1, f64::from(w) + f64::from(k) * 0.01, 100, 10);
                }
            }
        }
        let s = o.snapshot(20.0);
        assert!(s[0].rate_shape.is_steady(), "{:?}", s[0].rate_shape);
        assert!(s[1].rate_shape.cv() > 1.5, "{:?}", s[1].rate_shape);
        // At its mean rate the bursty tier is served a fraction of it.
        let mean = s[1].arrival_rate;
        assert!(s[1].served(1.0, mean) < 0.5 * mean);
    }
}
