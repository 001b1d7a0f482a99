use std::collections::HashMap;

use pyo3::prelude::*;
use tiertp_scheduler::batch_policy as core;
use tiertp_scheduler::dispatcher::DispatchClass;

use crate::errors::dispatch_err;

/// Per-GPU-group local batch policy, called by the worker every iteration.
#[pyclass(module = "tiertp._scheduler")]
pub struct BatchPolicy {
    inner: core::BatchPolicy,
}

#[pymethods]
impl BatchPolicy {
    #[new]
    #[pyo3(signature = (batch_cap, token_cap = 0))]
    fn new(batch_cap: u32, token_cap: u32) -> Self {
        Self {
            inner: core::BatchPolicy::new(batch_cap, token_cap),
        }
    }

    #[getter]
    fn batch_cap(&self) -> u32 {
        self.inner.batch_cap()
    }

    #[getter]
    fn token_cap(&self) -> u32 {
        self.inner.token_cap()
    }

    #[pyo3(signature = (batch_cap, token_cap = 0))]
    fn set_caps(&mut self, batch_cap: u32, token_cap: u32) {
        self.inner.set_caps(batch_cap, token_cap);
    }

    /// Queue a request under a dispatch class name; False if already queued.
    #[pyo3(signature = (request_id, cls, tokens))]
    fn enqueue(&mut self, request_id: u64, cls: &str, tokens: u32) -> PyResult<bool> {
        let class = DispatchClass::parse(cls).map_err(dispatch_err)?;
        Ok(self.inner.enqueue(request_id, class, tokens))
    }

    /// Drop a waiting request; False if it was not waiting.
    #[pyo3(signature = (request_id))]
    fn remove(&mut self, request_id: u64) -> bool {
        self.inner.remove(request_id)
    }

    /// Requests to add this iteration given `running` already batched.
    #[pyo3(signature = (running))]
    fn next_batch(&mut self, running: u32) -> Vec<u64> {
        self.inner.next_batch(running)
    }

    /// Like `next_batch`, within a KV budget: each admitted request uses
    /// `kv_needs[request_id]` tokens of `kv_budget` (its `tokens` when not
    /// listed); the first request that does not fit stops the fill (FCFS, no
    /// overtaking) and keeps its place at the head of its queue.
    #[pyo3(signature = (running, kv_budget, kv_needs))]
    fn next_batch_within(&mut self, running: u32, kv_budget: u64, kv_needs: HashMap<u64, u64>) -> Vec<u64> {
        let mut left = kv_budget;
        self.inner.next_batch_where(running, |id, tokens| {
            let need = kv_needs.get(&id).copied().unwrap_or(u64::from(tokens));
            let fits = need <= left;
            if fits {
                left -= need;
            }
            fits
        })
    }

    /// Waiting requests per queue, by dispatch class.
    #[pyo3(signature = ())]
    fn queue_lengths(&self) -> Vec<(&'static str, usize)> {
        DispatchClass::ALL
            .iter()
            .map(|c| c.name())
            .zip(self.inner.queue_lengths())
            .collect()
    }

    /// Queue a request that must start by `deadline` (caller's clock, s)
    /// to meet its TTFT; after that `take_expired` hands it back.
    #[pyo3(signature = (request_id, cls, tokens, deadline))]
    fn enqueue_with_deadline(&mut self, request_id: u64, cls: &str, tokens: u32, deadline: f64) -> PyResult<bool> {
        let class = DispatchClass::parse(cls).map_err(dispatch_err)?;
        Ok(self.inner.enqueue_with_deadline(request_id, class, tokens, deadline))
    }

    /// Remove and return the waiting requests whose deadline passed: the
    /// caller sheds them (they can no longer meet their SLO).
    #[pyo3(signature = (now))]
    fn take_expired(&mut self, now: f64) -> Vec<u64> {
        self.inner.take_expired(now)
    }

    fn __len__(&self) -> usize {
        self.inner.len()
    }
}
