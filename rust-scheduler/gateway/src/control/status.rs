//! Read-only views of the control state: `/v1/plan` and the plan part of
//! `/metrics`.

use serde_json::json;

use super::Control;

impl Control {
    /// The current plan as JSON (`/v1/plan`), with the GPUs that are down and
    /// each worker's connection and applied plan.
    pub fn plan_json(&self) -> serde_json::Value {
        let s = self.state.lock().unwrap();
        let plan = s.control.plan();
        let groups: Vec<_> = plan
            .groups
            .iter()
            .map(|g| {
                json!({
                    "tier": self.tiers.tiers()[g.tier].name,
                    "role": g.role.name(),
                    "tp": g.tp,
                    "first_gpu": g.first_gpu,
                    "capacity_rps": g.capacity_rps,
                    "batch_cap": g.batch_cap,
                    "token_cap": g.token_cap,
                    "slo_budget": g.slo_budget,
                    "max_prompt_tokens": g.max_prompt_tokens,
                    "served_share": g.served_share,
                })
            })
            .collect();
        let caps: serde_json::Map<_, _> = self
            .tiers
            .tiers()
            .iter()
            .zip(&plan.tier_capacity_rps)
            .map(|(t, c)| (t.name.clone(), json!(c)))
            .collect();
        // Pool members: tier -> the tier whose groups serve it.
        let name = |t: usize| self.tiers.tiers()[t].name.clone();
        let pooled_on: serde_json::Map<_, _> = plan
            .pooled_on
            .iter()
            .enumerate()
            .filter_map(|(t, host)| host.map(|h| (name(t), json!(name(h)))))
            .collect();
        let usable = s.health.usable();
        let down: Vec<usize> = (0..usable.len()).filter(|&g| !usable[g]).collect();
        let workers: Vec<_> = self
            .workers
            .iter()
            .enumerate()
            .map(|(i, w)| {
                json!({
                    "endpoint": w.name(),
                    "connected": w.is_alive(),
                    "first_gpu": self.nodes.first_gpu(i),
                    "gpus": self.nodes.size(i),
                    "applied_plan_id": s.workers[i].applied,
                    "rejected_plan_id": s.workers[i].rejected,
                })
            })
            .collect();
        json!({
            "plan_id": s.control.plan_id(),
            "num_gpus": plan.num_gpus,
            "groups": groups,
            "tier_capacity_rps": caps,
            "pooled_on": pooled_on,
            "gpus_down": down,
            "planner_note": s.control.planner_note(),
            "workers": workers,
        })
    }

    /// TP size of each GPU's group, 0 for GPUs in none (`/metrics`).
    pub fn tp_per_gpu(&self) -> Vec<u32> {
        let s = self.state.lock().unwrap();
        let plan = s.control.plan();
        let mut out = vec![0; plan.num_gpus as usize];
        for g in &plan.groups {
            for gpu in g.gpus() {
                out[gpu as usize] = g.tp;
            }
        }
        out
    }
}
