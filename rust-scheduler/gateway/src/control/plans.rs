//! Pushing plans to the agents: each worker gets its share of the current
//! plan in its own device numbering, until it says it runs it
//! (`plan_applied`, or the plan id in its `stats`) or refuses it.

use tiertp_scheduler::plan::Plan;

use super::{Control, State};
use crate::protocol::{DevicePlan, PlanMove};

/// How far a worker is with the plans sent to it.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct WorkerPlan {
    /// The plan the agent last said it runs (`plan_applied` or `stats`).
    pub(super) applied: Option<u64>,
    /// A plan the agent refused: not sent again.
    pub(super) rejected: Option<u64>,
    pub(super) connected: bool,
}

/// A plan to send: each worker's share, and the workers to send it to.
pub(super) struct PlanPush {
    plan_id: u64,
    per_worker: Vec<Vec<DevicePlan>>,
    /// Where each agent's TP switches move the requests of the groups they
    /// stop (the core's `settled`), in its numbering.
    moves: Vec<Vec<PlanMove>>,
    targets: Vec<usize>,
}

impl Control {
    /// The current plan for every connected worker that neither runs nor
    /// refused it.
    pub(super) fn plan_push(&self, s: &State) -> PlanPush {
        let plan_id = s.control.plan_id();
        let targets = (0..self.workers.len())
            .filter(|&w| {
                let wp = s.workers[w];
                wp.connected && wp.applied != Some(plan_id) && wp.rejected != Some(plan_id)
            })
            .collect();
        let mut moves = vec![Vec::new(); self.workers.len()];
        for (id, key) in s.holders.moves() {
            let w = self.nodes.worker_of(key.0);
            moves[w].push(PlanMove {
                id,
                tp_group: self.nodes.local(w, key),
            });
        }
        PlanPush {
            plan_id,
            per_worker: self.device_plans(s.control.plan()),
            moves,
            targets,
        }
    }

    /// Each worker's share of a plan, in its local device indices.
    fn device_plans(&self, plan: &Plan) -> Vec<Vec<DevicePlan>> {
        let mut out = vec![Vec::new(); self.workers.len()];
        for g in &plan.groups {
            let w = self.nodes.worker_of(g.first_gpu);
            let base = self.nodes.first_gpu(w);
            for gpu in g.gpus() {
                out[w].push(DevicePlan {
                    device: gpu - base,
                    role: g.role.name().to_string(),
                    tier: self.tiers.tiers()[g.tier].name.clone(),
                    tp_group: self.nodes.local(w, g.key()),
                    batch_cap: g.batch_cap,
                    token_cap: g.token_cap,
                });
            }
        }
        out
    }

    /// Sends the plan to its targets, each its share, and waits (bounded)
    /// for their answers.
    pub(super) async fn send_plan(&self, push: PlanPush) {
        let PlanPush {
            plan_id,
            mut per_worker,
            mut moves,
            targets,
        } = push;
        let sends = targets.iter().map(|&w| {
            let devices = std::mem::take(&mut per_worker[w]);
            let moves = std::mem::take(&mut moves[w]);
            let client = self.workers[w].clone();
            async move {
                let answer = tokio::time::timeout(self.stats_timeout, client.apply_plan(plan_id, devices, moves)).await;
                (w, answer)
            }
        });
        for (w, answer) in futures_util::future::join_all(sends).await {
            let name = self.workers[w].name();
            let mut s = self.state.lock().unwrap();
            match answer {
                Ok(Ok(r)) if r.ok => {
                    s.workers[w].applied = Some(plan_id);
                    s.holders.moves_applied(|key| self.nodes.worker_of(key.0) == w);
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
}
