//! Core results as JSON values, turned into Python objects through the
//! `json` module: one conversion path for plans and commands (the core's
//! `to_json`, which `/v1/plan` shares) and estimates.

use pyo3::prelude::*;
use serde_json::{json, Value};
use tiertp_scheduler::estimator::{Candidate, CandidateMode, StageEstimate, TierEstimate};

pub fn to_py<'py>(py: Python<'py>, v: &Value) -> PyResult<Bound<'py, PyAny>> {
    py.import("json")?.call_method1("loads", (v.to_string(),))
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
