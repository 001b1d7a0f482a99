use pyo3::prelude::*;
use pyo3::types::PyDict;
use serde_json::{json, Value};
use tiertp_sim::request::TraceRequest;
use tiertp_sim::SimSettings;

use crate::convert;
use crate::errors::plan_err;
use crate::profile::Profile;
use crate::tiers::TierSet;

/// Replays a trace in the cluster simulator under one policy.
///
/// Per-request lists are in trace order (sorted by arrival); `tier` holds
/// indices into `tiers.names`. Unset options take the simulator's defaults.
/// `engine_profile`: what the engine's iterations take, when the policies
/// plan with a `profile` that is not the engine (default: `profile`).
/// Per request, `status` is "completed" or "rejected", and `rejected_why`
/// says why a rejected one was (a shed reason as the gateway names it, or
/// `deadline_passed`, `no_group`, `kv_too_large`, `unfinished`,
/// `control_error`; None where it completed).
#[pyfunction]
#[pyo3(signature = (profile, tiers, arrival_s, tier, prompt_tokens, output_tokens, gpus, policy,
                    gpus_per_node = None, tp = None, prefill_share = None, window_s = None,
                    switch_ms = None, kv_gbps = None, progress = None, engine_profile = None))]
#[allow(clippy::too_many_arguments)]
pub fn simulate<'py>(
    py: Python<'py>,
    profile: &Profile,
    tiers: &TierSet,
    arrival_s: Vec<f64>,
    tier: Vec<usize>,
    prompt_tokens: Vec<u32>,
    output_tokens: Vec<u32>,
    gpus: u32,
    policy: &str,
    gpus_per_node: Option<u32>,
    tp: Option<u32>,
    prefill_share: Option<f64>,
    window_s: Option<f64>,
    switch_ms: Option<f64>,
    kv_gbps: Option<f64>,
    progress: Option<Bound<'py, PyAny>>,
    engine_profile: Option<&Profile>,
) -> PyResult<Bound<'py, PyDict>> {
    let n = arrival_s.len();
    if tier.len() != n || prompt_tokens.len() != n || output_tokens.len() != n {
        return Err(plan_err(format!(
            "arrival_s, tier, prompt_tokens and output_tokens must have one entry per request (got {n}, {}, {}, {})",
            tier.len(),
            prompt_tokens.len(),
            output_tokens.len()
        )));
    }
    let reqs: Vec<TraceRequest> = (0..n)
        .map(|i| TraceRequest {
            arrival_s: arrival_s[i],
            tier: tier[i],
            prompt_tokens: prompt_tokens[i],
            output_tokens: output_tokens[i],
        })
        .collect();
    let d = SimSettings::new(gpus);
    let settings = SimSettings {
        gpus,
        gpus_per_node: gpus_per_node.unwrap_or(d.gpus_per_node),
        window_s: window_s.unwrap_or(d.window_s),
        demand_memory_s: d.demand_memory_s,
        switch_ms: switch_ms.or(d.switch_ms),
        kv_gbps: kv_gbps.or(d.kv_gbps),
        tp,
        prefill_share,
        record_control: false,
    };
    // The simulator runs without the GIL: the planner's worker threads may
    // log (profile clamps) through Python logging, which needs it.
    let progress: Option<Py<PyAny>> = progress.map(Bound::unbind);
    let profile_arc = profile.inner.clone();
    let engine_arc = engine_profile.map_or_else(|| profile_arc.clone(), |e| e.inner.clone());
    let tier_set = &tiers.inner;
    let (res, callback_error) = py.allow_threads(|| {
        let mut callback_error: Option<PyErr> = None;
        let mut report = |fraction: f64| {
            if let (Some(cb), None) = (&progress, &callback_error) {
                if let Err(e) = Python::with_gil(|py| cb.call1(py, (fraction,)).map(drop)) {
                    callback_error = Some(e);
                }
            }
        };
        let profiles = tiertp_sim::SimProfiles::planning_on_engine(profile_arc, engine_arc);
        let res = tiertp_sim::simulate(profiles, tier_set, &reqs, policy, &settings, &mut report);
        (res, callback_error)
    });
    let res = res.map_err(plan_err)?;
    if let Some(e) = callback_error {
        return Err(e);
    }
    let names: Vec<String> = tiers.inner.tiers().iter().map(|t| t.name.clone()).collect();
    let timeline: Vec<Value> = res
        .timeline
        .iter()
        .map(|e| {
            json!({"time_s": e.time_s, "groups": e.groups.iter().map(|g| json!({
                "tier": g.tier.map_or("*", |t| names[t].as_str()), "role": g.role.name(), "tp": g.tp, "first_gpu": g.first_gpu,
            })).collect::<Vec<_>>()})
        })
        .collect();
    let out = PyDict::new(py);
    out.set_item("policy", &res.policy)?;
    out.set_item("settings", convert::to_py(py, &res.settings)?)?;
    out.set_item("num_gpus", res.num_gpus)?;
    out.set_item("sim_end_s", res.sim_end_s)?;
    out.set_item("ttft_ms", res.ttft_ms)?;
    out.set_item("tpot_ms", res.tpot_ms)?;
    out.set_item("finish_s", res.finish_s)?;
    out.set_item(
        "status",
        res.rejections
            .iter()
            .map(|r| if r.is_some() { "rejected" } else { "completed" })
            .collect::<Vec<_>>(),
    )?;
    out.set_item(
        "rejected_why",
        res.rejections.iter().map(|r| r.map(|r| r.name())).collect::<Vec<_>>(),
    )?;
    out.set_item("timeline", convert::to_py(py, &Value::Array(timeline))?)?;
    out.set_item("switches", res.switches)?;
    out.set_item("migrated_requests", res.migrated_requests)?;
    out.set_item("wall_s", res.wall_s)?;
    Ok(out)
}
