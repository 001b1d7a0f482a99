//! The control loop and the request placement: the core `Dispatcher` places
//! each request on a TP group (FCFS, tier bandwidth), the core `Planner`
//! runs every window on observed arrivals, and each committed plan change is
//! sent to the workers as `apply_plan`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;
use tiertp_scheduler::dispatcher::{DispatchError, Dispatcher};
use tiertp_scheduler::plan::Plan;
use tiertp_scheduler::planner::Planner;
use tiertp_scheduler::stats::{ArrivalObserver, TierStats};
use tiertp_scheduler::tiers::{TierId, TierSet};

use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::protocol::DevicePlan;
use crate::worker::WorkerClient;

/// Lengths the planner assumes for a tier before it has seen a request.
const PRIOR_PROMPT_TOKENS: f64 = 512.0;
const PRIOR_OUTPUT_TOKENS: f64 = 128.0;

/// Where a request went.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Placement {
    pub worker: usize,
    pub group: (u32, u32),
    pub class: &'static str,
}

struct State {
    dispatcher: Dispatcher,
    observer: ArrivalObserver,
    planner: Planner,
    plan: Plan,
    plan_id: u64,
    /// Spill cursor over live workers when the planned group's worker is down.
    cursor: usize,
}

pub struct Control {
    tiers: TierSet,
    pub workers: Vec<Arc<dyn WorkerClient>>,
    /// First global GPU of each worker (workers are the cluster's nodes).
    first_gpu: Vec<u32>,
    state: Mutex<State>,
    start: Instant,
    next_id: AtomicU64,
    pub metrics: Arc<Metrics>,
}

fn prior() -> TierStats {
    TierStats::new(0.0, PRIOR_PROMPT_TOKENS, PRIOR_OUTPUT_TOKENS)
}

impl Control {
    /// Plans for idle tiers to start with; `gpus` is each worker's GPU count.
    pub fn new(
        tiers: TierSet,
        mut planner: Planner,
        workers: Vec<Arc<dyn WorkerClient>>,
        gpus: &[u32],
        horizon: Duration,
        memory: Duration,
        metrics: Arc<Metrics>,
    ) -> Result<Self, String> {
        let observer = ArrivalObserver::new(tiers.len(), horizon.as_secs_f64(), memory.as_secs_f64(), prior());
        let idle = vec![prior(); tiers.len()];
        let plan = planner.step(&idle).map_err(|e| e.to_string())?.plan;
        let mut first_gpu = Vec::with_capacity(gpus.len());
        let mut next = 0;
        for g in gpus {
            first_gpu.push(next);
            next += g;
        }
        Ok(Self {
            state: Mutex::new(State {
                dispatcher: Dispatcher::new(&tiers, &plan),
                observer,
                planner,
                plan,
                plan_id: 1,
                cursor: 0,
            }),
            tiers,
            workers,
            first_gpu,
            start: Instant::now(),
            next_id: AtomicU64::new(1),
            metrics,
        })
    }

    pub fn tiers(&self) -> &TierSet {
        &self.tiers
    }

    pub fn new_request_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Records an arrival for the planner.
    pub fn observe(&self, tier: TierId, prompt_tokens: u32, max_tokens: u32) {
        let now = self.start.elapsed().as_secs_f64();
        self.state.lock().unwrap().observer.record(tier, now, prompt_tokens, max_tokens);
    }

    fn worker_of_gpu(&self, gpu: u32) -> usize {
        self.first_gpu.partition_point(|&f| f <= gpu).saturating_sub(1)
    }

    /// Places a request: the dispatcher's group, or, when that group's worker
    /// is down or was already tried (`exclude`), the next live worker (best
    /// effort, the charge stays on the planned group). 503 when none is left.
    pub fn place(&self, id: u64, tier: TierId, prompt_tokens: u32, exclude: &[usize]) -> Result<Placement, ApiError> {
        let mut s = self.state.lock().unwrap();
        let d = s.dispatcher.dispatch(id, tier, prompt_tokens).map_err(|e| match e {
            DispatchError::NoCapacity(_) => ApiError::NoCapacity(e.to_string()),
            e => ApiError::Internal(e.to_string()),
        })?;
        let usable = |w: usize| !exclude.contains(&w) && self.workers[w].is_alive();
        let planned = self.worker_of_gpu(d.group_first_gpu);
        if usable(planned) {
            return Ok(Placement {
                worker: planned,
                group: (d.group_first_gpu - self.first_gpu[planned], d.tp),
                class: d.class.name(),
            });
        }
        let n = self.workers.len();
        for k in 0..n {
            let w = (s.cursor + k) % n;
            if usable(w) {
                s.cursor = w + 1;
                return Ok(Placement {
                    worker: w,
                    group: (0, 1),
                    class: "best_effort",
                });
            }
        }
        let _ = s.dispatcher.complete(id);
        Err(ApiError::NoCapacity("no live worker can take the request".into()))
    }

    /// Returns a request's bandwidth (completion, failure or cancellation).
    pub fn complete(&self, id: u64) {
        let _ = self.state.lock().unwrap().dispatcher.complete(id);
    }

    /// The current plan as JSON (`/v1/plan`).
    pub fn plan_json(&self) -> serde_json::Value {
        let s = self.state.lock().unwrap();
        let groups: Vec<_> = s
            .plan
            .groups
            .iter()
            .map(|g| {
                json!({
                    "tier": self.tiers.tiers()[g.tier].name,
                    "role": g.role.name(),
                    "tp": g.tp,
                    "first_gpu": g.first_gpu,
                    "capacity_rps": g.capacity_rps,
                    "batch_cap": g.batch_cap,
                    "token_cap": g.token_cap,
                    "slo_budget": g.slo_budget,
                })
            })
            .collect();
        let caps: serde_json::Map<_, _> = self
            .tiers
            .tiers()
            .iter()
            .zip(&s.plan.tier_capacity_rps)
            .map(|(t, c)| (t.name.clone(), json!(c)))
            .collect();
        json!({"plan_id": s.plan_id, "num_gpus": s.plan.num_gpus, "groups": groups, "tier_capacity_rps": caps})
    }

    /// TP size of each GPU's group (`/metrics`).
    pub fn tp_per_gpu(&self) -> Vec<u32> {
        let s = self.state.lock().unwrap();
        let mut out = vec![0; s.plan.num_gpus as usize];
        for g in &s.plan.groups {
            for gpu in g.gpus() {
                out[gpu as usize] = g.tp;
            }
        }
        out
    }

    /// Each worker's share of the current plan, in its local device indices.
    fn device_plans(&self, plan: &Plan) -> Vec<Vec<DevicePlan>> {
        let mut out = vec![Vec::new(); self.workers.len()];
        for g in &plan.groups {
            let w = self.worker_of_gpu(g.first_gpu);
            let base = self.first_gpu[w];
            for gpu in g.gpus() {
                out[w].push(DevicePlan {
                    device: gpu - base,
                    role: g.role.name().to_string(),
                    tier: self.tiers.tiers()[g.tier].name.clone(),
                    tp_group: (g.first_gpu - base, g.tp),
                    batch_cap: g.batch_cap,
                    token_cap: g.token_cap,
                });
            }
        }
        out
    }

    /// Sends the current plan to every worker; waits up to `timeout` for each.
    pub async fn push_plan(&self, timeout: Duration) {
        let (plan_id, per_worker) = {
            let s = self.state.lock().unwrap();
            (s.plan_id, self.device_plans(&s.plan))
        };
        let sends = self.workers.iter().zip(per_worker).map(|(w, devices)| {
            let w = w.clone();
            async move {
                match tokio::time::timeout(timeout, w.apply_plan(plan_id, devices)).await {
                    Ok(Ok(r)) if r.ok => Some(r.switch_ms),
                    Ok(Ok(r)) => {
                        log::warn!("worker {} rejected plan {plan_id}: {}", w.name(), r.reason.unwrap_or_default());
                        None
                    }
                    Ok(Err(e)) => {
                        log::warn!("plan {plan_id}: {e}");
                        None
                    }
                    Err(_) => {
                        log::warn!("worker {} did not apply plan {plan_id} in time", w.name());
                        None
                    }
                }
            }
        });
        for switch_ms in futures_util::future::join_all(sends).await.into_iter().flatten() {
            self.metrics.switch.observe(switch_ms / 1e3);
        }
    }

    /// One control window: observe, plan, and on a change re-point the
    /// dispatcher. Returns whether the plan changed.
    pub fn step(&self) -> Result<bool, String> {
        let mut s = self.state.lock().unwrap();
        let now = self.start.elapsed().as_secs_f64();
        let stats = s.observer.snapshot(now);
        let outcome = s.planner.step(&stats).map_err(|e| e.to_string())?;
        if outcome.changed {
            s.dispatcher.set_plan(&self.tiers, &outcome.plan);
            s.plan = outcome.plan;
            s.plan_id += 1;
            self.metrics.plan_changes.fetch_add(1, Ordering::Relaxed);
        }
        Ok(outcome.changed)
    }

    /// The planner task: every `window`, step and push a changed plan.
    pub async fn run_loop(self: Arc<Self>, window: Duration, plan_timeout: Duration) {
        let mut tick = tokio::time::interval(window);
        tick.tick().await;
        loop {
            tick.tick().await;
            match self.step() {
                Ok(true) => self.push_plan(plan_timeout).await,
                Ok(false) => {}
                Err(e) => log::warn!("planner step failed: {e}"),
            }
        }
    }
}
