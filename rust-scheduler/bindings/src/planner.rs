use std::collections::HashMap;

use pyo3::prelude::*;
use pyo3::types::PyDict;
use serde_json::Value;
use tiertp_scheduler::defaults::GPUS_PER_NODE;
use tiertp_scheduler::plan as core_plan;
use tiertp_scheduler::planner::{self as core, PlannerConfig};
use tiertp_scheduler::stats::TierStats as CoreStats;
use tiertp_scheduler::topology::Cluster;

use crate::convert;
use crate::errors::plan_err;
use crate::profile::Profile;
use crate::stats::TierStats;
use crate::tiers::TierSet;

/// An immutable plan: which GPUs serve which tier, role and TP level.
#[pyclass(frozen, module = "tiertp._scheduler")]
pub struct Plan {
    pub inner: core_plan::Plan,
    pub tier_names: Vec<String>,
}

impl Plan {
    fn json(&self) -> Value {
        self.inner.to_json(&self.tier_names)
    }
}

#[pymethods]
impl Plan {
    #[getter]
    fn num_gpus(&self) -> u32 {
        self.inner.num_gpus
    }

    /// Planned SLO-compliant requests/s per tier name.
    #[getter]
    fn tier_capacity_rps(&self) -> HashMap<String, f64> {
        self.tier_names
            .iter()
            .cloned()
            .zip(self.inner.tier_capacity_rps.iter().copied())
            .collect()
    }

    /// Groups as dicts: tier, role, tp, first_gpu, gpus, capacity_rps,
    /// batch_cap, token_cap, slo_budget, max_prompt_tokens (0: any),
    /// served_share.
    #[pyo3(signature = ())]
    fn groups<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        convert::to_py(py, &self.json()["groups"])
    }

    #[pyo3(signature = ())]
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        convert::to_py(py, &self.json())
    }

    #[pyo3(signature = ())]
    fn to_json(&self) -> String {
        self.json().to_string()
    }

    fn __repr__(&self) -> String {
        format!("Plan(num_gpus={}, groups={})", self.inner.num_gpus, self.inner.groups.len())
    }
}

/// The control loop's planner (estimate, weighted greedy, hysteresis diff).
#[pyclass(module = "tiertp._scheduler")]
pub struct Planner {
    inner: core::Planner,
    tier_names: Vec<String>,
}

impl Planner {
    fn stats(&self, stats: HashMap<String, TierStats>) -> PyResult<Vec<CoreStats>> {
        let mut out = Vec::with_capacity(self.tier_names.len());
        for name in stats.keys() {
            if !self.tier_names.contains(name) {
                return Err(plan_err(format!(
                    "stats for unknown tier {name:?}; valid tiers: {:?}",
                    self.tier_names
                )));
            }
        }
        for name in &self.tier_names {
            let s = stats
                .get(name)
                .ok_or_else(|| plan_err(format!("no stats for tier {name:?}: every tier needs TierStats")))?;
            out.push(s.inner);
        }
        Ok(out)
    }

    fn wrap(&self, plan: core_plan::Plan) -> Plan {
        Plan {
            inner: plan,
            tier_names: self.tier_names.clone(),
        }
    }
}

#[pymethods]
impl Planner {
    /// `gpus` GPUs in nodes of `gpus_per_node`, or explicit `nodes` sizes.
    /// Unset options take the core's defaults.
    #[new]
    #[pyo3(signature = (profile, tiers, gpus = None, nodes = None, gpus_per_node = None, tp_levels = None,
                        hysteresis = None, fairness_weighting = None, allow_colocated = None, allow_disaggregated = None,
                        target_utilization = None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        profile: &Profile,
        tiers: &TierSet,
        gpus: Option<u32>,
        nodes: Option<Vec<u32>>,
        gpus_per_node: Option<u32>,
        tp_levels: Option<Vec<u32>>,
        hysteresis: Option<f64>,
        fairness_weighting: Option<bool>,
        allow_colocated: Option<bool>,
        allow_disaggregated: Option<bool>,
        target_utilization: Option<f64>,
    ) -> PyResult<Self> {
        let cluster = match (gpus, nodes) {
            (Some(_), Some(_)) => return Err(plan_err("give either gpus or nodes, not both")),
            (None, None) => return Err(plan_err("give the cluster size: gpus=N or nodes=[...]")),
            (Some(g), None) => Cluster::uniform(g, gpus_per_node.unwrap_or(GPUS_PER_NODE)),
            (None, Some(n)) => Cluster::new(n),
        }
        .map_err(plan_err)?;
        let d = PlannerConfig::default();
        let config = PlannerConfig {
            tp_levels: tp_levels.unwrap_or(d.tp_levels),
            hysteresis: hysteresis.unwrap_or(d.hysteresis),
            fairness_weighting: fairness_weighting.unwrap_or(d.fairness_weighting),
            allow_colocated: allow_colocated.unwrap_or(d.allow_colocated),
            allow_disaggregated: allow_disaggregated.unwrap_or(d.allow_disaggregated),
            target_utilization: target_utilization.unwrap_or(d.target_utilization),
            ..d
        };
        let tier_names = tiers.inner.tiers().iter().map(|t| t.name.clone()).collect();
        let inner = core::Planner::new(profile.inner.clone(), tiers.inner.clone(), cluster, config).map_err(plan_err)?;
        Ok(Self { inner, tier_names })
    }

    #[getter]
    fn num_gpus(&self) -> u32 {
        self.inner.cluster().num_gpus()
    }

    /// TP levels in use (profile ∩ config ∩ node sizes, powers of two).
    #[getter]
    fn tp_levels(&self) -> Vec<u32> {
        self.inner.tp_levels().to_vec()
    }

    /// One control-window step. `stats` maps every tier name to TierStats.
    /// Returns {plan, changed, commands, proposed_objective, current_objective}.
    #[pyo3(signature = (stats))]
    fn step<'py>(&mut self, py: Python<'py>, stats: HashMap<String, TierStats>) -> PyResult<Bound<'py, PyDict>> {
        let stats = self.stats(stats)?;
        let inner = &mut self.inner;
        let out = py.allow_threads(|| inner.step(&stats)).map_err(plan_err)?;
        let d = PyDict::new(py);
        let commands: Vec<Value> = out.commands.iter().map(|c| c.to_json(&self.tier_names)).collect();
        d.set_item("plan", Py::new(py, self.wrap(out.plan))?)?;
        d.set_item("changed", out.changed)?;
        d.set_item("commands", convert::to_py(py, &Value::Array(commands))?)?;
        d.set_item("proposed_objective", out.proposed_objective)?;
        d.set_item("current_objective", out.current_objective)?;
        Ok(d)
    }

    /// The greedy's plan from scratch, without hysteresis or commit.
    #[pyo3(signature = (stats))]
    fn propose(&self, py: Python<'_>, stats: HashMap<String, TierStats>) -> PyResult<Plan> {
        let stats = self.stats(stats)?;
        let (plan, _) = py.allow_threads(|| self.inner.propose(&stats)).map_err(plan_err)?;
        Ok(self.wrap(plan))
    }

    /// Per tier: per-TP stage estimates and candidate configurations.
    #[pyo3(signature = (stats))]
    fn estimate<'py>(&self, py: Python<'py>, stats: HashMap<String, TierStats>) -> PyResult<Bound<'py, PyAny>> {
        let stats = self.stats(stats)?;
        // Off the GIL: estimation runs on worker threads that may log.
        let est = py.allow_threads(|| self.inner.estimate(&stats)).map_err(plan_err)?;
        let v: Vec<Value> = est.iter().map(|e| convert::estimate(e, &self.tier_names)).collect();
        convert::to_py(py, &Value::Array(v))
    }

    /// The committed plan, if any step ran.
    #[pyo3(signature = ())]
    fn current(&self) -> Option<Plan> {
        self.inner.current().cloned().map(|p| self.wrap(p))
    }

    /// Forget the committed plan; the next step adopts its proposal.
    #[pyo3(signature = ())]
    fn reset(&mut self) {
        self.inner.reset();
    }
}

/// Runs the scheduler benchmark; returns its JSON text.
#[pyfunction]
#[pyo3(signature = (quick = false))]
pub fn bench_scheduler(py: Python<'_>, quick: bool) -> String {
    let mut settings = tiertp_scheduler::bench::BenchSettings::default();
    if quick {
        settings.gpu_counts = vec![8, 128];
        settings.tier_counts = vec![4];
        settings.plan_budget = std::time::Duration::from_millis(20);
        settings.dispatch_requests = 5_000;
        settings.dispatch_repeats = 1;
    }
    py.allow_threads(|| tiertp_scheduler::bench::run(&settings)).to_string()
}
