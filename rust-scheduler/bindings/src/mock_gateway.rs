//! `MockGateway`: the gateway over mock node agents on loopback
//! (`tiertp_gateway::mock_gateway`), run from Python for tests that need a
//! live gateway but no model (the API fuzz test).

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use tiertp_gateway::mock_gateway::{self, API_KEY, MODEL};
use tiertp_gateway::worker::mock::MockConfig;

use crate::hosted::Hosted;

/// The gateway over `workers` mock agents of one device each, which echo
/// the prompt's token ids as the output, with a tiny word-level tokenizer
/// and one tier whose key is `api_key`. `max_model_len`: the context
/// length the agents report (None: none, so the gateway checks no context
/// length). Starting failures (e.g. no loopback port) raise RuntimeError.
#[pyclass(module = "tiertp._scheduler")]
pub struct MockGateway {
    hosted: Hosted,
}

#[pymethods]
impl MockGateway {
    #[new]
    #[pyo3(signature = (workers = 1, max_model_len = None, threads = 2))]
    fn new(py: Python<'_>, workers: usize, max_model_len: Option<u32>, threads: usize) -> PyResult<Self> {
        let agent = MockConfig {
            max_model_len,
            ..MockConfig::default()
        };
        let hosted = Hosted::start(py, threads, mock_gateway::start(workers, agent), PyRuntimeError::new_err)?;
        Ok(Self { hosted })
    }

    /// `host:port` the gateway listens on.
    #[getter]
    fn address(&self) -> String {
        self.hosted.address()
    }

    /// The API key of its one tier.
    #[getter]
    fn api_key(&self) -> &'static str {
        API_KEY
    }

    /// The model name requests must give.
    #[getter]
    fn model(&self) -> &'static str {
        MODEL
    }

    /// Stops the gateway and its agents (idempotent); waits at most
    /// `timeout_s` for in-flight requests.
    #[pyo3(signature = (timeout_s = 10.0))]
    fn shutdown(&self, py: Python<'_>, timeout_s: f64) {
        self.hosted.shutdown(py, timeout_s);
    }
}
