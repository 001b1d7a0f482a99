//! The control loop (DESIGN.md §1), once: observe arrivals, plan every
//! window (priors, planner, commit rule), admit and dispatch each request,
//! hand prefilled requests to decode slots, shed what cannot meet its SLO.
//!
//! Its callers do only I/O on a clock they pass in: the gateway with wall
//! time and real workers, the simulator with simulated time. Both feed it
//! the same events:
//! - `admit` when a request arrives → `Admitted` (a group) or `Shed`;
//! - `first_token` when its prompt is prefilled → `Stay`, `Move` to a decode
//!   group, or `Wait` for a decode slot (granted later by `finish` or
//!   `window`, shed once the wait would spend its TPOT budget);
//! - `finish` when it ends (completed, failed or shed);
//! - `window` every control window → the plan to run (changed or not), the
//!   new group of each request whose group it stopped (`settled`: the
//!   caller moves them there with the switch), and the hand-offs granted or
//!   shed meanwhile.
//!
//! Overload policy: a tier's planned capacity is a budget. A request its
//! tier's groups cannot take within the SLO budget is shed at the door (the
//! gateway answers 503 `overloaded` with Retry-After, replay counts it
//! missed) rather than queued behind work it would delay; a prefill-only
//! group takes a prompt only with a decode slot in view for it
//! (`Dispatcher`); a decode group's batch cap is never exceeded (a hand-off
//! that finds no slot waits, then is shed); a queued request whose TTFT
//! deadline passes is shed by the batch policy (`take_expired`).

mod config;
mod handoff;

use std::sync::Arc;

pub use config::ControlConfig;
pub use handoff::HandoffQueue;

use crate::dispatcher::{Decision, DispatchError, Dispatcher};
use crate::estimator::{TierEstimate, HANDOFF_WAIT_SHARE};
use crate::live_view::LiveView;
use crate::plan::{GpuCommand, GroupKey, Plan};
use crate::planner::{PlanError, Planner};
use crate::profile::Profile;
use crate::stats::{ArrivalObserver, TierStats};
use crate::tiers::{TierId, TierSet};
use crate::topology::Cluster;

/// Why a request was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShedReason {
    /// Every group of its tier is at its SLO budget.
    OverBudget,
    /// The plan has no group that can take the tier's requests.
    NoCapacity,
    /// Prefilled requests of its tier already wait for decode slots.
    DecodeBacklog,
    /// Waited for a decode slot past its TPOT budget.
    HandoffTimeout,
    /// No group of its tier can prefill a prompt this long within the TTFT.
    PromptTooLong,
}

impl ShedReason {
    pub fn name(self) -> &'static str {
        match self {
            ShedReason::OverBudget => "over_slo_budget",
            ShedReason::NoCapacity => "no_capacity",
            ShedReason::DecodeBacklog => "decode_backlog",
            ShedReason::HandoffTimeout => "handoff_timeout",
            ShedReason::PromptTooLong => "prompt_too_long",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Admission {
    Admitted(Decision),
    /// Not admitted; worth retrying after `retry_after_s` (the next plan).
    Shed {
        reason: ShedReason,
        retry_after_s: f64,
    },
}

/// What happens to a request whose prompt was just prefilled.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Handoff {
    /// It decodes where it is (colocated group).
    Stay,
    /// Its KV moves to this decode group.
    Move(Decision),
    /// No decode slot of its tier is free: it waits (see `Released`).
    Wait,
}

/// Requests the loop let go of since the caller last asked: hand-offs now
/// granted a decode slot, and waiters shed (`HandoffTimeout`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Released {
    pub granted: Vec<(u64, Decision)>,
    /// Waiters whose hand-off wait ran out (`ShedReason::HandoffTimeout`).
    pub shed: Vec<u64>,
}

impl Released {
    pub fn is_empty(&self) -> bool {
        self.granted.is_empty() && self.shed.is_empty()
    }

    /// `later`'s grants and sheds after these.
    pub fn append(&mut self, later: Released) {
        self.granted.extend(later.granted);
        self.shed.extend(later.shed);
    }
}

/// What one control window decided.
#[derive(Debug, Clone)]
pub struct WindowOutcome {
    pub plan: Plan,
    /// Whether the GPUs' assignment changed (`commands` non-empty).
    pub layout_changed: bool,
    /// Whether anything the workers run changed (layout or caps): a new
    /// plan id.
    pub plan_changed: bool,
    pub commands: Vec<GpuCommand>,
    pub stats: Vec<TierStats>,
    pub estimates: Vec<TierEstimate>,
    /// Requests on groups the new plan stopped, each with the group over
    /// the same GPUs it goes to (`Dispatcher::settle_stopped`), by id.
    pub settled: Vec<(u64, Decision)>,
    pub released: Released,
}

pub struct ControlLoop {
    tiers: TierSet,
    config: ControlConfig,
    /// The whole cluster; plans, dispatch decisions and commands are in its
    /// GPU numbering.
    cluster: Cluster,
    /// The GPUs that are up, as the planner sees them; `None` when none is.
    view: Option<LiveView>,
    /// Plans over `view`'s cluster; `None` when no GPU is up or no TP level
    /// fits the live GPUs (`planner_note` says why).
    planner: Option<Planner>,
    planner_note: Option<String>,
    profile: Arc<Profile>,
    dispatcher: Dispatcher,
    observer: ArrivalObserver,
    handoffs: HandoffQueue,
    plan: Plan,
    plan_id: u64,
    last_stats: Vec<TierStats>,
    /// Granted or shed outside a window step, not yet taken by the caller.
    pending: Released,
}

impl ControlLoop {
    /// The loop with its first plan: every tier idle at the prior lengths.
    pub fn new(profile: Arc<Profile>, tiers: TierSet, cluster: Cluster, config: ControlConfig) -> Result<Self, PlanError> {
        config.validate().map_err(PlanError::Config)?;
        let mut planner = Planner::new(Arc::clone(&profile), tiers.clone(), cluster.clone(), config.planner.clone())?;
        let idle = vec![config.prior(); tiers.len()];
        let plan = planner.step(&idle)?.plan;
        let up = vec![true; cluster.num_gpus() as usize];
        let view = LiveView::new(cluster.node_sizes(), &up);
        let mut dispatcher = Dispatcher::new(&tiers, &plan);
        dispatcher.set_nodes(&cluster);
        let observer = ArrivalObserver::new(tiers.len(), config.horizon_s(), config.memory_s, config.window_s, config.prior());
        Ok(Self {
            dispatcher,
            handoffs: HandoffQueue::new(tiers.len()),
            last_stats: idle,
            tiers,
            config,
            cluster,
            view,
            planner: Some(planner),
            planner_note: None,
            profile,
            observer,
            plan,
            plan_id: 1,
            pending: Released::default(),
        })
    }

    pub fn tiers(&self) -> &TierSet {
        &self.tiers
    }

    /// The planner over the live GPUs, if there is one.
    pub fn planner(&self) -> Option<&Planner> {
        self.planner.as_ref()
    }

    /// Why there is no planner (no GPU up, no TP level fits them).
    pub fn planner_note(&self) -> Option<&str> {
        self.planner_note.as_deref()
    }

    pub fn dispatcher(&self) -> &Dispatcher {
        &self.dispatcher
    }

    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    pub fn plan_id(&self) -> u64 {
        self.plan_id
    }

    /// Plans from now on over the GPUs that are `up` only (a health
    /// change): a fresh planner over them, its plan committed at the next
    /// window; with none up (or none the profile's TP levels fit), the plan
    /// is empty at once, so every request is shed with `NoCapacity`.
    /// Observations and in-flight charges are kept.
    pub fn set_up(&mut self, up: &[bool]) {
        self.view = LiveView::new(self.cluster.node_sizes(), up);
        self.planner = None;
        self.planner_note = None;
        let down: Vec<usize> = (0..up.len()).filter(|&g| !up[g]).collect();
        match &self.view {
            None => self.planner_note = Some("no GPU is up (workers disconnected or their devices dead)".into()),
            Some(view) => match Planner::new(
                Arc::clone(&self.profile),
                self.tiers.clone(),
                view.cluster.clone(),
                self.config.planner.clone(),
            ) {
                Ok(p) => self.planner = Some(p),
                Err(e) => self.planner_note = Some(format!("cannot plan over the live GPUs (down: {down:?}): {e}")),
            },
        }
        if self.planner.is_none() {
            self.install(Plan {
                num_gpus: self.cluster.num_gpus(),
                groups: Vec::new(),
                tier_capacity_rps: vec![0.0; self.tiers.len()],
                tier_served_share: vec![1.0; self.tiers.len()],
                pooled_on: vec![None; self.tiers.len()],
            });
        }
    }

    /// Installs a plan decided elsewhere (a static baseline's, or an empty
    /// one), in the cluster's GPU numbering.
    pub fn install(&mut self, plan: Plan) {
        self.dispatcher.set_plan(&self.tiers, &plan);
        self.plan = plan;
        self.plan_id += 1;
    }

    /// When a request arriving at `arrival_s` must start prefilling to meet
    /// its TTFT (infinite for a background tier): its batch-policy deadline.
    pub fn ttft_deadline(&self, tier: TierId, arrival_s: f64) -> f64 {
        self.tiers.tiers()[tier].ttft_deadline(arrival_s)
    }

    /// A new request: recorded for the planner, then placed on a group of
    /// its tier (never one in `down`: failed or unreachable) or shed.
    /// `max_tokens` is what the client asked for (the planner's
    /// output-length signal).
    pub fn admit(
        &mut self,
        id: u64,
        tier: TierId,
        prompt_tokens: u32,
        max_tokens: u32,
        now_s: f64,
        down: &[GroupKey],
    ) -> Result<Admission, DispatchError> {
        if tier >= self.tiers.len() {
            return Err(DispatchError::UnknownTier {
                tier,
                num_tiers: self.tiers.len(),
            });
        }
        self.observer.record(tier, now_s, prompt_tokens, max_tokens);
        self.place(id, tier, prompt_tokens, down)
    }

    /// Places a request again, not a new arrival: its group failed under it
    /// (`down`: groups not to use), or stopped with no group of the new
    /// plan over its GPUs (else `window` settled it there). What it held
    /// comes back first.
    pub fn readmit(&mut self, id: u64, tier: TierId, prompt_tokens: u32, down: &[GroupKey]) -> Result<Admission, DispatchError> {
        self.handoffs.remove(id);
        let _ = self.dispatcher.complete(id);
        self.place(id, tier, prompt_tokens, down)
    }

    fn place(&mut self, id: u64, tier: TierId, prompt_tokens: u32, down: &[GroupKey]) -> Result<Admission, DispatchError> {
        let backlog = self.handoffs.waiting(tier) > 0;
        let shed = |reason| {
            Ok(Admission::Shed {
                reason,
                retry_after_s: self.config.window_s,
            })
        };
        match self.dispatcher.dispatch_avoiding(id, tier, prompt_tokens, !backlog, down) {
            Ok(d) => Ok(Admission::Admitted(d)),
            Err(DispatchError::OverBudget { .. }) if backlog => shed(ShedReason::DecodeBacklog),
            Err(DispatchError::OverBudget { .. }) => shed(ShedReason::OverBudget),
            Err(DispatchError::NoCapacity(_)) => shed(ShedReason::NoCapacity),
            Err(DispatchError::PromptTooLong { .. }) => shed(ShedReason::PromptTooLong),
            Err(e) => Err(e),
        }
    }

    /// The request's prompt is prefilled (its first token is out).
    pub fn first_token(&mut self, id: u64, now_s: f64) -> Result<Handoff, DispatchError> {
        let prompt_tokens = self.dispatcher.prompt_charge(id);
        if !self.dispatcher.prefill_done(id)? {
            return Ok(Handoff::Stay);
        }
        // What decode groups hold (`TierStats::prefilled_prompt_tokens`).
        if let (Some(tier), Some(tokens)) = (self.dispatcher.tier_of(id), prompt_tokens.filter(|&t| t > 0)) {
            self.observer
                .record_prefilled(tier, now_s, u32::try_from(tokens).unwrap_or(u32::MAX));
        }
        self.handoff(id, now_s, false)
    }

    /// A running, prefilled request whose group is stopping: a decode slot
    /// of its tier (decode or colocated group), or it waits. With none of
    /// its tier's or its lenders' on its node (a background request decodes
    /// on other tiers' groups), any group there with a free slot takes it,
    /// or it waits for one: never `Stay`, its group is going away.
    pub fn relocate(&mut self, id: u64, now_s: f64) -> Result<Handoff, DispatchError> {
        match self.handoff(id, now_s, true)? {
            Handoff::Stay => match self.dispatcher.dispatch_any_slot(id)? {
                Some(d) => Ok(Handoff::Move(d)),
                None => {
                    let tier = self.dispatcher.tier_of(id).ok_or(DispatchError::UnknownRequest(id))?;
                    self.handoffs.push_any_slot(tier, id, now_s + self.handoff_wait_s(tier));
                    Ok(Handoff::Wait)
                }
            },
            h => Ok(h),
        }
    }

    fn handoff(&mut self, id: u64, now_s: f64, colocated_too: bool) -> Result<Handoff, DispatchError> {
        let tier = self.dispatcher.tier_of(id).ok_or(DispatchError::UnknownRequest(id))?;
        // No decode group on its node (its KV cannot leave it): it decodes
        // where it is.
        if !self.dispatcher.decode_reachable(id, colocated_too)? {
            return Ok(Handoff::Stay);
        }
        // First come, first served: a slot goes to older waiters first.
        if self.handoffs.waiting(tier) == 0 {
            if let Some(d) = self.dispatcher.dispatch_decode(id, colocated_too)? {
                return Ok(Handoff::Move(d));
            }
        }
        let deadline = now_s + self.handoff_wait_s(tier);
        self.handoffs.push(tier, id, deadline);
        Ok(Handoff::Wait)
    }

    /// How long a prefilled request of `tier` may wait for a decode slot:
    /// the share of its TPOT budget the estimator keeps free for it.
    fn handoff_wait_s(&self, tier: TierId) -> f64 {
        match self.tiers.tiers()[tier].tpot_ms {
            None => f64::INFINITY,
            Some(tpot_ms) => {
                let out = self.last_stats[tier].mean_output_tokens.max(1.0);
                HANDOFF_WAIT_SHARE * tpot_ms / 1e3 * out
            }
        }
    }

    /// The request ended (completed, failed, cancelled or shed): everything
    /// it held comes back, and waiting hand-offs may get its slot (see
    /// `take_released`).
    pub fn finish(&mut self, id: u64, now_s: f64) {
        self.handoffs.remove(id);
        let _ = self.dispatcher.complete(id);
        self.release(now_s);
    }

    /// Hand-offs granted and waiters shed since the last call.
    pub fn take_released(&mut self, now_s: f64) -> Released {
        self.release(now_s);
        std::mem::take(&mut self.pending)
    }

    fn release(&mut self, now_s: f64) {
        if self.handoffs.is_empty() {
            return;
        }
        for id in self.handoffs.take_expired(now_s) {
            let _ = self.dispatcher.complete(id);
            self.pending.shed.push(id);
        }
        let tiers: Vec<TierId> = self.handoffs.tiers_waiting().collect();
        for t in tiers {
            while let Some((id, any_slot)) = self.handoffs.front(t) {
                let slot = if any_slot {
                    self.dispatcher.dispatch_any_slot(id)
                } else {
                    self.dispatcher.dispatch_decode(id, false)
                };
                match slot {
                    Ok(Some(d)) => {
                        self.handoffs.pop(t);
                        self.pending.granted.push((id, d));
                    }
                    Ok(None) => break,
                    Err(_) => {
                        // No longer in flight (finished elsewhere).
                        self.handoffs.pop(t);
                    }
                }
            }
        }
    }

    /// One control window at `now_s`: plan from the observed stats (or,
    /// for the hindsight oracle only, from `known_future`), commit by the
    /// planner's rule, and bring dispatch to the plan.
    pub fn window(&mut self, now_s: f64, known_future: Option<&[TierStats]>) -> Result<WindowOutcome, PlanError> {
        let observed = self.observer.snapshot(now_s);
        let stats = match known_future {
            // The future's arrivals, and what this run's prefill let
            // through so far (the hindsight has no dispatch to observe).
            Some(f) => f
                .iter()
                .zip(&observed)
                .map(|(f, o)| f.with_prefilled_prompt_tokens(f.prefilled_prompt_tokens.or(o.prefilled_prompt_tokens)))
                .collect(),
            None => observed,
        };
        self.last_stats = stats.clone();
        let (Some(planner), Some(view)) = (self.planner.as_mut(), self.view.as_ref()) else {
            return Ok(WindowOutcome {
                plan: self.plan.clone(),
                layout_changed: false,
                plan_changed: false,
                commands: Vec::new(),
                stats,
                estimates: Vec::new(),
                settled: Vec::new(),
                released: self.take_released(now_s),
            });
        };
        let outcome = planner.step(&stats)?;
        let num_gpus = self.cluster.num_gpus();
        let plan = view.to_physical_plan(outcome.plan, num_gpus);
        let commands = view.to_physical_commands(outcome.commands);
        // A fresh planner (after a health change) adopts its first plan.
        let layout_changed = outcome.changed || !same_layout(&plan, &self.plan);
        let plan_changed = layout_changed || plan != self.plan;
        let mut settled = Vec::new();
        if plan_changed {
            self.dispatcher.set_plan(&self.tiers, &plan);
            let handoffs = &self.handoffs;
            settled = self.dispatcher.settle_stopped(|id| handoffs.contains(id));
            self.plan = plan.clone();
            self.plan_id += 1;
        }
        let released = self.take_released(now_s);
        Ok(WindowOutcome {
            plan,
            layout_changed,
            plan_changed,
            commands,
            stats,
            estimates: outcome.estimates,
            settled,
            released,
        })
    }
}

/// Same groups at the same places doing the same thing (caps aside).
fn same_layout(a: &Plan, b: &Plan) -> bool {
    a.groups.len() == b.groups.len() && a.groups.iter().zip(&b.groups).all(|(x, y)| x.same_assignment(y))
}

#[cfg(test)]
mod tests;
