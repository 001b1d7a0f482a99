//! Comparing plans: the objective and per-GPU commands.

use crate::estimator::TierEstimate;
use crate::plan::{GpuCommand, GroupPlan, Plan, Role};
use crate::prompt_lengths::best_served_share;
use crate::tiers::Tier;
use crate::topology::Cluster;

/// Per tier: colocated capacity plus, node by node, the balanced part of
/// prefill/decode: a prefilled request's KV moves only within its node, so
/// a node's prefill beyond its own decode serves nothing. Summed over the
/// cluster, two nodes of 8 H200 (70B) counted a TP4 decode group on one
/// node for the surplus prefill groups on the other, and the plan valued
/// at 21 req/s served 15.
pub fn tier_capacities(num_tiers: usize, groups: &[GroupPlan], cluster: &Cluster) -> Vec<f64> {
    // (colocated, per node (prefill, decode)).
    let nodes = cluster.node_sizes().len().max(1);
    let mut parts = vec![(0.0, vec![(0.0, 0.0); nodes]); num_tiers];
    for g in groups {
        let (colocated, per_node) = &mut parts[g.tier];
        let node = cluster.node_of(g.first_gpu).unwrap_or(0);
        match g.role {
            Role::Colocated => *colocated += g.capacity_rps,
            Role::Prefill => per_node[node].0 += g.capacity_rps,
            Role::Decode => per_node[node].1 += g.capacity_rps,
        }
    }
    parts
        .into_iter()
        .map(|(c, per_node): (f64, Vec<(f64, f64)>)| c + per_node.iter().map(|&(p, d): &(f64, f64)| p.min(d)).sum::<f64>())
        .collect()
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

#[cfg(test)]
mod tests {
    use super::*;

    fn group(role: Role, tp: u32, first_gpu: u32, capacity_rps: f64) -> GroupPlan {
        GroupPlan {
            tier: 0,
            role,
            tp,
            first_gpu,
            capacity_rps,
            batch_cap: 1,
            token_cap: 0,
            slo_budget: 1,
            max_prompt_tokens: 0,
            served_share: 1.0,
        }
    }

    #[test]
    fn prefill_counts_only_up_to_the_decode_on_its_own_node() {
        // Node 0: a TP4 prefill (8 req/s) and a TP4 decode (40); node 1:
        // three TP2 prefill groups (12) and a TP2 decode (9). Summed over
        // the cluster it would be min(20, 49) = 20; KV stays on its node:
        // 8 + 9.
        let groups = [
            group(Role::Prefill, 4, 0, 8.0),
            group(Role::Decode, 4, 4, 40.0),
            group(Role::Prefill, 2, 8, 4.0),
            group(Role::Prefill, 2, 10, 4.0),
            group(Role::Decode, 2, 12, 9.0),
            group(Role::Prefill, 2, 14, 4.0),
        ];
        let two_nodes = Cluster::new(vec![8, 8]).unwrap();
        assert_eq!(tier_capacities(1, &groups, &two_nodes), vec![17.0]);
        // A colocated group counts whole wherever it is.
        let colocated = [group(Role::Colocated, 1, 9, 2.5)];
        assert_eq!(tier_capacities(1, &colocated, &two_nodes), vec![2.5]);
    }
}
