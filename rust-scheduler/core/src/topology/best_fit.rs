//! Where `Allocator::allocate` takes a block from: a min-tree over the
//! nodes' best-fit keys, one per block size, so a change to one node costs
//! log(nodes) and the choice is read at the root (a large cluster changes
//! one node per group placed).

/// A node without a free block of the size.
const NONE: u64 = u64::MAX;

/// Best-fit key of a node's best block of one size: integer order is the
/// allocator's order (smallest enclosing free block, then fewest free GPUs,
/// then lowest node).
pub(super) fn key(enclosing: u32, free_gpus: u32, node: usize) -> u64 {
    (u64::from(enclosing) << 40) | (u64::from(free_gpus) << 32) | node as u64
}

#[derive(Debug, Clone)]
pub(super) struct BestFitTree {
    /// Leaves (a power of two, at least the node count).
    leaves: usize,
    /// Heap order: 1 is the root, node n's leaf is `leaves + n`; per block
    /// size 2^s, the least key below.
    keys: Vec<[u64; 4]>,
}

impl BestFitTree {
    /// The tree over nodes with these keys, in node order.
    pub(super) fn new(nodes: impl ExactSizeIterator<Item = [Option<u64>; 4]>) -> Self {
        let leaves = nodes.len().next_power_of_two();
        let mut keys = vec![[NONE; 4]; 2 * leaves];
        for (leaf, k) in keys[leaves..].iter_mut().zip(nodes) {
            *leaf = k.map(|k| k.unwrap_or(NONE));
        }
        for i in (1..leaves).rev() {
            keys[i] = Self::least(keys[2 * i], keys[2 * i + 1]);
        }
        Self { leaves, keys }
    }

    fn least(l: [u64; 4], r: [u64; 4]) -> [u64; 4] {
        std::array::from_fn(|s| l[s].min(r[s]))
    }

    /// Sets a node's keys (`None`: no free block of that size).
    pub(super) fn set(&mut self, node: usize, keys: [Option<u64>; 4]) {
        let mut i = self.leaves + node;
        self.keys[i] = keys.map(|k| k.unwrap_or(NONE));
        while i > 1 {
            i /= 2;
            self.keys[i] = Self::least(self.keys[2 * i], self.keys[2 * i + 1]);
        }
    }

    /// The node with the least key for blocks of size 2^`level`.
    pub(super) fn best(&self, level: usize) -> Option<usize> {
        let k = self.keys[1][level];
        (k != NONE).then_some((k & 0xFFFF_FFFF) as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_least_key_wins_and_follows_changes() {
        let mut t = BestFitTree::new([[None; 4]; 3].into_iter());
        assert_eq!(t.best(0), None);
        t.set(0, [Some(key(8, 8, 0)), None, None, None]);
        t.set(2, [Some(key(2, 2, 2)), None, None, None]);
        assert_eq!(t.best(0), Some(2));
        t.set(2, [None; 4]);
        assert_eq!(t.best(0), Some(0));
        // Equal fit: the lower node.
        t.set(1, [Some(key(8, 8, 1)), None, None, None]);
        assert_eq!(t.best(0), Some(0));
        let built = BestFitTree::new([[Some(key(4, 6, 0)); 4], [Some(key(2, 2, 1)); 4], [None; 4]].into_iter());
        assert_eq!(built.best(2), Some(1));
        let one = BestFitTree::new([[None; 4]].into_iter());
        assert_eq!(one.best(3), None);
    }
}
