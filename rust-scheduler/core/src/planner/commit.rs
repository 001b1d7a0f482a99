//! The commit rule: a proposal replaces the current plan only when what it
//! is expected to gain over the next windows outweighs what switching costs.
//!
//! - gain: (weighted goodput of the proposal − of the current plan, both
//!   at the rates expected over the horizon, where a burst counts for as
//!   long as the tier's bursts last: `TierStats::rate_over`) × the commit
//!   horizon;
//! - cost: every current group that does not survive stops for a switch
//!   (`SwitchCost`: stop time plus its live KV moved); it loses what its
//!   tier's demand uses of it for that long (an idle group loses nothing);
//! - and the proposal must beat the current plan by the hysteresis margin,
//!   so noise in the observed rates does not move GPUs.
//!
//! A current plan that leaves a tier with demand without SLO capacity while
//! the proposal gives it some is always replaced; so is one that leaves a
//! tier far below its fair share (`fairness`) when the proposal meets the
//! plans' aim for every tier; and a proposal that leaves more tiers far
//! below than the current plan is not taken.

use super::{fairness, sharing};
use crate::estimator::TierEstimate;
use crate::plan::{Plan, Role};
use crate::switch_cost::SwitchCost;
use crate::tiers::{Tier, TierId};

pub struct CommitInput<'a> {
    pub tiers: &'a [Tier],
    pub estimates: &'a [TierEstimate],
    pub current: &'a Plan,
    pub proposal: &'a Plan,
    pub current_objective: f64,
    pub proposed_objective: f64,
    pub hysteresis: f64,
    pub horizon_s: f64,
    pub switch_cost: SwitchCost,
    pub kv_bytes_per_token: f64,
}

/// The tiers with demand that a plan gives no SLO capacity.
pub(super) fn starved_tiers<'a>(estimates: &'a [TierEstimate], plan: &'a Plan) -> impl Iterator<Item = TierId> + 'a {
    sharing::tiers_with_demand(estimates).filter(|&t| plan.tier_capacity_rps[t] <= 0.0)
}

/// Tiers a plan leaves below `fraction` of their proportional share of
/// the demand that can be served in time (prompts too long for every TP
/// level count for no one).
fn short_of_floor(fraction: f64, estimates: &[TierEstimate], plan: &Plan) -> usize {
    let demand: Vec<f64> = estimates.iter().map(|e| e.stats.arrival_rate * e.best_served_share()).collect();
    let served: Vec<f64> = estimates
        .iter()
        .zip(plan.tier_capacity_rps.iter().zip(&plan.tier_served_share))
        .map(|(e, (&cap, &share))| e.stats.served_within(1.0, cap, share))
        .collect();
    fairness::tiers_short(fraction, &demand, &served)
}

/// Weighted requests a switch from `current` to `proposal` loses: what each
/// stopped group serves of its tier's demand over its stop time, and the
/// running requests that do not fit the proposal's decode slots.
pub fn switch_loss(i: &CommitInput) -> f64 {
    let mut loss = evicted(i);
    for g in &i.current.groups {
        if i.proposal.groups.iter().any(|n| n.same_assignment(g)) {
            continue;
        }
        let s = &i.estimates[g.tier].stats;
        let live_tokens = match g.role {
            Role::Prefill => f64::from(g.token_cap),
            Role::Decode | Role::Colocated => f64::from(g.batch_cap) * s.decode_context_tokens(s.mean_prompt_tokens),
        };
        let stop_s = i.switch_cost.switch_ms(live_tokens * i.kv_bytes_per_token) / 1e3;
        loss += i.tiers[g.tier].weight * g.capacity_rps * busy_share(i, g.tier) * stop_s;
    }
    loss
}

/// The share of the current plan's capacity for `tier` that its demand uses.
fn busy_share(i: &CommitInput, tier: usize) -> f64 {
    let capacity = i.current.tier_capacity_rps[tier];
    if capacity > 0.0 {
        let share = i.current.tier_served_share[tier];
        (i.estimates[tier].stats.served_within(1.0, capacity, share) / capacity).min(1.0)
    } else {
        0.0
    }
}

/// Weighted running requests a switch leaves without a decode slot: the
/// slots the current decode and colocated groups that meet their tier's
/// SLO hold busy (at the share of its capacity each tier's demand uses)
/// beyond all such slots of the proposal. Those requests were promised a
/// TPOT they now miss: a plan built for a burst of prompts must repay the
/// decodes it evicts. Counted over all tiers together, since a pool's
/// members and a lending tier's borrowers decode on other tiers' groups.
fn evicted(i: &CommitInput) -> f64 {
    let slo_slots = |plan: &Plan, tier: usize| -> f64 {
        plan.groups
            .iter()
            .filter(|g| g.tier == tier && g.role != Role::Prefill && g.slo_budget > 0)
            .map(|g| f64::from(g.batch_cap))
            .sum()
    };
    let (mut busy, mut weighted_busy, mut after) = (0.0, 0.0, 0.0);
    for t in 0..i.tiers.len() {
        let slots = busy_share(i, t) * slo_slots(i.current, t);
        busy += slots;
        weighted_busy += i.tiers[t].weight * slots;
        after += slo_slots(i.proposal, t);
    }
    if busy <= after {
        return 0.0;
    }
    (busy - after) * weighted_busy / busy
}

/// `horizon_gain_rps`: `proposed_objective − current_objective` at the
/// rates expected over the horizon, worked out only for a proposal that
/// passes the margin (it re-estimates both plans).
pub fn worth_committing(i: &CommitInput, horizon_gain_rps: impl FnOnce() -> f64) -> bool {
    if starved_tiers(i.estimates, i.proposal).count() < starved_tiers(i.estimates, i.current).count() {
        return true;
    }
    // Unfair now, fair by the plans' own aim after; never the other way
    // round for goodput.
    let unfair = |p| short_of_floor(fairness::FAIR_REPLAN_FRACTION, i.estimates, p);
    let (unfair_now, unfair_after) = (unfair(i.current), unfair(i.proposal));
    if unfair_now > 0 && short_of_floor(fairness::FAIR_PLANNED_FRACTION, i.estimates, i.proposal) == 0 {
        return true;
    }
    if unfair_after > unfair_now {
        return false;
    }
    if i.proposed_objective <= i.current_objective * (1.0 + i.hysteresis) + 1e-9 {
        return false;
    }
    let gain = horizon_gain_rps() * i.horizon_s;
    gain > switch_loss(i)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::estimator::estimate_tier;
    use crate::profile::synthetic;
    use crate::stats::TierStats;
    use crate::tiers::Tier;

    fn group(role: Role, first_gpu: u32, capacity_rps: f64, batch_cap: u32) -> crate::plan::GroupPlan {
        crate::plan::GroupPlan {
            tier: 0,
            role,
            tp: 4,
            first_gpu,
            capacity_rps,
            batch_cap,
            token_cap: if role == Role::Prefill { 4096 } else { 0 },
            slo_budget: if role == Role::Prefill { 8192 } else { u64::from(batch_cap) },
            max_prompt_tokens: 0,
            served_share: 1.0,
        }
    }

    /// TP4 groups `(role, capacity_rps, batch_cap)` on consecutive GPUs.
    fn plan(groups: &[(Role, f64, u32)], capacity: f64) -> Plan {
        Plan {
            num_gpus: 12,
            groups: (0u32..)
                .zip(groups)
                .map(|(i, &(role, rps, cap))| group(role, 4 * i, rps, cap))
                .collect(),
            tier_capacity_rps: vec![capacity],
            tier_served_share: vec![1.0],
            pooled_on: vec![None],
        }
    }

    /// A commit between `current` and `proposal` valued at `objectives`
    /// (current, proposed), each stopped group stopping `stop_ms`.
    fn input<'a>(
        tiers: &'a [Tier],
        estimates: &'a [TierEstimate],
        current: &'a Plan,
        proposal: &'a Plan,
        objectives: (f64, f64),
        stop_ms: f64,
    ) -> CommitInput<'a> {
        CommitInput {
            tiers,
            estimates,
            current,
            proposal,
            current_objective: objectives.0,
            proposed_objective: objectives.1,
            hysteresis: 0.05,
            horizon_s: 10.0,
            switch_cost: SwitchCost { stop_ms, kv_gbps: 1e6 },
            kv_bytes_per_token: 0.0,
        }
    }

    /// Current: one prefill and two full decode groups (100 running each);
    /// proposal: two prefill groups and one decode group.
    fn commit_with_gain(objective_gain_rps: f64) -> bool {
        let tiers = [Tier::slo_tier("chat", 200.0, 10.0, 1.0)];
        let profile = synthetic::llama8b_like();
        let estimates = [estimate_tier(&profile, 0, &tiers[0], TierStats::new(80.0, 1000.0, 200.0), &[4], 8)];
        let (prefill, decode) = ((Role::Prefill, 40.0, 8), (Role::Decode, 30.0, 100));
        let current = plan(&[prefill, decode, decode], 40.0);
        let proposal = plan(&[prefill, prefill, decode], 30.0);
        let objectives = (40.0, 40.0 + objective_gain_rps);
        worth_committing(&input(&tiers, &estimates, &current, &proposal, objectives, 1.0), || {
            objective_gain_rps
        })
    }

    #[test]
    fn stopping_groups_costs_what_their_demand_used_of_them() {
        let tiers = [Tier::slo_tier("chat", 200.0, 10.0, 1.0)];
        let profile = synthetic::llama8b_like();
        let at = |rate: f64| [estimate_tier(&profile, 0, &tiers[0], TierStats::new(rate, 1000.0, 200.0), &[4], 8)];
        let current = plan(&[(Role::Prefill, 40.0, 8), (Role::Decode, 40.0, 100)], 40.0);
        let proposal = plan(&[(Role::Decode, 40.0, 100), (Role::Prefill, 40.0, 8)], 40.0);
        let loss = |rate: f64| {
            let estimates = at(rate);
            // Every stopped group stops for a second.
            switch_loss(&input(&tiers, &estimates, &current, &proposal, (rate, rate), 1000.0))
        };
        // Both groups stop; the decode slots stay the same.
        assert_eq!(loss(0.0), 0.0, "an idle tier loses nothing");
        assert!(
            (loss(20.0) - 40.0).abs() < 1e-6,
            "half busy: each group loses 20 requests, {}",
            loss(20.0)
        );
    }

    #[test]
    fn a_switch_that_evicts_running_decodes_must_repay_them() {
        // 100 running requests lose their decode slot: 5 req/s more for the
        // 10 s horizon (50) does not repay them, 15 req/s (150) does.
        assert!(!commit_with_gain(5.0));
        assert!(commit_with_gain(15.0));
    }
}
