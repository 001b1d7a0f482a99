//! How a tier's arrival rate varies from one control window to the next,
//! and what that does to the goodput a given capacity can serve.
//!
//! A request must start within its TTFT, so a window's arrivals beyond the
//! tier's capacity cannot wait for a quieter window: they are lost. With a
//! rate that varies across windows as Λ (mean μ), a capacity `c` serves
//! E[min(Λ, c)] per second, not min(μ, c). Real traces are far from steady
//! (the Azure code trace's per-second rate has a coefficient of variation
//! of ~1.6), so planning with the mean alone buys capacity that idles
//! between bursts and overrates bursty tiers.
//!
//! The shape is the empirical distribution of per-window rates over the
//! observer's memory, relative to their mean, kept as quantile points
//! (`quantiles`); a steady tier has every point at 1.

use crate::quantiles::{self, POINTS};

/// Fewer full windows than this: too little to tell, planned as steady.
pub const MIN_WINDOWS: usize = 8;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateShape {
    /// Per-window rate / mean rate at the quantiles (i + 0.5) / POINTS,
    /// ascending; their mean is 1.
    points: [f64; POINTS],
    /// Every point is 1 (the planner's hot path then takes a min).
    steady: bool,
}

impl Default for RateShape {
    fn default() -> Self {
        Self::steady()
    }
}

impl RateShape {
    /// The same rate every window.
    pub const fn steady() -> Self {
        Self {
            points: [1.0; POINTS],
            steady: true,
        }
    }

    /// From arrival counts of consecutive full windows; steady when there
    /// are too few windows or no arrivals.
    pub fn from_counts(counts: &[f64]) -> Self {
        if counts.len() < MIN_WINDOWS {
            return Self::steady();
        }
        let mut sorted: Vec<f64> = counts.iter().map(|c| c.max(0.0)).collect();
        sorted.sort_by(f64::total_cmp);
        let mut points = quantiles::midpoints(&sorted);
        let mean = points.iter().sum::<f64>() / POINTS as f64;
        if mean <= 0.0 || !mean.is_finite() {
            return Self::steady();
        }
        for p in &mut points {
            *p /= mean;
        }
        let steady = points.iter().all(|&p| (p - 1.0).abs() < 1e-9);
        Self { points, steady }
    }

    pub fn is_steady(&self) -> bool {
        self.steady
    }

    /// Coefficient of variation of the per-window rate.
    pub fn cv(&self) -> f64 {
        let var = self.points.iter().map(|p| (p - 1.0) * (p - 1.0)).sum::<f64>() / POINTS as f64;
        var.sqrt()
    }

    /// Requests per second a capacity of `capacity_rps` serves when the
    /// rate averages `mean_rps` with this shape: E[min(Λ, c)].
    pub fn served(&self, mean_rps: f64, capacity_rps: f64) -> f64 {
        if mean_rps <= 0.0 || capacity_rps <= 0.0 {
            return 0.0;
        }
        if self.steady {
            return mean_rps.min(capacity_rps);
        }
        self.points.iter().map(|p| (p * mean_rps).min(capacity_rps)).sum::<f64>() / POINTS as f64
    }

    /// The least capacity that serves `target_rps` of a rate averaging
    /// `mean_rps` (the inverse of `served`; the peak rate for the whole mean).
    pub fn capacity_for(&self, mean_rps: f64, target_rps: f64) -> f64 {
        if mean_rps <= 0.0 || target_rps <= 0.0 {
            return 0.0;
        }
        if self.steady {
            return target_rps.min(mean_rps);
        }
        // Between points k-1 and k, served(c) = (Σ_{i<k} p_i μ + (N - k) c) / N.
        let n = POINTS as f64;
        let mut below = 0.0;
        for (k, p) in self.points.iter().enumerate() {
            let x = p * mean_rps;
            if (below + (n - k as f64) * x) / n >= target_rps {
                return ((target_rps * n - below) / (n - k as f64)).max(0.0);
            }
            below += x;
        }
        self.peak(mean_rps)
    }

    /// The shape of several tiers' summed rate, each given as (mean rate,
    /// shape), for tiers whose bursts are independent: the form of the
    /// stacked quantiles (point i of the sum is the sum of the tiers' points
    /// i), scaled to the variance of a sum of independent rates, Σ (λ·cv)².
    /// Stacking alone takes every burst to coincide; separate traces'
    /// bursts mostly do not, and a pool's gain is exactly that one tier's
    /// burst fills another's lull.
    pub fn pooled(parts: &[(f64, RateShape)]) -> Self {
        let total: f64 = parts.iter().map(|(rate, _)| rate.max(0.0)).sum();
        if total <= 0.0 || parts.iter().all(|(rate, s)| s.steady || *rate <= 0.0) {
            return Self::steady();
        }
        let mut points = [0.0; POINTS];
        for (i, p) in points.iter_mut().enumerate() {
            *p = parts.iter().map(|(rate, s)| rate.max(0.0) * s.points[i]).sum::<f64>() / total;
        }
        let stacked_cv = Self { points, steady: false }.cv();
        let independent_cv = parts.iter().map(|(rate, s)| (rate.max(0.0) * s.cv()).powi(2)).sum::<f64>().sqrt() / total;
        if stacked_cv > 0.0 {
            for p in &mut points {
                *p = 1.0 + (*p - 1.0) * (independent_cv / stacked_cv);
            }
        }
        Self { points, steady: false }
    }

    /// The mean over windows of this tier's share of the arrivals when it
    /// averages `mean_rps` beside a steady `rest_rps` of other tiers'
    /// (its rate share when it is steady; less when its rate is high in
    /// few windows, the ones where it takes a larger share of the same
    /// room).
    pub fn time_share(&self, mean_rps: f64, rest_rps: f64) -> f64 {
        let share = |x: f64| if x + rest_rps > 0.0 { x / (x + rest_rps) } else { 0.0 };
        if self.steady {
            return share(mean_rps);
        }
        self.points.iter().map(|p| share(p * mean_rps)).sum::<f64>() / POINTS as f64
    }

    /// The rate of the busiest windows (the top quantile point).
    pub fn peak(&self, mean_rps: f64) -> f64 {
        self.points[POINTS - 1] * mean_rps
    }
}

/// How many consecutive windows a burst lasts, on average: the mean length
/// of the runs of windows with more arrivals than the mean of `counts`
/// (consecutive full windows). None with fewer than `MIN_WINDOWS` windows,
/// or none above the mean. Poisson noise gives runs of about two windows;
/// a tier whose load shifts for longer gives long ones, so a reading of it
/// is taken to persist.
pub fn mean_burst_windows(counts: &[f64]) -> Option<f64> {
    if counts.len() < MIN_WINDOWS {
        return None;
    }
    let mean = counts.iter().sum::<f64>() / counts.len() as f64;
    let (mut runs, mut busy) = (0usize, 0usize);
    let mut in_run = false;
    for &c in counts {
        let above = c > mean;
        if above {
            busy += 1;
            if !in_run {
                runs += 1;
            }
        }
        in_run = above;
    }
    (runs > 0).then(|| busy as f64 / runs as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bursts_last_the_mean_run_of_busy_windows() {
        let counts = [1.0, 9.0, 9.0, 9.0, 1.0, 1.0, 9.0, 1.0, 1.0, 1.0];
        // Runs of 3 and 1 windows above the mean of 4.2.
        assert_eq!(mean_burst_windows(&counts), Some(2.0));
        assert_eq!(mean_burst_windows(&counts[..MIN_WINDOWS - 1]), None, "too few windows");
        assert_eq!(mean_burst_windows(&[5.0; 10]), None, "no window above the mean");
    }

    #[test]
    fn steady_serves_the_smaller_of_rate_and_capacity() {
        let s = RateShape::steady();
        assert_eq!(s.served(10.0, 4.0), 4.0);
        assert_eq!(s.served(10.0, 40.0), 10.0);
        assert_eq!(s.cv(), 0.0);
        assert!(s.is_steady());
        assert!(RateShape::from_counts(&[5.0; 3]).is_steady(), "too few windows");
        assert!(RateShape::from_counts(&[5.0; 20]).is_steady());
        assert!(RateShape::from_counts(&[0.0; 20]).is_steady());
    }

    #[test]
    fn capacity_for_inverts_served() {
        let mut counts = vec![1.0; 9];
        counts.push(91.0);
        for shape in [RateShape::from_counts(&counts), RateShape::steady()] {
            for c in [0.5, 1.0, 3.0, 10.0, 40.0, 90.0] {
                let served = shape.served(10.0, c);
                let back = shape.capacity_for(10.0, served);
                assert!((shape.served(10.0, back) - served).abs() < 1e-9, "{c}: {back}");
                assert!(back <= c + 1e-9);
            }
        }
        assert_eq!(RateShape::steady().capacity_for(10.0, 0.0), 0.0);
    }

    #[test]
    fn a_pool_of_tiers_serves_their_summed_rate() {
        let mut counts = vec![1.0; 9];
        counts.push(91.0);
        let bursty = RateShape::from_counts(&counts);
        let pool = RateShape::pooled(&[(10.0, bursty), (30.0, RateShape::steady())]);
        // The mean is kept: ample capacity serves all 40 req/s.
        assert!((pool.served(40.0, 1e6) - 40.0).abs() < 1e-9);
        // Capacity at the mean serves the steady part, and loses the burst.
        let at_mean = pool.served(40.0, 40.0);
        assert!(at_mean < 40.0 - 1.0 && at_mean > 30.0, "{at_mean}");
        assert!(RateShape::pooled(&[(5.0, RateShape::steady()), (0.0, bursty)]).is_steady());
        // Two equal independent tiers: the sum varies by 1/sqrt(2) as much.
        let two = RateShape::pooled(&[(10.0, bursty), (10.0, bursty)]);
        assert!((two.cv() - bursty.cv() / 2f64.sqrt()).abs() < 1e-9, "{} {}", two.cv(), bursty.cv());
    }

    #[test]
    fn a_bursty_tier_has_a_smaller_share_of_the_windows_than_of_the_rate() {
        assert!((RateShape::steady().time_share(3.0, 1.0) - 0.75).abs() < 1e-12);
        // Nine quiet windows of 1 and one burst of 91: mean 10, beside a
        // steady 10. Its rate share is a half; in nine windows of ten it
        // has 1 arrival in 11.
        let mut counts = vec![1.0; 9];
        counts.push(91.0);
        let bursty = RateShape::from_counts(&counts);
        let share = bursty.time_share(10.0, 10.0);
        assert!(share < 0.25, "{share}");
        assert!(share > 1.0 / 11.0, "{share}");
    }

    #[test]
    fn bursts_lose_what_exceeds_capacity() {
        // Nine quiet windows of 1 and one burst of 91: mean 10.
        let mut counts = vec![1.0; 9];
        counts.push(91.0);
        let s = RateShape::from_counts(&counts);
        assert!(s.cv() > 1.0);
        // Capacity at the mean serves far less than the mean...
        assert!(s.served(10.0, 10.0) < 5.0);
        // ...more capacity always serves more, never more than the mean.
        let mut last = 0.0;
        for c in [1.0, 5.0, 10.0, 30.0, 60.0, 100.0, 1000.0] {
            let x = s.served(10.0, c);
            assert!(x >= last - 1e-12 && x <= 10.0 + 1e-9 && x <= c + 1e-9);
            last = x;
        }
        assert!((s.served(10.0, 1e6) - 10.0).abs() < 1e-9);
    }
}
