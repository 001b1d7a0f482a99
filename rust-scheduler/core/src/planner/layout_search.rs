//! The best layout of one tier's groups over the cluster, node by node,
//! found by enumeration instead of greedily.
//!
//! The greedy adds the group that serves the most per GPU next, which is
//! right while demand is covered but can end short of capacity when it is
//! not: the pair that serves most per GPU first (two TP2 pairs, say) can
//! leave no room for the layout that serves most in all (a TP4 decode group
//! whose larger batch still fits the TPOT, fed by smaller prefill groups).
//! When all GPUs serve one tier (a pool on its host, or the only tier with
//! demand), the capacity is colocated + min(prefill, decode) of one
//! estimate, so the layouts that can be best are few: per prefill level and
//! decode level, each prefill count with the decode count that balances
//! it (or one fewer), the rest colocated at the most efficient levels.

use crate::estimator::TierEstimate;
use crate::plan::Role;
use crate::topology::Cluster;

/// Which groups the search may use, and the planned headroom.
pub struct SearchInput<'a> {
    pub estimate: &'a TierEstimate,
    /// The planner's TP levels; `estimate.per_tp` has one entry per level.
    pub tp_levels: &'a [u32],
    pub allow_colocated: bool,
    pub allow_disaggregated: bool,
    /// Scales every stage throughput, as in the greedy.
    pub utilization: f64,
}

/// A layout: groups as (role, TP level), with the capacity they add up to.
#[derive(Debug, Clone, PartialEq)]
struct Layout {
    groups: Vec<(Role, u32)>,
    capacity: f64,
}

/// The layout of the most capacity, node by node, as groups (role, TP
/// level, first GPU); `None` if none serves anything. A prefilled request's
/// KV moves only within its node, so each node gets a layout of its own,
/// the best for its size (capacity adds up over nodes).
pub fn best_layout(input: &SearchInput, cluster: &Cluster) -> Option<Vec<(Role, u32, u32)>> {
    let mut best_of_size: Vec<(u32, Layout)> = Vec::new();
    let mut out = Vec::new();
    for (node, &size) in cluster.node_sizes().iter().enumerate() {
        let layout = match best_of_size.iter().find(|(s, _)| *s == size) {
            Some((_, l)) => l.clone(),
            None => {
                let best = candidates(input, size)
                    .into_iter()
                    .filter(|l| l.capacity > 0.0)
                    .reduce(|a, b| if b.capacity > a.capacity * (1.0 + 1e-12) { b } else { a })
                    .unwrap_or(Layout {
                        groups: Vec::new(),
                        capacity: 0.0,
                    });
                best_of_size.push((size, best.clone()));
                best
            }
        };
        // Largest first, back to back: each offset is a multiple of every
        // size placed after it, so every group is aligned.
        let mut groups = layout.groups;
        groups.sort_by_key(|&(_, tp)| std::cmp::Reverse(tp));
        let mut local = 0;
        for (role, tp) in groups {
            out.push((role, tp, cluster.node_first_gpu(node) + local));
            local += tp;
        }
    }
    (!out.is_empty()).then_some(out)
}

/// Every layout worth comparing on `gpus` GPUs of one node.
fn candidates(input: &SearchInput, gpus: u32) -> Vec<Layout> {
    let levels = input.tp_levels;
    let stage = |role: Role, i: usize| {
        let e = &input.estimate.per_tp[i];
        input.utilization
            * match role {
                Role::Prefill => e.prefill.throughput_rps,
                Role::Decode => e.decode.throughput_rps,
                Role::Colocated => e.colocated.throughput_rps,
            }
    };
    // Colocated levels by capacity per GPU, best first (those that serve).
    let mut colocated: Vec<(u32, f64)> = Vec::new();
    if input.allow_colocated {
        colocated = (0..levels.len())
            .map(|i| (levels[i], stage(Role::Colocated, i)))
            .filter(|&(_, c)| c > 0.0)
            .collect();
        colocated.sort_by(|a, b| (b.1 / f64::from(b.0)).total_cmp(&(a.1 / f64::from(a.0))));
    }
    let fill_colocated = |mut free: u32, groups: &mut Vec<(Role, u32)>| -> f64 {
        let mut capacity = 0.0;
        for &(tp, c) in &colocated {
            while tp <= free {
                groups.push((Role::Colocated, tp));
                capacity += c;
                free -= tp;
            }
        }
        capacity
    };
    let mut out = Vec::new();
    let mut only_colocated = Vec::new();
    let capacity = fill_colocated(gpus, &mut only_colocated);
    if capacity > 0.0 {
        out.push(Layout {
            groups: only_colocated,
            capacity,
        });
    }
    if !input.allow_disaggregated {
        return out;
    }
    for (pi, &ptp) in levels.iter().enumerate() {
        let per_prefill = stage(Role::Prefill, pi);
        if per_prefill <= 0.0 {
            continue;
        }
        for (di, &dtp) in levels.iter().enumerate() {
            let per_decode = stage(Role::Decode, di);
            if per_decode <= 0.0 {
                continue;
            }
            for n_prefill in 1..=gpus / ptp {
                let left = gpus - n_prefill * ptp;
                let most = left / dtp;
                let balanced = ((f64::from(n_prefill) * per_prefill / per_decode).ceil() as u32).min(most);
                for n_decode in [balanced, balanced.saturating_sub(1)] {
                    if n_decode == 0 {
                        continue;
                    }
                    let mut groups = vec![(Role::Prefill, ptp); n_prefill as usize];
                    groups.extend(std::iter::repeat_n((Role::Decode, dtp), n_decode as usize));
                    let paired = (f64::from(n_prefill) * per_prefill).min(f64::from(n_decode) * per_decode);
                    let capacity = paired + fill_colocated(left - n_decode * dtp, &mut groups);
                    out.push(Layout { groups, capacity });
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::estimator::{StageEstimate, TpEstimate};
    use crate::stats::TierStats;

    fn stage(throughput_rps: f64) -> StageEstimate {
        StageEstimate {
            throughput_rps,
            batch_requests: 1,
            batch_tokens: 1,
            batch_ms: 1.0,
            served_share: 1.0,
            max_prompt_tokens: 0,
        }
    }

    /// Per level (prefill, decode, colocated) throughputs.
    fn estimate(levels: &[(u32, f64, f64, f64)]) -> TierEstimate {
        TierEstimate {
            tier: 0,
            stats: TierStats::new(100.0, 1000.0, 100.0),
            per_tp: levels
                .iter()
                .map(|&(tp, p, d, c)| TpEstimate {
                    tp,
                    prefill: stage(p),
                    decode: stage(d),
                    decode_held: stage(d),
                    colocated: stage(c),
                })
                .collect(),
        }
    }

    fn search(e: &TierEstimate, levels: &[u32], gpus: u32) -> Vec<(Role, u32, u32)> {
        let input = SearchInput {
            estimate: e,
            tp_levels: levels,
            allow_colocated: true,
            allow_disaggregated: true,
            utilization: 1.0,
        };
        best_layout(&input, &Cluster::uniform(gpus, 8).unwrap()).unwrap()
    }

    fn count(groups: &[(Role, u32, u32)], role: Role, tp: u32) -> usize {
        groups.iter().filter(|g| g.0 == role && g.1 == tp).count()
    }

    #[test]
    fn a_large_decode_group_fed_by_small_prefill_groups() {
        // TP2 pairs serve the most per GPU two at a time (min(22, 18) per
        // 4 GPUs), but a TP4 decode group's batch serves 65 and four TP1
        // prefill groups feed it 56.
        let e = estimate(&[(1, 14.0, 5.0, 0.0), (2, 22.0, 18.0, 0.0), (4, 35.0, 65.0, 0.0)]);
        let groups = search(&e, &[1, 2, 4], 8);
        assert_eq!(count(&groups, Role::Decode, 4), 1, "{groups:?}");
        assert_eq!(count(&groups, Role::Prefill, 1), 4, "{groups:?}");
    }

    #[test]
    fn colocated_fills_what_pairs_leave() {
        let e = estimate(&[(1, 10.0, 10.0, 4.0), (2, 0.0, 0.0, 0.0)]);
        let groups = search(&e, &[1, 2], 3);
        assert_eq!(count(&groups, Role::Prefill, 1), 1, "{groups:?}");
        assert_eq!(count(&groups, Role::Decode, 1), 1, "{groups:?}");
        assert_eq!(count(&groups, Role::Colocated, 1), 1, "{groups:?}");
    }

    #[test]
    fn every_node_gets_its_own_pairs() {
        // KV cannot cross nodes: each node holds prefill and decode.
        let e = estimate(&[(1, 10.0, 10.0, 0.0), (2, 18.0, 30.0, 0.0)]);
        let input = SearchInput {
            estimate: &e,
            tp_levels: &[1, 2],
            allow_colocated: true,
            allow_disaggregated: true,
            utilization: 1.0,
        };
        let cluster = Cluster::new(vec![4, 4]).unwrap();
        let groups = best_layout(&input, &cluster).unwrap();
        for node in 0..2 {
            let on = |role| groups.iter().any(|g| g.0 == role && cluster.node_of(g.2) == Some(node));
            assert!(on(Role::Prefill) && on(Role::Decode), "node {node}: {groups:?}");
        }
        for g in &groups {
            cluster.check_group(g.2, g.1).unwrap();
        }
    }

    #[test]
    fn nothing_that_serves_is_no_layout() {
        let e = estimate(&[(1, 0.0, 3.0, 0.0)]);
        let input = SearchInput {
            estimate: &e,
            tp_levels: &[1],
            allow_colocated: true,
            allow_disaggregated: true,
            utilization: 1.0,
        };
        assert_eq!(best_layout(&input, &Cluster::uniform(4, 4).unwrap()), None);
    }
}
