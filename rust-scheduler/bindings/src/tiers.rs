use pyo3::prelude::*;
use pyo3::types::PyDict;
use tiertp_scheduler::tiers as core;

use crate::errors::tier_err;

/// The SLO tiers of a deployment, in config order.
#[pyclass(frozen, module = "tiertp._scheduler")]
pub struct TierSet {
    pub inner: core::TierSet,
}

impl TierSet {
    /// Tier id by name, or a TierConfigError listing the valid names.
    pub fn id(&self, name: &str) -> PyResult<usize> {
        self.inner.id_of(name).map_err(tier_err)
    }
}

#[pymethods]
impl TierSet {
    #[staticmethod]
    #[pyo3(signature = (path))]
    fn load(path: String) -> PyResult<Self> {
        Ok(Self {
            inner: core::TierSet::load(&path).map_err(tier_err)?,
        })
    }

    #[staticmethod]
    #[pyo3(signature = (text, origin = "<string>".to_string()))]
    fn from_toml(text: &str, origin: String) -> PyResult<Self> {
        Ok(Self {
            inner: core::TierSet::from_toml(text, &origin).map_err(tier_err)?,
        })
    }

    #[getter]
    fn names(&self) -> Vec<String> {
        self.inner.tiers().iter().map(|t| t.name.clone()).collect()
    }

    /// Each tier as a dict: name, ttft_ms, tpot_ms, background, weight, api_keys.
    #[pyo3(signature = ())]
    fn to_list<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        self.inner
            .tiers()
            .iter()
            .map(|t| {
                let d = PyDict::new(py);
                d.set_item("name", &t.name)?;
                d.set_item("ttft_ms", t.ttft_ms)?;
                d.set_item("tpot_ms", t.tpot_ms)?;
                d.set_item("background", t.background)?;
                d.set_item("weight", t.weight)?;
                d.set_item("api_keys", t.api_keys.clone())?;
                Ok(d)
            })
            .collect()
    }

    /// The tier's index; TierConfigError listing valid names if unknown.
    #[pyo3(signature = (name))]
    fn id_of(&self, name: &str) -> PyResult<usize> {
        self.id(name)
    }

    fn __len__(&self) -> usize {
        self.inner.len()
    }

    fn __repr__(&self) -> String {
        format!("TierSet({:?})", self.names())
    }
}
