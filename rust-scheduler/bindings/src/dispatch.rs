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

    /// Dispatch a new request: (group_first_gpu, tp, class, charge); an
    /// error when every group of the tier is at its SLO budget.
    #[pyo3(signature = (request_id, tier, prompt_tokens, prefill_groups = true))]
    fn dispatch(
        &mut self,
        py: Python<'_>,
        request_id: u64,
        tier: &str,
        prompt_tokens: u32,
        prefill_groups: bool,
    ) -> PyResult<DecisionTuple> {
        let id = self.tier_id(py, tier)?;
        self.inner
            .dispatch(request_id, id, prompt_tokens, prefill_groups)
            .map(decision)
            .map_err(dispatch_err)
    }

    /// The request's prompt is prefilled: its prompt tokens come back.
    /// True when it sits on a prefill-only group (it needs a decode slot).
    #[pyo3(signature = (request_id))]
    fn prefill_done(&mut self, request_id: u64) -> PyResult<bool> {
        self.inner.prefill_done(request_id).map_err(dispatch_err)
    }

    /// Move a prefilled request to a free decode slot of its tier; None
    /// when there is none.
    #[pyo3(signature = (request_id, colocated_too = false))]
    fn dispatch_decode(&mut self, request_id: u64, colocated_too: bool) -> PyResult<Option<DecisionTuple>> {
        self.inner
            .dispatch_decode(request_id, colocated_too)
            .map(|d| d.map(decision))
            .map_err(dispatch_err)
    }

    /// Return everything the request holds; its prompt tokens returned.
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

    /// (prompt tokens, decode slots) held over all groups.
    #[getter]
    fn total_load(&self) -> (u64, u64) {
        let l = self.inner.total_load();
        (l.tokens, l.slots)
    }

    /// (prompt tokens, decode slots) on the TP group at `first_gpu` of size `tp`.
    #[pyo3(signature = (first_gpu, tp))]
    fn load_of(&self, first_gpu: u32, tp: u32) -> (u64, u64) {
        let l = self.inner.load_of((first_gpu, tp));
        (l.tokens, l.slots)
    }
}

/// A group a node runs, as the node sees it for one request
/// (`fallback_group`).
#[pyclass(module = "tiertp._scheduler", frozen)]
#[derive(Clone, Copy)]
pub struct NodeGroup {
    inner: core::NodeGroup,
}

#[pymethods]
impl NodeGroup {
    #[new]
    #[pyo3(signature = (first_gpu, tp, *, its_tier, unplanned, decode_only, load))]
    fn new(first_gpu: u32, tp: u32, its_tier: bool, unplanned: bool, decode_only: bool, load: u64) -> Self {
        Self {
            inner: core::NodeGroup {
                key: (first_gpu, tp),
                its_tier,
                unplanned,
                decode_only,
                load,
            },
        }
    }
}

/// The group a node places a request on when the gateway's placement
/// cannot be followed there, as (first_gpu, tp); `over`: the (first_gpu,
/// tp) of the group a plan change stopped under it. None when `groups` is
/// empty.
#[pyfunction]
#[pyo3(signature = (groups, over = None))]
pub fn fallback_group(groups: Vec<NodeGroup>, over: Option<(u32, u32)>) -> Option<(u32, u32)> {
    let groups: Vec<core::NodeGroup> = groups.iter().map(|g| g.inner).collect();
    core::fallback_group(&groups, over)
}
