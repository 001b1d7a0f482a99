use pyo3::prelude::*;
use tiertp_scheduler::dispatcher as core;

use crate::errors::dispatch_err;
use crate::planner::Plan;
use crate::tiers::TierSet;

/// FCFS dispatcher with per-group SLO bandwidth accounting.
#[pyclass(module = "tiertp._scheduler")]
pub struct Dispatcher {
    inner: core::Dispatcher,
    tiers: Py<TierSet>,
}

impl Dispatcher {
    fn tier_id(&self, py: Python<'_>, tier: &str) -> PyResult<usize> {
        self.tiers.borrow(py).inner.id_of(tier).map_err(dispatch_err)
    }
}

type DecisionTuple = (u32, u32, &'static str, u64);

fn decision(d: core::Decision) -> DecisionTuple {
    (d.group_first_gpu, d.tp, d.class.name(), d.charge)
}

#[pymethods]
impl Dispatcher {
    #[new]
    #[pyo3(signature = (tiers, plan))]
    fn new(py: Python<'_>, tiers: Py<TierSet>, plan: &Plan) -> Self {
        let inner = core::Dispatcher::new(&tiers.borrow(py).inner, &plan.inner);
        Self { inner, tiers }
    }

    /// Switch to a new plan; in-flight charges stay exact.
    #[pyo3(signature = (plan))]
    fn set_plan(&mut self, py: Python<'_>, plan: &Plan) {
        self.inner.set_plan(&self.tiers.borrow(py).inner, &plan.inner);
    }

    /// Dispatch a new request: (group_first_gpu, tp, class, charge).
    #[pyo3(signature = (request_id, tier, prompt_tokens))]
    fn dispatch(&mut self, py: Python<'_>, request_id: u64, tier: &str, prompt_tokens: u32) -> PyResult<DecisionTuple> {
        let id = self.tier_id(py, tier)?;
        self.inner
            .dispatch(request_id, id, prompt_tokens)
            .map(decision)
            .map_err(dispatch_err)
    }

    /// Move a prefilled request to a decode group of its tier.
    #[pyo3(signature = (request_id, tier))]
    fn dispatch_decode(&mut self, py: Python<'_>, request_id: u64, tier: &str) -> PyResult<DecisionTuple> {
        let id = self.tier_id(py, tier)?;
        self.inner.dispatch_decode(request_id, id).map(decision).map_err(dispatch_err)
    }

    /// Return the request's bandwidth; the amount returned.
    #[pyo3(signature = (request_id))]
    fn complete(&mut self, request_id: u64) -> PyResult<u64> {
        self.inner.complete(request_id).map_err(dispatch_err)
    }

    #[pyo3(signature = (request_id))]
    fn is_in_flight(&self, request_id: u64) -> bool {
        self.inner.is_in_flight(request_id)
    }

    #[getter]
    fn in_flight(&self) -> usize {
        self.inner.in_flight()
    }

    #[getter]
    fn total_load(&self) -> u64 {
        self.inner.total_load()
    }

    /// Load on the TP group starting at `first_gpu` of size `tp`.
    #[pyo3(signature = (first_gpu, tp))]
    fn load_of(&self, first_gpu: u32, tp: u32) -> u64 {
        self.inner.load_of((first_gpu, tp))
    }
}
