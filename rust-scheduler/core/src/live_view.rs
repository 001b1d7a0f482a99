//! The cluster the planner plans over: the GPUs that are up. A node with a
//! GPU down is split into aligned power-of-two blocks of live GPUs, each a
//! planner node of its own, so that every group the planner forms inside a
//! block is an aligned TP group of the physical node too (and no group
//! includes a dead GPU). Planner GPU `i` is physical GPU `to_physical[i]`.

use crate::plan::{GpuCommand, Plan};
use crate::topology::Cluster;

#[derive(Debug, Clone, PartialEq)]
pub struct LiveView {
    pub cluster: Cluster,
    pub to_physical: Vec<u32>,
}

impl LiveView {
    /// The live part of a cluster of nodes `node_sizes` (physical GPUs
    /// numbered in node order); `None` when no GPU is up.
    pub fn new(node_sizes: &[u32], up: &[bool]) -> Option<Self> {
        let mut sizes = Vec::new();
        let mut to_physical = Vec::new();
        let mut first = 0usize;
        for &n in node_sizes {
            let n = n as usize;
            let node_up = &up[first..first + n];
            if node_up.iter().all(|&u| u) {
                // Whole node: the planner sees it as it is.
                sizes.push(n as u32);
                to_physical.extend(first as u32..(first + n) as u32);
            } else {
                let mut local = 0;
                while local < n {
                    if !node_up[local] {
                        local += 1;
                        continue;
                    }
                    // The largest aligned block starting here that is all up.
                    let mut size = 1;
                    while local % (2 * size) == 0 && local + 2 * size <= n && node_up[local..local + 2 * size].iter().all(|&u| u) {
                        size *= 2;
                    }
                    sizes.push(size as u32);
                    to_physical.extend((first + local) as u32..(first + local + size) as u32);
                    local += size;
                }
            }
            first += n;
        }
        let cluster = Cluster::new(sizes).ok()?;
        Some(Self { cluster, to_physical })
    }

    /// Whether every GPU is up (planner and physical numbering agree).
    pub fn is_whole(&self, num_gpus: u32) -> bool {
        self.to_physical.len() == num_gpus as usize
    }

    /// A planner plan in physical GPU numbering over `num_gpus` GPUs; GPUs
    /// that are down belong to no group.
    pub fn to_physical_plan(&self, mut plan: Plan, num_gpus: u32) -> Plan {
        for g in &mut plan.groups {
            g.first_gpu = self.to_physical[g.first_gpu as usize];
        }
        plan.groups.sort_by_key(|g| g.first_gpu);
        plan.num_gpus = num_gpus;
        plan
    }

    /// Planner commands in physical GPU numbering.
    pub fn to_physical_commands(&self, commands: Vec<GpuCommand>) -> Vec<GpuCommand> {
        commands
            .into_iter()
            .map(|c| GpuCommand {
                gpu: self.to_physical[c.gpu as usize],
                group_first_gpu: self.to_physical[c.group_first_gpu as usize],
                ..c
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(nodes: &[u32], down: &[u32]) -> Option<(Vec<u32>, Vec<u32>)> {
        let total: u32 = nodes.iter().sum();
        let up: Vec<bool> = (0..total).map(|g| !down.contains(&g)).collect();
        LiveView::new(nodes, &up).map(|v| (v.cluster.node_sizes().to_vec(), v.to_physical))
    }

    #[test]
    fn whole_nodes_are_kept() {
        assert_eq!(view(&[3, 2], &[]), Some((vec![3, 2], vec![0, 1, 2, 3, 4])));
    }

    #[test]
    fn a_node_with_a_dead_gpu_splits_into_aligned_blocks() {
        assert_eq!(view(&[4], &[1]), Some((vec![1, 2], vec![0, 2, 3])));
        assert_eq!(view(&[4], &[0, 3]), Some((vec![1, 1], vec![1, 2])));
        assert_eq!(view(&[8], &[7]), Some((vec![4, 2, 1], vec![0, 1, 2, 3, 4, 5, 6])));
        assert_eq!(view(&[2, 2], &[2]), Some((vec![2, 1], vec![0, 1, 3])));
        assert_eq!(view(&[2], &[0, 1]), None);
    }

    #[test]
    fn every_planner_group_is_a_physical_aligned_group() {
        // All aligned groups of each planner node map to aligned physical
        // groups of live GPUs.
        let nodes = [8u32];
        let physical = Cluster::new(nodes.to_vec()).unwrap();
        for mask in 0u32..256 {
            let up: Vec<bool> = (0..8).map(|g| mask & (1 << g) != 0).collect();
            let Some(v) = LiveView::new(&nodes, &up) else {
                assert_eq!(mask, 0);
                continue;
            };
            for (node, &size) in v.cluster.node_sizes().iter().enumerate() {
                let first = v.cluster.node_first_gpu(node);
                let mut tp = 1;
                while tp <= size {
                    for local in (0..size).step_by(tp as usize) {
                        if local + tp > size {
                            continue;
                        }
                        let p = v.to_physical[(first + local) as usize];
                        assert!(physical.check_group(p, tp).is_ok(), "mask {mask:08b}: group at {p} of {tp}");
                        for k in 0..tp {
                            let g = v.to_physical[(first + local + k) as usize];
                            assert_eq!(g, p + k, "mask {mask:08b}: not contiguous");
                            assert!(up[g as usize], "mask {mask:08b}: GPU {g} is down");
                        }
                    }
                    tp *= 2;
                }
            }
            assert_eq!(v.to_physical.len(), mask.count_ones() as usize);
        }
    }
}
