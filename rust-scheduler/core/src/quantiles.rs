//! Equal-mass quantile summaries of an empirical distribution: `POINTS`
//! values at the quantiles (i + 0.5) / POINTS, each standing for 1/POINTS
//! of the mass (Copy, no allocation), shared by the rate shape and the
//! prompt-length distribution.

/// Quantile points kept per summary.
pub const POINTS: usize = 16;

/// Finer points over the top 1/POINTS of the mass: where a summary's top
/// point alone would say a cap past it serves every value, these tell how
/// much of the tail a cap below the largest values leaves out.
pub const TAIL_POINTS: usize = 4;

/// The quantile of each point of a summary.
fn mid_quantile(i: usize) -> f64 {
    (i as f64 + 0.5) / POINTS as f64
}

/// The quantile of each tail point: the midpoints of TAIL_POINTS equal parts
/// of the top 1/POINTS.
fn tail_quantile(j: usize) -> f64 {
    (POINTS as f64 - 1.0 + (j as f64 + 0.5) / TAIL_POINTS as f64) / POINTS as f64
}

/// The `q` quantile of `sorted` (ascending, non-empty), interpolating
/// linearly between order statistics.
fn quantile(sorted: &[f64], q: f64) -> f64 {
    let n = sorted.len();
    let pos = q * n as f64 - 0.5;
    let lo = pos.floor().clamp(0.0, (n - 1) as f64) as usize;
    let hi = (lo + 1).min(n - 1);
    let frac = (pos - lo as f64).clamp(0.0, 1.0);
    sorted[lo] + (sorted[hi] - sorted[lo]) * frac
}

/// The quantile points of `sorted` (ascending, non-empty).
pub fn midpoints(sorted: &[f64]) -> [f64; POINTS] {
    assert!(!sorted.is_empty(), "quantiles of an empty sample");
    std::array::from_fn(|i| quantile(sorted, mid_quantile(i)))
}

/// The tail points of `sorted` (ascending, non-empty).
pub fn tail_points(sorted: &[f64]) -> [f64; TAIL_POINTS] {
    assert!(!sorted.is_empty(), "quantiles of an empty sample");
    std::array::from_fn(|j| quantile(sorted, tail_quantile(j)))
}

/// The value below which `q` of the weight lies, of `values` sorted
/// ascending with positive `total` weight.
fn weighted_quantile(values: &[(f64, f64)], total: f64, q: f64) -> f64 {
    let target = q * total;
    let (mut k, mut below) = (0, 0.0);
    while k + 1 < values.len() && below + values[k].1.max(0.0) < target {
        below += values[k].1.max(0.0);
        k += 1;
    }
    values[k].0
}

/// The quantile points and tail points of a mixture of weighted values (a
/// value with weight w counts w times); None when no value has positive
/// weight.
pub fn weighted_summary(values: &mut [(f64, f64)]) -> Option<([f64; POINTS], [f64; TAIL_POINTS])> {
    let total: f64 = values.iter().map(|(_, w)| w.max(0.0)).sum();
    if total <= 0.0 {
        return None;
    }
    values.sort_by(|a, b| a.0.total_cmp(&b.0));
    Some((
        std::array::from_fn(|i| weighted_quantile(values, total, mid_quantile(i))),
        std::array::from_fn(|j| weighted_quantile(values, total, tail_quantile(j))),
    ))
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
        // The top 100 values in four parts of 25: midpoints 1512, 1537, ...
        let t = tail_points(&range);
        assert!((t[0] - 1512.0).abs() < 1e-9 && (t[TAIL_POINTS - 1] - 1587.0).abs() < 1e-9, "{t:?}");
    }

    #[test]
    fn a_mixture_keeps_each_part_in_proportion() {
        let mut values = [(100.0, 3.0), (1000.0, 1.0)];
        let (p, tail) = weighted_summary(&mut values).unwrap();
        assert_eq!(p.iter().filter(|&&x| x == 100.0).count(), 12);
        assert_eq!(p.iter().filter(|&&x| x == 1000.0).count(), 4);
        assert_eq!(tail, [1000.0; TAIL_POINTS]);
        assert!(weighted_summary(&mut [(5.0, 0.0)]).is_none());
    }
}
