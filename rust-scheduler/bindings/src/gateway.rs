use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

/// Requests/s and p50/p99 latency through the gateway with mock workers on
/// loopback (load generator in the same process); returns the JSON text.
/// Unset options take the gateway bench's defaults; a failed run (e.g. no
/// loopback port) raises RuntimeError.
#[pyfunction]
#[pyo3(signature = (requests = None, concurrency = None, workers = None, max_tokens = None, max_seconds = None, threads = None))]
pub fn bench_gateway(
    py: Python<'_>,
    requests: Option<u64>,
    concurrency: Option<usize>,
    workers: Option<usize>,
    max_tokens: Option<u32>,
    max_seconds: Option<f64>,
    threads: Option<usize>,
) -> PyResult<String> {
    let d = tiertp_gateway::bench::BenchSettings::default();
    let settings = tiertp_gateway::bench::BenchSettings {
        requests: requests.unwrap_or(d.requests),
        concurrency: concurrency.unwrap_or(d.concurrency),
        workers: workers.unwrap_or(d.workers),
        max_tokens: max_tokens.unwrap_or(d.max_tokens),
        max_seconds: max_seconds.unwrap_or(d.max_seconds),
        threads: threads.unwrap_or(d.threads),
        ..d
    };
    py.allow_threads(|| tiertp_gateway::bench::run(&settings))
        .map(|v| v.to_string())
        .map_err(PyRuntimeError::new_err)
}
