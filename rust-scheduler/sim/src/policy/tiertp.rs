//! tiertp and its ablations: the production Planner (every window) and
//! Dispatcher (every request) drive the cluster; groups run the production
//! BatchPolicy inside the engine model.

use std::sync::Arc;

use serde_json::{json, Value};
use tiertp_scheduler::dispatcher::{DispatchClass, Dispatcher};
use tiertp_scheduler::plan::Plan;
use tiertp_scheduler::planner::{Planner, PlannerConfig};
use tiertp_scheduler::stats::TierStats;

use super::{throughput_caps, Ctx, Policy, Route};
use crate::engine::{GroupSim, GroupSpec};
use crate::settings::{SimSettings, NAIVE_SWITCH_MS};

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Variant {
    Full,
    NoFairness,
    StaticTp,
    NaiveSwitch,
    Oracle,
}

pub struct Tiertp {
    variant: Variant,
    planner: Planner,
    dispatcher: Dispatcher,
}

impl Tiertp {
    pub fn new(ctx: &Ctx, variant: Variant) -> Result<Self, String> {
        let mut config = PlannerConfig::default();
        match variant {
            Variant::NoFairness => config.fairness_weighting = false,
            Variant::StaticTp => config.tp_levels = vec![super::static_tp(ctx)?],
            _ => {}
        }
        let planner = Planner::new(Arc::clone(ctx.profile), ctx.tiers.clone(), ctx.cluster.clone(), config).map_err(|e| e.to_string())?;
        let empty = Plan {
            num_gpus: ctx.cluster.num_gpus(),
            groups: Vec::new(),
            tier_capacity_rps: vec![0.0; ctx.tiers.len()],
        };
        Ok(Self {
            variant,
            dispatcher: Dispatcher::new(ctx.tiers, &empty),
            planner,
        })
    }

    fn specs(&self, ctx: &Ctx, plan: &Plan) -> Vec<GroupSpec> {
        plan.groups
            .iter()
            .map(|g| {
                // A group that cannot meet its tier's SLO runs best effort at
                // full throughput rather than with an SLO-sized batch.
                let (batch_cap, token_cap) = if g.capacity_rps > 0.0 {
                    (g.batch_cap, g.token_cap)
                } else {
                    throughput_caps(ctx.profile, g.tp)
                };
                GroupSpec {
                    first_gpu: g.first_gpu,
                    tp: g.tp,
                    role: g.role,
                    tier: Some(g.tier),
                    batch_cap,
                    token_cap,
                }
            })
            .collect()
    }

    fn commit(&mut self, ctx: &Ctx, stats: &[TierStats]) -> Option<Vec<GroupSpec>> {
        let out = self.planner.step(stats).ok()?;
        self.dispatcher.set_plan(ctx.tiers, &out.plan);
        // Caps follow the stats every window; GPUs move only on a change.
        Some(self.specs(ctx, &out.plan))
    }

    fn decision(d: tiertp_scheduler::dispatcher::Decision) -> Route {
        Route::To((d.group_first_gpu, d.tp), d.class)
    }
}

impl Policy for Tiertp {
    fn name(&self) -> &'static str {
        match self.variant {
            Variant::Full => "tiertp",
            Variant::NoFairness => "tiertp-no-fairness",
            Variant::StaticTp => "tiertp-static-tp",
            Variant::NaiveSwitch => "tiertp-naive-switch",
            Variant::Oracle => "oracle",
        }
    }

    fn describe(&self) -> Value {
        json!({"tp_levels": self.planner.tp_levels()})
    }

    fn deadline_aware(&self) -> bool {
        true
    }

    fn switch_ms(&self, settings: &SimSettings) -> f64 {
        match self.variant {
            Variant::NaiveSwitch => NAIVE_SWITCH_MS,
            Variant::Oracle => 0.0,
            _ => settings.switch_ms,
        }
    }

    fn initial(&mut self, ctx: &Ctx) -> Vec<GroupSpec> {
        // Nothing observed yet: the trace's mean lengths with no load spread
        // the GPUs over the tiers; the oracle already knows window 0.
        let stats: Vec<TierStats> = ctx.trace_stats.iter().map(|s| TierStats { arrival_rate: 0.0, ..*s }).collect();
        self.commit(ctx, &stats).unwrap_or_default()
    }

    fn on_window(
        &mut self,
        ctx: &Ctx,
        _now: f64,
        observed: &[TierStats],
        future: &[TierStats],
        _groups: &[GroupSim],
    ) -> Option<Vec<GroupSpec>> {
        let stats = if self.variant == Variant::Oracle { future } else { observed };
        self.commit(ctx, stats)
    }

    fn route(&mut self, ctx: &Ctx, i: u32, _groups: &[GroupSim]) -> Route {
        let r = &ctx.reqs[i as usize];
        if self.dispatcher.is_in_flight(u64::from(i)) {
            let _ = self.dispatcher.complete(u64::from(i));
        }
        match self.dispatcher.dispatch(u64::from(i), r.tier, r.prompt_tokens) {
            Ok(d) => Self::decision(d),
            Err(_) => Route::Reject,
        }
    }

    fn route_decode(&mut self, ctx: &Ctx, i: u32, _groups: &[GroupSim]) -> Option<Route> {
        let r = &ctx.reqs[i as usize];
        match self.dispatcher.dispatch_decode(u64::from(i), r.tier) {
            Ok(d) if d.charge == 0 => None,
            Ok(d) => Some(Self::decision(d)),
            Err(_) => None,
        }
    }

    fn route_migrated(&mut self, ctx: &Ctx, i: u32, prefilled: bool, groups: &[GroupSim]) -> Route {
        let first = self.route(ctx, i, groups);
        if !prefilled || first == Route::Reject {
            return first;
        }
        match self.route_decode(ctx, i, groups) {
            Some(r) => r,
            None => match first {
                // Stays on the prefill-capable group it got (colocated).
                Route::To(key, _) => Route::To(key, DispatchClass::Feasible),
                Route::Reject => Route::Reject,
            },
        }
    }

    fn on_finish(&mut self, i: u32) {
        let _ = self.dispatcher.complete(u64::from(i));
    }
}
