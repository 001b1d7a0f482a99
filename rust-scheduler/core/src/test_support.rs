//! Plans by hand for the core's unit tests.

use crate::plan::{GroupPlan, Plan, Role};

/// A TP1 group with the given SLO token budget and batch cap.
pub fn group(tier: usize, role: Role, first_gpu: u32, slo_budget: u64, batch_cap: u32) -> GroupPlan {
    GroupPlan {
        tier,
        role,
        tp: 1,
        first_gpu,
        capacity_rps: 1.0,
        batch_cap,
        token_cap: 100,
        slo_budget,
        max_prompt_tokens: 0,
        served_share: 1.0,
    }
}

/// A plan of two tiers over just the GPUs its groups use.
pub fn plan(groups: Vec<GroupPlan>) -> Plan {
    Plan {
        num_gpus: groups.iter().map(|g| g.first_gpu + g.tp).max().unwrap_or(1),
        groups,
        tier_capacity_rps: vec![1.0, 1.0],
        tier_served_share: vec![1.0, 1.0],
        pooled_on: vec![None, None],
    }
}
