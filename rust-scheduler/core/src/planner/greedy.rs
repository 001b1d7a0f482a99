//! Weighted greedy assignment of GPU groups to tiers (DESIGN.md §1.3).
//!
//! Phases, each repeatedly taking the best next TP group while GPUs remain:
//! 0. every tier with demand gets one group, smallest feasible first, with
//!    the GPUs of its smallest SLO-capable group (a prefill+decode pair, or
//!    one colocated group) held back for each tier still waiting, so no
//!    tier starves;
//! 1. SLO tiers with unmet demand: score = served gain / GPUs, times the
//!    tier's weight and its unmet demand (the fairness weight). Served is
//!    E[min(rate, capacity)] over the tier's observed window-to-window rate
//!    variation (`rate_shape`): capacity beyond a steady tier's demand, or
//!    beyond a bursty tier's typical window, serves little;
//! 2. background tiers with unmet demand, scored the same way;
//! 3. leftovers: headroom to the tier with the least capacity per unit of
//!    weighted demand, using its most GPU-efficient move; where no move
//!    adds capacity and no best-effort group would serve a request in
//!    time, prefill groups beside the binding decode groups
//!    (`prefill_headroom`).
//!
//! A tier's capacity is colocated + min(prefill, decode): a prefill group
//! only adds capacity while decode keeps up, so moves include a
//! prefill+decode pair. The greedy sums each stage over the cluster; the
//! plan it builds is valued node by node (`diff::tier_capacities`), and
//! candidates are compared on that (valued per node inside the greedy too,
//! 70B on two nodes of 8 H200 at 40 req/s served 28.9 -> 26.7 req/s, and a
//! planning step on 128 GPUs took 1.6x as long). It serves the share of
//! the tier's prompts its best prefill-capable group can prefill in time
//! (`served_share`: a larger TP level takes longer prompts); demand is
//! covered when what it serves reaches the share the best TP level could.
//!
//! Placement: a prefilled request's KV cannot leave its node, so a pair
//! goes on one node, and a lone prefill (decode) group only on a node with
//! a decode (prefill) group of its tier; the move is refused otherwise.
//! Placed anywhere, a prefill group on a node without its tier's decode
//! groups decoded its prompts itself, outside any decode budget (14B on two
//! nodes of 8 H100 at 40 req/s: batches of 185 at 16 ms a step against a
//! 10 ms TPOT, 1,464 chat TPOT misses).

use super::fairness;
use crate::estimator::TierEstimate;
use crate::plan::Role;
use crate::profile::Profile;
use crate::prompt_lengths::best_served_share;
use crate::tiers::Tier;
use crate::topology::Allocator;

/// A group chosen by the greedy, with where the greedy put it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Chosen {
    pub tier: usize,
    pub role: Role,
    pub tp_index: usize,
    pub first_gpu: u32,
}

#[derive(Debug, Clone, Copy)]
enum Move {
    Single(Role, usize),
    Pair(usize, usize),
}

#[derive(Debug, Clone, Copy, Default)]
struct Capacity {
    colocated: f64,
    prefill: f64,
    decode: f64,
    /// Best served share of the prefill-capable groups; 0 with none.
    share: f64,
}

impl Capacity {
    fn total(&self) -> f64 {
        self.colocated + self.prefill.min(self.decode)
    }

    fn add(&mut self, role: Role, throughput: f64, share: f64) {
        match role {
            Role::Prefill => self.prefill += throughput,
            Role::Decode => self.decode += throughput,
            Role::Colocated => self.colocated += throughput,
        }
        if role.takes_prefill() {
            self.share = self.share.max(share);
        }
    }

    /// The share `served_within` takes (1 before any prefill-capable group:
    /// the capacity is 0 then anyway).
    fn served_share(&self) -> f64 {
        best_served_share([self.share])
    }
}

pub struct GreedyInput<'a> {
    pub profile: &'a Profile,
    pub tiers: &'a [Tier],
    pub estimates: &'a [TierEstimate],
    pub tp_levels: &'a [u32],
    /// Scale scores by unmet demand (DESIGN's w_t). Off only in ablations.
    pub fairness_weighting: bool,
    pub allow_colocated: bool,
    pub allow_disaggregated: bool,
    /// Scales every stage throughput (planned headroom).
    pub utilization: f64,
}

struct State<'a> {
    input: &'a GreedyInput<'a>,
    alloc: Allocator,
    caps: Vec<Capacity>,
    chosen: Vec<Chosen>,
    /// Per tier, what its capacity serves now (`served` of `caps[t]`),
    /// kept with `caps` so each step reads it instead of integrating again.
    served_now: Vec<f64>,
    /// Factor on every tier's demand (a uniform surge; 1 = as observed).
    scale: f64,
    /// Per tier, the most of its prompts any TP level serves in time.
    best_share: Vec<f64>,
}

/// One tier's move values at its current capacity: per move, the capacity
/// it adds and the extra requests served. Valid until the tier's capacity
/// changes.
struct TierMoves {
    gain_and_served: Vec<(f64, f64)>,
}

impl<'a> State<'a> {
    /// (throughput, served share) of one group in `role` at a TP level.
    fn stage(&self, tier: usize, role: Role, tp_index: usize) -> (f64, f64) {
        let e = &self.input.estimates[tier].per_tp[tp_index];
        let s = match role {
            Role::Prefill => e.prefill,
            Role::Decode => e.decode,
            Role::Colocated => e.colocated,
        };
        (self.input.utilization * s.throughput_rps, s.served_share)
    }

    fn demand(&self, tier: usize) -> f64 {
        self.input.estimates[tier].stats.arrival_rate * self.scale
    }

    /// The demand the best TP level could serve in time.
    fn servable_demand(&self, tier: usize) -> f64 {
        self.demand(tier) * self.best_share[tier]
    }

    /// Requests per second a capacity serves of the tier's (scaled) demand,
    /// its window-to-window variation and the share of prompts it can serve
    /// in time included (`TierStats::served_within`).
    fn served(&self, tier: usize, capacity: &Capacity) -> f64 {
        self.input.estimates[tier]
            .stats
            .served_within(self.scale, capacity.total(), capacity.served_share())
    }

    /// Servable demand the tier's capacity does not serve.
    fn unmet(&self, tier: usize) -> f64 {
        (self.servable_demand(tier) - self.served_now[tier]).max(0.0)
    }

    /// Whether the tier is planned below the plans' fairness aim (`fairness`).
    fn short_of_fair_floor(&self, tier: usize) -> bool {
        let n = self.input.tiers.len();
        let total_demand: f64 = (0..n).map(|t| self.servable_demand(t)).sum();
        let total_served: f64 = self.served_now.iter().sum();
        fairness::below(
            fairness::FAIR_PLANNED_FRACTION,
            self.servable_demand(tier),
            self.served_now[tier],
            total_demand,
            total_served,
        )
    }

    /// Whether the unserved part is within `COVERED_SHORTFALL` of the
    /// servable demand.
    fn covered(&self, tier: usize) -> bool {
        self.unmet(tier) <= COVERED_SHORTFALL * self.servable_demand(tier) + 1e-9
    }

    fn gpus(&self, m: Move) -> u32 {
        let tp = |i: usize| self.input.tp_levels[i];
        match m {
            Move::Single(_, i) => tp(i),
            Move::Pair(p, d) => tp(p) + tp(d),
        }
    }

    /// The tier's capacity after the move.
    fn after(&self, tier: usize, m: Move) -> Capacity {
        let mut c = self.caps[tier];
        let mut add = |role: Role, i: usize| {
            let (x, share) = self.stage(tier, role, i);
            c.add(role, x, share);
        };
        match m {
            Move::Single(role, i) => add(role, i),
            Move::Pair(p, d) => {
                add(Role::Prefill, p);
                add(Role::Decode, d);
            }
        }
        c
    }

    /// Capacity the move adds.
    fn gain(&self, tier: usize, m: Move) -> f64 {
        self.after(tier, m).total() - self.caps[tier].total()
    }

    fn fits(&self, m: Move) -> bool {
        let tp = |i: usize| self.input.tp_levels[i];
        match m {
            Move::Single(_, i) => self.alloc.available(tp(i)) >= 1,
            Move::Pair(p, d) if p == d => self.alloc.available(tp(p)) >= 2,
            Move::Pair(p, d) => self.alloc.available(tp(p)) >= 1 && self.alloc.available(tp(d)) >= 1,
        }
    }

    fn moves(&self) -> Vec<Move> {
        let n = self.input.tp_levels.len();
        let mut out = Vec::with_capacity(n * (3 + n));
        for i in 0..n {
            if self.input.allow_colocated {
                out.push(Move::Single(Role::Colocated, i));
            }
            if self.input.allow_disaggregated {
                out.push(Move::Single(Role::Prefill, i));
                out.push(Move::Single(Role::Decode, i));
            }
        }
        if self.input.allow_disaggregated {
            for p in 0..n {
                for d in 0..n {
                    out.push(Move::Pair(p, d));
                }
            }
        }
        out
    }

    /// Places the move's groups (largest first); undoes and returns false if
    /// fragmentation prevents it.
    fn apply(&mut self, tier: usize, m: Move) -> bool {
        let parts: Vec<(Role, usize)> = match m {
            Move::Single(role, i) => vec![(role, i)],
            Move::Pair(p, d) => {
                let mut v = vec![(Role::Prefill, p), (Role::Decode, d)];
                v.sort_by_key(|&(_, i)| std::cmp::Reverse(self.input.tp_levels[i]));
                v
            }
        };
        let placed = match self.partner_nodes(tier, &parts) {
            Some(nodes) => self.place_on_one_node(tier, &parts, &nodes),
            None => self.place_anywhere(tier, &parts),
        };
        let Some(placed) = placed else {
            return false;
        };
        for c in placed {
            let (x, share) = self.stage(tier, c.role, c.tp_index);
            self.caps[tier].add(c.role, x, share);
            self.chosen.push(c);
        }
        self.served_now[tier] = self.served(tier, &self.caps[tier]);
        true
    }

    /// The nodes the parts may go on, all on one of them: a prefill+decode
    /// pair on any node, a lone prefill or decode group only beside its
    /// tier's groups of the other role (a prefilled request's KV cannot
    /// leave its node; one on a node without a decode group of its tier
    /// decodes on the prefill group, outside any decode budget). None: no
    /// constraint (a colocated group, or the tier's first of its kind).
    fn partner_nodes(&self, tier: usize, parts: &[(Role, usize)]) -> Option<Vec<usize>> {
        if parts.len() > 1 {
            return Some((0..self.alloc.num_nodes()).collect());
        }
        let want = match parts[0].0 {
            Role::Prefill => Role::Decode,
            Role::Decode => Role::Prefill,
            Role::Colocated => return None,
        };
        let mut nodes: Vec<usize> = self
            .chosen
            .iter()
            .filter(|c| c.tier == tier && c.role == want)
            .filter_map(|c| self.alloc.node_of(c.first_gpu))
            .collect();
        nodes.sort_unstable();
        nodes.dedup();
        (!nodes.is_empty()).then_some(nodes)
    }

    /// The parts together on the first of `nodes` with room for all.
    fn place_on_one_node(&mut self, tier: usize, parts: &[(Role, usize)], nodes: &[usize]) -> Option<Vec<Chosen>> {
        nodes
            .iter()
            .find_map(|&node| self.place_with(tier, parts, |a, tp| a.allocate_on(node, tp)))
    }

    /// The parts wherever the allocator fits them best.
    fn place_anywhere(&mut self, tier: usize, parts: &[(Role, usize)]) -> Option<Vec<Chosen>> {
        self.place_with(tier, parts, Allocator::allocate)
    }

    /// Every part at the GPUs `pick` takes, or none (what it took is given
    /// back).
    fn place_with(
        &mut self,
        tier: usize,
        parts: &[(Role, usize)],
        pick: impl Fn(&mut Allocator, u32) -> Option<u32>,
    ) -> Option<Vec<Chosen>> {
        let mut placed = Vec::with_capacity(parts.len());
        for &(role, i) in parts {
            match pick(&mut self.alloc, self.input.tp_levels[i]) {
                Some(first) => placed.push(Chosen {
                    tier,
                    role,
                    tp_index: i,
                    first_gpu: first,
                }),
                None => {
                    for c in &placed {
                        self.alloc.release(c.first_gpu, self.input.tp_levels[c.tp_index]);
                    }
                    return None;
                }
            }
        }
        Some(placed)
    }

    fn tier_moves(&self, tier: usize, moves: &[Move]) -> TierMoves {
        let before = self.caps[tier].total();
        let served_now = self.served_now[tier];
        let gain_and_served = moves
            .iter()
            .map(|&m| {
                let after = self.after(tier, m);
                let gain = after.total() - before;
                let served = if gain > 0.0 { self.served(tier, &after) - served_now } else { 0.0 };
                (gain, served)
            })
            .collect();
        TierMoves { gain_and_served }
    }

    /// Repeatedly applies the best-scoring move over `tiers`; stops when no
    /// move has a positive score. A move's score: the requests it adds to
    /// those served, per GPU, times the tier's weight, its unmet demand (the
    /// fairness weight, unless disabled) and `factor` (0 leaves the tier
    /// out; computed once per tier and step, as is everything but the
    /// move's own gain).
    fn run(&mut self, tiers: &[usize], moves: &[Move], factor: impl Fn(&Self, usize) -> f64) {
        let mut blocked: Vec<(usize, usize)> = Vec::new();
        let mut fits = vec![false; moves.len()];
        let gpus: Vec<f64> = moves.iter().map(|&m| f64::from(self.gpus(m))).collect();
        // Only the tier a move went to changes its move values.
        let mut values: Vec<Option<TierMoves>> = (0..self.input.tiers.len()).map(|_| None).collect();
        loop {
            for (f, &m) in fits.iter_mut().zip(moves) {
                *f = self.fits(m);
            }
            let mut best: Option<((f64, f64), usize, usize)> = None;
            for &t in tiers {
                let k = factor(self, t);
                if k <= 0.0 {
                    continue;
                }
                let fairness = if self.input.fairness_weighting { self.unmet(t) } else { 1.0 };
                let w = k * self.input.tiers[t].weight * fairness;
                let tier_values = values[t].get_or_insert_with(|| self.tier_moves(t, moves));
                for (mi, &(gain, served)) in tier_values.gain_and_served.iter().enumerate() {
                    if gain <= 0.0 || !fits[mi] || blocked.contains(&(t, mi)) {
                        continue;
                    }
                    // Ties (several moves cover the unmet demand) go to the
                    // move with the most capacity per GPU.
                    let s = (w * served / gpus[mi], gain / gpus[mi]);
                    if s.0 > 0.0 && best.is_none_or(|(b, _, _)| s > b) {
                        best = Some((s, t, mi));
                    }
                }
            }
            let Some((_, t, mi)) = best else { return };
            if self.apply(t, moves[mi]) {
                values[t] = None;
                blocked.clear();
            } else {
                blocked.push((t, mi));
            }
        }
    }
}

/// Runs all phases. `alloc` starts empty (all GPUs free).
///
/// When the cluster covers the demand, the plan is made for the largest
/// uniform surge of the observed mix that the cluster can still cover
/// (every tier's demand scaled by the same factor), so the headroom is
/// spread over tiers and stages in proportion and built from the groups
/// that are efficient at that load (e.g. a TP2 decode group rather than two
/// TP1 ones that only fit today's rate): bursts meet capacity, not a queue.
///
/// Fairness floor (`fairness`): while a tier is planned below it, its moves
/// come first.
pub fn assign(input: &GreedyInput, alloc: Allocator) -> Vec<Chosen> {
    let base = assign_scaled(input, alloc.clone(), 1.0);
    let must_cover = base.covered.clone();
    // Only when the observed demand is covered: short of GPUs, the plan for
    // today's demand is the one to run.
    if base.gpus_used == 0 || must_cover.contains(&false) {
        return base.finish();
    }
    let covers = |o: &Outcome| must_cover.iter().zip(&o.covered).all(|(&must, &is)| !must || is);
    let free = f64::from(alloc.free_gpus());
    // The largest surge on a short ladder that the cluster still covers.
    for scale in SURGE_LADDER {
        if fewest_gpus_to_cover(input, scale) > free {
            continue;
        }
        let tried = assign_scaled(input, alloc.clone(), scale);
        if covers(&tried) {
            return tried.finish();
        }
    }
    base.finish()
}

/// A lower bound on the GPUs that cover every tier's demand scaled by
/// `scale`: each tier at its most GPU-efficient rate, colocated or as a
/// prefill+decode mix. A surge above what the cluster has cannot be covered,
/// so the greedy need not try it (the bound errs low: same decisions).
fn fewest_gpus_to_cover(input: &GreedyInput, scale: f64) -> f64 {
    let needed: f64 = input
        .estimates
        .iter()
        .map(|est| {
            let demand = est.stats.arrival_rate * scale;
            if demand <= 0.0 {
                return 0.0;
            }
            let (mut colocated, mut prefill, mut decode) = (0.0_f64, 0.0_f64, 0.0_f64);
            for (e, &tp) in est.per_tp.iter().zip(input.tp_levels) {
                let per_gpu = input.utilization / f64::from(tp);
                colocated = colocated.max(per_gpu * e.colocated.throughput_rps);
                prefill = prefill.max(per_gpu * e.prefill.throughput_rps);
                decode = decode.max(per_gpu * e.decode.throughput_rps);
            }
            let mut best = 0.0_f64;
            if input.allow_colocated {
                best = best.max(colocated);
            }
            if input.allow_disaggregated && prefill + decode > 0.0 {
                best = best.max(prefill * decode / (prefill + decode));
            }
            // Covered means at most COVERED_SHORTFALL unserved.
            let to_serve = (1.0 - COVERED_SHORTFALL) * demand * est.best_served_share();
            if best > 0.0 {
                to_serve / best
            } else {
                f64::INFINITY
            }
        })
        .sum();
    // Rounding in the greedy's sums must never turn the bound into a refusal.
    needed * (1.0 - 1e-9) - 1e-6
}

/// Score factor that puts a tier short of the fairness floor first.
const FLOOR_PRIORITY: f64 = 1e6;

/// A tier counts as covered when at most this fraction of its demand goes
/// unserved (a bursty tier's busiest windows may exceed any capacity).
pub(super) const COVERED_SHORTFALL: f64 = 0.01;

/// Surges tried, largest first (each a re-plan): headroom for a burst of
/// 4x the observed mix, else 2x, else 1.4x.
const SURGE_LADDER: [f64; 3] = [4.0, 2.0, 1.4];

/// A greedy run up to its leftovers: the demand-driven phases decide which
/// surge is planned for; only the plan kept gets its leftovers handed out.
struct Outcome<'a> {
    state: State<'a>,
    /// GPUs the demand-driven phases used (before leftovers).
    gpus_used: u32,
    /// Per tier, whether its (scaled) demand is covered.
    covered: Vec<bool>,
    slo: Vec<usize>,
    background: Vec<usize>,
    moves: Vec<Move>,
}

impl Outcome<'_> {
    /// Hands out the leftover GPUs and returns the groups.
    fn finish(mut self) -> Vec<Chosen> {
        phase3_leftovers(&mut self.state, &self.slo, &self.background, &self.moves);
        self.state.chosen
    }
}

fn assign_scaled<'a>(input: &'a GreedyInput<'a>, alloc: Allocator, scale: f64) -> Outcome<'a> {
    let total = alloc.free_gpus();
    let mut s = State {
        input,
        alloc,
        caps: vec![Capacity::default(); input.tiers.len()],
        chosen: Vec::new(),
        served_now: vec![0.0; input.tiers.len()],
        scale,
        best_share: input.estimates.iter().map(|e| e.best_served_share()).collect(),
    };
    for t in 0..input.tiers.len() {
        s.served_now[t] = s.served(t, &Capacity::default());
    }
    let moves = s.moves();
    let slo: Vec<usize> = (0..input.tiers.len()).filter(|&t| !input.tiers[t].background).collect();
    let background: Vec<usize> = (0..input.tiers.len()).filter(|&t| input.tiers[t].background).collect();

    phase0_one_group_each(&mut s, &slo, &background, &moves);
    let factor = |s: &State, t: usize| {
        if s.covered(t) {
            0.0
        } else if s.short_of_fair_floor(t) {
            FLOOR_PRIORITY
        } else {
            1.0
        }
    };
    s.run(&slo, &moves, factor);
    s.run(&background, &moves, factor);
    let gpus_used = total - s.alloc.free_gpus();
    let covered = (0..input.tiers.len()).map(|t| s.covered(t)).collect();
    Outcome {
        state: s,
        gpus_used,
        covered,
        slo,
        background,
        moves,
    }
}

fn phase0_one_group_each(s: &mut State, slo: &[usize], background: &[usize], moves: &[Move]) {
    let by_load = |tiers: &[usize]| {
        let mut v: Vec<usize> = tiers.iter().copied().filter(|&t| s.demand(t) > 0.0).collect();
        v.sort_by(|&a, &b| {
            let key = |t: usize| s.input.tiers[t].weight * s.demand(t);
            key(b).total_cmp(&key(a)).then(a.cmp(&b))
        });
        v
    };
    let order: Vec<usize> = by_load(slo).into_iter().chain(by_load(background)).collect();
    // A lone prefill or decode group serves nothing; pairs do.
    let serving = |m: &Move| !matches!(m, Move::Single(Role::Prefill | Role::Decode, _));
    // The fewest GPUs that give each tier SLO capacity (a smallest group
    // when nothing does: it is then served best effort).
    let need: Vec<u32> = order
        .iter()
        .map(|&t| {
            moves
                .iter()
                .filter(|m| serving(m) && s.gain(t, **m) > 0.0)
                .map(|&m| s.gpus(m))
                .min()
                .unwrap_or(s.input.tp_levels[0])
        })
        .collect();
    // With too few GPUs for every tier's need, the first `served` tiers get
    // theirs and the rest a smallest group each (best effort), as many as
    // fit; each tier holds back what the tiers after it get.
    let smallest = s.input.tp_levels[0];
    let free = s.alloc.free_gpus();
    let fit = order.len().min((free / smallest) as usize);
    let held_for = |k: usize| need.iter().take(k).sum::<u32>() + (fit - k) as u32 * smallest;
    let served = (0..=fit).take_while(|&k| held_for(k) <= free).last().unwrap_or(0);
    let gets: Vec<u32> = (0..order.len())
        .map(|i| {
            if i < served {
                need[i]
            } else if i < fit {
                smallest
            } else {
                0
            }
        })
        .collect();
    for (pos, &t) in order.iter().enumerate() {
        let held: u32 = gets.iter().skip(pos + 1).sum();
        let budget = s.alloc.free_gpus().saturating_sub(held);
        let mut best: Option<((f64, f64), Move)> = None;
        for &m in moves {
            if !serving(&m) || s.gpus(m) > budget || !s.fits(m) {
                continue;
            }
            let after = s.after(t, m);
            let gain = after.total() - s.caps[t].total();
            let gpus = f64::from(s.gpus(m));
            let score = ((s.served(t, &after) - s.served_now[t]) / gpus, gain / gpus);
            if gain > 0.0 && best.is_none_or(|(b, _)| score > b) {
                best = Some((score, m));
            }
        }
        let placed = best.is_some_and(|(_, m)| s.apply(t, m));
        if !placed && budget >= 1 {
            // Nothing meets the SLO within budget: a best-effort group.
            let smallest = 0;
            s.apply(t, Move::Single(Role::Colocated, smallest));
        }
    }
}

fn phase3_leftovers(s: &mut State, slo: &[usize], background: &[usize], moves: &[Move]) {
    let with_demand = |tiers: &[usize]| tiers.iter().copied().filter(|&t| s.demand(t) > 0.0).collect::<Vec<_>>();
    let mut takers = with_demand(slo);
    if takers.is_empty() {
        takers = with_demand(background);
    }
    let any_demand = !takers.is_empty();
    if !any_demand {
        takers = (0..s.input.tiers.len()).collect();
    }
    while s.alloc.free_gpus() > 0 {
        // Least covered first: capacity per weighted demand, or GPUs per
        // weight when nobody has demand (a fresh start spreads evenly).
        let coverage = |s: &State, t: usize| {
            let w = s.input.tiers[t].weight;
            if any_demand {
                s.caps[t].total() / (w * s.demand(t))
            } else {
                f64::from(
                    s.chosen
                        .iter()
                        .filter(|c| c.tier == t)
                        .map(|c| s.input.tp_levels[c.tp_index])
                        .sum::<u32>(),
                ) / w
            }
        };
        let mut order = takers.clone();
        order.sort_by(|&a, &b| coverage(s, a).total_cmp(&coverage(s, b)).then(a.cmp(&b)));
        let mut progressed = false;
        'tiers: for &t in &order {
            // The most capacity per GPU first (the first of equals), and the
            // rest in that order only if fragmentation refuses it.
            let per_gpu = |m: Move| s.gain(t, m) / f64::from(s.gpus(m));
            let mut best: Option<(f64, Move)> = None;
            for &m in moves.iter().filter(|&&m| s.fits(m)) {
                let g = per_gpu(m);
                if g > 0.0 && best.is_none_or(|(b, _)| g > b) {
                    best = Some((g, m));
                }
            }
            let Some((_, first)) = best else { continue };
            if s.apply(t, first) {
                progressed = true;
                break 'tiers;
            }
            let mut ranked: Vec<(f64, Move)> = moves
                .iter()
                .filter(|&&m| s.fits(m))
                .map(|&m| (s.gain(t, m) / f64::from(s.gpus(m)), m))
                .filter(|&(g, _)| g > 0.0)
                .collect();
            ranked.sort_by(|a, b| b.0.total_cmp(&a.0));
            for (_, m) in ranked {
                if s.apply(t, m) {
                    progressed = true;
                    break 'tiers;
                }
            }
        }
        if !progressed {
            // No move adds SLO capacity, e.g. decode binds. Where even a
            // lone request decodes slower than the TPOT on the smallest
            // level, a best-effort group serves nothing in time; prefill
            // groups beside the decode-bound ones are then headroom: more
            // slack for their queue, and the prompts spread thinner.
            // Qwen2.5-32B on 8 A100 (three tiers, 25 req/s): two idle TP1
            // groups beside a TP4 decode group and TP1 prefill groups whose
            // TTFT held two prompts, a quarter of whose chat prompts missed
            // it; with the headroom 7.52 -> 8.01 req/s.
            if let Some((t, m)) = prefill_headroom(s, &order) {
                if s.apply(t, m) {
                    continue;
                }
            }
            // No tier can use what is left to meet an SLO: hand it out as
            // best-effort single-GPU groups, least covered tier first.
            let t = order[0];
            if !s.apply(t, Move::Single(Role::Colocated, 0)) {
                return;
            }
        }
    }
}

/// Where best-effort groups would serve nothing in time (a lone request on
/// the smallest TP level decodes slower than the least covered tier's
/// TPOT): the largest feasible prefill group that fits, for the first tier
/// in `order` whose decode capacity it can feed.
fn prefill_headroom(s: &State, order: &[usize]) -> Option<(usize, Move)> {
    let input = s.input;
    let first = *order.first()?;
    let e = &input.estimates[first].stats;
    let lone_step_ms = input
        .profile
        .decode_ms(input.tp_levels[0], 1.0, e.decode_context_tokens(e.mean_prompt_tokens));
    if input.tiers[first].tpot_ms.is_none_or(|tpot| lone_step_ms <= tpot) {
        return None;
    }
    order.iter().find_map(|&t| {
        let fitting = (0..input.tp_levels.len())
            .rev()
            .find(|&i| s.fits(Move::Single(Role::Prefill, i)) && s.stage(t, Role::Prefill, i).0 > 0.0);
        fitting
            .filter(|_| s.caps[t].decode > 0.0)
            .map(|i| (t, Move::Single(Role::Prefill, i)))
    })
}
