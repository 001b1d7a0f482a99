//! The control loop and the request placement: the core `Dispatcher` places
//! each request on a TP group (FCFS, tier bandwidth), and every control
//! window the loop polls the workers' health, runs the core `Planner` over
//! the GPUs that are up, and brings every worker to the current plan
//! (`apply_plan`).
//!
//! GPU health: a GPU is up when its agent is connected, answers `stats`,
//! and does not report the device's execution process dead or starting;
//! a request that fails with `worker_died` takes its group's GPUs out at
//! once (for at least one window, then the agent's word counts again) and
//! wakes the loop. When the set of up GPUs changes, the planner is rebuilt
//! over the live ones (see `live`), so plans never use a dead GPU, and GPUs
//! that come back are planned again.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;
use tiertp_scheduler::dispatcher::{DispatchError, Dispatcher};
use tiertp_scheduler::plan::Plan;
use tiertp_scheduler::planner::{Planner, PlannerConfig};
use tiertp_scheduler::profile::Profile;
use tiertp_scheduler::stats::{ArrivalObserver, TierStats};
use tiertp_scheduler::tiers::{TierId, TierSet};
use tokio::sync::Notify;

use crate::error::ApiError;
use crate::live::LiveView;
use crate::metrics::Metrics;
use crate::protocol::{DevicePlan, StatsReply};
use crate::worker::WorkerClient;

/// Lengths the planner assumes for a tier before it has seen a request.
const PRIOR_PROMPT_TOKENS: f64 = 512.0;
const PRIOR_OUTPUT_TOKENS: f64 = 128.0;

/// A TP group in global GPU numbering: (first GPU, TP size).
pub type GroupKey = (u32, u32);

/// Where a request went.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Placement {
    pub worker: usize,
    /// The group in global numbering.
    pub key: GroupKey,
    /// The group in the worker's own device numbering, or `None` when the
    /// worker does not run the current plan (not yet acknowledged, or
    /// refused): the agent then routes by tier over its own assignment.
    pub group: Option<(u32, u32)>,
    pub class: &'static str,
}

/// How far a worker is with the plans sent to it.
#[derive(Debug, Clone, Copy, Default)]
struct WorkerPlan {
    /// The plan the agent last said it runs (`plan_applied` or `stats`).
    applied: Option<u64>,
    /// A plan the agent refused: not sent again.
    rejected: Option<u64>,
    connected: bool,
}

struct State {
    dispatcher: Dispatcher,
    observer: ArrivalObserver,
    /// `None` when no GPU is up, or no TP level fits the live GPUs.
    planner: Option<(Planner, LiveView)>,
    /// Why there is no planner.
    planner_note: Option<String>,
    /// The committed plan, in global GPU numbering.
    plan: Plan,
    plan_id: u64,
    /// Per GPU: whether requests may be placed on it now.
    usable: Vec<bool>,
    /// Per GPU: what the agent said in its last `stats` (or lost connection).
    reported_up: Vec<bool>,
    /// Per GPU: out after a `worker_died` report until then.
    suspect_until: Vec<Option<Instant>>,
    /// The GPUs the current planner plans over.
    planned_up: Vec<bool>,
    workers: Vec<WorkerPlan>,
    /// Spill cursor over the plan's groups.
    cursor: usize,
}

pub struct Control {
    tiers: TierSet,
    pub workers: Vec<Arc<dyn WorkerClient>>,
    /// First global GPU and GPU count of each worker (workers are the
    /// cluster's nodes).
    first_gpu: Vec<u32>,
    node_sizes: Vec<u32>,
    num_gpus: u32,
    profile: Arc<Profile>,
    planner_config: PlannerConfig,
    window: Duration,
    stats_timeout: Duration,
    state: Mutex<State>,
    start: Instant,
    next_id: AtomicU64,
    /// Asks the loop for a step now (a GPU or worker failed).
    wake: Notify,
    pub metrics: Arc<Metrics>,
}

/// The control loop's settings.
#[derive(Debug, Clone)]
pub struct ControlConfig {
    pub planner: PlannerConfig,
    pub window: Duration,
    pub horizon: Duration,
    pub memory: Duration,
    pub stats_timeout: Duration,
}

fn prior() -> TierStats {
    TierStats::new(0.0, PRIOR_PROMPT_TOKENS, PRIOR_OUTPUT_TOKENS)
}

fn no_groups(num_gpus: u32, tiers: usize) -> Plan {
    Plan {
        num_gpus,
        groups: Vec::new(),
        tier_capacity_rps: vec![0.0; tiers],
    }
}

impl Control {
    /// Plans for idle tiers over all GPUs to start with; `gpus` is each
    /// worker's GPU count.
    pub fn new(
        tiers: TierSet,
        profile: Arc<Profile>,
        workers: Vec<Arc<dyn WorkerClient>>,
        gpus: &[u32],
        config: ControlConfig,
        metrics: Arc<Metrics>,
    ) -> Result<Self, String> {
        let num_gpus: u32 = gpus.iter().sum();
        let all_up = vec![true; num_gpus as usize];
        let view = LiveView::new(gpus, &all_up).ok_or("no GPUs")?;
        let mut planner =
            Planner::new(profile.clone(), tiers.clone(), view.cluster.clone(), config.planner.clone()).map_err(|e| e.to_string())?;
        let idle = vec![prior(); tiers.len()];
        let plan = view.to_physical_plan(planner.step(&idle).map_err(|e| e.to_string())?.plan, num_gpus);
        let mut first_gpu = Vec::with_capacity(gpus.len());
        let mut next = 0;
        for g in gpus {
            first_gpu.push(next);
            next += g;
        }
        let observer = ArrivalObserver::new(tiers.len(), config.horizon.as_secs_f64(), config.memory.as_secs_f64(), prior());
        Ok(Self {
            state: Mutex::new(State {
                dispatcher: Dispatcher::new(&tiers, &plan),
                observer,
                planner: Some((planner, view)),
                planner_note: None,
                plan,
                plan_id: 1,
                usable: all_up.clone(),
                reported_up: all_up.clone(),
                suspect_until: vec![None; num_gpus as usize],
                planned_up: all_up,
                workers: vec![WorkerPlan::default(); workers.len()],
                cursor: 0,
            }),
            tiers,
            workers,
            first_gpu,
            node_sizes: gpus.to_vec(),
            num_gpus,
            profile,
            planner_config: config.planner,
            window: config.window,
            stats_timeout: config.stats_timeout,
            start: Instant::now(),
            next_id: AtomicU64::new(1),
            wake: Notify::new(),
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

    fn gpus_of_worker(&self, w: usize) -> std::ops::Range<usize> {
        let first = self.first_gpu[w] as usize;
        first..first + self.node_sizes[w] as usize
    }

    /// The worker of a group whose GPUs can take a request now.
    fn usable_group(&self, s: &State, key: GroupKey) -> Option<usize> {
        let w = self.worker_of_gpu(key.0);
        let up = (key.0..key.0 + key.1).all(|g| s.usable[g as usize]);
        (up && self.workers[w].is_alive()).then_some(w)
    }

    fn placement(&self, s: &State, w: usize, key: GroupKey, class: &'static str) -> Placement {
        let runs_plan = s.workers[w].applied == Some(s.plan_id);
        Placement {
            worker: w,
            key,
            group: runs_plan.then_some((key.0 - self.first_gpu[w], key.1)),
            class,
        }
    }

    /// Places a request: the dispatcher's group, or, when that group is down
    /// or was already tried (`exclude`), the next group of the plan that can
    /// take it (best effort; the charge stays on the dispatcher's group).
    /// 503 when none can.
    pub fn place(&self, id: u64, tier: TierId, prompt_tokens: u32, exclude: &[GroupKey]) -> Result<Placement, ApiError> {
        let mut s = self.state.lock().unwrap();
        let d = match s.dispatcher.dispatch(id, tier, prompt_tokens) {
            Ok(d) => d,
            Err(DispatchError::NoCapacity(_)) if s.plan.groups.is_empty() => {
                let why = s.planner_note.clone().unwrap_or_else(|| "no GPU is up".into());
                return Err(ApiError::NoCapacity(why));
            }
            Err(e @ DispatchError::NoCapacity(_)) => return Err(ApiError::NoCapacity(e.to_string())),
            Err(e) => return Err(ApiError::Internal(e.to_string())),
        };
        let planned = (d.group_first_gpu, d.tp);
        if !exclude.contains(&planned) {
            if let Some(w) = self.usable_group(&s, planned) {
                return Ok(self.placement(&s, w, planned, d.class.name()));
            }
        }
        let n = s.plan.groups.len();
        for k in 0..n {
            let i = (s.cursor + k) % n;
            let g = &s.plan.groups[i];
            let key = (g.first_gpu, g.tp);
            if g.role.takes_prefill() && !exclude.contains(&key) {
                if let Some(w) = self.usable_group(&s, key) {
                    s.cursor = i + 1;
                    return Ok(self.placement(&s, w, key, "best_effort"));
                }
            }
        }
        let _ = s.dispatcher.complete(id);
        Err(ApiError::NoCapacity("no live GPU can take the request".into()))
    }

    /// Returns a request's bandwidth (completion, failure or cancellation).
    pub fn complete(&self, id: u64) {
        let _ = self.state.lock().unwrap().dispatcher.complete(id);
    }

    /// A request on `key` failed with `worker_died`: its GPUs take no new
    /// requests for at least a window, and the loop re-plans now.
    pub fn report_dead_group(&self, key: GroupKey) {
        let until = Instant::now() + self.window;
        {
            let mut s = self.state.lock().unwrap();
            for g in key.0..key.0 + key.1 {
                s.usable[g as usize] = false;
                s.suspect_until[g as usize] = Some(until);
            }
        }
        self.wake.notify_one();
    }

    /// A worker's connection failed under a request: re-plan now.
    pub fn report_lost_worker(&self) {
        self.wake.notify_one();
    }

    /// The current plan as JSON (`/v1/plan`), with the GPUs that are down and
    /// each worker's connection and applied plan.
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
        let down: Vec<usize> = (0..s.usable.len()).filter(|&g| !s.usable[g]).collect();
        let workers: Vec<_> = self
            .workers
            .iter()
            .enumerate()
            .map(|(i, w)| {
                json!({
                    "endpoint": w.name(),
                    "connected": w.is_alive(),
                    "first_gpu": self.first_gpu[i],
                    "gpus": self.node_sizes[i],
                    "applied_plan_id": s.workers[i].applied,
                    "rejected_plan_id": s.workers[i].rejected,
                })
            })
            .collect();
        json!({
            "plan_id": s.plan_id,
            "num_gpus": s.plan.num_gpus,
            "groups": groups,
            "tier_capacity_rps": caps,
            "gpus_down": down,
            "planner_note": s.planner_note,
            "workers": workers,
        })
    }

    /// TP size of each GPU's group, 0 for GPUs in none (`/metrics`).
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

    /// Whether each GPU takes requests now (`/metrics`).
    pub fn gpu_up(&self) -> Vec<bool> {
        self.state.lock().unwrap().usable.clone()
    }

    /// Each worker's share of a plan, in its local device indices.
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

    /// Asks every connected worker for its `stats` (concurrently, each
    /// bounded by the stats timeout); `None` for a worker that is
    /// disconnected or did not answer.
    async fn poll(&self) -> Vec<Option<StatsReply>> {
        let polls = self.workers.iter().map(|w| async move {
            if !w.is_alive() {
                return None;
            }
            match tokio::time::timeout(self.stats_timeout, w.stats()).await {
                Ok(Ok(r)) => Some(r),
                Ok(Err(e)) => {
                    log::warn!("worker {}: stats failed: {e}", w.name());
                    None
                }
                Err(_) => {
                    log::warn!(
                        "worker {}: no stats within {} s; its GPUs are out of the plan until it answers",
                        w.name(),
                        self.stats_timeout.as_secs_f64()
                    );
                    None
                }
            }
        });
        futures_util::future::join_all(polls).await
    }

    /// Folds the workers' replies into GPU health.
    fn update_health(&self, s: &mut State, replies: &[Option<StatsReply>], now: Instant) {
        for (w, reply) in replies.iter().enumerate() {
            s.workers[w].connected = reply.is_some();
            let gpus = self.gpus_of_worker(w);
            let base = gpus.start;
            for g in gpus {
                s.reported_up[g] = match reply {
                    // A device the agent does not list is not known to be down.
                    Some(r) => r
                        .devices
                        .iter()
                        .find(|d| d.device as usize == g - base)
                        .is_none_or(|d| d.is_ready()),
                    None => false,
                };
            }
            if let Some(r) = reply {
                s.workers[w].applied = r.plan_id;
            }
        }
        for g in 0..s.usable.len() {
            if s.suspect_until[g].is_some_and(|t| now >= t) {
                s.suspect_until[g] = None;
            }
            s.usable[g] = s.reported_up[g] && s.suspect_until[g].is_none();
        }
    }

    /// A new planner over the usable GPUs (after a health change).
    fn rebuild_planner(&self, s: &mut State) {
        s.planned_up = s.usable.clone();
        let down: Vec<usize> = (0..s.usable.len()).filter(|&g| !s.usable[g]).collect();
        s.planner = None;
        s.planner_note = None;
        match LiveView::new(&self.node_sizes, &s.usable) {
            None => s.planner_note = Some("no GPU is up (workers disconnected or their devices dead)".into()),
            Some(view) => match Planner::new(
                self.profile.clone(),
                self.tiers.clone(),
                view.cluster.clone(),
                self.planner_config.clone(),
            ) {
                Ok(p) => s.planner = Some((p, view)),
                Err(e) => s.planner_note = Some(format!("cannot plan over the live GPUs (down: {down:?}): {e}")),
            },
        }
        if let Some(note) = &s.planner_note {
            log::warn!("{note}");
        } else {
            log::info!("GPUs down: {down:?}; planning over the others");
        }
    }

    /// Commits `plan` (global numbering) as a new plan id.
    fn commit(&self, s: &mut State, plan: Plan) {
        s.dispatcher.set_plan(&self.tiers, &plan);
        s.plan = plan;
        s.plan_id += 1;
        self.metrics.plan_changes.fetch_add(1, Ordering::Relaxed);
    }

    /// One control window: poll health, re-plan (over the live GPUs), and
    /// send the current plan to each worker that does not run it yet.
    pub async fn step(&self) {
        let replies = self.poll().await;
        let (plan_id, per_worker, targets) = {
            let mut s = self.state.lock().unwrap();
            let now = Instant::now();
            self.update_health(&mut s, &replies, now);
            let rebuilt = s.usable != s.planned_up;
            if rebuilt {
                self.rebuild_planner(&mut s);
            }
            let stats = s.observer.snapshot(self.start.elapsed().as_secs_f64());
            let outcome = match &mut s.planner {
                Some((planner, view)) => match planner.step(&stats) {
                    Ok(o) => Some((o.changed || rebuilt, view.to_physical_plan(o.plan, self.num_gpus))),
                    Err(e) => {
                        log::warn!("planner step failed: {e}");
                        None
                    }
                },
                None => rebuilt.then(|| (true, no_groups(self.num_gpus, self.tiers.len()))),
            };
            if let Some((true, plan)) = outcome {
                self.commit(&mut s, plan);
            }
            let plan_id = s.plan_id;
            let targets: Vec<usize> = (0..self.workers.len())
                .filter(|&w| {
                    let wp = s.workers[w];
                    wp.connected && wp.applied != Some(plan_id) && wp.rejected != Some(plan_id)
                })
                .collect();
            (plan_id, self.device_plans(&s.plan), targets)
        };
        self.send_plan(plan_id, per_worker, &targets).await;
    }

    /// Sends plan `plan_id` to the `targets` workers, each its share, and
    /// waits (bounded) for their answers.
    async fn send_plan(&self, plan_id: u64, mut per_worker: Vec<Vec<DevicePlan>>, targets: &[usize]) {
        let sends = targets.iter().map(|&w| {
            let devices = std::mem::take(&mut per_worker[w]);
            let client = self.workers[w].clone();
            async move {
                let answer = tokio::time::timeout(self.stats_timeout, client.apply_plan(plan_id, devices)).await;
                (w, answer)
            }
        });
        for (w, answer) in futures_util::future::join_all(sends).await {
            let name = self.workers[w].name();
            let mut s = self.state.lock().unwrap();
            match answer {
                Ok(Ok(r)) if r.ok => {
                    s.workers[w].applied = Some(plan_id);
                    self.metrics.switch.observe(r.switch_ms / 1e3);
                }
                Ok(Ok(r)) => {
                    log::warn!("worker {name} rejected plan {plan_id}: {}", r.reason.unwrap_or_default());
                    s.workers[w].rejected = Some(plan_id);
                }
                Ok(Err(e)) => log::warn!("plan {plan_id}: {e}"),
                Err(_) => log::warn!("worker {name} did not answer plan {plan_id} in time; sent again next window"),
            }
        }
    }

    /// The control task: a step every window, and at once when woken by a
    /// failure report.
    pub async fn run_loop(self: Arc<Self>) {
        let mut tick = tokio::time::interval(self.window);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = self.wake.notified() => {}
            }
            self.step().await;
        }
    }
}
