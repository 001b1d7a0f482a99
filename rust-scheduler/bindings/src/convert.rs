//! Core results as JSON values, turned into Python objects through the
//! `json` module: one conversion path for plans, commands and estimates.

use pyo3::prelude::*;
use serde_json::{json, Value};
use tiertp_scheduler::estimator::{Candidate, CandidateMode, StageEstimate, TierEstimate};
use tiertp_scheduler::plan::{GpuCommand, GroupPlan, Plan};

pub fn to_py<'py>(py: Python<'py>, v: &Value) -> PyResult<Bound<'py, PyAny>> {
    py.import("json")?.call_method1("loads", (v.to_string(),))
}

pub fn group(g: &GroupPlan, names: &[String]) -> Value {
    json!({
        "tier": names[g.tier], "role": g.role.name(), "tp": g.tp, "first_gpu": g.first_gpu,
        "gpus": g.gpus().collect::<Vec<_>>(), "capacity_rps": g.capacity_rps,
        "batch_cap": g.batch_cap, "token_cap": g.token_cap, "slo_budget": g.slo_budget,
        "max_prompt_tokens": g.max_prompt_tokens, "served_share": g.served_share,
    })
}

pub fn plan(p: &Plan, names: &[String]) -> Value {
    let caps: serde_json::Map<String, Value> = names.iter().cloned().zip(p.tier_capacity_rps.iter().map(|&c| json!(c))).collect();
    json!({
        "num_gpus": p.num_gpus,
        "groups": p.groups.iter().map(|g| group(g, names)).collect::<Vec<_>>(),
        "tier_capacity_rps": caps,
        "tier_served_share": names.iter().cloned().zip(p.tier_served_share.iter().map(|&s| json!(s))).collect::<serde_json::Map<_, _>>(),
        // Pool members: tier -> the tier whose groups serve it.
        "pooled_on": names.iter().cloned().zip(&p.pooled_on)
            .filter_map(|(name, host)| host.map(|h| (name, json!(names[h]))))
            .collect::<serde_json::Map<_, _>>(),
    })
}

pub fn command(c: &GpuCommand, names: &[String]) -> Value {
    json!({
        "gpu": c.gpu, "tier": names[c.tier], "role": c.role.name(), "tp": c.tp,
        "group_first_gpu": c.group_first_gpu, "batch_cap": c.batch_cap, "token_cap": c.token_cap,
    })
}

fn stage(s: &StageEstimate) -> Value {
    json!({
        "throughput_rps": s.throughput_rps, "batch_requests": s.batch_requests,
        "batch_tokens": s.batch_tokens, "batch_ms": s.batch_ms, "feasible": s.feasible(),
    })
}

fn candidate(c: &Candidate) -> Value {
    let mut v = match c.mode {
        CandidateMode::Colocated { tp } => json!({"mode": "colocated", "tp": tp}),
        CandidateMode::Disaggregated {
            prefill_tp,
            decode_tp,
            prefill_groups,
            decode_groups,
        } => json!({
            "mode": "disaggregated", "prefill_tp": prefill_tp, "decode_tp": decode_tp,
            "prefill_groups": prefill_groups, "decode_groups": decode_groups,
        }),
    };
    v["gpus"] = json!(c.gpus);
    v["throughput_rps"] = json!(c.throughput_rps);
    v["goodput_efficiency"] = json!(c.goodput_efficiency);
    v
}

pub fn estimate(e: &TierEstimate, names: &[String]) -> Value {
    json!({
        "tier": names[e.tier],
        "arrival_rate": e.stats.arrival_rate,
        "per_tp": e.per_tp.iter().map(|t| json!({
            "tp": t.tp, "prefill": stage(&t.prefill), "decode": stage(&t.decode), "decode_held": stage(&t.decode_held),
            "colocated": stage(&t.colocated),
        })).collect::<Vec<_>>(),
        "candidates": e.candidates().iter().map(candidate).collect::<Vec<_>>(),
    })
}
