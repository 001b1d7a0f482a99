//! GPU numbering: the core numbers GPUs globally across the cluster; each
//! worker (one node) numbers its own devices from 0. Workers are the
//! cluster's nodes, in order.

use std::ops::Range;

use tiertp_scheduler::plan::GroupKey;

#[derive(Debug, Clone)]
pub(super) struct Nodes {
    /// Each worker's first global GPU.
    first_gpu: Vec<u32>,
    /// Each worker's GPU count.
    sizes: Vec<u32>,
}

impl Nodes {
    /// `gpus` is each worker's GPU count.
    pub(super) fn new(gpus: &[u32]) -> Self {
        let first_gpu = gpus
            .iter()
            .scan(0, |next, &g| {
                let first = *next;
                *next += g;
                Some(first)
            })
            .collect();
        Self {
            first_gpu,
            sizes: gpus.to_vec(),
        }
    }

    pub(super) fn num_gpus(&self) -> usize {
        self.sizes.iter().sum::<u32>() as usize
    }

    /// The worker driving global GPU `gpu`.
    pub(super) fn worker_of(&self, gpu: u32) -> usize {
        self.first_gpu.partition_point(|&f| f <= gpu).saturating_sub(1)
    }

    /// Worker `w`'s GPUs, in global numbering.
    pub(super) fn gpus_of(&self, w: usize) -> Range<usize> {
        let first = self.first_gpu[w] as usize;
        first..first + self.sizes[w] as usize
    }

    pub(super) fn first_gpu(&self, w: usize) -> u32 {
        self.first_gpu[w]
    }

    pub(super) fn size(&self, w: usize) -> u32 {
        self.sizes[w]
    }

    /// A group of worker `w`, in that worker's device numbering.
    pub(super) fn local(&self, w: usize, key: GroupKey) -> GroupKey {
        (key.0 - self.first_gpu[w], key.1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn global_and_local_numbering() {
        let n = Nodes::new(&[2, 4, 1]);
        assert_eq!(n.num_gpus(), 7);
        assert_eq!((0..7).map(|g| n.worker_of(g)).collect::<Vec<_>>(), [0, 0, 1, 1, 1, 1, 2]);
        assert_eq!((n.gpus_of(1), n.first_gpu(2), n.size(1)), (2..6, 6, 4));
        assert_eq!(n.local(1, (4, 2)), (2, 2));
    }
}
