use pyo3::prelude::*;
use tiertp_scheduler::stats as core;

use crate::errors::plan_err;
use crate::tiers::TierSet;

/// Observed load of one tier: arrival rate and mean lengths.
#[pyclass(frozen, module = "tiertp._scheduler")]
#[derive(Clone, Copy)]
pub struct TierStats {
    pub inner: core::TierStats,
}

#[pymethods]
impl TierStats {
    #[new]
    #[pyo3(signature = (arrival_rate, mean_prompt_tokens, mean_output_tokens))]
    fn new(arrival_rate: f64, mean_prompt_tokens: f64, mean_output_tokens: f64) -> PyResult<Self> {
        let inner = core::TierStats::new(arrival_rate, mean_prompt_tokens, mean_output_tokens);
        inner.validate().map_err(plan_err)?;
        Ok(Self { inner })
    }

    #[getter]
    fn arrival_rate(&self) -> f64 {
        self.inner.arrival_rate
    }

    #[getter]
    fn mean_prompt_tokens(&self) -> f64 {
        self.inner.mean_prompt_tokens
    }

    #[getter]
    fn mean_output_tokens(&self) -> f64 {
        self.inner.mean_output_tokens
    }

    /// Mean output of the requests a decode batch holds, E[o²]/E[o] (long
    /// outputs stay longer); `mean_output_tokens` when all are alike.
    #[getter]
    fn resident_output_tokens(&self) -> f64 {
        self.inner.resident_output_tokens
    }

    /// Mean prompt of the tier's recently prefilled requests (what its
    /// decode groups hold); None until enough were seen.
    #[getter]
    fn prefilled_prompt_tokens(&self) -> Option<f64> {
        self.inner.prefilled_prompt_tokens
    }

    fn __repr__(&self) -> String {
        let s = &self.inner;
        format!(
            "TierStats(arrival_rate={}, mean_prompt_tokens={}, mean_output_tokens={})",
            s.arrival_rate, s.mean_prompt_tokens, s.mean_output_tokens
        )
    }
}

/// Sliding-horizon arrival statistics per tier (the control loop's Observe).
#[pyclass(module = "tiertp._scheduler")]
pub struct ArrivalObserver {
    inner: core::ArrivalObserver,
    tiers: Py<TierSet>,
}

#[pymethods]
impl ArrivalObserver {
    /// Rates are the larger of the last `horizon_s` and the last `memory_s`
    /// (default: `horizon_s`, no memory); the rate's shape counts arrivals
    /// per `window_s` (default: the control loop's window).
    #[new]
    #[pyo3(signature = (tiers, horizon_s, prior, memory_s = None, window_s = None))]
    fn new(
        tiers: Py<TierSet>,
        horizon_s: f64,
        prior: TierStats,
        memory_s: Option<f64>,
        window_s: Option<f64>,
        py: Python<'_>,
    ) -> PyResult<Self> {
        let memory_s = memory_s.unwrap_or(horizon_s);
        let window_s = window_s.unwrap_or(tiertp_scheduler::defaults::WINDOW_S);
        for (name, v) in [("horizon_s", horizon_s), ("memory_s", memory_s), ("window_s", window_s)] {
            if !(v.is_finite() && v > 0.0) {
                return Err(plan_err(format!("{name} = {v}: must be a finite number > 0")));
            }
        }
        let n = tiers.borrow(py).inner.len();
        Ok(Self {
            inner: core::ArrivalObserver::new(n, horizon_s, memory_s, window_s, prior.inner),
            tiers,
        })
    }

    #[pyo3(signature = (tier, time_s, prompt_tokens, output_tokens))]
    fn record(&mut self, py: Python<'_>, tier: &str, time_s: f64, prompt_tokens: u32, output_tokens: u32) -> PyResult<()> {
        let id = self.tiers.borrow(py).id(tier)?;
        self.inner.record(id, time_s, prompt_tokens, output_tokens);
        Ok(())
    }

    /// Stats per tier name over the horizon ending at `now_s`.
    #[pyo3(signature = (now_s))]
    fn snapshot(&mut self, py: Python<'_>, now_s: f64) -> Vec<(String, TierStats)> {
        let names: Vec<String> = self.tiers.borrow(py).inner.tiers().iter().map(|t| t.name.clone()).collect();
        names
            .into_iter()
            .zip(self.inner.snapshot(now_s))
            .map(|(n, s)| (n, TierStats { inner: s }))
            .collect()
    }
}
