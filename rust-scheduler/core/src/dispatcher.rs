//! FCFS request dispatch on the request path (DESIGN.md §1, Dispatch).
//!
//! - background tier → round robin over background groups (any prefill-
//!   capable group if no background tier has one);
//! - otherwise → the least-loaded prefill-capable group of the tier that
//!   still has SLO bandwidth for the request (an idle group always has:
//!   a long prompt is served soonest there) (`Feasible`); if none has,
//!   round-robin spill over every prefill-capable group (`BestEffort`).
//!   (Spilling to the least-loaded group by prompt-token load was tried
//!   in replay and did worse: that load ignores decode work.)
//!
//! Each dispatched request is charged to its group (prompt tokens; one slot
//! on decode groups) and its completion returns exactly that charge. Charges
//! on groups a new plan removed are kept until their requests complete.

use rustc_hash::FxHashMap;
use thiserror::Error;

use crate::plan::{Plan, Role};
use crate::tiers::{TierId, TierSet};

/// Why a request went where it went; also its queue in the batch policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DispatchClass {
    Feasible,
    BestEffort,
    Background,
}

impl DispatchClass {
    pub const ALL: [DispatchClass; 3] = [DispatchClass::Feasible, DispatchClass::BestEffort, DispatchClass::Background];

    pub fn name(self) -> &'static str {
        match self {
            DispatchClass::Feasible => "feasible",
            DispatchClass::BestEffort => "best_effort",
            DispatchClass::Background => "background",
        }
    }

    pub fn parse(name: &str) -> Result<Self, String> {
        Self::ALL.into_iter().find(|c| c.name() == name).ok_or_else(|| {
            format!(
                "unknown dispatch class {name:?}; valid classes: {:?}",
                Self::ALL.map(DispatchClass::name)
            )
        })
    }
}

#[derive(Debug, Error, Clone, PartialEq)]
pub enum DispatchError {
    #[error("unknown tier id {tier} (there are {num_tiers} tiers)")]
    UnknownTier { tier: TierId, num_tiers: usize },
    #[error("request {0} is already in flight")]
    Duplicate(u64),
    #[error("request {0} is not in flight")]
    UnknownRequest(u64),
    #[error("no GPU group can take {0} requests under the current plan")]
    NoCapacity(&'static str),
}

/// A TP group is identified by (first GPU, TP size) across plans.
pub type GroupKey = (u32, u32);

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Decision {
    pub group_first_gpu: u32,
    pub tp: u32,
    pub class: DispatchClass,
    /// Bandwidth taken; returned by `complete`.
    pub charge: u64,
}

#[derive(Debug, Clone, Copy)]
struct Charge {
    key: GroupKey,
    amount: u64,
    class: DispatchClass,
    /// Whether the group also decodes (colocated), so a decode hand-off
    /// can leave the request where it is.
    on_colocated: bool,
}

#[derive(Debug, Clone)]
struct Slot {
    key: GroupKey,
    role: Role,
    budget: u64,
    load: u64,
}

#[derive(Debug, Default)]
pub struct Dispatcher {
    num_tiers: usize,
    tier_is_background: Vec<bool>,
    slots: Vec<Slot>,
    slot_of: FxHashMap<GroupKey, usize>,
    /// Loads left on groups that are no longer in the plan.
    retired: FxHashMap<GroupKey, u64>,
    tier_prefill: Vec<Vec<usize>>,
    tier_decode: Vec<Vec<usize>>,
    all_prefill: Vec<usize>,
    all_decode: Vec<usize>,
    background: Vec<usize>,
    spill_cursor: usize,
    background_cursor: usize,
    decode_spill_cursor: usize,
    in_flight: FxHashMap<u64, Charge>,
}

impl Dispatcher {
    pub fn new(tiers: &TierSet, plan: &Plan) -> Self {
        let mut d = Self::default();
        d.set_plan(tiers, plan);
        d
    }

    /// Switches to a new plan; loads of groups that persist carry over.
    pub fn set_plan(&mut self, tiers: &TierSet, plan: &Plan) {
        let mut loads: FxHashMap<GroupKey, u64> = std::mem::take(&mut self.retired);
        for s in self.slots.drain(..) {
            if s.load > 0 {
                *loads.entry(s.key).or_default() += s.load;
            }
        }
        self.num_tiers = tiers.len();
        self.tier_is_background = tiers.tiers().iter().map(|t| t.background).collect();
        self.slot_of.clear();
        self.tier_prefill = vec![Vec::new(); tiers.len()];
        self.tier_decode = vec![Vec::new(); tiers.len()];
        self.all_prefill.clear();
        self.all_decode.clear();
        self.background.clear();
        for g in &plan.groups {
            let key = (g.first_gpu, g.tp);
            let i = self.slots.len();
            self.slots.push(Slot {
                key,
                role: g.role,
                budget: g.slo_budget,
                load: loads.remove(&key).unwrap_or(0),
            });
            self.slot_of.insert(key, i);
            if g.role.takes_prefill() {
                self.tier_prefill[g.tier].push(i);
                self.all_prefill.push(i);
                if self.tier_is_background[g.tier] {
                    self.background.push(i);
                }
            }
            if matches!(g.role, Role::Decode) {
                self.tier_decode[g.tier].push(i);
                self.all_decode.push(i);
            }
        }
        if self.background.is_empty() {
            self.background = self.all_prefill.clone();
        }
        self.retired = loads;
    }

    /// Dispatches a new request's prefill.
    pub fn dispatch(&mut self, request_id: u64, tier: TierId, prompt_tokens: u32) -> Result<Decision, DispatchError> {
        self.check_new(request_id, tier)?;
        let charge = u64::from(prompt_tokens.max(1));
        let (slot, class) = if self.tier_is_background[tier] {
            let slot = round_robin(&self.background, &mut self.background_cursor).ok_or(DispatchError::NoCapacity("background"))?;
            (slot, DispatchClass::Background)
        } else if let Some(slot) = least_loaded_feasible(&self.slots, &self.tier_prefill[tier], charge) {
            (slot, DispatchClass::Feasible)
        } else {
            let slot = round_robin(&self.all_prefill, &mut self.spill_cursor).ok_or(DispatchError::NoCapacity("new"))?;
            (slot, DispatchClass::BestEffort)
        };
        Ok(self.charge(request_id, slot, charge, class))
    }

    /// Moves a prefilled request to a decode group of its tier, returning its
    /// prefill charge first. Without room in the tier's decode groups, a
    /// request on a colocated group decodes where it is (charge 0); otherwise
    /// it spills round robin to any decode group, or stays if there is none.
    pub fn dispatch_decode(&mut self, request_id: u64, tier: TierId) -> Result<Decision, DispatchError> {
        if tier >= self.num_tiers {
            return Err(DispatchError::UnknownTier {
                tier,
                num_tiers: self.num_tiers,
            });
        }
        let current = *self.in_flight.get(&request_id).ok_or(DispatchError::UnknownRequest(request_id))?;
        let background = self.tier_is_background[tier];
        let target = if let Some(slot) = least_loaded_feasible(&self.slots, &self.tier_decode[tier], 1) {
            Some((
                slot,
                if background {
                    DispatchClass::Background
                } else {
                    DispatchClass::Feasible
                },
            ))
        } else if current.on_colocated {
            None
        } else {
            round_robin(&self.all_decode, &mut self.decode_spill_cursor).map(|slot| {
                (
                    slot,
                    if background {
                        DispatchClass::Background
                    } else {
                        DispatchClass::BestEffort
                    },
                )
            })
        };
        self.complete(request_id)?;
        Ok(match target {
            Some((slot, class)) => self.charge(request_id, slot, 1, class),
            None => {
                self.in_flight.insert(request_id, Charge { amount: 0, ..current });
                Decision {
                    group_first_gpu: current.key.0,
                    tp: current.key.1,
                    class: current.class,
                    charge: 0,
                }
            }
        })
    }

    /// Returns the request's charge to its group; the amount returned.
    pub fn complete(&mut self, request_id: u64) -> Result<u64, DispatchError> {
        let c = self
            .in_flight
            .remove(&request_id)
            .ok_or(DispatchError::UnknownRequest(request_id))?;
        match self.slot_of.get(&c.key) {
            Some(&i) => self.slots[i].load -= c.amount,
            None if c.amount == 0 => {}
            None => {
                let left = self.retired.get_mut(&c.key).expect("a charge's group is planned or retired");
                *left -= c.amount;
                if *left == 0 {
                    self.retired.remove(&c.key);
                }
            }
        }
        Ok(c.amount)
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    pub fn is_in_flight(&self, request_id: u64) -> bool {
        self.in_flight.contains_key(&request_id)
    }

    /// Load on a group, planned or retired.
    pub fn load_of(&self, key: GroupKey) -> u64 {
        self.slot_of
            .get(&key)
            .map_or_else(|| self.retired.get(&key).copied().unwrap_or(0), |&i| self.slots[i].load)
    }

    /// Sum of all group loads (equals the sum of in-flight charges).
    pub fn total_load(&self) -> u64 {
        self.slots.iter().map(|s| s.load).sum::<u64>() + self.retired.values().sum::<u64>()
    }

    pub fn total_charged(&self) -> u64 {
        self.in_flight.values().map(|c| c.amount).sum()
    }

    fn check_new(&self, request_id: u64, tier: TierId) -> Result<(), DispatchError> {
        if tier >= self.num_tiers {
            return Err(DispatchError::UnknownTier {
                tier,
                num_tiers: self.num_tiers,
            });
        }
        if self.in_flight.contains_key(&request_id) {
            return Err(DispatchError::Duplicate(request_id));
        }
        Ok(())
    }

    fn charge(&mut self, request_id: u64, slot: usize, amount: u64, class: DispatchClass) -> Decision {
        let s = &mut self.slots[slot];
        s.load += amount;
        self.in_flight.insert(
            request_id,
            Charge {
                key: s.key,
                amount,
                class,
                on_colocated: s.role == Role::Colocated,
            },
        );
        Decision {
            group_first_gpu: s.key.0,
            tp: s.key.1,
            class,
            charge: amount,
        }
    }
}

/// The candidate with the lowest load fraction that still fits `amount`.
/// An idle group always fits: a prompt larger than a group's budget is
/// still served soonest on an idle group. Groups with no SLO budget never do.
fn least_loaded_feasible(slots: &[Slot], candidates: &[usize], amount: u64) -> Option<usize> {
    let mut best: Option<(f64, usize)> = None;
    for &i in candidates {
        let s = &slots[i];
        if s.budget == 0 || (s.load > 0 && s.load + amount > s.budget) {
            continue;
        }
        let frac = s.load as f64 / s.budget as f64;
        if best.is_none_or(|(b, _)| frac < b) {
            best = Some((frac, i));
        }
    }
    best.map(|(_, i)| i)
}

fn round_robin(candidates: &[usize], cursor: &mut usize) -> Option<usize> {
    if candidates.is_empty() {
        return None;
    }
    let i = candidates[*cursor % candidates.len()];
    *cursor = cursor.wrapping_add(1);
    Some(i)
}

#[cfg(test)]
mod tests;
