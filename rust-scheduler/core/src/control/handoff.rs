//! Prefilled requests waiting for a decode slot of their tier, FIFO per
//! tier, each with the time by which it must get one: past it, the wait
//! alone has spent the request's TPOT budget and it is shed. A request
//! whose group stopped under it, with no slot of its tier or its lenders'
//! on its node, waits for a free slot of any group there (`any_slot`).

use std::collections::VecDeque;

use crate::tiers::TierId;

#[derive(Debug, Clone, Copy, PartialEq)]
struct Waiting {
    id: u64,
    deadline_s: f64,
    any_slot: bool,
}

#[derive(Debug, Clone, Default)]
pub struct HandoffQueue {
    per_tier: Vec<VecDeque<Waiting>>,
}

impl HandoffQueue {
    pub fn new(num_tiers: usize) -> Self {
        Self {
            per_tier: vec![VecDeque::new(); num_tiers],
        }
    }

    pub fn push(&mut self, tier: TierId, id: u64, deadline_s: f64) {
        self.enqueue(tier, id, deadline_s, false);
    }

    /// A request whose group stopped, to take a free slot of any group on
    /// its node.
    pub fn push_any_slot(&mut self, tier: TierId, id: u64, deadline_s: f64) {
        self.enqueue(tier, id, deadline_s, true);
    }

    fn enqueue(&mut self, tier: TierId, id: u64, deadline_s: f64, any_slot: bool) {
        self.per_tier[tier].push_back(Waiting { id, deadline_s, any_slot });
    }

    pub fn waiting(&self, tier: TierId) -> usize {
        self.per_tier[tier].len()
    }

    pub fn is_empty(&self) -> bool {
        self.per_tier.iter().all(VecDeque::is_empty)
    }

    pub fn tiers_waiting(&self) -> impl Iterator<Item = TierId> + '_ {
        (0..self.per_tier.len()).filter(|&t| !self.per_tier[t].is_empty())
    }

    /// The oldest waiter of a tier, if any, and whether any group's slot
    /// will do for it.
    pub fn front(&self, tier: TierId) -> Option<(u64, bool)> {
        self.per_tier[tier].front().map(|w| (w.id, w.any_slot))
    }

    pub fn pop(&mut self, tier: TierId) -> Option<u64> {
        self.per_tier[tier].pop_front().map(|w| w.id)
    }

    pub fn contains(&self, id: u64) -> bool {
        self.per_tier.iter().any(|q| q.iter().any(|w| w.id == id))
    }

    /// Removes a waiter (cancelled); whether it was waiting.
    pub fn remove(&mut self, id: u64) -> bool {
        for q in &mut self.per_tier {
            if let Some(pos) = q.iter().position(|w| w.id == id) {
                q.remove(pos);
                return true;
            }
        }
        false
    }

    /// Removes and returns the waiters whose deadline passed.
    pub fn take_expired(&mut self, now_s: f64) -> Vec<u64> {
        let mut out = Vec::new();
        for q in &mut self.per_tier {
            q.retain(|w| {
                let keep = w.deadline_s > now_s;
                if !keep {
                    out.push(w.id);
                }
                keep
            });
        }
        out
    }
}
