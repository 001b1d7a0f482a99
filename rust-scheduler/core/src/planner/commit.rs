//! The commit rule: a proposal replaces the current plan only when what it
//! is expected to gain over the next windows outweighs what switching costs.
//!
//! - gain: (weighted goodput of the proposal − of the current plan, both
//!   under the same new stats) × the commit horizon;
//! - cost: every current group that does not survive stops for a switch
//!   (`SwitchCost`: stop time plus its live KV moved); it loses its weighted
//!   goodput for that long;
//! - and the proposal must beat the current plan by the hysteresis margin,
//!   so noise in the observed rates does not move GPUs.
//!
//! A current plan that leaves a tier with demand without SLO capacity while
//! the proposal gives it some is always replaced; so is one that leaves a
//! tier far below its fair share (`fairness`) when the proposal meets the
//! plans' aim for every tier; and a proposal that leaves more tiers far
//! below than the current plan is not taken.

use super::fairness;
use crate::estimator::TierEstimate;
use crate::plan::{Plan, Role};
use crate::switch_cost::SwitchCost;
use crate::tiers::Tier;

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

/// Tiers with demand that a plan gives no SLO capacity.
fn starved(estimates: &[TierEstimate], plan: &Plan) -> usize {
    estimates
        .iter()
        .zip(&plan.tier_capacity_rps)
        .filter(|(e, &cap)| e.stats.arrival_rate > 0.0 && cap <= 0.0)
        .count()
}

/// Tiers a plan leaves below `fraction` of their proportional share.
fn short_of_floor(fraction: f64, estimates: &[TierEstimate], plan: &Plan) -> usize {
    let demand: Vec<f64> = estimates.iter().map(|e| e.stats.arrival_rate).collect();
    let served: Vec<f64> = estimates
        .iter()
        .zip(&plan.tier_capacity_rps)
        .map(|(e, &cap)| e.stats.served(1.0, cap))
        .collect();
    fairness::tiers_short(fraction, &demand, &served)
}

/// Weighted requests a switch from `current` to `proposal` loses: each
/// stopped group's weighted goodput over its stop time.
pub fn switch_loss(i: &CommitInput) -> f64 {
    let mut loss = 0.0;
    for g in &i.current.groups {
        if i.proposal.groups.iter().any(|n| n.same_assignment(g)) {
            continue;
        }
        let s = &i.estimates[g.tier].stats;
        let live_tokens = match g.role {
            Role::Prefill => f64::from(g.token_cap),
            Role::Decode | Role::Colocated => f64::from(g.batch_cap) * (s.mean_prompt_tokens + s.mean_output_tokens / 2.0),
        };
        let stop_s = i.switch_cost.switch_ms(live_tokens * i.kv_bytes_per_token) / 1e3;
        loss += i.tiers[g.tier].weight * g.capacity_rps * stop_s;
    }
    loss
}

pub fn worth_committing(i: &CommitInput) -> bool {
    if starved(i.estimates, i.proposal) < starved(i.estimates, i.current) {
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
    let gain = (i.proposed_objective - i.current_objective) * i.horizon_s;
    gain > switch_loss(i)
}
