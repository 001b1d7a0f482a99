//! The gateway's side of the control loop: I/O around the core's
//! `ControlLoop`, which decides everything (plan, commit, admission,
//! dispatch, hand-offs, shedding). No policy rule lives here; one file per
//! concern:
//!
//! - `placement`: a request's admission and dispatch, over the groups up;
//! - `handoff`: carrying out the core's prefill -> decode hand-offs;
//! - `health`: which GPUs are up (agents' `stats`, failure reports);
//! - `plans`: pushing each plan to the agents;
//! - `status`: `/v1/plan` and `/metrics` views;
//! - `nodes`: global GPU numbering vs each worker's own.
//!
//! This file: the shared state, the wall clock and the window loop.

mod handoff;
mod health;
mod nodes;
mod placement;
mod plans;
mod status;

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tiertp_scheduler::control::{ControlConfig as CoreConfig, ControlLoop};
use tiertp_scheduler::planner::PlannerConfig;
use tiertp_scheduler::profile::Profile;
use tiertp_scheduler::tiers::TierSet;
use tiertp_scheduler::topology::Cluster;
use tokio::sync::Notify;

pub use self::handoff::Prefilled;
use self::handoff::{Holders, Order};
use self::health::GpuHealth;
pub use self::health::Health;
use self::nodes::Nodes;
pub use self::placement::Placement;
use self::plans::WorkerPlan;
use crate::metrics::Metrics;
use crate::worker::WorkerClient;

/// What the control loop's lock guards.
struct State {
    control: ControlLoop,
    health: GpuHealth,
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
    /// The workers are the cluster's nodes.
    nodes: Nodes,
    window: Duration,
    stats_timeout: Duration,
    state: Mutex<State>,
    next_id: AtomicU64,
    /// Asks the loop for a step now (a GPU or worker failed).
    wake: Notify,
    /// The model's context length as the agents report it (0: unknown).
    max_model_len: AtomicU32,
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
        let cluster = Cluster::new(gpus.to_vec()).map_err(|e| e.to_string())?;
        let core = CoreConfig {
            planner: config.planner,
            window_s: config.window.as_secs_f64(),
            ..CoreConfig::default()
        };
        let control = ControlLoop::new(profile, tiers.clone(), cluster, core).map_err(|e| e.to_string())?;
        let nodes = Nodes::new(gpus);
        let start = Instant::now();
        Ok(Self {
            clock: Arc::new(move || start.elapsed().as_secs_f64()),
            state: Mutex::new(State {
                control,
                health: GpuHealth::new(nodes.num_gpus()),
                workers: vec![WorkerPlan::default(); workers.len()],
                holders: Holders::default(),
            }),
            tiers,
            workers,
            nodes,
            window: config.window,
            stats_timeout: config.stats_timeout,
            next_id: AtomicU64::new(1),
            wake: Notify::new(),
            max_model_len: AtomicU32::new(0),
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

    /// One control window: poll health, let the core plan (over the live
    /// GPUs), carry out the hand-offs it granted or shed meanwhile, and send
    /// the current plan to each worker that does not run it.
    pub async fn step(&self) {
        let replies = self.poll().await;
        let mut orders = Vec::new();
        let push = {
            let mut s = self.state.lock().unwrap();
            self.update_health(&mut s, &replies, Instant::now());
            self.window(&mut s, &mut orders);
            self.plan_push(&s)
        };
        self.execute(orders);
        self.send_plan(push).await;
    }

    /// The core's window: a new plan maybe (with the new groups of the
    /// requests whose groups it stops), and the hand-off waits it let go.
    fn window(&self, s: &mut State, orders: &mut Vec<Order>) {
        let before = s.control.plan_id();
        let now = self.now_s();
        let released = match s.control.window(now, None) {
            Ok(outcome) => {
                for (id, d) in outcome.settled {
                    s.holders.settled(id, d.key());
                }
                outcome.released
            }
            Err(e) => {
                log::warn!("planner step failed: {e}");
                s.control.take_released(now)
            }
        };
        s.holders.released(released, orders);
        if s.control.plan_id() != before {
            self.metrics.plan_changes.fetch_add(1, Ordering::Relaxed);
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
