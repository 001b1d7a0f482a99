//! A gateway run from Python on its own tokio runtime (`GatewayServer`,
//! `MockGateway`): Python only starts it, reads its address and stops it.
//! The GIL is released while the gateway starts and stops.

use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use tiertp_gateway::server::GatewayHandle;

pub struct Hosted {
    address: String,
    running: Mutex<Option<(tokio::runtime::Runtime, GatewayHandle)>>,
}

impl Hosted {
    /// Runs `start` on a new runtime of `threads` worker threads; its error
    /// becomes the Python exception `err` makes.
    pub fn start<F, E>(py: Python<'_>, threads: usize, start: F, err: impl FnOnce(E) -> PyErr) -> PyResult<Self>
    where
        F: Future<Output = Result<GatewayHandle, E>> + Send,
        E: Send,
    {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads.max(1))
            .thread_name("tiertp-gateway")
            .enable_all()
            .build()
            .map_err(|e| PyRuntimeError::new_err(format!("tokio runtime: {e}")))?;
        let handle = py.allow_threads(|| runtime.block_on(start)).map_err(err)?;
        Ok(Self {
            address: handle.addr.to_string(),
            running: Mutex::new(Some((runtime, handle))),
        })
    }

    /// `host:port` the gateway listens on.
    pub fn address(&self) -> String {
        self.address.clone()
    }

    /// Whether the gateway is still serving (`shutdown` not called yet).
    pub fn running(&self) -> bool {
        self.running.lock().map(|r| r.is_some()).unwrap_or(false)
    }

    /// Stops the gateway (idempotent); waits at most `timeout_s` for
    /// in-flight requests, then aborts them.
    pub fn shutdown(&self, py: Python<'_>, timeout_s: f64) {
        let taken = self.running.lock().ok().and_then(|mut r| r.take());
        if let Some((runtime, handle)) = taken {
            let wait = Duration::from_secs_f64(if timeout_s.is_finite() && timeout_s > 0.0 { timeout_s } else { 0.0 });
            py.allow_threads(move || {
                runtime.block_on(async move {
                    let _ = tokio::time::timeout(wait, handle.shutdown()).await;
                });
                runtime.shutdown_timeout(Duration::from_secs(2));
            });
        }
    }
}

impl Drop for Hosted {
    fn drop(&mut self) {
        if let Some((runtime, handle)) = self.running.get_mut().ok().and_then(|r| r.take()) {
            drop(handle);
            runtime.shutdown_background();
        }
    }
}
