//! The GPU pool: nodes of 1–8 GPUs, numbered globally in node order. TP
//! groups are aligned, contiguous power-of-two GPU sets inside one node
//! ({0,1}, {2,3}, {0..3}, ...), which is what NVLink islands and the
//! interleaved weight layout both assume.

use std::sync::OnceLock;

use thiserror::Error;

mod best_fit;
use best_fit::BestFitTree;

pub const MAX_GPUS_PER_NODE: u32 = 8;

#[derive(Debug, Error, Clone, PartialEq)]
pub enum TopologyError {
    #[error("node {node} has {gpus} GPUs; a node must have 1 to {MAX_GPUS_PER_NODE}")]
    BadNodeSize { node: usize, gpus: u32 },
    #[error("a cluster needs at least one node")]
    Empty,
    #[error("gpus_per_node = {0}: a node must have 1 to {MAX_GPUS_PER_NODE} GPUs")]
    BadGpusPerNode(u32),
    #[error("TP group at GPU {first} of size {tp}: {reason}")]
    BadGroup { first: u32, tp: u32, reason: String },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cluster {
    node_sizes: Vec<u32>,
    node_first_gpu: Vec<u32>,
}

impl Cluster {
    pub fn new(node_sizes: Vec<u32>) -> Result<Self, TopologyError> {
        if node_sizes.is_empty() {
            return Err(TopologyError::Empty);
        }
        let mut first = Vec::with_capacity(node_sizes.len());
        let mut next = 0;
        for (node, &gpus) in node_sizes.iter().enumerate() {
            if gpus == 0 || gpus > MAX_GPUS_PER_NODE {
                return Err(TopologyError::BadNodeSize { node, gpus });
            }
            first.push(next);
            next += gpus;
        }
        Ok(Self {
            node_sizes,
            node_first_gpu: first,
        })
    }

    /// `gpus` GPUs in nodes of `per_node` (the last node takes the remainder).
    pub fn uniform(gpus: u32, per_node: u32) -> Result<Self, TopologyError> {
        if gpus == 0 {
            return Err(TopologyError::Empty);
        }
        if per_node == 0 || per_node > MAX_GPUS_PER_NODE {
            return Err(TopologyError::BadGpusPerNode(per_node));
        }
        let mut sizes = vec![per_node; (gpus / per_node) as usize];
        if gpus % per_node != 0 {
            sizes.push(gpus % per_node);
        }
        Self::new(sizes)
    }

    pub fn num_gpus(&self) -> u32 {
        self.node_sizes.iter().sum()
    }

    pub fn node_sizes(&self) -> &[u32] {
        &self.node_sizes
    }

    /// GPUs of the largest node: the most one TP group, or one prefill +
    /// decode pair, can span.
    pub fn largest_node(&self) -> u32 {
        self.node_sizes.iter().copied().max().unwrap_or(0)
    }

    pub fn node_first_gpu(&self, node: usize) -> u32 {
        self.node_first_gpu[node]
    }

    /// The node holding global GPU `gpu`.
    pub fn node_of(&self, gpu: u32) -> Option<usize> {
        if gpu >= self.num_gpus() {
            return None;
        }
        Some(self.node_first_gpu.partition_point(|&f| f <= gpu) - 1)
    }

    /// Checks a TP group: power-of-two size, aligned, inside one node.
    pub fn check_group(&self, first: u32, tp: u32) -> Result<(), TopologyError> {
        let bad = |reason: String| TopologyError::BadGroup { first, tp, reason };
        if tp == 0 || !tp.is_power_of_two() || tp > MAX_GPUS_PER_NODE {
            return Err(bad(format!("size must be a power of two from 1 to {MAX_GPUS_PER_NODE}")));
        }
        let node = self
            .node_of(first)
            .ok_or_else(|| bad(format!("GPU {first} does not exist (cluster has {})", self.num_gpus())))?;
        let local = first - self.node_first_gpu[node];
        if local % tp != 0 {
            return Err(bad(format!(
                "not aligned: local index {local} in node {node} is not a multiple of {tp}"
            )));
        }
        if local + tp > self.node_sizes[node] {
            return Err(bad(format!("does not fit in node {node} of {} GPUs", self.node_sizes[node])));
        }
        Ok(())
    }
}

/// Free aligned blocks per node, as bitmasks (bit i = local GPU i is free).
#[derive(Debug, Clone)]
pub struct Allocator {
    sizes: Vec<u32>,
    first: Vec<u32>,
    free: Vec<u8>,
    /// blocks[s] = number of free aligned blocks of size 2^s, all nodes.
    blocks: [u32; 4],
    free_gpus: u32,
    /// Each node's best-fit block per size, for `allocate`.
    tree: BestFitTree,
}

fn block_mask(local: u32, tp: u32) -> u8 {
    (((1u32 << tp) - 1) << local) as u8
}

/// What a node of one size with one free mask offers; computed once per
/// (size, mask) for all allocators.
#[derive(Debug, Clone, Copy, Default)]
struct NodeKind {
    /// Free aligned blocks of size 2^s.
    blocks: [u32; 4],
    /// Per block size 2^s, the best-fit block: (size of the largest
    /// fully-free aligned block enclosing it, local offset).
    best: [Option<(u32, u32)>; 4],
}

fn node_kind(size: u32, free: u8) -> &'static NodeKind {
    static TABLE: OnceLock<Vec<NodeKind>> = OnceLock::new();
    let table = TABLE.get_or_init(|| {
        (1..=MAX_GPUS_PER_NODE)
            .flat_map(|size| (0..=255u8).map(move |free| describe_node(size, free)))
            .collect()
    });
    &table[(size as usize - 1) * 256 + free as usize]
}

fn describe_node(size: u32, free: u8) -> NodeKind {
    let mut out = NodeKind::default();
    for s in 0..4 {
        let tp = 1u32 << s;
        let mut local = 0;
        while local + tp <= size {
            let m = block_mask(local, tp);
            if free & m == m {
                out.blocks[s] += 1;
                let key = (enclosing_free_block(size, free, local, tp), local);
                if out.best[s].is_none_or(|b| key < b) {
                    out.best[s] = Some(key);
                }
            }
            local += tp;
        }
    }
    out
}

/// A node's best-fit keys per block size (`best_fit::key`).
fn best_fit_keys(size: u32, free: u8, node: usize) -> [Option<u64>; 4] {
    node_kind(size, free)
        .best
        .map(|b| b.map(|(enclosing, _)| best_fit::key(enclosing, free.count_ones(), node)))
}

/// Size of the largest fully-free aligned block inside the node that
/// contains the free block (local, tp).
fn enclosing_free_block(node_size: u32, free: u8, local: u32, tp: u32) -> u32 {
    let mut level = tp;
    while level * 2 <= MAX_GPUS_PER_NODE {
        let start = local / (level * 2) * (level * 2);
        let m = block_mask(start, level * 2);
        if start + level * 2 > node_size || free & m != m {
            break;
        }
        level *= 2;
    }
    level
}

impl Allocator {
    pub fn new(cluster: &Cluster) -> Self {
        let sizes = cluster.node_sizes().to_vec();
        let free: Vec<u8> = sizes.iter().map(|&s| ((1u32 << s) - 1) as u8).collect();
        let first = (0..sizes.len()).map(|n| cluster.node_first_gpu(n)).collect();
        let mut blocks = [0; 4];
        for (n, &f) in free.iter().enumerate() {
            for (b, c) in blocks.iter_mut().zip(node_kind(sizes[n], f).blocks) {
                *b += c;
            }
        }
        let tree = BestFitTree::new(free.iter().enumerate().map(|(n, &f)| best_fit_keys(sizes[n], f, n)));
        Self {
            free_gpus: sizes.iter().sum(),
            sizes,
            first,
            free,
            blocks,
            tree,
        }
    }

    pub fn free_gpus(&self) -> u32 {
        self.free_gpus
    }

    /// Free aligned blocks of size `tp` (disjoint by alignment).
    pub fn available(&self, tp: u32) -> u32 {
        self.blocks[tp.trailing_zeros() as usize]
    }

    fn set_free(&mut self, node: usize, new_free: u8) {
        let (size, old_free) = (self.sizes[node], self.free[node]);
        let old = node_kind(size, old_free).blocks;
        let new = node_kind(size, new_free).blocks;
        for s in 0..4 {
            self.blocks[s] = self.blocks[s] - old[s] + new[s];
        }
        self.free_gpus = self.free_gpus - old_free.count_ones() + new_free.count_ones();
        self.tree.set(node, best_fit_keys(size, new_free, node));
        self.free[node] = new_free;
    }

    /// Buddy best fit: among free aligned blocks of `tp`, the one inside the
    /// smallest fully-free aligned block (so large blocks stay whole), then
    /// on the node with the fewest free GPUs, then the lowest node and
    /// offset. Returns the first global GPU.
    pub fn allocate(&mut self, tp: u32) -> Option<u32> {
        if self.available(tp) == 0 {
            return None;
        }
        let level = tp.trailing_zeros() as usize;
        let node = self.tree.best(level)?;
        let (_, local) = node_kind(self.sizes[node], self.free[node]).best[level]?;
        self.set_free(node, self.free[node] & !block_mask(local, tp));
        Some(self.first[node] + local)
    }

    /// `allocate`, on `node` only.
    pub fn allocate_on(&mut self, node: usize, tp: u32) -> Option<u32> {
        if tp == 0 || !tp.is_power_of_two() || node >= self.sizes.len() {
            return None;
        }
        let level = tp.trailing_zeros() as usize;
        let (_, local) = node_kind(self.sizes[node], self.free[node]).best.get(level).copied().flatten()?;
        self.set_free(node, self.free[node] & !block_mask(local, tp));
        Some(self.first[node] + local)
    }

    pub fn num_nodes(&self) -> usize {
        self.sizes.len()
    }

    /// The node of an aligned group's first GPU.
    pub fn node_of(&self, first: u32) -> Option<usize> {
        self.first.partition_point(|&f| f <= first).checked_sub(1)
    }

    /// (node, local mask) of an aligned group inside this allocator's nodes.
    fn locate(&self, first: u32, tp: u32) -> Option<(usize, u8)> {
        if tp == 0 || !tp.is_power_of_two() || tp > MAX_GPUS_PER_NODE {
            return None;
        }
        let node = self.first.partition_point(|&f| f <= first).checked_sub(1)?;
        let local = first - self.first[node];
        (local % tp == 0 && local + tp <= self.sizes[node]).then(|| (node, block_mask(local, tp)))
    }

    /// Takes a specific aligned group if all its GPUs are free.
    pub fn take(&mut self, first: u32, tp: u32) -> bool {
        match self.locate(first, tp) {
            Some((node, m)) if self.free[node] & m == m => {
                self.set_free(node, self.free[node] & !m);
                true
            }
            _ => false,
        }
    }

    /// Returns an allocated group.
    pub fn release(&mut self, first: u32, tp: u32) {
        let (node, m) = self.locate(first, tp).expect("released groups were allocated");
        debug_assert_eq!(self.free[node] & m, 0, "releasing a free block");
        self.set_free(node, self.free[node] | m);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_must_be_aligned_powers_of_two_inside_a_node() {
        let c = Cluster::new(vec![8, 6]).unwrap();
        assert!(c.check_group(0, 8).is_ok());
        assert!(c.check_group(12, 2).is_ok());
        assert!(c.check_group(8, 4).is_ok());
        assert!(c.check_group(2, 4).unwrap_err().to_string().contains("not aligned"));
        assert!(c.check_group(12, 4).unwrap_err().to_string().contains("does not fit"));
        assert!(c.check_group(0, 3).unwrap_err().to_string().contains("power of two"));
        assert!(c.check_group(14, 1).unwrap_err().to_string().contains("does not exist"));
        assert!(Cluster::new(vec![9]).is_err());
        assert!(Cluster::new(vec![]).is_err());
    }

    #[test]
    fn uniform_nodes_take_the_remainder_and_refuse_impossible_sizes() {
        assert_eq!(Cluster::uniform(12, 8).unwrap().node_sizes(), &[8, 4]);
        assert_eq!(Cluster::uniform(3, 2).unwrap().node_sizes(), &[2, 1]);
        for per_node in [0, MAX_GPUS_PER_NODE + 1] {
            let e = Cluster::uniform(8, per_node).unwrap_err();
            assert_eq!(e, TopologyError::BadGpusPerNode(per_node));
            assert!(e.to_string().contains(&format!("gpus_per_node = {per_node}")), "{e}");
        }
        assert_eq!(Cluster::uniform(0, 8).unwrap_err(), TopologyError::Empty);
    }

    #[test]
    fn allocator_best_fit_and_counts() {
        let c = Cluster::new(vec![8, 2]).unwrap();
        let mut a = Allocator::new(&c);
        assert_eq!(a.available(2), 5);
        // Best fit puts a 2-group in the 2-GPU node, leaving the 8 intact.
        assert_eq!(a.allocate(2), Some(8));
        let c6 = Cluster::new(vec![6]).unwrap();
        let mut b = Allocator::new(&c6);
        // In a 6-GPU node (4 + 2), a pair takes {4,5} and keeps {0..3} whole,
        // and single GPUs then split the same pair of an already split block.
        assert_eq!(b.allocate(2), Some(4));
        assert_eq!(b.allocate(1), Some(0));
        assert_eq!(b.allocate(1), Some(1));
        assert_eq!(b.available(2), 1);
        assert_eq!(a.available(8), 1);
        assert_eq!(a.allocate(4), Some(0));
        assert_eq!(a.allocate(4), Some(4));
        assert_eq!(a.allocate(1), None);
        a.release(4, 4);
        assert!(a.take(6, 2));
        assert!(!a.take(6, 1));
        assert!(!a.take(5, 2));
        assert_eq!(a.free_gpus(), 2);
        assert_eq!(a.available(2), 1);
    }

    /// `allocate`'s rule by brute force over every free aligned block.
    fn best_fit_by_scan(a: &Allocator, tp: u32) -> Option<u32> {
        let mut best: Option<(u32, u32, usize, u32)> = None;
        for (node, (&size, &free)) in a.sizes.iter().zip(&a.free).enumerate() {
            for local in (0..size).step_by(tp as usize).filter(|l| l + tp <= size) {
                let m = block_mask(local, tp);
                if free & m == m {
                    let key = (enclosing_free_block(size, free, local, tp), free.count_ones(), node, local);
                    if best.is_none_or(|b| key < b) {
                        best = Some(key);
                    }
                }
            }
        }
        best.map(|(_, _, node, local)| a.first[node] + local)
    }

    proptest::proptest! {
        #[test]
        fn allocate_takes_the_best_fit_a_scan_finds(
            sizes in proptest::collection::vec(1u32..=8, 1..12),
            ops in proptest::collection::vec((0u32..4, 0usize..64, proptest::bool::ANY), 1..80),
        ) {
            let c = Cluster::new(sizes).unwrap();
            let mut a = Allocator::new(&c);
            let mut held: Vec<(u32, u32)> = Vec::new();
            for (level, pick, release) in ops {
                if release && !held.is_empty() {
                    let (first, tp) = held.swap_remove(pick % held.len());
                    a.release(first, tp);
                    continue;
                }
                let tp = 1 << level;
                let expected = best_fit_by_scan(&a, tp);
                proptest::prop_assert_eq!(a.allocate(tp), expected);
                if let Some(first) = expected {
                    held.push((first, tp));
                }
                proptest::prop_assert_eq!(a.free_gpus(), a.free.iter().map(|f| f.count_ones()).sum::<u32>());
            }
        }
    }
}
