//! Equal-mass quantile summaries of an empirical distribution: `POINTS`
//! values at the quantiles (i + 0.5) / POINTS, each standing for 1/POINTS
//! of the mass (Copy, no allocation), shared by the rate shape and the
//! prompt-length distribution.

/// Quantile points kept per summary.
pub const POINTS: usize = 16;

/// The quantile points of `sorted` (ascending, non-empty), interpolating
/// linearly between order statistics.
pub fn midpoints(sorted: &[f64]) -> [f64; POINTS] {
    assert!(!sorted.is_empty(), "quantiles of an empty sample");
    let n = sorted.len();
    let mut points = [0.0; POINTS];
    for (i, p) in points.iter_mut().enumerate() {
        let pos = ((i as f64 + 0.5) / POINTS as f64) * n as f64 - 0.5;
        let lo = pos.floor().clamp(0.0, (n - 1) as f64) as usize;
        let hi = (lo + 1).min(n - 1);
        let frac = (pos - lo as f64).clamp(0.0, 1.0);
        *p = sorted[lo] + (sorted[hi] - sorted[lo]) * frac;
    }
    points
}

/// The quantile points of a mixture of weighted values (a value with weight
/// w counts w times); None when no value has positive weight.
pub fn weighted_midpoints(values: &mut [(f64, f64)]) -> Option<[f64; POINTS]> {
    let total: f64 = values.iter().map(|(_, w)| w.max(0.0)).sum();
    if total <= 0.0 {
        return None;
    }
    values.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut points = [0.0; POINTS];
    let (mut k, mut below) = (0, 0.0);
    for (i, p) in points.iter_mut().enumerate() {
        let target = (i as f64 + 0.5) / POINTS as f64 * total;
        while k + 1 < values.len() && below + values[k].1.max(0.0) < target {
            below += values[k].1.max(0.0);
            k += 1;
        }
        *p = values[k].0;
    }
    Some(points)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn midpoints_of_a_constant_and_of_a_range() {
        assert_eq!(midpoints(&[7.0]), [7.0; POINTS]);
        let range: Vec<f64> = (0..1600).map(f64::from).collect();
        let p = midpoints(&range);
        assert!((p[0] - 49.5).abs() < 1e-9 && (p[POINTS - 1] - 1549.5).abs() < 1e-9, "{p:?}");
    }

    #[test]
    fn a_mixture_keeps_each_part_in_proportion() {
        let mut values = [(100.0, 3.0), (1000.0, 1.0)];
        let p = weighted_midpoints(&mut values).unwrap();
        assert_eq!(p.iter().filter(|&&x| x == 100.0).count(), 12);
        assert_eq!(p.iter().filter(|&&x| x == 1000.0).count(), 4);
        assert!(weighted_midpoints(&mut [(5.0, 0.0)]).is_none());
    }
}
