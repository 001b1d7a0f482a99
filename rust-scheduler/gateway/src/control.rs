//! The gateway's side of the control loop: I/O around the core's
//! `ControlLoop`, which decides everything (plan, commit, admission,
//! dispatch, hand-offs, shedding). Here: the wall clock, the workers' health,
//! the mapping of GPUs to workers, pushing plans to the agents, and carrying
//! out the core's hand-off decisions (`crate::handoff`).
//!
//! GPU health: a GPU is up when its agent is connected, answers `stats`,
//! and does not report the device's execution process dead or starting;
//! a request that fails with `worker_died` takes its group's GPUs out at
//! once (for at least one window, then the agent's word counts again) and
//! wakes the loop. When the set of up GPUs changes, the core plans over the
//! live ones only (`ControlLoop::set_up`), so plans never use a dead GPU,
//! and GPUs that come back are planned again.
//!
//! Hand-offs: when a request's first token arrives (`first_token`) the core
//! says stay, move to a decode group, or wait for a decode slot. A move is
//! sent at once to the agent holding the request (`hand_off`, naming the
//! group in the agent's numbering); a waiting request keeps decoding where
//! it is until the core grants it a slot (then it is moved the same way) or
//! sheds it (then it is cancelled at its agent and its client gets 503
//! `overloaded` with Retry-After). Grants and sheds are collected
//! (`take_released`) whenever a request completes and every window.
//! An agent moves KV within its node only; the core moves a request only
//! to a decode group on its node (one node per agent).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;
use tiertp_scheduler::control::{Admission, ControlConfig as CoreConfig, ControlLoop, ShedReason};
pub use tiertp_scheduler::plan::GroupKey;
use tiertp_scheduler::plan::Plan;
use tiertp_scheduler::planner::PlannerConfig;
use tiertp_scheduler::profile::Profile;
use tiertp_scheduler::tiers::{TierId, TierSet};
use tiertp_scheduler::topology::Cluster;
use tokio::sync::Notify;

use crate::error::ApiError;
pub use crate::handoff::Prefilled;
use crate::handoff::{Holders, Order};
use crate::metrics::Metrics;
use crate::protocol::{DevicePlan, StatsReply};
use crate::worker::WorkerClient;

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
    control: ControlLoop,
    /// Per GPU: whether requests may be placed on it now.
    usable: Vec<bool>,
    /// Per GPU: what the agent said in its last `stats` (or lost connection).
    reported_up: Vec<bool>,
    /// Per GPU: out after a `worker_died` report until then.
    suspect_until: Vec<Option<Instant>>,
    /// The GPUs the core plans over.
    planned_up: Vec<bool>,
    workers: Vec<WorkerPlan>,
    /// Where each placed request runs, for the core's hand-off decisions.
    holders: Holders,
}

/// The control loop's clock: seconds on a monotonic scale.
pub type Clock = Arc<dyn Fn() -> f64 + Send + Sync>;

pub struct Control {
    tiers: TierSet,
    clock: Clock,
    pub workers: Vec<Arc<dyn WorkerClient>>,
    /// First global GPU and GPU count of each worker (workers are the
    /// cluster's nodes).
    first_gpu: Vec<u32>,
    node_sizes: Vec<u32>,
    window: Duration,
    stats_timeout: Duration,
    state: Mutex<State>,
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
    pub stats_timeout: Duration,
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
        let cluster = Cluster::new(gpus.to_vec()).map_err(|e| e.to_string())?;
        let core = CoreConfig {
            planner: config.planner,
            window_s: config.window.as_secs_f64(),
            ..CoreConfig::default()
        };
        let control = ControlLoop::new(profile, tiers.clone(), cluster, core).map_err(|e| e.to_string())?;
        let mut first_gpu = Vec::with_capacity(gpus.len());
        let mut next = 0;
        for g in gpus {
            first_gpu.push(next);
            next += g;
        }
        let all_up = vec![true; num_gpus as usize];
        let start = Instant::now();
        Ok(Self {
            clock: Arc::new(move || start.elapsed().as_secs_f64()),
            state: Mutex::new(State {
                control,
                usable: all_up.clone(),
                reported_up: all_up.clone(),
                suspect_until: vec![None; num_gpus as usize],
                planned_up: all_up,
                workers: vec![WorkerPlan::default(); workers.len()],
                holders: Holders::default(),
            }),
            tiers,
            workers,
            first_gpu,
            node_sizes: gpus.to_vec(),
            window: config.window,
            stats_timeout: config.stats_timeout,
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

    /// Replaces the wall clock (seconds since start) with another, e.g. a
    /// virtual one that replays a simulated run.
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// The control loop's clock.
    fn now_s(&self) -> f64 {
        (self.clock)()
    }

    /// Seconds from now by which a request that arrived at `arrival` must
    /// start prefilling to meet its TTFT (the core's deadline); `None` for
    /// a tier without one.
    pub fn start_within_s(&self, tier: TierId, arrival: Instant) -> Option<f64> {
        // The core's deadline, counted from the arrival.
        let from_arrival = self.tiers.tiers()[tier].ttft_deadline(0.0);
        from_arrival
            .is_finite()
            .then(|| (from_arrival - arrival.elapsed().as_secs_f64()).max(0.0))
    }

    fn worker_of_gpu(&self, gpu: u32) -> usize {
        self.first_gpu.partition_point(|&f| f <= gpu).saturating_sub(1)
    }

    fn gpus_of_worker(&self, w: usize) -> std::ops::Range<usize> {
        let first = self.first_gpu[w] as usize;
        first..first + self.node_sizes[w] as usize
    }

    /// Whether a group's GPUs can take a request now.
    fn group_usable(&self, s: &State, key: GroupKey) -> bool {
        let w = self.worker_of_gpu(key.0);
        (key.0..key.0 + key.1).all(|g| s.usable[g as usize]) && self.workers[w].is_alive()
    }

    /// Places a request (the core's admission and dispatch), never on a
    /// group that is down or was already tried (`exclude`). `first` says it
    /// is a new arrival (recorded for the planner); later attempts follow a
    /// failure. A shed request gets 503: `overloaded` with Retry-After (its
    /// tier is at its SLO capacity: the server's limit, not the client's
    /// rate, so not 429) or `no_capacity` (no live group can take it).
    pub fn place(
        &self,
        id: u64,
        tier: TierId,
        prompt_tokens: u32,
        max_tokens: u32,
        exclude: &[GroupKey],
        first: bool,
    ) -> Result<Placement, ApiError> {
        let mut s = self.state.lock().unwrap();
        let mut down: Vec<GroupKey> = s
            .control
            .plan()
            .groups
            .iter()
            .map(|g| g.key())
            .filter(|&k| !self.group_usable(&s, k))
            .collect();
        down.extend_from_slice(exclude);
        let now = self.now_s();
        let admission = if first {
            s.control.admit(id, tier, prompt_tokens, max_tokens, now, &down)
        } else {
            s.control.readmit(id, tier, prompt_tokens, &down)
        };
        match admission.map_err(|e| ApiError::Internal(e.to_string()))? {
            Admission::Admitted(d) => {
                let key = d.key();
                s.holders.placed(id, key, tier);
                let w = self.worker_of_gpu(key.0);
                let runs_plan = s.workers[w].applied == Some(s.control.plan_id());
                Ok(Placement {
                    worker: w,
                    key,
                    group: runs_plan.then_some((key.0 - self.first_gpu[w], key.1)),
                    class: d.class.name(),
                })
            }
            Admission::Shed { reason, retry_after_s } => {
                self.metrics.tiers[tier].shed.fetch_add(1, Ordering::Relaxed);
                let retry = retry_after_s.ceil().max(1.0) as u64;
                let all_down = s.control.plan().groups.iter().all(|g| down.contains(&g.key()));
                Err(match (reason, s.control.planner_note()) {
                    // No GPU to plan over, or none up: not a matter of load.
                    (ShedReason::NoCapacity, Some(note)) => ApiError::NoCapacity(note.to_string()),
                    (ShedReason::NoCapacity, None) if all_down => ApiError::NoCapacity("no live GPU can take the request".into()),
                    _ => ApiError::Overloaded {
                        message: format!(
                            "tier {:?} is at its SLO capacity ({}); retry after {retry} s",
                            self.tiers.tiers()[tier].name,
                            reason.name()
                        ),
                        retry_after_s: retry,
                    },
                })
            }
        }
    }

    /// A request's first token arrived: its prompt charge comes back and the
    /// core decides its hand-off, which is carried out here (a move is sent
    /// to its agent now; see `Prefilled` for a wait); `None` for a request
    /// the loop does not hold.
    pub fn first_token(&self, id: u64) -> Option<Prefilled> {
        let now = self.now_s();
        let mut orders = Vec::new();
        let prefilled = {
            let mut s = self.state.lock().unwrap();
            let handoff = s.control.first_token(id, now).ok()?;
            s.holders.prefilled(id, handoff, &mut orders)
        };
        self.execute(orders);
        Some(prefilled)
    }

    /// The request ended (completion, failure or cancellation), or failed
    /// before its first token to be placed again: what it held comes back,
    /// and the hand-offs that were waiting for it are granted (or shed, if
    /// their wait ran out meanwhile).
    pub fn complete(&self, id: u64) {
        let now = self.now_s();
        let mut orders = Vec::new();
        {
            let mut s = self.state.lock().unwrap();
            s.control.finish(id, now);
            s.holders.ended(id);
            let released = s.control.take_released(now);
            s.holders.released(released, &mut orders);
        }
        self.execute(orders);
    }

    /// Carries out the core's hand-off orders: a move goes to the agent
    /// holding the request, in that agent's device numbering; a shed request
    /// is cancelled there after its client has been given the error (so its
    /// stream reports the shed, not a closed channel).
    fn execute(&self, orders: Vec<Order>) {
        for order in orders {
            match order {
                Order::Move { id, from, to } => {
                    let w = self.worker_of_gpu(from.0);
                    if self.worker_of_gpu(to.0) != w {
                        // The core's nodes are the agents: never happens.
                        log::error!("request {id}: a move from group {from:?} to {to:?} on another agent; it decodes where it is");
                        continue;
                    }
                    self.workers[w].hand_off(id, (to.0 - self.first_gpu[w], to.1));
                }
                Order::Shed { id, at, tier, notify } => {
                    self.metrics.tiers[tier].shed.fetch_add(1, Ordering::Relaxed);
                    if let Some(n) = notify {
                        let _ = n.send(self.handoff_shed_error(tier));
                    }
                    self.workers[self.worker_of_gpu(at.0)].cancel(id);
                }
            }
        }
    }

    /// What the client of a request shed while waiting for a decode slot gets:
    /// like an admission shed, 503 `overloaded`, worth retrying after the
    /// next plan.
    fn handoff_shed_error(&self, tier: TierId) -> ApiError {
        let retry = self.window.as_secs_f64().ceil().max(1.0) as u64;
        ApiError::Overloaded {
            message: format!(
                "tier {:?} is at its SLO capacity ({}): no decode slot came free within its TPOT budget; retry after {retry} s",
                self.tiers.tiers()[tier].name,
                ShedReason::HandoffTimeout.name()
            ),
            retry_after_s: retry,
        }
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
        let plan = s.control.plan();
        let groups: Vec<_> = plan
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
            .zip(&plan.tier_capacity_rps)
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
            "plan_id": s.control.plan_id(),
            "num_gpus": plan.num_gpus,
            "groups": groups,
            "tier_capacity_rps": caps,
            "gpus_down": down,
            "planner_note": s.control.planner_note(),
            "workers": workers,
        })
    }

    /// TP size of each GPU's group, 0 for GPUs in none (`/metrics`).
    pub fn tp_per_gpu(&self) -> Vec<u32> {
        let s = self.state.lock().unwrap();
        let plan = s.control.plan();
        let mut out = vec![0; plan.num_gpus as usize];
        for g in &plan.groups {
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

    /// One control window: poll health, let the core plan (over the live
    /// GPUs), carry out the hand-offs it granted or shed meanwhile, and send
    /// the current plan to each worker that does not run it.
    pub async fn step(&self) {
        let replies = self.poll().await;
        let mut orders = Vec::new();
        let (plan_id, per_worker, targets) = {
            let mut s = self.state.lock().unwrap();
            self.update_health(&mut s, &replies, Instant::now());
            if s.usable != s.planned_up {
                s.planned_up = s.usable.clone();
                let up = s.usable.clone();
                s.control.set_up(&up);
                let down: Vec<usize> = (0..up.len()).filter(|&g| !up[g]).collect();
                match s.control.planner_note() {
                    Some(note) => log::warn!("{note}"),
                    None => log::info!("GPUs down: {down:?}; planning over the others"),
                }
            }
            let before = s.control.plan_id();
            let now = self.now_s();
            let released = match s.control.window(now, None) {
                Ok(outcome) => outcome.released,
                Err(e) => {
                    log::warn!("planner step failed: {e}");
                    s.control.take_released(now)
                }
            };
            s.holders.released(released, &mut orders);
            if s.control.plan_id() != before {
                self.metrics.plan_changes.fetch_add(1, Ordering::Relaxed);
            }
            let plan_id = s.control.plan_id();
            let targets: Vec<usize> = (0..self.workers.len())
                .filter(|&w| {
                    let wp = s.workers[w];
                    wp.connected && wp.applied != Some(plan_id) && wp.rejected != Some(plan_id)
                })
                .collect();
            (plan_id, self.device_plans(s.control.plan()), targets)
        };
        self.execute(orders);
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
