//! The discrete-event loop.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::sync::Arc;
use std::time::Instant;

use rustc_hash::FxHashMap;
use thiserror::Error;
use tiertp_scheduler::control::ControlConfig;
use tiertp_scheduler::dispatcher::DispatchClass;
use tiertp_scheduler::profile::Profile;
use tiertp_scheduler::prompt_lengths::PromptLengths;
use tiertp_scheduler::stats::{self, TierStats};
use tiertp_scheduler::tiers::TierSet;
use tiertp_scheduler::topology::Cluster;

use crate::engine::{GroupSim, GroupSpec, Outcome};
use crate::policy::{self, Ctx, Policy, Route};
use crate::rejection::Rejection;
use crate::request::{kv_reservation, Progress, TraceRequest};
use crate::result::{ControlEvent, SimResult, TimelineEntry};
use crate::settings::SimSettings;

#[derive(Debug, Error, Clone, PartialEq)]
pub enum SimError {
    #[error("bad simulation input: {0}")]
    Input(String),
    #[error("policy {policy}: {reason}")]
    Policy { policy: String, reason: String },
}

/// Requests still unfinished this long after the last arrival are reported
/// rejected ("did not finish"), so a stuck configuration cannot hang a run.
const DRAIN_LIMIT_S: f64 = 6.0 * 3600.0;

#[derive(Debug, Clone, Copy)]
enum Ev {
    Arrival(u32),
    IterationDone(u64),
    /// A request reaches a group after a KV transfer.
    Deliver(u32, (u32, u32), DispatchClass),
    Wake(u64),
    Window,
}

struct Timed {
    t: f64,
    seq: u64,
    ev: Ev,
}

impl PartialEq for Timed {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Timed {}
impl PartialOrd for Timed {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Timed {
    // BinaryHeap is a max-heap: earliest time (then lowest seq) first.
    fn cmp(&self, o: &Self) -> Ordering {
        o.t.total_cmp(&self.t).then(o.seq.cmp(&self.seq))
    }
}

struct Sim<'a> {
    ctx: Ctx<'a>,
    /// What the engine's iterations take (the policies see `ctx.profile`).
    engine: Arc<Profile>,
    policy: Box<dyn Policy>,
    progress: Vec<Progress>,
    groups: Vec<GroupSim>,
    by_id: FxHashMap<u64, usize>,
    by_key: FxHashMap<(u32, u32), usize>,
    next_gid: u64,
    events: BinaryHeap<Timed>,
    seq: u64,
    now: f64,
    timeline: Vec<TimelineEntry>,
    switches: u64,
    migrated: u64,
    remaining: usize,
    bytes_per_token: f64,
    kv_gbps: f64,
    deadline_aware: bool,
    log: Option<Vec<ControlEvent>>,
}

/// The profiles a run uses: the policies plan on `planning` while the
/// engine's iterations take `engine`'s times. They differ in a run where
/// the policies' model of the engine is not the engine (e.g. a server that
/// plans with a measured profile while serving costs more per step); one
/// profile converts into both.
#[derive(Debug, Clone)]
pub struct SimProfiles {
    pub planning: Arc<Profile>,
    pub engine: Arc<Profile>,
}

impl SimProfiles {
    /// `engine` must have every TP level of `planning` (`simulate` checks).
    pub fn planning_on_engine(planning: Arc<Profile>, engine: Arc<Profile>) -> Self {
        Self { planning, engine }
    }
}

impl From<Arc<Profile>> for SimProfiles {
    fn from(profile: Arc<Profile>) -> Self {
        Self {
            engine: Arc::clone(&profile),
            planning: profile,
        }
    }
}

/// Replays `reqs` (sorted by arrival) under `policy_name`.
pub fn simulate(
    profiles: impl Into<SimProfiles>,
    tiers: &TierSet,
    reqs: &[TraceRequest],
    policy_name: &str,
    settings: &SimSettings,
    progress_cb: &mut dyn FnMut(f64),
) -> Result<SimResult, SimError> {
    let SimProfiles { planning: profile, engine } = profiles.into();
    settings.validate().map_err(SimError::Input)?;
    let engine_levels = engine.tp_levels();
    if let Some(tp) = profile.tp_levels().into_iter().find(|tp| !engine_levels.contains(tp)) {
        return Err(SimError::Input(format!(
            "the engine profile {} has no TP{tp} table, which the planning profile {} has",
            engine.name, profile.name
        )));
    }
    check_trace(tiers, reqs)?;
    let cluster = Cluster::uniform(settings.gpus, settings.gpus_per_node).map_err(|e| SimError::Input(e.to_string()))?;
    let trace_stats = whole_trace_stats(tiers.len(), reqs);
    let future = window_stats(tiers.len(), reqs, settings.window_s, &trace_stats);
    let ctx = Ctx {
        profile: &profile,
        tiers,
        settings,
        cluster: &cluster,
        trace_stats: &trace_stats,
        reqs,
    };
    let policy = policy::build(policy_name, &ctx).map_err(|reason| SimError::Policy {
        policy: policy_name.into(),
        reason,
    })?;
    let mut sim = Sim {
        engine,
        bytes_per_token: profile.kv_bytes_per_token.unwrap_or(0) as f64,
        kv_gbps: settings.switch_cost(&profile).kv_gbps,
        ctx,
        policy,
        progress: vec![Progress::default(); reqs.len()],
        groups: Vec::new(),
        by_id: FxHashMap::default(),
        by_key: FxHashMap::default(),
        next_gid: 0,
        events: BinaryHeap::new(),
        seq: 0,
        now: 0.0,
        timeline: Vec::new(),
        switches: 0,
        migrated: 0,
        remaining: reqs.len(),
        deadline_aware: false,
        log: settings.record_control.then(Vec::new),
    };
    sim.deadline_aware = sim.policy.deadline_aware();
    let wall = Instant::now();
    let initial = sim.policy.initial(&sim.ctx);
    sim.apply(initial, true);
    for (i, r) in reqs.iter().enumerate() {
        sim.push(r.arrival_s, Ev::Arrival(i as u32));
    }
    sim.push(settings.window_s, Ev::Window);
    let last_arrival = reqs.last().map_or(0.0, |r| r.arrival_s);
    let mut window = 0usize;
    let mut next_report = 0.0;
    while sim.remaining > 0 {
        let Some(Timed { t, ev, .. }) = sim.events.pop() else { break };
        if t > last_arrival + DRAIN_LIMIT_S {
            break;
        }
        sim.now = t;
        match ev {
            Ev::Arrival(i) => sim.arrive(i),
            Ev::IterationDone(gid) => sim.iteration_done(gid),
            Ev::Deliver(i, key, class) => sim.deliver(i, key, class),
            Ev::Wake(gid) => {
                if let Some(&g) = sim.by_id.get(&gid) {
                    sim.groups[g].wake_pending = false;
                    sim.kick(g);
                }
            }
            Ev::Window => {
                window += 1;
                let fut = future.get(window).unwrap_or(&future[future.len() - 1]).clone();
                let change = sim.policy.on_window(&sim.ctx, sim.now, &fut, &sim.groups);
                let time_s = sim.now;
                sim.record(|| ControlEvent::Window {
                    time_s,
                    groups: change.clone(),
                });
                if let Some(specs) = change {
                    sim.apply(specs, false);
                }
                for (i, target) in sim.policy.rebalance(&sim.ctx, &sim.groups, &sim.progress) {
                    sim.live_migrate(i, target);
                }
                sim.released();
                if sim.remaining > 0 {
                    sim.push(sim.now + settings.window_s, Ev::Window);
                }
                if last_arrival > 0.0 && sim.now >= next_report {
                    progress_cb((sim.now / last_arrival).min(1.0));
                    next_report = sim.now + last_arrival / 50.0;
                }
            }
        }
    }
    // Anything left never finished within the drain limit.
    for p in sim.progress.iter_mut().filter(|p| !p.done()) {
        p.rejection = Some(Rejection::Unfinished);
    }
    progress_cb(1.0);
    Ok(sim.result(policy_name, wall.elapsed().as_secs_f64()))
}

fn check_trace(tiers: &TierSet, reqs: &[TraceRequest]) -> Result<(), SimError> {
    let mut prev = 0.0;
    for (i, r) in reqs.iter().enumerate() {
        let bad = |why: String| Err(SimError::Input(format!("request {i}: {why}")));
        if !(r.arrival_s.is_finite() && r.arrival_s >= 0.0) {
            return bad(format!("arrival_s = {} must be a finite time >= 0", r.arrival_s));
        }
        if r.arrival_s < prev {
            return bad(format!(
                "arrival_s = {} is before the previous request's {prev}; sort the trace",
                r.arrival_s
            ));
        }
        prev = r.arrival_s;
        if r.tier >= tiers.len() {
            return bad(format!("tier index {} but there are {} tiers", r.tier, tiers.len()));
        }
        if r.prompt_tokens == 0 || r.output_tokens == 0 {
            return bad("prompt_tokens and output_tokens must be >= 1".into());
        }
    }
    Ok(())
}

fn stats_of(num_tiers: usize, reqs: &[TraceRequest], span_s: f64, fallback: &[TierStats]) -> Vec<TierStats> {
    let mut acc = vec![(0usize, 0.0f64, 0.0f64, 0.0f64); num_tiers];
    let mut prompts: Vec<Vec<u32>> = vec![Vec::new(); num_tiers];
    for r in reqs {
        let a = &mut acc[r.tier];
        a.0 += 1;
        a.1 += f64::from(r.prompt_tokens);
        a.2 += f64::from(r.output_tokens);
        a.3 += f64::from(r.output_tokens) * f64::from(r.output_tokens);
        prompts[r.tier].push(r.prompt_tokens);
    }
    acc.iter()
        .zip(prompts)
        .enumerate()
        .map(|(t, (&(n, p, o, o_sq), prompts))| {
            if n == 0 {
                TierStats {
                    arrival_rate: 0.0,
                    ..fallback.get(t).copied().unwrap_or_else(|| ControlConfig::default().prior())
                }
            } else {
                let n_f = n as f64;
                let mean_output = o / n_f;
                let stats = TierStats::new(n_f / span_s, p / n_f, mean_output).with_resident_output_tokens(stats::resident_output_tokens(
                    o,
                    o_sq,
                    mean_output,
                ));
                match PromptLengths::from_samples(prompts.into_iter()) {
                    Some(lengths) => stats.with_prompt_lengths(lengths),
                    None => stats,
                }
            }
        })
        .collect()
}

fn whole_trace_stats(num_tiers: usize, reqs: &[TraceRequest]) -> Vec<TierStats> {
    let span = reqs.last().map_or(1.0, |r| r.arrival_s).max(1.0);
    stats_of(num_tiers, reqs, span, &[])
}

/// The true stats of each window (index k covers [k·w, (k+1)·w)): what the
/// oracle is allowed to see in advance.
fn window_stats(num_tiers: usize, reqs: &[TraceRequest], w: f64, whole: &[TierStats]) -> Vec<Vec<TierStats>> {
    let windows = (reqs.last().map_or(0.0, |r| r.arrival_s) / w).floor() as usize + 2;
    let mut out = Vec::with_capacity(windows);
    let mut start = 0;
    for k in 0..windows {
        let end_t = (k + 1) as f64 * w;
        let end = start + reqs[start..].partition_point(|r| r.arrival_s < end_t);
        out.push(stats_of(num_tiers, &reqs[start..end], w, whole));
        start = end;
    }
    out
}

impl Sim<'_> {
    fn push(&mut self, t: f64, ev: Ev) {
        self.seq += 1;
        self.events.push(Timed { t, seq: self.seq, ev });
    }

    fn reindex(&mut self) {
        self.by_id = self.groups.iter().enumerate().map(|(i, g)| (g.id, i)).collect();
        self.by_key = self
            .groups
            .iter()
            .enumerate()
            .filter(|(_, g)| !g.retiring)
            .map(|(i, g)| (g.spec.key(), i))
            .collect();
    }

    fn kv_capacity(&self, tp: u32) -> u64 {
        self.ctx
            .profile
            .table(tp)
            .ok()
            .and_then(|t| t.kv_capacity_tokens)
            .unwrap_or(u64::MAX / 4)
    }

    /// Seconds to move `tokens` of KV between groups.
    fn transfer_s(&self, tokens: u64) -> f64 {
        tokens as f64 * self.bytes_per_token / (self.kv_gbps * 1e9)
    }

    fn arrive(&mut self, i: u32) {
        let route = self.policy.route(&self.ctx, i, self.now, &self.groups);
        let time_s = self.now;
        self.record(|| ControlEvent::Admit { time_s, request: i, route });
        self.place(i, route, 0.0);
    }

    /// Sends a request to a routed group after `delay_s` (KV transfer), or
    /// rejects it.
    fn place(&mut self, i: u32, route: Route, delay_s: f64) {
        match route {
            Route::Reject(why) => self.reject(i, why),
            Route::Wait => {}
            Route::To(key, class) => {
                if delay_s > 0.0 {
                    self.push(self.now + delay_s, Ev::Deliver(i, key, class));
                } else {
                    self.deliver(i, key, class);
                }
            }
        }
    }

    fn reject(&mut self, i: u32, why: Rejection) {
        let p = &mut self.progress[i as usize];
        if !p.done() {
            p.rejection = Some(why);
            self.remaining -= 1;
            self.policy.on_finish(i, self.now);
            let time_s = self.now;
            self.record(|| ControlEvent::Finish { time_s, request: i });
        }
    }

    fn record(&mut self, event: impl FnOnce() -> ControlEvent) {
        if let Some(log) = &mut self.log {
            log.push(event());
        }
    }

    /// Places what the policy let go of (granted hand-offs, sheds).
    fn released(&mut self) {
        for (i, route) in self.policy.take_released(self.now) {
            let p = self.progress[i as usize];
            let delay = match route {
                Route::To(..) => self.transfer_s(u64::from(p.prefilled) + u64::from(p.generated)),
                _ => 0.0,
            };
            self.place(i, route, delay);
        }
    }

    fn deliver(&mut self, i: u32, key: (u32, u32), class: DispatchClass) {
        let Some(&g) = self.by_key.get(&key) else {
            // The target stopped while the KV was in flight: route again.
            let prefilled = self.progress[i as usize].prefilled == self.ctx.reqs[i as usize].prompt_tokens;
            let route = self.policy.route_migrated(&self.ctx, i, prefilled, self.now, &self.groups);
            let time_s = self.now;
            self.record(|| ControlEvent::Migrate { time_s, request: i, route });
            return self.place(i, route, 0.0);
        };
        if kv_reservation(&self.ctx.reqs[i as usize]) > self.groups[g].kv_capacity {
            return self.reject(i, Rejection::KvTooLarge);
        }
        // A request not yet started must begin prefill before its TTFT runs
        // out (less the prefill itself, which the batch policy cannot know);
        // the engine demotes it to best effort after that.
        let deadline = if self.deadline_aware && self.progress[i as usize].prefilled == 0 {
            self.policy.deadline(&self.ctx, i)
        } else {
            f64::INFINITY
        };
        self.groups[g].enqueue(i, class, deadline, self.ctx.reqs, &self.progress);
        self.kick(g);
    }

    fn kick(&mut self, g: usize) {
        let grp = &mut self.groups[g];
        if grp.busy || grp.retiring {
            return;
        }
        if self.now < grp.available_at {
            if !grp.wake_pending {
                grp.wake_pending = true;
                let (t, id) = (grp.available_at, grp.id);
                self.push(t, Ev::Wake(id));
            }
            return;
        }
        if self.deadline_aware {
            // Queued past its TTFT deadline: it can no longer count, so it
            // must not take a batch slot (the batch policy's rule).
            let expired = grp.take_expired(self.now, self.ctx.reqs, &self.progress);
            for i in expired {
                self.reject(i, Rejection::DeadlinePassed);
            }
        }
        let grp = &mut self.groups[g];
        if let Some(ms) = grp.start_iteration(self.now, &self.engine, self.ctx.reqs, &self.progress) {
            grp.busy = true;
            grp.iteration_start = self.now;
            grp.busy_until = self.now + ms / 1e3;
            let (t, id) = (grp.busy_until, grp.id);
            self.push(t, Ev::IterationDone(id));
        }
    }

    fn iteration_done(&mut self, gid: u64) {
        let Some(&g) = self.by_id.get(&gid) else { return };
        let iteration_ms = (self.now - self.groups[g].iteration_start) * 1e3;
        self.groups[g].busy = false;
        let outcomes = self.groups[g].finish_iteration(self.now, self.ctx.reqs, &mut self.progress);
        for o in outcomes {
            match o {
                Outcome::Finished(i) => {
                    self.remaining -= 1;
                    self.policy.on_finish(i, self.now);
                    let time_s = self.now;
                    self.record(|| ControlEvent::Finish { time_s, request: i });
                }
                Outcome::FirstToken(i) => {
                    self.policy.on_first_token(i, self.now);
                    let time_s = self.now;
                    self.record(|| ControlEvent::FirstToken { time_s, request: i });
                }
                Outcome::PrefillDone(i) => {
                    let route = self.policy.route_decode(&self.ctx, i, self.now, &self.groups);
                    let time_s = self.now;
                    self.record(|| ControlEvent::Handoff { time_s, request: i, route });
                    match route {
                        None => self.groups[g].keep_decoding(i, self.ctx.reqs),
                        Some(route) => {
                            let delay = self.transfer_s(u64::from(self.ctx.reqs[i as usize].prompt_tokens));
                            self.place(i, route, delay);
                        }
                    }
                }
            }
        }
        self.released();
        let Some(&g) = self.by_id.get(&gid) else { return };
        if self.groups[g].retiring {
            return self.retire(g);
        }
        self.policy.on_iteration(&self.ctx, &mut self.groups[g], iteration_ms);
        self.kick(g);
    }

    /// Stops a group: its queued requests move as metadata, its running ones
    /// with their KV.
    fn retire(&mut self, g: usize) {
        let (running, queued) = self.groups[g].drain();
        self.groups.remove(g);
        self.reindex();
        for (i, _) in queued {
            let prefilled = self.progress[i as usize].prefilled == self.ctx.reqs[i as usize].prompt_tokens;
            let route = self.policy.route_migrated(&self.ctx, i, prefilled, self.now, &self.groups);
            let time_s = self.now;
            self.record(|| ControlEvent::Migrate { time_s, request: i, route });
            self.place(i, route, 0.0);
        }
        for i in running {
            self.migrated += 1;
            let p = self.progress[i as usize];
            let prefilled = p.prefilled == self.ctx.reqs[i as usize].prompt_tokens;
            let route = self.policy.route_migrated(&self.ctx, i, prefilled, self.now, &self.groups);
            let time_s = self.now;
            self.record(|| ControlEvent::Migrate { time_s, request: i, route });
            let tokens = u64::from(p.prefilled) + u64::from(p.generated);
            let delay = self.transfer_s(tokens);
            self.place(i, route, delay);
        }
    }

    /// Moves one running request to another group (Llumnix-style).
    fn live_migrate(&mut self, i: u32, target: (u32, u32)) {
        let Some(src) = self.groups.iter().position(|g| !g.busy && g.running.contains(&i)) else {
            return;
        };
        if !self.by_key.contains_key(&target) || self.groups[src].spec.key() == target {
            return;
        }
        self.groups[src].release(i, self.ctx.reqs);
        self.migrated += 1;
        let p = self.progress[i as usize];
        let delay = self.transfer_s(u64::from(p.prefilled) + u64::from(p.generated));
        self.push(self.now + delay, Ev::Deliver(i, target, DispatchClass::Feasible));
        self.kick(src);
    }

    /// Replaces the configuration: groups at the same place survive; the
    /// others stop at their next iteration boundary, and new groups start
    /// after the switch time once the GPUs they need are free.
    fn apply(&mut self, specs: Vec<GroupSpec>, initial: bool) {
        let switch_s = if initial { 0.0 } else { self.policy.switch_ms(&self.ctx) / 1e3 };
        let mut keep = vec![false; self.groups.len()];
        let mut fresh = Vec::new();
        for spec in &specs {
            match self.groups.iter().position(|g| !g.retiring && g.spec.same_place(spec)) {
                Some(g) => {
                    keep[g] = true;
                    self.groups[g].set_spec(*spec);
                }
                None => fresh.push(*spec),
            }
        }
        let mut stopping = Vec::new();
        for (g, k) in keep.iter().enumerate() {
            if !k && !self.groups[g].retiring {
                self.groups[g].retiring = true;
                stopping.push(self.groups[g].id);
            }
        }
        for spec in fresh {
            let gpus = spec.first_gpu..spec.first_gpu + spec.tp;
            let free_at = self
                .groups
                .iter()
                .filter(|g| g.retiring && g.busy)
                .filter(|g| g.spec.first_gpu < gpus.end && gpus.start < g.spec.first_gpu + g.spec.tp)
                .map(|g| g.busy_until)
                .fold(self.now, f64::max);
            let id = self.next_gid;
            self.next_gid += 1;
            self.switches += u64::from(!initial);
            self.groups
                .push(GroupSim::new(id, spec, self.kv_capacity(spec.tp), free_at + switch_s));
        }
        self.reindex();
        // Every change of where, role or tier is recorded, also one that
        // keeps every group's place (a GPU lent from one tier to another
        // at the same TP); a change of caps alone is not.
        let layout_changed = self.timeline.last().is_none_or(|last| !same_assignments(&last.groups, &specs));
        if initial || layout_changed {
            self.timeline.push(TimelineEntry {
                time_s: self.now,
                groups: specs,
            });
        }
        // Idle stopping groups hand over now; busy ones at their boundary.
        for id in stopping {
            if let Some(&g) = self.by_id.get(&id) {
                if !self.groups[g].busy {
                    self.retire(g);
                }
            }
        }
        for g in 0..self.groups.len() {
            self.kick(g);
        }
    }

    fn result(self, policy: &str, wall_s: f64) -> SimResult {
        let reqs = self.ctx.reqs;
        let mut ttft = Vec::with_capacity(reqs.len());
        let mut tpot = Vec::with_capacity(reqs.len());
        let mut finish = Vec::with_capacity(reqs.len());
        let mut rejections = Vec::with_capacity(reqs.len());
        for (r, p) in reqs.iter().zip(&self.progress) {
            if p.rejection.is_some() {
                ttft.push(f64::NAN);
                tpot.push(f64::NAN);
                finish.push(f64::NAN);
            } else {
                ttft.push((p.first_token_s - r.arrival_s) * 1e3);
                let steps = f64::from(r.output_tokens.saturating_sub(1));
                tpot.push(if steps > 0.0 {
                    (p.finish_s - p.first_token_s) * 1e3 / steps
                } else {
                    0.0
                });
                finish.push(p.finish_s);
            }
            rejections.push(p.rejection);
        }
        SimResult {
            policy: policy.to_string(),
            settings: self.policy.describe(),
            num_gpus: self.ctx.cluster.num_gpus(),
            sim_end_s: self.now,
            ttft_ms: ttft,
            tpot_ms: tpot,
            finish_s: finish,
            rejections,
            timeline: self.timeline,
            switches: self.switches,
            migrated_requests: self.migrated,
            wall_s,
            control_log: self.log.unwrap_or_default(),
        }
    }
}

/// The same groups in the same places, roles and tiers (caps aside).
fn same_assignments(a: &[GroupSpec], b: &[GroupSpec]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.same_assignment(y))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tiertp_scheduler::plan::Role;
    use tiertp_scheduler::tiers::TierId;

    fn spec(first_gpu: u32, role: Role, tier: Option<TierId>, batch_cap: u32) -> GroupSpec {
        GroupSpec {
            first_gpu,
            tp: 1,
            role,
            tier,
            batch_cap,
            token_cap: 0,
        }
    }

    #[test]
    fn a_gpu_lent_to_another_tier_in_place_is_a_layout_change_new_caps_are_not() {
        let before = [spec(0, Role::Prefill, Some(0), 8), spec(1, Role::Colocated, Some(1), 8)];
        let lent = [spec(0, Role::Prefill, Some(0), 8), spec(1, Role::Decode, Some(0), 8)];
        let recapped = [spec(0, Role::Prefill, Some(0), 16), spec(1, Role::Colocated, Some(1), 4)];
        assert!(!same_assignments(&before, &lent));
        assert!(same_assignments(&before, &recapped));
        assert!(!same_assignments(&before, &before[..1]));
    }
}
