//! Plans and GPU commands as JSON, with tiers by name: the one spelling the
//! bindings' dicts and the gateway's `/v1/plan` share.

use serde_json::{json, Map, Value};

use crate::plan::{GpuCommand, GroupPlan, Plan};

impl GroupPlan {
    pub fn to_json(&self, names: &[String]) -> Value {
        json!({
            "tier": names[self.tier], "role": self.role.name(), "tp": self.tp, "first_gpu": self.first_gpu,
            "gpus": self.gpus().collect::<Vec<_>>(), "capacity_rps": self.capacity_rps,
            "batch_cap": self.batch_cap, "token_cap": self.token_cap, "slo_budget": self.slo_budget,
            "max_prompt_tokens": self.max_prompt_tokens, "served_share": self.served_share,
        })
    }
}

impl Plan {
    /// Groups, per-tier capacity and served share, and each pool member's
    /// host (tier -> the tier whose groups serve it; members only).
    pub fn to_json(&self, names: &[String]) -> Value {
        let per_tier = |values: &[f64]| names.iter().cloned().zip(values.iter().map(|&v| json!(v))).collect::<Map<_, _>>();
        let pooled_on: Map<_, _> = names
            .iter()
            .cloned()
            .zip(&self.pooled_on)
            .filter_map(|(name, host)| host.map(|h| (name, json!(names[h]))))
            .collect();
        json!({
            "num_gpus": self.num_gpus,
            "groups": self.groups.iter().map(|g| g.to_json(names)).collect::<Vec<_>>(),
            "tier_capacity_rps": per_tier(&self.tier_capacity_rps),
            "tier_served_share": per_tier(&self.tier_served_share),
            "pooled_on": pooled_on,
        })
    }
}

impl GpuCommand {
    pub fn to_json(&self, names: &[String]) -> Value {
        json!({
            "gpu": self.gpu, "tier": names[self.tier], "role": self.role.name(), "tp": self.tp,
            "group_first_gpu": self.group_first_gpu, "batch_cap": self.batch_cap, "token_cap": self.token_cap,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Role;

    #[test]
    fn a_plan_names_its_tiers_and_each_pool_members_host() {
        let group = GroupPlan {
            tier: 1,
            role: Role::Colocated,
            tp: 2,
            first_gpu: 2,
            capacity_rps: 3.0,
            batch_cap: 8,
            token_cap: 512,
            slo_budget: 4096,
            max_prompt_tokens: 0,
            served_share: 1.0,
        };
        let plan = Plan {
            num_gpus: 4,
            groups: vec![group],
            tier_capacity_rps: vec![1.5, 3.0],
            tier_served_share: vec![1.0, 0.9],
            pooled_on: vec![Some(1), None],
        };
        let names = vec!["chat".to_string(), "batch".to_string()];
        let v = plan.to_json(&names);
        assert_eq!(v["groups"][0]["tier"], "batch");
        assert_eq!(v["groups"][0]["gpus"], json!([2, 3]));
        assert_eq!(v["tier_capacity_rps"]["chat"], 1.5);
        assert_eq!(v["tier_served_share"]["batch"], 0.9);
        assert_eq!(v["pooled_on"], json!({"chat": "batch"}));
    }
}
