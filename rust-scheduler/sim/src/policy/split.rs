//! `split`: one static partition per tier, sized by the tier's share of the
//! trace's requests. Each partition is what a competent operator would
//! deploy for its tier alone: the production planner over the partition's
//! GPUs at one static TP level (prefill/decode pairs or colocated groups,
//! whichever it finds best), the TP level the one with the most
//! SLO-compliant capacity. Served by the production control loop with the
//! plan fixed: admission within each partition's SLO budget, overflow
//! rejected (counted as missed), never spilled to another tier.

use std::sync::Arc;

use serde_json::{json, Value};
use tiertp_scheduler::plan::{GroupPlan, Plan};
use tiertp_scheduler::planner::{Planner, PlannerConfig};
use tiertp_scheduler::tiers::TierSet;
use tiertp_scheduler::topology::{Allocator, Cluster};

use super::Ctx;

/// GPUs per tier by largest remainder, each tier with traffic at least one.
fn shares(gpus: u32, rates: &[f64]) -> Vec<u32> {
    let total: f64 = rates.iter().sum();
    if total <= 0.0 {
        return vec![gpus / rates.len().max(1) as u32; rates.len()];
    }
    let exact: Vec<f64> = rates.iter().map(|r| r / total * f64::from(gpus)).collect();
    let mut out: Vec<u32> = exact.iter().map(|e| e.floor() as u32).collect();
    for (o, r) in out.iter_mut().zip(rates) {
        if *r > 0.0 && *o == 0 {
            *o = 1;
        }
    }
    while out.iter().sum::<u32>() > gpus {
        let i = (0..out.len())
            .filter(|&i| out[i] > 1)
            .max_by(|&a, &b| out[a].cmp(&out[b]))
            .unwrap_or(0);
        out[i] -= 1;
    }
    let mut order: Vec<usize> = (0..out.len()).collect();
    order.sort_by(|&a, &b| (exact[b] - exact[b].floor()).total_cmp(&(exact[a] - exact[a].floor())));
    let mut k = 0;
    while out.iter().sum::<u32>() < gpus {
        out[order[k % order.len()]] += 1;
        k += 1;
    }
    out
}

/// A partition: the tier's groups on GPUs 0.. of its own, and its layout.
struct Partition {
    tier: usize,
    gpus: u32,
    tp: u32,
    groups: Vec<GroupPlan>,
    capacity_rps: f64,
}

/// The best single-tier plan for `gpus` GPUs at one static TP level.
fn best_partition(ctx: &Ctx, tier: usize, gpus: u32) -> Result<Option<Partition>, String> {
    if gpus == 0 {
        return Ok(None);
    }
    let t = &ctx.tiers.tiers()[tier];
    let alone = TierSet::new(vec![t.clone()], "split partition").map_err(|e| e.to_string())?;
    let cluster = Cluster::new(vec![gpus.min(ctx.settings.gpus_per_node)]).map_err(|e| e.to_string())?;
    let mut best: Option<Partition> = None;
    for tp in ctx.profile.tp_levels() {
        if !PlannerConfig::default().tp_levels.contains(&tp) || tp > cluster.num_gpus() {
            continue;
        }
        let config = PlannerConfig {
            tp_levels: vec![tp],
            ..PlannerConfig::default()
        };
        let Ok(planner) = Planner::new(Arc::clone(ctx.profile), alone.clone(), cluster.clone(), config) else {
            continue;
        };
        let (plan, _) = planner.propose(&ctx.trace_stats[tier..=tier]).map_err(|e| e.to_string())?;
        let capacity_rps = plan.tier_capacity_rps[0];
        if best.as_ref().is_none_or(|b| capacity_rps > b.capacity_rps * (1.0 + 1e-9)) {
            best = Some(Partition {
                tier,
                gpus,
                tp,
                groups: plan.groups,
                capacity_rps,
            });
        }
    }
    Ok(best)
}

/// The fixed plan of every partition on the cluster, and a description.
pub fn partition_plan(ctx: &Ctx) -> Result<(Plan, Value), String> {
    let n = ctx.tiers.len();
    let rates: Vec<f64> = ctx.trace_stats.iter().map(|s| s.arrival_rate).collect();
    let gpus = shares(ctx.cluster.num_gpus(), &rates);
    let mut parts = Vec::new();
    for (t, &g) in gpus.iter().enumerate() {
        parts.extend(best_partition(ctx, t, g)?);
    }
    // Largest groups first keep the aligned blocks they need.
    let mut placed: Vec<(usize, GroupPlan)> = parts.iter().flat_map(|p| p.groups.iter().map(move |g| (p.tier, *g))).collect();
    placed.sort_by_key(|(_, g)| std::cmp::Reverse(g.tp));
    let mut alloc = Allocator::new(ctx.cluster);
    let mut groups = Vec::new();
    for (tier, g) in placed {
        if let Some(first_gpu) = alloc.allocate(g.tp) {
            groups.push(GroupPlan { tier, first_gpu, ..g });
        }
    }
    groups.sort_by_key(|g| g.first_gpu);
    let tier_served_share = tiertp_scheduler::planner::tier_served_shares(n, &groups);
    let mut tier_capacity_rps = vec![0.0; n];
    for p in &parts {
        tier_capacity_rps[p.tier] = p.capacity_rps;
    }
    let layout = json!({"partitions": parts.iter().map(|p| json!({
        "tier": ctx.tiers.tiers()[p.tier].name, "tp": p.tp, "gpus": p.gpus, "capacity_rps": p.capacity_rps,
    })).collect::<Vec<_>>()});
    Ok((
        Plan {
            num_gpus: ctx.cluster.num_gpus(),
            groups,
            tier_capacity_rps,
            tier_served_share,
            pooled_on: vec![None; n],
        },
        layout,
    ))
}

#[cfg(test)]
mod tests {
    use super::shares;

    #[test]
    fn shares_sum_to_the_cluster_and_give_every_tier_one() {
        assert_eq!(shares(8, &[3.0, 1.0]), vec![6, 2]);
        assert_eq!(shares(8, &[100.0, 0.1]), vec![7, 1]);
        assert_eq!(shares(4, &[0.0, 0.0]), vec![2, 2]);
        assert_eq!(shares(9, &[1.0, 1.0, 1.0]).iter().sum::<u32>(), 9);
    }
}
