//! Comparing plans: the objective and per-GPU commands.

use crate::estimator::TierEstimate;
use crate::plan::{GpuCommand, GroupPlan, Plan, Role};
use crate::prompt_lengths::best_served_share;
use crate::tiers::Tier;

/// Per tier: colocated capacity plus the balanced part of prefill/decode.
pub fn tier_capacities(num_tiers: usize, groups: &[GroupPlan]) -> Vec<f64> {
    let mut parts = vec![(0.0, 0.0, 0.0); num_tiers];
    for g in groups {
        let p = &mut parts[g.tier];
        match g.role {
            Role::Colocated => p.0 += g.capacity_rps,
            Role::Prefill => p.1 += g.capacity_rps,
            Role::Decode => p.2 += g.capacity_rps,
        }
    }
    parts.into_iter().map(|(c, p, d): (f64, f64, f64)| c + p.min(d)).collect()
}

/// Per tier: the best served share of its prefill-capable groups (1 with
/// none).
pub fn tier_served_shares(num_tiers: usize, groups: &[GroupPlan]) -> Vec<f64> {
    (0..num_tiers)
        .map(|tier| {
            best_served_share(
                groups
                    .iter()
                    .filter(|g| g.tier == tier && g.role.takes_prefill() && g.capacity_rps > 0.0)
                    .map(|g| g.served_share),
            )
        })
        .collect()
}

/// Weighted goodput the plan can deliver: Σ_t weight_t · E[min(λ_t,
/// capacity_t)] over the tier's rate variation and the share of its
/// prompts the plan can serve in time (`TierStats::served_within`), with
/// λ_t the demand its prefill-capable groups admit (`blocking`).
pub fn objective(tiers: &[Tier], estimates: &[TierEstimate], plan: &Plan) -> f64 {
    let admitted = super::blocking::admitted_shares(tiers, estimates, plan);
    tiers
        .iter()
        .zip(estimates)
        .zip(plan.tier_capacity_rps.iter().zip(&plan.tier_served_share))
        .zip(admitted)
        .map(|(((t, e), (&cap, &share)), admitted)| t.weight * e.stats.served_within(admitted, cap, share))
        .sum()
}

/// Commands for every GPU whose (tier, role, TP group) differs from `old`.
pub fn commands(old: Option<&Plan>, new: &Plan) -> Vec<GpuCommand> {
    let old_of_gpu = old.map(|p| (p, p.group_of_gpu()));
    let mut out = Vec::new();
    for g in &new.groups {
        for gpu in g.gpus() {
            let unchanged = old_of_gpu.as_ref().is_some_and(|(p, map)| {
                map.get(gpu as usize)
                    .copied()
                    .flatten()
                    .is_some_and(|i| p.groups[i].same_assignment(g))
            });
            if !unchanged {
                out.push(GpuCommand {
                    gpu,
                    tier: g.tier,
                    role: g.role,
                    tp: g.tp,
                    group_first_gpu: g.first_gpu,
                    batch_cap: g.batch_cap,
                    token_cap: g.token_cap,
                });
            }
        }
    }
    out
}
