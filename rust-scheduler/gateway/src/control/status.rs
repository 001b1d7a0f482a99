//! Read-only views of the control state: `/v1/plan` and the plan part of
//! `/metrics`.

use serde_json::json;

use super::Control;

impl Control {
    /// The current plan as JSON (`/v1/plan`: the core's `Plan::to_json`), with
    /// its id, the GPUs that are down and each worker's connection and
    /// applied plan.
    pub fn plan_json(&self) -> serde_json::Value {
        let s = self.state.lock().unwrap();
        let plan = s.control.plan();
        let names: Vec<String> = self.tiers.tiers().iter().map(|t| t.name.clone()).collect();
        let mut out = plan.to_json(&names);
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
        out["plan_id"] = json!(s.control.plan_id());
        out["gpus_down"] = json!(down);
        out["planner_note"] = json!(s.control.planner_note());
        out["workers"] = json!(workers);
        out
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
