use std::sync::Arc;

use pyo3::prelude::*;
use tiertp_scheduler::profile::{self as core, synthetic};

use crate::errors::profile_err;

/// A validated TP performance profile.
#[pyclass(frozen, module = "tiertp._scheduler")]
pub struct Profile {
    pub inner: Arc<core::Profile>,
}

#[pymethods]
impl Profile {
    /// Loads and validates a profile JSON file.
    #[staticmethod]
    #[pyo3(signature = (path))]
    fn load(py: Python<'_>, path: String) -> PyResult<Self> {
        let p = py.allow_threads(|| core::Profile::load(&path)).map_err(profile_err)?;
        Ok(Self { inner: Arc::new(p) })
    }

    /// Parses and validates profile JSON; `origin` names it in errors.
    #[staticmethod]
    #[pyo3(signature = (text, origin = "<string>".to_string()))]
    fn from_json(text: &str, origin: String) -> PyResult<Self> {
        let p = core::Profile::from_json(text, &origin).map_err(profile_err)?;
        Ok(Self { inner: Arc::new(p) })
    }

    /// The analytic Llama-8B-like profile (not a measurement).
    #[staticmethod]
    #[pyo3(signature = ())]
    fn synthetic() -> Self {
        Self {
            inner: Arc::new(synthetic::llama8b_like()),
        }
    }

    #[getter]
    fn name(&self) -> String {
        self.inner.name.clone()
    }

    #[getter]
    fn gpu(&self) -> String {
        self.inner.gpu.clone()
    }

    #[getter]
    fn model(&self) -> String {
        self.inner.model.clone()
    }

    #[getter]
    fn dtype(&self) -> String {
        self.inner.dtype.clone()
    }

    #[getter]
    fn kv_bytes_per_token(&self) -> Option<u64> {
        self.inner.kv_bytes_per_token
    }

    #[getter]
    fn tp_levels(&self) -> Vec<u32> {
        self.inner.tp_levels()
    }

    /// Prefill batch time (ms); clamped outside the profiled range.
    #[pyo3(signature = (tp, batch_tokens, batch_size))]
    fn prefill_ms(&self, tp: u32, batch_tokens: f64, batch_size: f64) -> PyResult<f64> {
        self.inner.table(tp).map_err(profile_err)?;
        Ok(self.inner.prefill_ms(tp, batch_tokens, batch_size))
    }

    /// Decode step time (ms); clamped outside the profiled range.
    #[pyo3(signature = (tp, batch_size, context_len))]
    fn decode_ms(&self, tp: u32, batch_size: f64, context_len: f64) -> PyResult<f64> {
        self.inner.table(tp).map_err(profile_err)?;
        Ok(self.inner.decode_ms(tp, batch_size, context_len))
    }

    /// KV tokens one TP group holds, if the profile says.
    #[pyo3(signature = (tp))]
    fn kv_capacity_tokens(&self, tp: u32) -> PyResult<Option<u64>> {
        Ok(self.inner.table(tp).map_err(profile_err)?.kv_capacity_tokens)
    }

    /// Queries so far that fell outside the profiled range.
    #[pyo3(signature = ())]
    fn clamped_queries(&self) -> u64 {
        self.inner.clamped_queries()
    }

    #[pyo3(signature = ())]
    fn to_json(&self) -> String {
        self.inner.to_json()
    }

    fn __repr__(&self) -> String {
        format!("Profile({:?}, tp_levels={:?})", self.inner.name, self.inner.tp_levels())
    }
}
