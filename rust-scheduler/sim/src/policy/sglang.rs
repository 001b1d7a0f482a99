//! SGLang baselines: replicas of one static TP level.
//! - `sglang`: colocated (chunked prefill), least-load dispatch, FCFS,
//!   SLO-agnostic;
//! - `sglang-slo`: the same plus the SLO-aware batch rule (the production
//!   batch policy's: a queued request past its TTFT deadline is shed, not
//!   run) — the paper's ablation step before per-tier scheduling;
//! - `sglang-pd`: fixed prefill and decode replicas, KV hand-off between
//!   them, least-load dispatch to each stage.

use serde_json::{json, Value};
use tiertp_scheduler::dispatcher::DispatchClass;
use tiertp_scheduler::plan::Role;

use super::{least_loaded, replicas, static_tp, Ctx, Policy, Route};
use crate::engine::{GroupSim, GroupSpec};
use crate::rejection::Rejection;

/// Default share of GPUs doing prefill in sglang-pd.
const DEFAULT_PREFILL_SHARE: f64 = 0.5;

pub struct Sglang {
    tp: u32,
    disaggregated: bool,
    slo_aware: bool,
    prefill_share: f64,
}

impl Sglang {
    pub fn new(ctx: &Ctx, disaggregated: bool) -> Result<Self, String> {
        let tp = static_tp(ctx)?;
        let groups = ctx.cluster.num_gpus() / tp;
        if disaggregated && groups < 2 {
            return Err(format!(
                "needs at least 2 replicas; {} GPUs at TP{tp} make {groups}",
                ctx.cluster.num_gpus()
            ));
        }
        Ok(Self {
            tp,
            disaggregated,
            slo_aware: false,
            prefill_share: ctx.settings.prefill_share.unwrap_or(DEFAULT_PREFILL_SHARE),
        })
    }
}

impl Sglang {
    pub fn slo_aware(ctx: &Ctx) -> Result<Self, String> {
        Ok(Self {
            slo_aware: true,
            ..Self::new(ctx, false)?
        })
    }
}

fn route_to(groups: &[GroupSim], i: Option<usize>) -> Route {
    i.map_or(Route::Reject(Rejection::NoGroup), |i| {
        Route::To(groups[i].spec.key(), DispatchClass::Feasible)
    })
}

impl Policy for Sglang {
    fn name(&self) -> &'static str {
        match (self.disaggregated, self.slo_aware) {
            (true, _) => "sglang-pd",
            (false, true) => "sglang-slo",
            (false, false) => "sglang",
        }
    }

    fn deadline_aware(&self) -> bool {
        self.slo_aware
    }

    fn describe(&self) -> Value {
        if self.disaggregated {
            json!({"tp": self.tp, "prefill_share": self.prefill_share})
        } else {
            json!({"tp": self.tp})
        }
    }

    fn initial(&mut self, ctx: &Ctx) -> Vec<GroupSpec> {
        let mut specs = replicas(ctx, self.tp);
        if self.disaggregated {
            let n = specs.len();
            let prefill = ((n as f64 * self.prefill_share).round() as usize).clamp(1, n - 1);
            for (k, s) in specs.iter_mut().enumerate() {
                s.role = if k < prefill { Role::Prefill } else { Role::Decode };
            }
        }
        specs
    }

    fn route(&mut self, _ctx: &Ctx, _i: u32, _now: f64, groups: &[GroupSim]) -> Route {
        route_to(
            groups,
            least_loaded(groups, |g| g.spec.role.takes_prefill(), |g| g.outstanding() as f64),
        )
    }

    fn route_decode(&mut self, _ctx: &Ctx, _i: u32, _now: f64, groups: &[GroupSim]) -> Option<Route> {
        if !self.disaggregated {
            return None;
        }
        Some(route_to(
            groups,
            least_loaded(groups, |g| g.spec.role == Role::Decode, |g| g.outstanding() as f64),
        ))
    }
}
