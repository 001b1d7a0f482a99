//! The planner: every control window, estimate each tier's candidates, assign
//! GPU groups with the weighted greedy (per tier, and for a pool of tiers on
//! one host's groups where the demand allows one: `sharing`), and commit the
//! better proposal only if it beats the current plan by the hysteresis
//! margin and repays the switch (DESIGN.md §1).

mod blocking;
mod commit;
mod diff;
pub mod fairness;
mod greedy;
mod layout_search;
pub use fairness::{FAIR_MIN_GOODPUT_FRACTION, FAIR_MIN_SHARE};
mod placement;
mod queueing;
mod sharing;
use sharing::Sharing;

use std::borrow::Cow;
use std::sync::Arc;

use thiserror::Error;

use crate::estimator::{self, estimate_all, TierEstimate, TpEstimate};
use crate::plan::{GpuCommand, GroupPlan, Plan, Role};
use crate::profile::Profile;
use crate::stats::TierStats;
use crate::switch_cost::SwitchCost;
use crate::tiers::{Tier, TierSet};
use crate::topology::{Allocator, Cluster, MAX_GPUS_PER_NODE};

pub use diff::{objective, tier_served_shares};

#[derive(Debug, Error, Clone, PartialEq)]
pub enum PlanError {
    #[error("got stats for {got} tiers, the tier config has {expected}")]
    StatsCount { got: usize, expected: usize },
    #[error("stats for tier {tier:?}: {reason}")]
    BadStats { tier: String, reason: String },
    #[error("no usable TP level: the profile has {profile:?}, the config allows {allowed:?}, the largest node has {largest_node} GPUs")]
    NoTpLevel {
        profile: Vec<u32>,
        allowed: Vec<u32>,
        largest_node: u32,
    },
    #[error("bad planner config: {0}")]
    Config(String),
}

/// Planner settings; each default is written once, here.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannerConfig {
    /// TP levels the planner may use (further limited by profile and nodes).
    pub tp_levels: Vec<u32>,
    /// A new plan replaces the current one only if its weighted goodput is
    /// higher by this fraction, so GPUs do not flap on noise.
    pub hysteresis: f64,
    /// How long a committed plan is expected to serve: the span over which
    /// a proposal's gain must repay its switch cost (see `commit`).
    pub commit_horizon_s: f64,
    /// The switch mechanism's cost; `None`: the measured model of the
    /// profile's device (`SwitchCost::for_profile`).
    pub switch_cost: Option<SwitchCost>,
    pub fairness_weighting: bool,
    pub allow_colocated: bool,
    pub allow_disaggregated: bool,
    /// Fraction of a group's SLO-compliant throughput the plan counts on:
    /// near saturation, queueing alone breaks the TTFT, so plans keep headroom.
    pub target_utilization: f64,
}

impl Default for PlannerConfig {
    fn default() -> Self {
        Self {
            tp_levels: vec![1, 2, 4, 8],
            hysteresis: 0.05,
            commit_horizon_s: 10.0,
            switch_cost: None,
            fairness_weighting: true,
            allow_colocated: true,
            allow_disaggregated: true,
            target_utilization: 0.85,
        }
    }
}

/// What one control-window step decided.
#[derive(Debug, Clone)]
pub struct PlanOutcome {
    /// The committed plan (the new one, or the current one kept).
    pub plan: Plan,
    pub changed: bool,
    /// Per-GPU commands for GPUs whose assignment changed.
    pub commands: Vec<GpuCommand>,
    /// Weighted goodput of the proposal and of the current plan, under the
    /// same (new) stats.
    pub proposed_objective: f64,
    pub current_objective: Option<f64>,
    pub estimates: Vec<TierEstimate>,
}

pub struct Planner {
    profile: Arc<Profile>,
    tiers: TierSet,
    cluster: Cluster,
    config: PlannerConfig,
    tp_levels: Vec<u32>,
    current: Option<Plan>,
}

impl Planner {
    pub fn new(profile: Arc<Profile>, tiers: TierSet, cluster: Cluster, config: PlannerConfig) -> Result<Self, PlanError> {
        if !(config.hysteresis.is_finite() && config.hysteresis >= 0.0) {
            return Err(PlanError::Config(format!(
                "hysteresis = {}: must be a finite number >= 0",
                config.hysteresis
            )));
        }
        if !(config.commit_horizon_s.is_finite() && config.commit_horizon_s >= 0.0) {
            return Err(PlanError::Config(format!(
                "commit_horizon_s = {}: must be a finite number >= 0",
                config.commit_horizon_s
            )));
        }
        if !(config.target_utilization > 0.0 && config.target_utilization <= 1.0) {
            return Err(PlanError::Config(format!(
                "target_utilization = {}: must be in (0, 1]",
                config.target_utilization
            )));
        }
        if !config.allow_colocated && !config.allow_disaggregated {
            return Err(PlanError::Config("both colocated and disaggregated groups are disabled".into()));
        }
        let largest_node = cluster.largest_node().min(MAX_GPUS_PER_NODE);
        let profile_levels = profile.tp_levels();
        let tp_levels: Vec<u32> = profile_levels
            .iter()
            .copied()
            .filter(|tp| tp.is_power_of_two() && config.tp_levels.contains(tp) && *tp <= largest_node)
            .collect();
        if tp_levels.is_empty() {
            return Err(PlanError::NoTpLevel {
                profile: profile_levels,
                allowed: config.tp_levels.clone(),
                largest_node,
            });
        }
        Ok(Self {
            profile,
            tiers,
            cluster,
            config,
            tp_levels,
            current: None,
        })
    }

    pub fn tiers(&self) -> &TierSet {
        &self.tiers
    }

    pub fn cluster(&self) -> &Cluster {
        &self.cluster
    }

    pub fn profile(&self) -> &Arc<Profile> {
        &self.profile
    }

    /// The switch cost the commit rule charges.
    pub fn switch_cost(&self) -> SwitchCost {
        self.config.switch_cost.unwrap_or_else(|| SwitchCost::for_profile(&self.profile))
    }

    /// TP levels in use: profile ∩ config ∩ node sizes.
    pub fn tp_levels(&self) -> &[u32] {
        &self.tp_levels
    }

    pub fn current(&self) -> Option<&Plan> {
        self.current.as_ref()
    }

    /// Forgets the current plan: the next step adopts its proposal.
    pub fn reset(&mut self) {
        self.current = None;
    }

    /// How `groups` serve the tiers under the current demand: as a pool
    /// the demand allows (of every tier first, `sharing::whole_pool`, then
    /// `sharing::pool_for`'s) when one member alone has groups of its own
    /// and could host it (every member's request then runs on that tier's
    /// groups), else per tier. The host is the one the groups belong to,
    /// not the one a new pool would take (the busiest): a committed pool
    /// judged with another host had no member serving it, so when two
    /// members' rates crossed the plan looked starved and was replaced by
    /// the same GPUs under the other host, window after window.
    fn sharing_of(&self, groups: &[(usize, Role, u32, u32)], estimates: &[TierEstimate]) -> Sharing {
        let tiers = self.tiers.tiers();
        let pool = sharing::pool_for(tiers, estimates);
        // The pool of every tier first: groups that all belong to a tier
        // that can host everyone serve everyone, not a pool that leaves a
        // tier its host does not lend to with nothing. Worked out only
        // where one tier with demand has all of their groups.
        let mut owners: Vec<usize> = groups.iter().map(|g| g.0).collect();
        owners.sort_unstable();
        owners.dedup();
        let mut busy_owners = owners.iter().filter(|&&t| estimates[t].stats.arrival_rate > 0.0);
        let one_owner = busy_owners.next().is_some() && busy_owners.next().is_none();
        let whole = one_owner.then(|| sharing::whole_pool(tiers, estimates, pool.as_ref())).flatten();
        for candidate in [whole, pool].into_iter().flatten() {
            let Sharing::Pooled { members, load, .. } = candidate else {
                continue;
            };
            let mut member_owners = owners.iter().copied().filter(|t| members.contains(t));
            let Some(host) = member_owners.next() else {
                continue;
            };
            if sharing::can_host(tiers, host, &members) && member_owners.next().is_none() {
                return Sharing::Pooled { host, members, load };
            }
        }
        owners
            .iter()
            .find_map(|&host| sharing::idle_host_pool(tiers, estimates, host, &owners))
            .unwrap_or(Sharing::PerTier)
    }

    pub fn estimate(&self, stats: &[TierStats]) -> Result<Vec<TierEstimate>, PlanError> {
        check_stats(self.tiers.tiers(), stats)?;
        Ok(estimate_all(
            &self.profile,
            self.tiers.tiers(),
            stats,
            &self.tp_levels,
            &self.cluster,
        ))
    }

    /// The plan the greedy would choose from scratch, without hysteresis.
    pub fn propose(&self, stats: &[TierStats]) -> Result<(Plan, Vec<TierEstimate>), PlanError> {
        let estimates = self.estimate(stats)?;
        let plan = self.best_proposal(&estimates);
        Ok((plan, estimates))
    }

    /// The best of the per-tier proposal and the pooled ones where the
    /// demand allows a pool (`sharing`). Where that leaves demand unserved
    /// and one tier's groups serve all (a pool's host, or the only tier
    /// with demand), also that tier's layout of the most capacity, found by
    /// enumeration (`layout_search`): the greedy's headroom rules are for
    /// demand it covers. Earlier candidates win ties. Where they leave
    /// demand unserved, a pool of every tier across their weights
    /// (`sharing::whole_pool`) is weighed too, with the starvation rule
    /// first (`across_weights`).
    fn best_proposal(&self, estimates: &[TierEstimate]) -> Plan {
        let tiers = self.tiers.tiers();
        let best = |candidates: Vec<Plan>| {
            candidates
                .into_iter()
                .map(|p| {
                    let v = objective(tiers, estimates, &p);
                    (p, v)
                })
                .reduce(|best, next| if next.1 > best.1 * (1.0 + 1e-9) { next } else { best })
                .expect("at least one candidate")
                .0
        };
        let per_tier_basis = self.basis(estimates, Sharing::PerTier);
        let mut candidates = vec![self.propose_at(estimates, &per_tier_basis, &self.tp_levels)];
        let pool = sharing::pool_for(tiers, estimates).map(|pool| self.basis(estimates, pool));
        if let Some(pool) = &pool {
            candidates.extend(self.pool_candidates(estimates, pool));
        }
        let mut greedy = best(candidates);
        if covers_demand(estimates, &greedy) {
            return greedy;
        }
        let whole_pool = sharing::whole_pool(tiers, estimates, pool.as_ref().map(|b| &b.sharing)).map(|pool| self.basis(estimates, pool));
        if let Some(whole_pool) = &whole_pool {
            greedy = across_weights(tiers, estimates, greedy, best(self.pool_candidates(estimates, whole_pool)));
            if covers_demand(estimates, &greedy) {
                return greedy;
            }
        }
        let whole = |pool: &&Basis<'_>| sharing::pools_every_tier_with_demand(&pool.sharing, estimates);
        let sole = match pool.iter().find(whole).or(whole_pool.as_ref()) {
            Some(basis) => match &basis.sharing {
                Sharing::Pooled { host, .. } => Some((*host, basis)),
                Sharing::PerTier => None,
            },
            None if pool.is_none() => sharing::sole_tier_with_demand(estimates).map(|t| (t, &per_tier_basis)),
            None => None,
        };
        let across = |basis: &Basis<'_>| whole_pool.as_ref().is_some_and(|w| w.sharing == basis.sharing);
        match sole.and_then(|(tier, basis)| Some((self.searched(estimates, basis, tier)?, across(basis)))) {
            Some((searched, true)) => across_weights(tiers, estimates, greedy, searched),
            Some((searched, false)) => best(vec![greedy, searched]),
            None => greedy,
        }
    }

    /// The greedy's plans for a pool: on all levels, and on each level
    /// alone where it pools every tier with demand (a mix of levels the
    /// greedy builds tier by tier can split GPUs that one level's groups
    /// use whole).
    fn pool_candidates(&self, estimates: &[TierEstimate], pool: &Basis<'_>) -> Vec<Plan> {
        let mut out = vec![self.propose_at(estimates, pool, &self.tp_levels)];
        if self.tp_levels.len() > 1 && sharing::pools_every_tier_with_demand(&pool.sharing, estimates) {
            out.extend(self.tp_levels.iter().map(|&tp| self.propose_at(estimates, pool, &[tp])));
        }
        out
    }

    /// All groups to `tier`, laid out by `layout_search` under `basis`.
    fn searched(&self, estimates: &[TierEstimate], basis: &Basis<'_>, tier: usize) -> Option<Plan> {
        let input = layout_search::SearchInput {
            estimate: &basis.planning[tier],
            tp_levels: &self.tp_levels,
            allow_colocated: self.config.allow_colocated,
            allow_disaggregated: self.config.allow_disaggregated,
            utilization: self.config.target_utilization,
        };
        let groups: Vec<(usize, Role, u32, u32)> = layout_search::best_layout(&input, &self.cluster)?
            .into_iter()
            .map(|(role, tp, first)| (tier, role, tp, first))
            .collect();
        Some(self.place_and_build(groups, estimates, basis))
    }

    /// What planning under `sharing` sees, worked out once per step.
    fn basis<'a>(&self, estimates: &'a [TierEstimate], sharing: Sharing) -> Basis<'a> {
        let planning = sharing::planning_estimates(
            &self.profile,
            self.tiers.tiers(),
            estimates,
            &sharing,
            (&self.tp_levels, &self.cluster),
        );
        Basis { sharing, planning }
    }

    /// The greedy's plan under `basis`, using only the TP levels `levels`
    /// (a subset of the planner's).
    fn propose_at(&self, estimates: &[TierEstimate], basis: &Basis<'_>, levels: &[u32]) -> Plan {
        let restricted: Vec<TierEstimate>;
        let planning = if levels.len() < self.tp_levels.len() {
            restricted = basis
                .planning
                .iter()
                .map(|e| TierEstimate {
                    per_tp: e.per_tp.iter().filter(|x| levels.contains(&x.tp)).copied().collect(),
                    ..e.clone()
                })
                .collect();
            &restricted[..]
        } else {
            &basis.planning[..]
        };
        let input = greedy::GreedyInput {
            profile: &self.profile,
            tiers: self.tiers.tiers(),
            estimates: planning,
            tp_levels: levels,
            fairness_weighting: self.config.fairness_weighting,
            allow_colocated: self.config.allow_colocated,
            allow_disaggregated: self.config.allow_disaggregated,
            utilization: self.config.target_utilization,
        };
        let chosen = greedy::assign(&input, Allocator::new(&self.cluster));
        let groups: Vec<(usize, Role, u32, u32)> = chosen.iter().map(|c| (c.tier, c.role, levels[c.tp_index], c.first_gpu)).collect();
        self.place_and_build(groups, estimates, basis)
    }

    /// The plan of `groups`, kept on their current GPUs where they exist.
    fn place_and_build(&self, groups: Vec<(usize, Role, u32, u32)>, estimates: &[TierEstimate], basis: &Basis<'_>) -> Plan {
        let placed = match &self.current {
            Some(cur) => placement::stable(&self.cluster, cur, &groups).unwrap_or(groups),
            None => groups,
        };
        self.build_plan(&placed, estimates, Some(basis))
    }

    /// One control-window step: propose, compare with the current plan under
    /// the same stats, commit the proposal if it wins by the margin.
    pub fn step(&mut self, stats: &[TierStats]) -> Result<PlanOutcome, PlanError> {
        let estimates = self.estimate(stats)?;
        let proposal = self.best_proposal(&estimates);
        let proposed_objective = objective(self.tiers.tiers(), &estimates, &proposal);
        let current = self.current.as_ref().map(|cur| {
            let refreshed = self.refresh(cur, &estimates);
            let obj = objective(self.tiers.tiers(), &estimates, &refreshed);
            (refreshed, obj)
        });
        let (plan, changed, current_objective) = match current {
            Some((refreshed, cur_obj)) => {
                let input = commit::CommitInput {
                    tiers: self.tiers.tiers(),
                    estimates: &estimates,
                    current: &refreshed,
                    proposal: &proposal,
                    current_objective: cur_obj,
                    proposed_objective,
                    hysteresis: self.config.hysteresis,
                    horizon_s: self.config.commit_horizon_s,
                    switch_cost: self.switch_cost(),
                    kv_bytes_per_token: self.profile.kv_bytes_per_token.unwrap_or(0) as f64,
                };
                let horizon_gain_rps = || {
                    self.gain_over_horizon(stats, &refreshed, &proposal)
                        .unwrap_or(proposed_objective - cur_obj)
                };
                if commit::worth_committing(&input, horizon_gain_rps) {
                    (proposal, true, Some(cur_obj))
                } else {
                    (refreshed, false, Some(cur_obj))
                }
            }
            None => (proposal, true, None),
        };
        let commands = diff::commands(self.current.as_ref(), &plan);
        let changed = changed && !commands.is_empty();
        self.current = Some(plan.clone());
        Ok(PlanOutcome {
            plan,
            changed,
            commands,
            proposed_objective,
            current_objective,
            estimates,
        })
    }

    /// The proposal's objective minus the current plan's at the rates
    /// expected over the commit horizon (`TierStats::rate_over`); None when
    /// no tier is in a burst that ends within it (the rates are the
    /// observed ones).
    fn gain_over_horizon(&self, stats: &[TierStats], current: &Plan, proposal: &Plan) -> Option<f64> {
        let horizon_s = self.config.commit_horizon_s;
        let expected: Vec<TierStats> = stats
            .iter()
            .map(|s| TierStats {
                arrival_rate: s.rate_over(horizon_s),
                ..*s
            })
            .collect();
        if expected.iter().zip(stats).all(|(e, s)| e.arrival_rate >= s.arrival_rate) {
            return None;
        }
        // Checked as `stats` were; a rate over the horizon lies between the
        // sustained and the observed one.
        let estimates = estimate_all(&self.profile, self.tiers.tiers(), &expected, &self.tp_levels, &self.cluster);
        let value = |plan: &Plan| objective(self.tiers.tiers(), &estimates, &self.refresh(plan, &estimates));
        Some(value(proposal) - value(current))
    }

    /// The current plan's groups with capacities and caps recomputed under
    /// new estimates.
    fn refresh(&self, plan: &Plan, estimates: &[TierEstimate]) -> Plan {
        let groups: Vec<(usize, Role, u32, u32)> = plan.groups.iter().map(|g| (g.tier, g.role, g.tp, g.first_gpu)).collect();
        self.build_plan(&groups, estimates, None)
    }

    /// Groups sized by their tier's estimate; a pool's host's groups by the
    /// host's estimate for the merged load (the host's SLO, everyone's
    /// prompts), so their caps admit the prompts the pool is credited for:
    /// sized by the host's own estimate, a pool kept under its short-prompt
    /// member turned the long prompts it was counted as serving away. A
    /// pool's capacity is counted in requests of the merged load, and each
    /// tier credited as the groups serve it (`sharing_of`).
    /// `known`: a basis already worked out for these estimates, used when
    /// it is how the groups serve the tiers.
    fn build_plan(&self, groups: &[(usize, Role, u32, u32)], estimates: &[TierEstimate], known: Option<&Basis<'_>>) -> Plan {
        let tiers = self.tiers.tiers();
        let sharing = self.sharing_of(groups, estimates);
        // The host's estimate for the merged load (none per tier).
        let worked_out;
        let merged_host = match &sharing {
            Sharing::PerTier => None,
            Sharing::Pooled { host, .. } => {
                let planning = match known {
                    Some(b) if b.sharing == sharing => &b.planning,
                    _ => {
                        worked_out = self.basis(estimates, sharing.clone()).planning;
                        &worked_out
                    }
                };
                Some((*host, &planning[*host]))
            }
        };
        let target = self.config.target_utilization;
        let mut prefill_slack = vec![0.0; tiers.len()];
        let mut out: Vec<GroupPlan> = groups
            .iter()
            .map(|&(tier, role, tp, first_gpu)| {
                let sized_by = match merged_host {
                    Some((host, merged)) if host == tier => merged,
                    _ => &estimates[tier],
                };
                let e = sized_by.at(tp).expect("planned TP levels were estimated");
                let g = group_plan(&self.profile, &tiers[tier], e, tier, role, first_gpu);
                if role == Role::Prefill && g.slo_budget > 0 {
                    prefill_slack[tier] += queueing::slack_prompts(&tiers[tier], &e.prefill).unwrap_or(f64::INFINITY);
                }
                g
            })
            .collect();
        for g in &mut out {
            g.capacity_rps *= match g.role {
                Role::Prefill => queueing::prefill_utilization(prefill_slack[g.tier], target),
                role => counted_utilization(role, target),
            };
        }
        out.sort_by_key(|g| g.first_gpu);
        let mut tier_served_share = diff::tier_served_shares(tiers.len(), &out);
        self.size_decode_for_served_prompts(&mut out, estimates, &sharing, &tier_served_share);
        let mut tier_capacity_rps = diff::tier_capacities(tiers.len(), &out, &self.cluster);
        sharing::credit_members(&mut tier_capacity_rps, &mut tier_served_share, estimates, &sharing);
        Plan {
            num_gpus: self.cluster.num_gpus(),
            groups: out,
            tier_capacity_rps,
            tier_served_share,
            pooled_on: sharing::pooled_on(tiers.len(), &sharing),
        }
    }

    /// Decode groups counted for the prompts the plan's prefill-capable
    /// groups serve (`shares`, per tier): where they cap shorter prompts
    /// than the tier's best TP level would, decode holds shorter contexts
    /// and runs larger batches than the estimate's decode, which is sized
    /// for that level's subset. Without this a layout whose prefill serves
    /// fewer prompts was charged for decode contexts it never sees, and
    /// lost to layouts whose estimate was not (long prompts, 14B on 8 H100:
    /// a TP4 pool counted at 6.3 req/s of decode against 9.9).
    fn size_decode_for_served_prompts(&self, groups: &mut [GroupPlan], estimates: &[TierEstimate], sharing: &Sharing, shares: &[f64]) {
        let tiers = self.tiers.tiers();
        let mut memo: Vec<(usize, u32, f64)> = Vec::new();
        for g in groups.iter_mut().filter(|g| g.role == Role::Decode && g.slo_budget > 0) {
            let share = shares[g.tier];
            let stats = match sharing {
                Sharing::Pooled { host, load, .. } if *host == g.tier => &**load,
                _ => &estimates[g.tier].stats,
            };
            if share >= 1.0 {
                continue;
            }
            let capacity = match memo.iter().find(|(t, tp, _)| *t == g.tier && *tp == g.tp) {
                Some(&(_, _, c)) => c,
                None => {
                    let c = estimator::decode_within_share(&self.profile, &tiers[g.tier], stats, g.tp, share).throughput_rps
                        * counted_utilization(Role::Decode, self.config.target_utilization);
                    memo.push((g.tier, g.tp, c));
                    c
                }
            };
            g.capacity_rps = g.capacity_rps.max(capacity);
        }
    }
}

/// The share of a group's SLO-compliant throughput a plan is valued at
/// (prefill groups: `queueing::prefill_utilization`, at most `target`).
/// Colocated groups at `target`: near saturation, queueing alone breaks
/// the TTFT. A decode group's throughput is that of its largest
/// batch within the TPOT, so a full group still meets it, and a request
/// that finds no slot waits at the hand-off only as long as its TPOT
/// budget allows: it delivers the whole. Valued at `target` too, a
/// capacity-bound prefill/decode pair ranked below prefill layouts that
/// served less. The greedy still buys decode with `target`'s headroom.
fn counted_utilization(role: Role, target: f64) -> f64 {
    match role {
        Role::Decode => 1.0,
        Role::Prefill | Role::Colocated => target,
    }
}

/// A way of sharing and the estimates planning under it sees (`sharing`).
struct Basis<'a> {
    sharing: Sharing,
    planning: Cow<'a, [TierEstimate]>,
}

/// `best` against `pooled`, a plan that pools every tier across their
/// weights: taken where it leaves fewer SLO tiers with demand without SLO
/// capacity than `best`, or as few and it is worth more. None may be left
/// without, and the host's SLO can need a group that per-tier groups
/// leave no room for (five tiers on 8 A100, 14B: voice decodes in time
/// only at TP8). Valued like any other plan, it lets tiers of unequal
/// weights share groups where groups of their own each run half empty
/// (five tiers on 8 H100 at 120 req/s: 78.5 -> 98.5 req/s). Where it
/// replaces a background tier's group, the requests queued there move to
/// a new group over the same GPUs (`Dispatcher::settle_stopped`); placed
/// anew against the pool's budgets they were shed (4 A100, weights 2 / 1
/// / 0.5, at a load drop: 41.3 -> 30.3 req/s at 80 req/s).
fn across_weights(tiers: &[Tier], estimates: &[TierEstimate], best: Plan, pooled: Plan) -> Plan {
    // A background tier takes spare room wherever it has no group.
    let starved = |plan: &Plan| commit::starved_tiers(estimates, plan).filter(|&t| !tiers[t].background).count();
    let (pooled_starves, best_starves) = (starved(&pooled), starved(&best));
    let worth_more = || objective(tiers, estimates, &pooled) > objective(tiers, estimates, &best) * (1.0 + 1e-9);
    if pooled_starves < best_starves || (pooled_starves == best_starves && worth_more()) {
        pooled
    } else {
        best
    }
}

/// Whether the plan serves every tier's demand but for the greedy's
/// `COVERED_SHORTFALL`.
fn covers_demand(estimates: &[TierEstimate], plan: &Plan) -> bool {
    estimates
        .iter()
        .zip(plan.tier_capacity_rps.iter().zip(&plan.tier_served_share))
        .all(|(e, (&capacity, &share))| {
            let servable = e.best_served_share() * e.stats.arrival_rate;
            e.stats.served_within(1.0, capacity, share) >= (1.0 - greedy::COVERED_SHORTFALL) * servable - 1e-9
        })
}

fn check_stats(tiers: &[Tier], stats: &[TierStats]) -> Result<(), PlanError> {
    if stats.len() != tiers.len() {
        return Err(PlanError::StatsCount {
            got: stats.len(),
            expected: tiers.len(),
        });
    }
    for (t, s) in tiers.iter().zip(stats) {
        s.validate().map_err(|reason| PlanError::BadStats {
            tier: t.name.clone(),
            reason,
        })?;
    }
    Ok(())
}

/// A group's capacity, batch caps and SLO budget from its estimate. A group
/// whose stage cannot meet the tier's SLO has no budget (it takes a request
/// only when idle) and runs at the profile's SLO-agnostic caps.
pub fn group_plan(profile: &Profile, tier: &Tier, e: &TpEstimate, tier_id: usize, role: Role, first_gpu: u32) -> GroupPlan {
    let stage = match role {
        Role::Prefill => e.prefill,
        Role::Decode => e.decode,
        Role::Colocated => e.colocated,
    };
    let slo_budget = if !stage.feasible() {
        0
    } else {
        match role {
            // Prompt tokens that can be outstanding (running and queued)
            // before the newest one's TTFT runs out: as many batches as fit
            // in the TTFT, and at least the estimator's one running plus one
            // queued. A batch far shorter than the TTFT (its size bound by
            // the profile, not the SLO) can have several queued behind it.
            Role::Prefill => (f64::from(stage.batch_tokens) * queueing::batches_in_ttft(tier, &stage)) as u64,
            Role::Decode => u64::from(e.decode_held.batch_requests),
            // Prompt tokens the chunked prefill can absorb before the newest
            // request's TTFT runs out (two batches for background tiers).
            Role::Colocated => {
                let iterations = tier.ttft_ms.map_or(2.0, |ttft| (ttft / stage.batch_ms - 1.0).floor().max(1.0));
                (f64::from(stage.batch_tokens) * iterations) as u64
            }
        }
    };
    let (batch_cap, token_cap) = if stage.feasible() && role == Role::Prefill {
        // The TTFT binds the tokens of a prefill batch, not its prompts:
        // prompts shorter than the mean share a batch of the same tokens.
        let (most_prompts, _) = profile.throughput_caps(e.tp).expect("planned TP levels come from the profile");
        (stage.batch_requests.max(most_prompts), stage.batch_tokens)
    } else if stage.feasible() && role == Role::Decode {
        (e.decode_held.batch_requests.max(1), 0)
    } else if stage.feasible() {
        (stage.batch_requests.max(1), stage.batch_tokens)
    } else {
        profile.throughput_caps(e.tp).expect("planned TP levels come from the profile")
    };
    let (max_prompt_tokens, served_share) = if stage.feasible() && role.takes_prefill() {
        (stage.max_prompt_tokens, stage.served_share)
    } else {
        (0, 1.0)
    };
    GroupPlan {
        tier: tier_id,
        role,
        tp: e.tp,
        first_gpu,
        capacity_rps: stage.throughput_rps,
        batch_cap,
        token_cap: if role == Role::Decode { 0 } else { token_cap },
        slo_budget,
        max_prompt_tokens,
        served_share,
    }
}

#[cfg(test)]
mod tests;
