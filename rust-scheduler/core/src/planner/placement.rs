//! Stable placement: when a new plan is adopted, groups that exist in the
//! current plan with the same (tier, role, TP) keep their GPUs, so only the
//! GPUs that really change role or TP level switch.

use std::collections::VecDeque;

use rustc_hash::FxHashMap;

use crate::plan::{Plan, Role};
use crate::topology::{Allocator, Cluster};

type Group = (usize, Role, u32, u32);

/// Re-places `groups` (tier, role, tp, first) preferring current positions;
/// the rest go largest first, best fit. `None` if that cannot place them all
/// (the caller then keeps the greedy's own placement).
pub fn stable(cluster: &Cluster, current: &Plan, groups: &[Group]) -> Option<Vec<Group>> {
    let mut alloc = Allocator::new(cluster);
    // The current groups of each (tier, role, TP), in plan order.
    let mut current_of: FxHashMap<(usize, Role, u32), VecDeque<u32>> = FxHashMap::default();
    for g in &current.groups {
        current_of.entry((g.tier, g.role, g.tp)).or_default().push_back(g.first_gpu);
    }
    let mut placed: Vec<Option<Group>> = vec![None; groups.len()];
    for (i, &(tier, role, tp, _)) in groups.iter().enumerate() {
        let Some(candidates) = current_of.get_mut(&(tier, role, tp)) else {
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
        let (tier, role, tp, _) = groups[i];
        placed[i] = Some((tier, role, tp, alloc.allocate(tp)?));
    }
    placed.into_iter().collect()
}
