//! FCFS request dispatch on the request path (DESIGN.md §1, Dispatch).
//!
//! A group's SLO budget has two parts, both from the plan:
//! - **prompt tokens** waiting to be prefilled (prefill and colocated
//!   groups): beyond the budget the newest prompt's TTFT runs out in the
//!   queue;
//! - **decode slots** (decode and colocated groups): the planned batch cap,
//!   the largest batch whose step fits the tier's TPOT. It is hard: a group
//!   never holds more requests than its cap.
//!
//! - background tier → round robin over background groups, budgets ignored
//!   (it has no SLO); without such groups, the least-full prefill-capable
//!   group with room, and it runs behind SLO work in the batch policy;
//! - SLO tier → the least-loaded prefill-capable group of the tier with room
//!   in both parts (an idle group always has room: a long prompt is served
//!   soonest there) as `Feasible`; if none has, the least-loaded such group
//!   of a tier that lends to it, one whose SLO is at least as strict and
//!   whose weight is no higher (served there, the request meets its own
//!   SLO, and the lender's budget still bounds the lender's queue, so bursts
//!   of one tier use another's idle room instead of being shed); if none
//!   has room either, `OverBudget`: the caller
//!   sheds the request rather than let it delay work that can still meet
//!   its SLO (no best-effort spill: a request in a batch holds its slot
//!   until it finishes, whether or not it still counts).
//!
//! Every group, idle or not, takes only prompts it can prefill within its
//! TTFT alone (`GroupPlan::max_prompt_tokens`): a longer one goes to a
//! larger TP group, or, where no group of the tier or its lenders can take
//! it, is refused as `PromptTooLong` (run anyway, it would miss its TTFT and
//! delay the prompts queued behind it).
//!
//! A prefill-only group takes an SLO request only while a decode slot will
//! be free for it when it is prefilled: the decode groups of its tier and
//! its lenders on the group's node have more slots free, now or surely by
//! then, than the tier has prompts prefilling there. "Surely": the
//! requests a group finishes by then at its planned rate, two standard
//! deviations below that count's mean. Counting only the slots free now
//! shut prefill out whenever decode was full, though a decode group under
//! a tight TPOT with short outputs frees its slots several times within
//! one TTFT (8B on 8 H100, a 10/90 chat/agent split of the Azure code
//! trace at 120 req/s: a pool served 66.8 req/s gated on the slots free
//! now, 78.0 with no gate, 72.4 with this one); counting the mean alone
//! admitted prompts that then waited past their TPOT for slots that came
//! late (8B on 4 A100 at 70 req/s: the 132 prefilled requests shed for
//! want of a slot became 3,039 and goodput fell 29.1 -> 26.8; with the
//! margin, 426 and 29.8).
//! A prompt prefilled with no slot to go to waits, and is shed once the wait
//! spends its TPOT budget: the prefill it took is lost, and prompts
//! admitted behind it were delayed for nothing. Admitted only with a slot
//! in view, prefill runs as far ahead of decode as decode can take.
//!
//! A request's prompt charge comes back at its first token (`prefill_done`);
//! its decode slot when it finishes (`complete`). A prefilled request on a
//! prefill group takes a decode slot with `dispatch_decode` (its tier's
//! groups first, then a lending tier's on the same node), or none is free
//! and it waits (the control loop queues it). Charges on groups a new plan
//! removed are kept until their requests return them.

use rustc_hash::FxHashMap;
use thiserror::Error;

use crate::plan::{GroupKey, GroupPlan, Plan, Role};
use crate::tiers::{TierId, TierSet};
use crate::topology::Cluster;

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
    #[error("tier {tier}: every group of the tier is at its SLO budget")]
    OverBudget { tier: TierId },
    #[error("tier {tier}: no group of the tier can prefill a {prompt_tokens}-token prompt within its TTFT")]
    PromptTooLong { tier: TierId, prompt_tokens: u32 },
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Decision {
    pub group_first_gpu: u32,
    pub tp: u32,
    pub class: DispatchClass,
    /// Prompt tokens charged (0 for a decode hand-off).
    pub charge: u64,
}

impl Decision {
    pub fn key(&self) -> GroupKey {
        (self.group_first_gpu, self.tp)
    }
}

/// What one request or one group holds: prompt tokens still to prefill and
/// decode slots.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Load {
    pub tokens: u64,
    pub slots: u64,
}

impl Load {
    fn add(&mut self, o: Load) {
        self.tokens += o.tokens;
        self.slots += o.slots;
    }

    fn sub(&mut self, o: Load) {
        self.tokens -= o.tokens;
        self.slots -= o.slots;
    }

    pub fn is_zero(&self) -> bool {
        self.tokens == 0 && self.slots == 0
    }
}

#[derive(Debug, Clone, Copy)]
struct Charge {
    tier: TierId,
    key: GroupKey,
    load: Load,
    role: Role,
}

#[derive(Debug, Clone)]
struct Slot {
    key: GroupKey,
    role: Role,
    token_budget: u64,
    slot_budget: u64,
    /// Longest prompt the group takes; 0: any (`GroupPlan::max_prompt_tokens`).
    max_prompt_tokens: u64,
    /// Decode slots a full group frees per second (its planned throughput;
    /// 0 for prefill-only groups).
    frees_per_s: f64,
    /// Seconds a prefill-capable group takes to prefill its whole token
    /// budget: the TTFT it was sized for (0 without one).
    drain_s: f64,
    load: Load,
}

impl Slot {
    /// Whether the group can prefill a prompt this long in time at all.
    fn takes_prompt(&self, tokens: u64) -> bool {
        self.max_prompt_tokens == 0 || tokens <= self.max_prompt_tokens
    }

    fn holds_slots(&self) -> bool {
        self.role != Role::Prefill
    }

    /// A decode slot is free here.
    fn has_free_slot(&self) -> bool {
        self.holds_slots() && self.load.slots < self.slot_budget
    }

    /// Decode slots free here within `within_s` seconds: those free now and
    /// those its running requests finish with by then, at the rate a full
    /// group finishes them scaled by how full it is (whole slots only).
    fn slots_free_within(&self, within_s: f64) -> f64 {
        let free = self.slot_budget.saturating_sub(self.load.slots) as f64;
        let used = self.load.slots.min(self.slot_budget) as f64;
        let finishing = if self.slot_budget == 0 {
            0.0
        } else {
            self.frees_per_s * used / self.slot_budget as f64 * within_s
        };
        // Finishing times vary: count what finishes with high probability
        // (two standard deviations below a Poisson count's mean).
        let sure = (finishing - 2.0 * finishing.sqrt()).max(0.0);
        free + sure.min(used).floor()
    }

    /// When a prompt of `tokens` dispatched here now is prefilled: the
    /// budget drains in `drain_s`, and the prompt waits behind what it holds.
    fn prefilled_within_s(&self, tokens: u64) -> f64 {
        if self.token_budget == 0 {
            return 0.0;
        }
        self.drain_s * ((self.load.tokens + tokens) as f64 / self.token_budget as f64).min(1.0)
    }

    /// Whether `add` fits the budget. An idle group always fits.
    fn fits(&self, add: Load) -> bool {
        if self.load.is_zero() {
            return true;
        }
        let tokens_ok = add.tokens == 0 || self.load.tokens + add.tokens <= self.token_budget;
        let slots_ok = add.slots == 0 || self.load.slots + add.slots <= self.slot_budget;
        tokens_ok && slots_ok
    }

    /// Fullness in [0, 1+]: the tighter of the two parts.
    fn fullness(&self) -> f64 {
        let part = |used: u64, budget: u64| if budget == 0 { 1.0 } else { used as f64 / budget as f64 };
        let tokens = if self.role == Role::Decode {
            0.0
        } else {
            part(self.load.tokens, self.token_budget)
        };
        let slots = if self.holds_slots() {
            part(self.load.slots, self.slot_budget)
        } else {
            0.0
        };
        tokens.max(slots)
    }
}

#[derive(Debug, Default)]
pub struct Dispatcher {
    num_tiers: usize,
    tier_is_background: Vec<bool>,
    slots: Vec<Slot>,
    slot_of: FxHashMap<GroupKey, usize>,
    /// Loads left on groups that are no longer in the plan.
    retired: FxHashMap<GroupKey, Load>,
    tier_prefill: Vec<Vec<usize>>,
    tier_decode: Vec<Vec<usize>>,
    /// Per SLO tier, the prefill-capable and the decode groups of the tiers
    /// that lend to it (`Tier::lends_to`) or host its pool (`Plan::pooled_on`):
    /// where its requests may go when its own groups are full (served
    /// there, they meet their own SLO).
    lender_prefill: Vec<Vec<usize>>,
    lender_decode: Vec<Vec<usize>>,
    all_prefill: Vec<usize>,
    background: Vec<usize>,
    has_background_groups: bool,
    background_cursor: usize,
    in_flight: FxHashMap<u64, Charge>,
    /// Per (tier, node): prompts on prefill-only groups not yet prefilled,
    /// each to claim a decode slot on that node.
    prefilling: FxHashMap<(TierId, u32), u64>,
    /// Node of each GPU (empty: one node). KV moves only within a node.
    node_of_gpu: Vec<u32>,
}

impl Dispatcher {
    pub fn new(tiers: &TierSet, plan: &Plan) -> Self {
        let mut d = Self::default();
        d.set_plan(tiers, plan);
        d
    }

    /// The cluster's nodes: a prefilled request moves only to a decode
    /// group on its own node (its KV cannot cross nodes).
    pub fn set_nodes(&mut self, cluster: &Cluster) {
        self.node_of_gpu = (0..cluster.num_gpus()).map(|g| cluster.node_of(g).unwrap_or(0) as u32).collect();
    }

    fn node(&self, gpu: u32) -> u32 {
        self.node_of_gpu.get(gpu as usize).copied().unwrap_or(0)
    }

    /// Decode slots a prefilled request may move to: its tier's decode
    /// groups on its node (`colocated_too`: also its colocated groups).
    fn decode_targets(&self, c: &Charge, colocated_too: bool) -> Vec<usize> {
        let mut out = self.on_node_of(c, &self.tier_decode[c.tier]);
        if colocated_too {
            out.extend(
                self.on_node_of(c, &self.tier_prefill[c.tier])
                    .into_iter()
                    .filter(|&i| self.slots[i].holds_slots()),
            );
        }
        out
    }

    /// Decode groups of the tiers lending to the request's on its node: its
    /// decode slot when its own tier's are all taken.
    fn lent_decode_targets(&self, c: &Charge) -> Vec<usize> {
        self.on_node_of(c, &self.lender_decode[c.tier])
    }

    /// The groups of `slots` on the request's node (its KV cannot cross nodes).
    fn on_node_of(&self, c: &Charge, slots: &[usize]) -> Vec<usize> {
        let here = self.node(c.key.0);
        slots.iter().copied().filter(|&i| self.node(self.slots[i].key.0) == here).collect()
    }

    /// Whether a prompt of `tier` prefilled on `node` within `within_s`
    /// would find a decode slot: more slots free by then
    /// (`Slot::slots_free_within`) on the node's decode groups of the tier
    /// and its lenders than the tier's prompts prefilling there. True
    /// without such groups (a prompt prefilled there decodes where it is).
    /// A lender's own prompts are not counted against a borrower: the lent
    /// slots are the borrower's only way out, and counting both tiers'
    /// prompts against them shuts the borrower out whenever the lender is
    /// busy.
    fn decode_room(&self, tier: TierId, node: u32, within_s: f64) -> bool {
        let mut targets = self.tier_decode[tier]
            .iter()
            .chain(&self.lender_decode[tier])
            .map(|&i| &self.slots[i])
            .filter(|s| self.node(s.key.0) == node)
            .peekable();
        if targets.peek().is_none() {
            return true;
        }
        let free: f64 = targets.map(|s| s.slots_free_within(within_s)).sum();
        free > self.prefilling.get(&(tier, node)).copied().unwrap_or(0) as f64
    }

    /// Whether the request's node has any decode group it could move to
    /// (full or not); without one it decodes where it is.
    pub fn decode_reachable(&self, request_id: u64, colocated_too: bool) -> Result<bool, DispatchError> {
        let c = self.in_flight.get(&request_id).ok_or(DispatchError::UnknownRequest(request_id))?;
        Ok(!self.decode_targets(c, colocated_too).is_empty() || !self.lent_decode_targets(c).is_empty())
    }

    /// Switches to a new plan; loads of groups that persist carry over.
    pub fn set_plan(&mut self, tiers: &TierSet, plan: &Plan) {
        let mut loads: FxHashMap<GroupKey, Load> = std::mem::take(&mut self.retired);
        for s in self.slots.drain(..) {
            if !s.load.is_zero() {
                loads.entry(s.key).or_default().add(s.load);
            }
        }
        self.adopt_roles(plan);
        self.num_tiers = tiers.len();
        self.tier_is_background = tiers.tiers().iter().map(|t| t.background).collect();
        self.slot_of.clear();
        self.tier_prefill = vec![Vec::new(); tiers.len()];
        self.tier_decode = vec![Vec::new(); tiers.len()];
        self.all_prefill.clear();
        self.background.clear();
        for g in &plan.groups {
            let key = g.key();
            let i = self.slots.len();
            self.slots.push(Slot {
                key,
                role: g.role,
                token_budget: g.slo_budget,
                slot_budget: u64::from(g.batch_cap),
                max_prompt_tokens: u64::from(g.max_prompt_tokens),
                frees_per_s: if g.role == Role::Prefill { 0.0 } else { g.capacity_rps },
                drain_s: tiers.tiers()[g.tier].ttft_ms.map_or(0.0, |ms| ms / 1e3),
                load: loads.remove(&key).unwrap_or_default(),
            });
            self.slot_of.insert(key, i);
            if g.role.takes_prefill() {
                self.tier_prefill[g.tier].push(i);
                self.all_prefill.push(i);
                if self.tier_is_background[g.tier] {
                    self.background.push(i);
                }
            }
            if g.role == Role::Decode {
                self.tier_decode[g.tier].push(i);
            }
        }
        self.has_background_groups = !self.background.is_empty();
        let lenders = |t: usize, of_role: fn(Role) -> bool| -> Vec<usize> {
            let borrower = &tiers.tiers()[t];
            if borrower.background {
                return Vec::new();
            }
            let pooled_on = plan.pooled_on.get(t).copied().flatten();
            let lends =
                |g: &GroupPlan| g.tier != t && of_role(g.role) && (pooled_on == Some(g.tier) || tiers.tiers()[g.tier].lends_to(borrower));
            // Slot indices follow the plan's group order.
            (0..plan.groups.len()).filter(|&i| lends(&plan.groups[i])).collect()
        };
        self.lender_prefill = (0..tiers.len()).map(|t| lenders(t, Role::takes_prefill)).collect();
        self.lender_decode = (0..tiers.len()).map(|t| lenders(t, |r| r == Role::Decode)).collect();
        self.retired = loads;
    }

    /// A group the plan keeps at its place under a new role keeps its
    /// requests (its process runs on): their charges take the new role.
    fn adopt_roles(&mut self, plan: &Plan) {
        let roles: FxHashMap<GroupKey, Role> = plan.groups.iter().map(|g| (g.key(), g.role)).collect();
        let mut changed = Vec::new();
        for c in self.in_flight.values_mut() {
            if let Some(&role) = roles.get(&c.key) {
                if role != c.role {
                    // Still to prefill: it claims a decode slot on a prefill-only group.
                    if c.load.tokens > 0 && (role == Role::Prefill || c.role == Role::Prefill) {
                        changed.push((c.tier, c.key, role == Role::Prefill));
                    }
                    c.role = role;
                }
            }
        }
        for (tier, key, now_prefill_only) in changed {
            if now_prefill_only {
                let node = self.node(key.0);
                *self.prefilling.entry((tier, node)).or_default() += 1;
            } else {
                self.prefilled(tier, key);
            }
        }
    }

    /// Dispatches a new request's prefill. `prefill_groups`: whether the
    /// tier's prefill-only groups may take it (not while its prefilled
    /// requests wait for decode slots: more would only wait too).
    pub fn dispatch(&mut self, request_id: u64, tier: TierId, prompt_tokens: u32, prefill_groups: bool) -> Result<Decision, DispatchError> {
        self.dispatch_avoiding(request_id, tier, prompt_tokens, prefill_groups, &[])
    }

    /// `dispatch`, never onto the groups in `down` (failed or unreachable).
    /// When an SLO tier has no group up (none planned, e.g. fewer live GPUs
    /// than tiers, or all down), the request fails over to the least-full
    /// group of another tier that has room, as best effort.
    pub fn dispatch_avoiding(
        &mut self,
        request_id: u64,
        tier: TierId,
        prompt_tokens: u32,
        prefill_groups: bool,
        down: &[GroupKey],
    ) -> Result<Decision, DispatchError> {
        self.check_new(request_id, tier)?;
        let tokens = u64::from(prompt_tokens.max(1));
        let slots = &self.slots;
        let up = |i: &usize| !down.contains(&slots[*i].key);
        let room = |i: &usize| {
            let s = &slots[*i];
            s.takes_prompt(tokens)
                && s.fits(Load {
                    tokens,
                    slots: u64::from(s.holds_slots()),
                })
        };
        if self.tier_is_background[tier] {
            if self.has_background_groups {
                let live: Vec<usize> = self.background.iter().copied().filter(up).collect();
                let slot = round_robin(&live, &mut self.background_cursor).ok_or(DispatchError::NoCapacity("background"))?;
                return Ok(self.charge(request_id, tier, slot, tokens, DispatchClass::Background));
            }
            // On other tiers' groups only with room to spare: a running
            // background request holds its slot until it finishes.
            let fitting = self.all_prefill.iter().copied().filter(up).filter(room);
            let best = least_full(slots, fitting).ok_or(DispatchError::OverBudget { tier })?;
            return Ok(self.charge(request_id, tier, best, tokens, DispatchClass::Background));
        }
        let may_prefill_on = |i: usize| {
            slots[i].role != Role::Prefill
                || (prefill_groups && self.decode_room(tier, self.node(slots[i].key.0), slots[i].prefilled_within_s(tokens)))
        };
        let fitting_in = |groups: &[usize]| {
            let fitting = groups.iter().copied().filter(up).filter(|&i| may_prefill_on(i)).filter(|i| room(i));
            least_full(slots, fitting)
        };
        // Its own groups full (or none planned), a request may
        // take room on a lending tier's group: served there, it meets its
        // own SLO, and the budget it is charged against keeps the lender's
        // feasible.
        if let Some(best) = fitting_in(&self.tier_prefill[tier]).or_else(|| fitting_in(&self.lender_prefill[tier])) {
            return Ok(self.charge(request_id, tier, best, tokens, DispatchClass::Feasible));
        }
        let has_own = self.tier_prefill[tier].iter().any(up);
        let has_lender = self.lender_prefill[tier].iter().any(up);
        if !has_own && !has_lender {
            let fitting = self.all_prefill.iter().copied().filter(up).filter(room);
            let best = least_full(slots, fitting).ok_or(DispatchError::NoCapacity("this tier's"))?;
            return Ok(self.charge(request_id, tier, best, tokens, DispatchClass::BestEffort));
        }
        let long_enough = |i: &usize| slots[*i].takes_prompt(tokens);
        if !self.tier_prefill[tier]
            .iter()
            .chain(&self.lender_prefill[tier])
            .filter(|i| up(i))
            .any(long_enough)
        {
            return Err(DispatchError::PromptTooLong { tier, prompt_tokens });
        }
        Err(DispatchError::OverBudget { tier })
    }

    /// The request's prompt is prefilled: its prompt charge comes back.
    /// Returns whether it sits on a prefill-only group (it then needs a
    /// decode slot elsewhere).
    pub fn prefill_done(&mut self, request_id: u64) -> Result<bool, DispatchError> {
        let c = self
            .in_flight
            .get_mut(&request_id)
            .ok_or(DispatchError::UnknownRequest(request_id))?;
        let give = Load {
            tokens: c.load.tokens,
            slots: 0,
        };
        c.load.tokens = 0;
        let (tier, key, role) = (c.tier, c.key, c.role);
        if role == Role::Prefill && give.tokens > 0 {
            self.prefilled(tier, key);
        }
        self.release(key, give);
        Ok(role == Role::Prefill)
    }

    /// Moves a prefilled request to the least-full decode group of its tier
    /// on its node with a free slot (`colocated_too`: or a colocated one,
    /// for a request whose group is stopping); `None` (nothing changes) when
    /// none has one.
    pub fn dispatch_decode(&mut self, request_id: u64, colocated_too: bool) -> Result<Option<Decision>, DispatchError> {
        let c = self.in_flight.get(&request_id).ok_or(DispatchError::UnknownRequest(request_id))?;
        let tier = c.tier;
        let slots = &self.slots;
        let has_slot = |i: &usize| slots[*i].has_free_slot();
        let decode: Vec<usize> = self.decode_targets(c, false).into_iter().filter(has_slot).collect();
        let mut candidates = if decode.is_empty() && colocated_too {
            self.decode_targets(c, true).into_iter().filter(has_slot).collect()
        } else {
            decode
        };
        if candidates.is_empty() {
            candidates = self.lent_decode_targets(c).into_iter().filter(has_slot).collect();
        }
        self.move_to_slot(request_id, tier, least_full(slots, candidates.into_iter()), DispatchClass::Feasible)
    }

    /// The request gives back what it holds and takes a decode slot of
    /// `target` (none: nothing changes), in the background class if its
    /// tier is one, else in `slo_class`.
    fn move_to_slot(
        &mut self,
        request_id: u64,
        tier: TierId,
        target: Option<usize>,
        slo_class: DispatchClass,
    ) -> Result<Option<Decision>, DispatchError> {
        let Some(target) = target else { return Ok(None) };
        let class = if self.tier_is_background[tier] {
            DispatchClass::Background
        } else {
            slo_class
        };
        self.complete(request_id)?;
        Ok(Some(self.charge_load(
            request_id,
            tier,
            target,
            Load { tokens: 0, slots: 1 },
            class,
        )))
    }

    /// A free decode slot on any group of the request's node (decode or
    /// colocated, whichever tier's), for a running request whose group
    /// stops and whose tier, and the tiers lending to it, have none there:
    /// it finishes on another tier's room (background class for a
    /// background tier, best effort for an SLO tier) rather than not at all.
    /// None when no group on its node has a free slot.
    pub fn dispatch_any_slot(&mut self, request_id: u64) -> Result<Option<Decision>, DispatchError> {
        let c = self.in_flight.get(&request_id).ok_or(DispatchError::UnknownRequest(request_id))?;
        let tier = c.tier;
        let slots = &self.slots;
        let free: Vec<usize> = (0..slots.len()).filter(|&i| slots[i].has_free_slot()).collect();
        let target = least_full(slots, self.on_node_of(c, &free).into_iter());
        self.move_to_slot(request_id, tier, target, DispatchClass::BestEffort)
    }

    /// The tier a request in flight belongs to.
    pub fn tier_of(&self, request_id: u64) -> Option<TierId> {
        self.in_flight.get(&request_id).map(|c| c.tier)
    }

    /// The prompt tokens the request is charged until its first token (0
    /// after `prefill_done`).
    pub fn prompt_charge(&self, request_id: u64) -> Option<u64> {
        self.in_flight.get(&request_id).map(|c| c.load.tokens)
    }

    /// Returns everything the request holds; its prompt tokens returned.
    pub fn complete(&mut self, request_id: u64) -> Result<u64, DispatchError> {
        let c = self
            .in_flight
            .remove(&request_id)
            .ok_or(DispatchError::UnknownRequest(request_id))?;
        if c.role == Role::Prefill && c.load.tokens > 0 {
            self.prefilled(c.tier, c.key);
        }
        self.release(c.key, c.load);
        Ok(c.load.tokens)
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    pub fn is_in_flight(&self, request_id: u64) -> bool {
        self.in_flight.contains_key(&request_id)
    }

    /// The group a request is charged to.
    pub fn group_of(&self, request_id: u64) -> Option<GroupKey> {
        self.in_flight.get(&request_id).map(|c| c.key)
    }

    /// Load on a group, planned or retired.
    pub fn load_of(&self, key: GroupKey) -> Load {
        self.slot_of
            .get(&key)
            .map_or_else(|| self.retired.get(&key).copied().unwrap_or_default(), |&i| self.slots[i].load)
    }

    /// Sum of all group loads (equals the sum of in-flight charges).
    pub fn total_load(&self) -> Load {
        let mut t = Load::default();
        for l in self.slots.iter().map(|s| s.load).chain(self.retired.values().copied()) {
            t.add(l);
        }
        t
    }

    pub fn total_charged(&self) -> Load {
        let mut t = Load::default();
        for c in self.in_flight.values() {
            t.add(c.load);
        }
        t
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

    /// A prompt of `tier` on prefill-only group `key` is no longer prefilling.
    fn prefilled(&mut self, tier: TierId, key: GroupKey) {
        let node = self.node(key.0);
        if let Some(n) = self.prefilling.get_mut(&(tier, node)) {
            *n -= 1;
            if *n == 0 {
                self.prefilling.remove(&(tier, node));
            }
        }
    }

    fn release(&mut self, key: GroupKey, load: Load) {
        if load.is_zero() {
            return;
        }
        match self.slot_of.get(&key) {
            Some(&i) => self.slots[i].load.sub(load),
            None => {
                let left = self.retired.get_mut(&key).expect("a charge's group is planned or retired");
                left.sub(load);
                if left.is_zero() {
                    self.retired.remove(&key);
                }
            }
        }
    }

    fn charge(&mut self, request_id: u64, tier: TierId, slot: usize, tokens: u64, class: DispatchClass) -> Decision {
        let slots = u64::from(self.slots[slot].holds_slots());
        self.charge_load(request_id, tier, slot, Load { tokens, slots }, class)
    }

    fn charge_load(&mut self, request_id: u64, tier: TierId, slot: usize, load: Load, class: DispatchClass) -> Decision {
        if self.slots[slot].role == Role::Prefill && load.tokens > 0 {
            let node = self.node(self.slots[slot].key.0);
            *self.prefilling.entry((tier, node)).or_default() += 1;
        }
        let s = &mut self.slots[slot];
        s.load.add(load);
        self.in_flight.insert(
            request_id,
            Charge {
                tier,
                key: s.key,
                load,
                role: s.role,
            },
        );
        Decision {
            group_first_gpu: s.key.0,
            tp: s.key.1,
            class,
            charge: load.tokens,
        }
    }
}

/// The least-full candidate (ties: the first).
fn least_full(slots: &[Slot], candidates: impl Iterator<Item = usize>) -> Option<usize> {
    let mut best: Option<(f64, usize)> = None;
    for i in candidates {
        let f = slots[i].fullness();
        if best.is_none_or(|(b, _)| f < b) {
            best = Some((f, i));
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

mod fallback;
mod settle;

pub use fallback::{fallback_group, NodeGroup};

#[cfg(test)]
mod tests;
