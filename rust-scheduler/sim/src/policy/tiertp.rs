//! tiertp, its ablations, the oracle and `split`: the production control
//! loop (`tiertp_scheduler::control::ControlLoop`) decides everything
//! (plans, commits, admission, dispatch, hand-offs, shedding); this file
//! only turns its answers into simulator routes. Groups run the production
//! `BatchPolicy` inside the engine model. `split` is the same loop with its
//! plan fixed to static per-tier partitions (see `split.rs`).

use std::sync::Arc;

use rustc_hash::FxHashMap;
use serde_json::{json, Value};
use tiertp_scheduler::control::{Admission, ControlConfig, ControlLoop, Handoff, Released, ShedReason};
use tiertp_scheduler::dispatcher::Decision;
use tiertp_scheduler::plan::Plan;
use tiertp_scheduler::stats::TierStats;
use tiertp_scheduler::switch_cost::SwitchCost;

use super::{Ctx, Policy, Route};
use crate::engine::{GroupSim, GroupSpec};
use crate::rejection::Rejection;
use crate::settings::NAIVE_SWITCH_MS;

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Variant {
    Full,
    NoFairness,
    StaticTp,
    NaiveSwitch,
    Oracle,
    Split,
}

pub struct Tiertp {
    variant: Variant,
    control: ControlLoop,
    switch: SwitchCost,
    /// Reported settings beyond the loop's own (split's partitions).
    layout: Value,
    /// Hand-offs granted and waiters shed by the last window step, placed
    /// with the next `take_released` (the gateway hands a window's to its
    /// holders the same way).
    window_released: Released,
    /// Where the loop moved each request of a group a plan change stopped
    /// (`WindowOutcome::settled`), until the group hands it over.
    settled: FxHashMap<u64, Decision>,
}

/// The control loop's settings for a simulated run of `variant`: the
/// production defaults, the run's window, and the switch mechanism the run
/// models (so the commit rule weighs the cost the simulator charges).
pub fn control_config(ctx: &Ctx, variant: Variant) -> Result<(ControlConfig, SwitchCost), String> {
    let mut config = ControlConfig {
        window_s: ctx.settings.window_s,
        memory_s: ctx.settings.demand_memory_s,
        ..ControlConfig::default()
    };
    let mut switch = ctx.settings.switch_cost(ctx.profile);
    match variant {
        Variant::NoFairness => config.planner.fairness_weighting = false,
        Variant::StaticTp => config.planner.tp_levels = vec![super::static_tp(ctx)?],
        // The hindsight ceiling may also be searched at one static level.
        Variant::Oracle if ctx.settings.tp.is_some() => {
            config.planner.tp_levels = vec![super::static_tp(ctx)?];
            switch = SwitchCost { stop_ms: 0.0, ..switch };
        }
        Variant::NaiveSwitch => switch.stop_ms = NAIVE_SWITCH_MS,
        Variant::Oracle => switch = SwitchCost { stop_ms: 0.0, ..switch },
        Variant::Full | Variant::Split => {}
    }
    config.planner.switch_cost = Some(switch);
    Ok((config, switch))
}

impl Tiertp {
    pub fn new(ctx: &Ctx, variant: Variant) -> Result<Self, String> {
        let (config, switch) = control_config(ctx, variant)?;
        let mut control =
            ControlLoop::new(Arc::clone(ctx.profile), ctx.tiers.clone(), ctx.cluster.clone(), config).map_err(|e| e.to_string())?;
        let mut layout = Value::Null;
        if variant == Variant::Split {
            let (plan, described) = super::split::partition_plan(ctx)?;
            control.install(plan);
            layout = described;
        }
        Ok(Self {
            variant,
            control,
            switch,
            layout,
            window_released: Released::default(),
            settled: FxHashMap::default(),
        })
    }

    /// The engine's groups for a plan.
    pub fn specs(plan: &Plan) -> Vec<GroupSpec> {
        plan.groups
            .iter()
            .map(|g| GroupSpec {
                first_gpu: g.first_gpu,
                tp: g.tp,
                role: g.role,
                tier: Some(g.tier),
                batch_cap: g.batch_cap,
                token_cap: g.token_cap,
            })
            .collect()
    }

    fn decision(d: Decision) -> Route {
        Route::To(d.key(), d.class)
    }

    fn admission(a: Admission) -> Route {
        match a {
            Admission::Admitted(d) => Self::decision(d),
            Admission::Shed { reason, .. } => Route::Reject(Rejection::Shed(reason)),
        }
    }

    fn handoff(h: Handoff) -> Option<Route> {
        match h {
            Handoff::Stay => None,
            Handoff::Move(d) => Some(Self::decision(d)),
            Handoff::Wait => Some(Route::Wait),
        }
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
            Variant::Split => "split",
        }
    }

    fn describe(&self) -> Value {
        if self.variant == Variant::Split {
            return self.layout.clone();
        }
        json!({
            "tp_levels": self.control.planner().map(|p| p.tp_levels().to_vec()),
            "switch_stop_ms": self.switch.stop_ms,
            "kv_gbps": self.switch.kv_gbps,
        })
    }

    fn deadline_aware(&self) -> bool {
        true
    }

    fn switch_ms(&self, _ctx: &Ctx) -> f64 {
        self.switch.stop_ms
    }

    fn initial(&mut self, _ctx: &Ctx) -> Vec<GroupSpec> {
        Self::specs(self.control.plan())
    }

    fn on_window(&mut self, _ctx: &Ctx, now: f64, future: &[TierStats], _groups: &[GroupSim]) -> Option<Vec<GroupSpec>> {
        if self.variant == Variant::Split {
            return None;
        }
        let known = (self.variant == Variant::Oracle).then_some(future);
        let out = self.control.window(now, known).ok()?;
        self.window_released.append(out.released);
        self.settled.extend(out.settled);
        out.plan_changed.then(|| Self::specs(&out.plan))
    }

    fn route(&mut self, ctx: &Ctx, i: u32, now: f64, _groups: &[GroupSim]) -> Route {
        let r = &ctx.reqs[i as usize];
        // The trace's output length stands for the client's max_tokens (live
        // replay sends exactly that).
        match self.control.admit(u64::from(i), r.tier, r.prompt_tokens, r.output_tokens, now, &[]) {
            Ok(a) => Self::admission(a),
            Err(_) => Route::Reject(Rejection::ControlError),
        }
    }

    fn on_first_token(&mut self, i: u32, now: f64) {
        let _ = self.control.first_token(u64::from(i), now);
    }

    fn route_decode(&mut self, _ctx: &Ctx, i: u32, now: f64, _groups: &[GroupSim]) -> Option<Route> {
        match self.control.first_token(u64::from(i), now) {
            Ok(h) => Self::handoff(h),
            Err(_) => Some(Route::Reject(Rejection::ControlError)),
        }
    }

    fn route_migrated(&mut self, ctx: &Ctx, i: u32, prefilled: bool, now: f64, _groups: &[GroupSim]) -> Route {
        let id = u64::from(i);
        // Settled by the plan change, and not moved since (a hand-off).
        if let Some(d) = self.settled.remove(&id) {
            if self.control.dispatcher().group_of(id) == Some(d.key()) {
                return Self::decision(d);
            }
        }
        // No group of the new plan over its GPUs: placed anew.
        let placed = if prefilled {
            self.control
                .relocate(id, now)
                .map(|h| Self::handoff(h).unwrap_or(Route::Reject(Rejection::ControlError)))
        } else {
            let r = &ctx.reqs[i as usize];
            self.control.readmit(id, r.tier, r.prompt_tokens, &[]).map(Self::admission)
        };
        placed.unwrap_or(Route::Reject(Rejection::ControlError))
    }

    fn on_finish(&mut self, i: u32, now: f64) {
        self.settled.remove(&u64::from(i));
        self.control.finish(u64::from(i), now);
    }

    fn take_released(&mut self, now: f64) -> Vec<(u32, Route)> {
        let mut r = std::mem::take(&mut self.window_released);
        r.append(self.control.take_released(now));
        let granted = r.granted.into_iter().map(|(id, d)| (id as u32, Self::decision(d)));
        let shed = r
            .shed
            .into_iter()
            .map(|id| (id as u32, Route::Reject(Rejection::Shed(ShedReason::HandoffTimeout))));
        granted.chain(shed).collect()
    }
}
