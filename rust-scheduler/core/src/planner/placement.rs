//! Stable placement: when a new plan is adopted, groups that exist in the
//! current plan with the same (tier, role, TP) on the same node keep their
//! GPUs, so only the GPUs that really change role or TP level switch. A
//! group stays on the node the proposal put it on: a prefilled request's
//! KV moves only within its node, so which node holds which group is part
//! of the plan.

use std::collections::VecDeque;

use rustc_hash::FxHashMap;

use crate::plan::{Plan, Role};
use crate::topology::{Allocator, Cluster};

type Group = (usize, Role, u32, u32);

/// Re-places `groups` (tier, role, tp, first) on their nodes, preferring
/// current positions; the rest go largest first, lowest free place on the
/// node. `None` if that cannot place them all (the caller then keeps the
/// proposal's own placement).
pub fn stable(cluster: &Cluster, current: &Plan, groups: &[Group]) -> Option<Vec<Group>> {
    let mut alloc = Allocator::new(cluster);
    // The current groups of each (tier, role, TP, node), in plan order.
    let mut current_of: FxHashMap<(usize, Role, u32, usize), VecDeque<u32>> = FxHashMap::default();
    for g in &current.groups {
        current_of
            .entry((g.tier, g.role, g.tp, cluster.node_of(g.first_gpu)?))
            .or_default()
            .push_back(g.first_gpu);
    }
    let mut placed: Vec<Option<Group>> = vec![None; groups.len()];
    for (i, &(tier, role, tp, first)) in groups.iter().enumerate() {
        let Some(candidates) = current_of.get_mut(&(tier, role, tp, cluster.node_of(first)?)) else {
            continue;
        };
        while let Some(first) = candidates.pop_front() {
            if alloc.take(first, tp) {
                placed[i] = Some((tier, role, tp, first));
                break;
            }
        }
    }
    let mut rest: Vec<usize> = (0..groups.len()).filter(|&i| placed[i].is_none()).collect();
    rest.sort_by_key(|&i| std::cmp::Reverse(groups[i].2));
    for i in rest {
        let (tier, role, tp, first) = groups[i];
        let node = cluster.node_of(first)?;
        let (start, size) = (cluster.node_first_gpu(node), cluster.node_sizes()[node]);
        let at = (0..size)
            .step_by(tp as usize)
            .map(|local| start + local)
            .find(|&f| alloc.take(f, tp))?;
        placed[i] = Some((tier, role, tp, at));
    }
    placed.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::GroupPlan;

    fn current(groups: &[(Role, u32, u32)]) -> Plan {
        Plan {
            num_gpus: 16,
            groups: groups
                .iter()
                .map(|&(role, tp, first_gpu)| GroupPlan {
                    tier: 0,
                    role,
                    tp,
                    first_gpu,
                    capacity_rps: 1.0,
                    batch_cap: 1,
                    token_cap: 0,
                    slo_budget: 1,
                    max_prompt_tokens: 0,
                    served_share: 1.0,
                })
                .collect(),
            tier_capacity_rps: vec![1.0],
            tier_served_share: vec![1.0],
            pooled_on: vec![None],
        }
    }

    #[test]
    fn groups_keep_their_gpus_only_on_the_node_the_proposal_chose() {
        let cluster = Cluster::uniform(16, 8).unwrap();
        // Now: both TP4 decode groups on node 0, prefill on node 1.
        let now = current(&[
            (Role::Decode, 4, 0),
            (Role::Decode, 4, 4),
            (Role::Prefill, 4, 8),
            (Role::Prefill, 4, 12),
        ]);
        // Proposed: a decode and a prefill group on each node.
        let proposed = [
            (0, Role::Decode, 4, 0),
            (0, Role::Prefill, 4, 4),
            (0, Role::Decode, 4, 8),
            (0, Role::Prefill, 4, 12),
        ];
        let placed = stable(&cluster, &now, &proposed).unwrap();
        for node in 0..2 {
            let roles: Vec<Role> = placed.iter().filter(|g| cluster.node_of(g.3) == Some(node)).map(|g| g.1).collect();
            assert!(
                roles.contains(&Role::Prefill) && roles.contains(&Role::Decode),
                "node {node}: {placed:?}"
            );
        }
        // Node 0's decode group and one of node 1's prefill groups stay put.
        assert!(
            placed.contains(&(0, Role::Decode, 4, 0)) && placed.contains(&(0, Role::Prefill, 4, 8)),
            "{placed:?}"
        );
    }
}
