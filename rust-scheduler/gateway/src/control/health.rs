//! GPU health: a GPU is up when its agent is connected, answers `stats`,
//! and does not report the device's execution process dead or starting;
//! a request that fails with `worker_died` takes its group's GPUs out at
//! once (for at least one window, then the agent's word counts again) and
//! wakes the loop. When the set of up GPUs changes, the core plans over the
//! live ones only (`ControlLoop::set_up`), so plans never use a dead GPU,
//! and GPUs that come back are planned again.

use std::ops::Range;
use std::sync::atomic::Ordering;
use std::time::Instant;

use serde_json::{json, Value};
use tiertp_scheduler::plan::GroupKey;

use super::{Control, State};
use crate::protocol::StatsReply;

/// What the gateway knows of each GPU's health.
pub(super) struct GpuHealth {
    /// Per GPU: whether requests may be placed on it now.
    usable: Vec<bool>,
    /// Per GPU: what the agent said in its last `stats` (or lost connection).
    reported_up: Vec<bool>,
    /// Per GPU: out after a `worker_died` report until then.
    suspect_until: Vec<Option<Instant>>,
    /// The GPUs the core plans over.
    planned_up: Vec<bool>,
}

impl GpuHealth {
    /// Every GPU up.
    pub(super) fn new(num_gpus: usize) -> Self {
        Self {
            usable: vec![true; num_gpus],
            reported_up: vec![true; num_gpus],
            suspect_until: vec![None; num_gpus],
            planned_up: vec![true; num_gpus],
        }
    }

    pub(super) fn usable(&self) -> &[bool] {
        &self.usable
    }

    /// The GPUs of a failed group: out now, until `until` at least.
    fn suspect(&mut self, gpus: Range<u32>, until: Instant) {
        for g in gpus {
            self.usable[g as usize] = false;
            self.suspect_until[g as usize] = Some(until);
        }
    }

    /// Recomputes which GPUs are usable at `now`; the new up set when it
    /// differs from the one the core plans over.
    fn settle(&mut self, now: Instant) -> Option<Vec<bool>> {
        for g in 0..self.usable.len() {
            if self.suspect_until[g].is_some_and(|t| now >= t) {
                self.suspect_until[g] = None;
            }
            self.usable[g] = self.reported_up[g] && self.suspect_until[g].is_none();
        }
        (self.usable != self.planned_up).then(|| {
            self.planned_up = self.usable.clone();
            self.usable.clone()
        })
    }
}

/// The gateway's answer to `/health`.
#[derive(Debug, Clone, PartialEq)]
pub struct Health {
    pub workers_alive: usize,
    pub workers: usize,
    pub gpus_up: usize,
    pub gpus: usize,
}

impl Health {
    /// Serving: a connected worker with a GPU up.
    pub fn is_ok(&self) -> bool {
        self.workers_alive > 0 && self.gpus_up > 0
    }

    pub fn json(&self) -> Value {
        json!({
            "status": if self.is_ok() { "ok" } else { "no_capacity" },
            "workers_alive": self.workers_alive,
            "workers": self.workers,
            "gpus_up": self.gpus_up,
            "gpus": self.gpus,
        })
    }
}

impl Control {
    /// Whether a group's GPUs can take a request now.
    pub(super) fn group_usable(&self, s: &State, key: GroupKey) -> bool {
        let usable = s.health.usable();
        (key.0..key.0 + key.1).all(|g| usable[g as usize]) && self.workers[self.nodes.worker_of(key.0)].is_alive()
    }

    /// A request on `key` failed with `worker_died`: its GPUs take no new
    /// requests for at least a window, and the loop re-plans now.
    pub fn report_dead_group(&self, key: GroupKey) {
        let until = Instant::now() + self.window;
        self.state.lock().unwrap().health.suspect(key.0..key.0 + key.1, until);
        self.wake.notify_one();
    }

    /// A worker's connection failed under a request: re-plan now.
    pub fn report_lost_worker(&self) {
        self.wake.notify_one();
    }

    /// Whether each GPU takes requests now (`/metrics`).
    pub fn gpu_up(&self) -> Vec<bool> {
        self.state.lock().unwrap().health.usable().to_vec()
    }

    pub fn health(&self) -> Health {
        let up = self.gpu_up();
        Health {
            workers_alive: self.workers.iter().filter(|w| w.is_alive()).count(),
            workers: self.workers.len(),
            gpus_up: up.iter().filter(|&&u| u).count(),
            gpus: up.len(),
        }
    }

    /// The model's context length, once an agent has reported it.
    pub fn max_model_len(&self) -> Option<u32> {
        Some(self.max_model_len.load(Ordering::Relaxed)).filter(|&n| n > 0)
    }

    /// Asks every connected worker for its `stats` (concurrently, each
    /// bounded by the stats timeout); `None` for a worker that is
    /// disconnected or did not answer.
    pub(super) async fn poll(&self) -> Vec<Option<StatsReply>> {
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
                        "worker {}: no stats within {} s (busy, or holding another control-plane key: an agent \
                         answers nothing it cannot open); its GPUs are out of the plan until it answers",
                        w.name(),
                        self.stats_timeout.as_secs_f64()
                    );
                    None
                }
            }
        });
        futures_util::future::join_all(polls).await
    }

    /// Folds the workers' replies into GPU health and their plan state;
    /// when the GPUs up changed, the core plans over the new set.
    pub(super) fn update_health(&self, s: &mut State, replies: &[Option<StatsReply>], now: Instant) {
        for (w, reply) in replies.iter().enumerate() {
            s.workers[w].connected = reply.is_some();
            let gpus = self.nodes.gpus_of(w);
            let base = gpus.start;
            for g in gpus {
                s.health.reported_up[g] = match reply {
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
        // The smallest reported: a request must fit wherever it is placed.
        // Kept while no agent answers, so the check does not lapse then.
        if let Some(len) = replies.iter().flatten().filter_map(|r| r.max_model_len).min() {
            self.max_model_len.store(len, Ordering::Relaxed);
        }
        if let Some(up) = s.health.settle(now) {
            s.control.set_up(&up);
            let down: Vec<usize> = (0..up.len()).filter(|&g| !up[g]).collect();
            match s.control.planner_note() {
                Some(note) => log::warn!("{note}"),
                None if down.is_empty() => log::info!("every GPU is up; planning over all {}", up.len()),
                None => log::info!("GPUs down: {down:?}; planning over the others"),
            }
        }
    }
}
