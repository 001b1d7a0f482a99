//! A tier's prompt-length distribution, as quantile points (`quantiles`).
//!
//! The estimator needs more than the mean: prompt lengths are heavy-tailed
//! (a coefficient of variation of 2 is common), and a TP level that cannot
//! prefill a mean-length prompt within the TTFT may still serve most of a
//! tier's prompts in time, while the longest ones fit no TP level at all.
//! Judged by the mean alone, such a tier looked unservable at every TP level
//! and got no SLO capacity.

use crate::quantiles::{self, POINTS, TAIL_POINTS};

/// The largest of the served shares of a tier's prefill-capable stages or
/// groups; 1 when there is none above 0 (nothing is then served, for a
/// reason other than prompt length, so no share of the demand is excused).
pub fn best_served_share(shares: impl IntoIterator<Item = f64>) -> f64 {
    let best = shares.into_iter().fold(0.0, f64::max);
    if best > 0.0 {
        best
    } else {
        1.0
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PromptLengths {
    /// Prompt tokens at the quantiles (i + 0.5) / POINTS, ascending.
    points: [f64; POINTS],
    /// The top 1/POINTS of the prompts in finer points (`quantiles::tail_points`).
    tail: [f64; TAIL_POINTS],
}

impl PromptLengths {
    /// Every prompt `tokens` long (what a mean alone says).
    pub const fn all(tokens: f64) -> Self {
        Self {
            points: [tokens; POINTS],
            tail: [tokens; TAIL_POINTS],
        }
    }

    /// From observed prompt lengths; None when there are none.
    pub fn from_samples(lengths: impl Iterator<Item = u32>) -> Option<Self> {
        let mut sorted: Vec<u32> = lengths.collect();
        if sorted.is_empty() {
            return None;
        }
        sorted.sort_unstable();
        let sorted: Vec<f64> = sorted.into_iter().map(f64::from).collect();
        Some(Self {
            points: quantiles::midpoints(&sorted),
            tail: quantiles::tail_points(&sorted),
        })
    }

    /// The lengths of several tiers' prompts together, each given as (rate,
    /// lengths); None when no part has a positive rate.
    pub fn mixture(parts: &[(f64, PromptLengths)]) -> Option<Self> {
        // Each part's top point stands for its tail points.
        let mut values: Vec<(f64, f64)> = parts
            .iter()
            .flat_map(|(rate, l)| {
                let below = l.points[..POINTS - 1].iter().map(move |&p| (p, *rate));
                below.chain(l.tail.iter().map(move |&p| (p, *rate / TAIL_POINTS as f64)))
            })
            .collect();
        quantiles::weighted_summary(&mut values).map(|(points, tail)| Self { points, tail })
    }

    /// The share of prompts of at most `longest` tokens.
    pub fn share_within(&self, longest: f64) -> f64 {
        let below = self.points[..POINTS - 1].iter().filter(|&&p| p <= longest).count();
        let in_tail = if below == POINTS - 1 {
            self.tail.iter().filter(|&&p| p <= longest).count()
        } else {
            0
        };
        (below as f64 + in_tail as f64 / TAIL_POINTS as f64) / POINTS as f64
    }

    /// Ascending; each point stands for 1/POINTS of the prompts.
    pub fn points(&self) -> &[f64; POINTS] {
        &self.points
    }

    /// The servable subsets a stage may plan for, largest first: for each
    /// distinct cutoff, the share of prompts up to it, their mean length and
    /// the longest of them. The points' mean estimates the true mean with a
    /// bias (a heavy tail's top point is below that tail's mean), so each
    /// subset's mean is scaled by `mean_tokens` / the points' mean: the
    /// whole set's mean is `mean_tokens` exactly.
    pub fn subsets(&self, mean_tokens: f64) -> impl Iterator<Item = Subset> + '_ {
        let all: f64 = self.points.iter().sum::<f64>() / POINTS as f64;
        let scale = if all > 0.0 { mean_tokens / all } else { 1.0 };
        (1..=POINTS)
            .rev()
            .filter(|&k| k == POINTS || self.points[k - 1] < self.points[k])
            .map(move |k| {
                let longest = self.points[k - 1];
                let part = &self.points[..k];
                let mean = part.iter().sum::<f64>() / k as f64;
                let variance = part.iter().map(|p| (p - mean) * (p - mean)).sum::<f64>() / k as f64;
                let mean_tokens = if k == POINTS { mean_tokens } else { (mean * scale).max(1.0) };
                Subset {
                    share: k as f64 / POINTS as f64,
                    mean_tokens,
                    longest,
                    excess_tokens: variance * scale * scale / mean_tokens,
                }
            })
    }
}

/// The prompts up to a cutoff (`PromptLengths::subsets`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Subset {
    /// Their share of all prompts.
    pub share: f64,
    pub mean_tokens: f64,
    /// The longest (the cutoff).
    pub longest: f64,
    /// How much longer than `mean_tokens` the prompt being prefilled when
    /// one of them arrives is on average, E[l²]/E[l] − E[l]: a random arrival
    /// more likely finds a long prompt running, since it runs longer.
    pub excess_tokens: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mean_alone_is_one_subset() {
        let l = PromptLengths::all(1000.0);
        let subsets: Vec<Subset> = l.subsets(1000.0).collect();
        assert_eq!(
            subsets,
            [Subset {
                share: 1.0,
                mean_tokens: 1000.0,
                longest: 1000.0,
                excess_tokens: 0.0,
            }]
        );
    }

    #[test]
    fn a_heavy_tail_leaves_out_its_longest_prompts_first() {
        // 15 of 16 prompts of 500 tokens, one of 20,500: mean 1,750.
        let samples = (0..160).map(|i| if i % 16 == 15 { 20_500 } else { 500 });
        let l = PromptLengths::from_samples(samples).unwrap();
        let subsets: Vec<Subset> = l.subsets(1750.0).collect();
        assert_eq!(subsets.len(), 2, "{subsets:?}");
        assert_eq!((subsets[0].share, subsets[0].mean_tokens), (1.0, 1750.0));
        assert_eq!(subsets[1].share, 15.0 / 16.0);
        assert!((subsets[1].mean_tokens - 500.0).abs() < 1e-9, "{subsets:?}");
        assert_eq!(subsets[1].longest, 500.0);
        // The batch an arrival finds running: E[l²]/E[l] − E[l] longer than
        // the mean, (15 x 1250² + 18750²) / 16 / 1750 tokens for all of
        // them, nothing for prompts all alike.
        assert!((subsets[0].excess_tokens - 23_437_500.0 / 1750.0).abs() < 1e-6, "{subsets:?}");
        assert_eq!(subsets[1].excess_tokens, 0.0);
    }

    #[test]
    fn a_cap_below_the_top_point_leaves_out_only_the_tail_past_it() {
        // 1 prompt in 32 is 20,000 tokens: the top point (half way into the
        // last 1/16) falls between them and the rest; the tail points tell
        // that a 5,000-token cap serves 31 of 32.
        let samples = (0..640).map(|i| if i >= 620 { 20_000 } else { 500 });
        let l = PromptLengths::from_samples(samples).unwrap();
        assert_eq!(l.share_within(5_000.0), 31.0 / 32.0);
        assert_eq!(l.share_within(20_000.0), 1.0);
        assert_eq!(l.share_within(400.0), 0.0);
        // A rate-weighted mixture keeps the tail in proportion.
        let m = PromptLengths::mixture(&[(1.0, l), (1.0, PromptLengths::all(500.0))]).unwrap();
        assert_eq!(m.share_within(5_000.0), 63.0 / 64.0);
    }

    #[test]
    fn a_mixture_weights_by_rate() {
        let m = PromptLengths::mixture(&[(3.0, PromptLengths::all(100.0)), (1.0, PromptLengths::all(900.0))]).unwrap();
        assert_eq!(m.points().iter().filter(|&&p| p == 100.0).count(), 12);
        assert!(PromptLengths::mixture(&[(0.0, PromptLengths::all(1.0))]).is_none());
    }
}
