//! How busy a tier's prefill groups can run before queueing alone breaks
//! the TTFT.
//!
//! A prefill group serves batches of n prompts, each in T_p; the TTFT holds
//! K such batches, so a prompt may find (K − 1)·n prompts ahead of it and
//! still meet it: the group's slack, in prompts. Arrivals join the tier's
//! prefill groups as one queue (the dispatcher sends a prompt to whichever
//! has budget), so c groups drain a queue c times as fast and the tier's
//! slack is the sum of its groups'. Read as one server of deterministic
//! service, an M/D/1 queue at utilization ρ holds ρ²/(2(1 − ρ)) prompts on
//! average; keeping that within the slack S gives ρ ≤ 2S / (2S + 1) (the
//! bound at ρ → 1, slightly below the exact root). A tier whose prefill
//! rests on one group with room for a prompt or two is valued at about
//! 0.7 of its throughput, not the usual target: at the target its queue
//! overruns the TTFT and the prompts are shed (five tiers on 8 A100, a TP1
//! prefill group with a TTFT of two batches, valued above a TP4 one and
//! delivering a quarter less). A tier with several groups, or batches far
//! shorter than its TTFT, keeps the target.

use crate::estimator::StageEstimate;
use crate::tiers::Tier;

/// Whole prefill batches a prompt may find outstanding, its own included,
/// before its TTFT runs out: as many as fit, and at least the estimator's
/// one running plus one queued (two for a tier without a TTFT). A feasible
/// stage only.
pub fn batches_in_ttft(tier: &Tier, stage: &StageEstimate) -> f64 {
    tier.ttft_ms.map_or(2.0, |ttft| (ttft / stage.batch_ms).floor().max(2.0))
}

/// Prompts a prefill group can have ahead of a new one within the TTFT.
/// None for a tier without a TTFT (nothing to break).
pub fn slack_prompts(tier: &Tier, stage: &StageEstimate) -> Option<f64> {
    tier.ttft_ms?;
    if !stage.feasible() || stage.batch_ms <= 0.0 {
        return Some(0.0);
    }
    Some((batches_in_ttft(tier, stage) - 1.0) * f64::from(stage.batch_requests.max(1)))
}

/// The utilization a tier's prefill groups are valued at: `target`, or less
/// where their summed slack (`slack_prompts`) cannot absorb the queue.
pub fn prefill_utilization(slack: f64, target: f64) -> f64 {
    if slack <= 0.0 || slack.is_infinite() {
        return target;
    }
    (2.0 * slack / (2.0 * slack + 1.0)).min(target)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_group_with_little_slack_runs_below_the_target() {
        assert!((prefill_utilization(1.0, 0.85) - 2.0 / 3.0).abs() < 1e-12);
        assert!((prefill_utilization(2.0, 0.85) - 0.8).abs() < 1e-12);
    }

    #[test]
    fn pooled_slack_keeps_the_target() {
        assert_eq!(prefill_utilization(3.0, 0.85), 0.85);
        assert_eq!(prefill_utilization(100.0, 0.85), 0.85);
    }
}
