//! Where a request goes when a plan change stops the group it is on.
//!
//! A TP switch moves KV only among the GPUs it changes (a merge folds its
//! groups' heads into one group, a split spreads them over the smaller
//! ones), so a request stays on its GPUs: it goes to a group of the new
//! plan over them. Among those, a prefilled request goes to one that decodes
//! its tier, a waiting one to one that prefills it; failing that, to one
//! that decodes (prefills) for any tier, else to any; the least full first.
//! It is never shed here: what it can no longer meet, the batch policy's
//! deadline and the hand-off wait still catch.
//!
//! The rule runs where the plan is committed (`ControlLoop::window`), so
//! the simulator and the gateway decide it alike; the gateway sends each
//! decision with the plan (`apply_plan`'s `moves`) and the node agent moves
//! the request there.

use super::fallback::overlaps;
use super::{least_full, Decision, DispatchClass, Dispatcher, Load};
use crate::plan::{GroupKey, Role};
use crate::tiers::TierId;

impl Dispatcher {
    /// Moves every request charged to a group the plan no longer has (and
    /// not `keep_off`: e.g. one waiting for a decode slot, held by no
    /// group) onto a planned group over the same GPUs, in request-id order.
    /// A request with no planned group over its GPUs keeps its charge.
    pub fn settle_stopped(&mut self, keep_off: impl Fn(u64) -> bool) -> Vec<(u64, Decision)> {
        let mut ids: Vec<u64> = self
            .in_flight
            .iter()
            .filter(|(id, c)| !self.slot_of.contains_key(&c.key) && !keep_off(**id))
            .map(|(&id, _)| id)
            .collect();
        ids.sort_unstable();
        let mut out = Vec::new();
        for id in ids {
            let c = self.in_flight[&id];
            let prefilled = c.load.tokens == 0;
            let Some(target) = self.settle_target(c.tier, c.key, prefilled) else {
                continue;
            };
            let load = if prefilled {
                Load { tokens: 0, slots: 1 }
            } else {
                Load {
                    tokens: c.load.tokens,
                    slots: u64::from(self.slots[target].holds_slots()),
                }
            };
            let class = if self.tier_is_background[c.tier] {
                DispatchClass::Background
            } else if self.serves(target, c.tier, prefilled) {
                DispatchClass::Feasible
            } else {
                DispatchClass::BestEffort
            };
            let _ = self.complete(id);
            out.push((id, self.charge_load(id, c.tier, target, load, class)));
        }
        out
    }

    /// The least full planned group over `from`'s GPUs of the best kind
    /// there: one of `tier`'s for the request's next phase, else any that
    /// does that phase, else any.
    fn settle_target(&self, tier: TierId, from: GroupKey, prefilled: bool) -> Option<usize> {
        let does_phase = |i: usize| {
            let role = self.slots[i].role;
            if prefilled {
                role.decodes()
            } else {
                role.takes_prefill()
            }
        };
        let kind = |i: usize| u8::from(!self.serves(i, tier, prefilled)) + u8::from(!does_phase(i));
        let over = || (0..self.slots.len()).filter(|&i| overlaps(self.slots[i].key, from));
        let best = over().map(kind).min()?;
        least_full(&self.slots, over().filter(|&i| kind(i) == best))
    }

    /// Whether slot `i` is `tier`'s and does the request's next phase.
    fn serves(&self, i: usize, tier: TierId, prefilled: bool) -> bool {
        if prefilled {
            self.tier_decode[tier].contains(&i) || (self.slots[i].role == Role::Colocated && self.tier_prefill[tier].contains(&i))
        } else {
            self.tier_prefill[tier].contains(&i)
        }
    }
}
