//! Goodput estimation: for a tier's SLOs and observed load, how many
//! requests per second one TP group can serve while meeting them, per role.
//!
//! The model (DESIGN.md §1), per TP level k, with L_in and L_out the tier's
//! mean prompt and output lengths:
//! - prompts served: a prefill-capable stage takes no prompt longer than it
//!   prefills within the TTFT alone (`max_prompt_tokens`, enforced by the
//!   dispatcher). It plans for all prompts, judged by their mean L_in, or,
//!   where that fails the TTFT, for the largest subset of the tier's
//!   prompt-length distribution (`PromptLengths`) that it serves in time,
//!   with that subset's mean as L_in and its share as `served_share`; the
//!   planner counts only that share as goodput. Planning for all prompts
//!   still sheds those past the cap: the whole set's share is that of the
//!   prompts up to it, read at finer points over the top 1/16
//!   (`PromptLengths::share_within`). Counted as served, that tail made a
//!   TP1 prefill group, whose cap is lower, look as good as a TP2 one (14B
//!   on 8 H100 at 0.7x the SLOs, 10 req/s: 8.58 -> 8.96);
//! - prefill: the largest batch of n prompts (n·L_in tokens) whose batch time
//!   T_p, after one batch of queueing, meets the TTFT gives X_p = n / T_p.
//!   The batch a prompt queues behind is size-biased: an arrival more
//!   likely finds a long prompt running, since it runs longer, so that batch
//!   holds n·L_in + (E[l²]/E[l] − E[l]) tokens (`Subset::excess_tokens`;
//!   none when the prompts are alike). With heavy-tailed prompts the whole
//!   set judged by 2·T_p(n·L_in) filled batches whose followers missed
//!   their TTFT (8B on 4 H100, three tiers, at 60 req/s: 31.7 -> 34.1);
//! - decode: the largest batch B whose step time T_d(B, ctx = L_in + R/2)
//!   is ≤ TPOT less the hand-off's share (`HANDOFF_WAIT_SHARE`), and whose
//!   KV fits, gives X_d = B / (L_out · T_d), with R the mean output of the
//!   requests a batch holds (E[o²]/E[o], `TierStats::resident_output_tokens`:
//!   long outputs stay longer); L_in here is the mean of the
//!   largest subset any TP level's prefill serves (decode never sees the
//!   prompts shed at dispatch). That is what the planner counts on; a
//!   decode group's batch and slots (`decode_held`) take the same rule
//!   with L_in the observed mean of the prompts lately prefilled
//!   (`TierStats::prefilled_prompt_tokens`), which under overload are
//!   shorter than the arrivals: a prefill group's token budget lets short
//!   prompts in where a long one no longer fits, and the long ones are
//!   shed. Slots sized for the arrivals' mean stood half empty then (14B on
//!   8 H100 at 100 req/s: 69.8 -> 72.1 req/s; a heavy-tailed 8B trace on
//!   4 A100 at 40 req/s: 11.5 -> 15.4), while planning for it moved GPUs
//!   on each shift of a noisy mean;
//! - colocated (chunked prefill): B decoding requests and prefill chunks of
//!   c tokens. c₀ = ⌈B·L_in/L_out⌉ keeps pace with the decodes in every
//!   iteration; a larger chunk (doublings of c₀, up to the whole prompt) is
//!   carried by a share c₀/c of them. Every iteration with a chunk,
//!   T_d(B) + T_p(c), must be ≤ TPOT (for a tier that no group serves
//!   that way, the mean step of a request of L_out steps that sees
//!   max(c₀/c, 1/L_out) of them with a chunk instead: TPOT is a
//!   per-request mean, `TpotRule`), and ⌈L_in/c⌉ of them after the one
//!   under way ≤ TTFT; X_c = B / (L_out · T̄) with the mean iteration
//!   T̄ = T_d(B) + (c₀/c)·T_p(c), best over B and c. A chunk's fixed cost
//!   is paid fewer times in larger chunks: with a loose TPOT and outputs
//!   much shorter than the prompts (a CPU profile, 1,000-token prompts, 32
//!   output tokens) the steady chunk of a few dozen tokens made colocation
//!   look infeasible where whole-prompt chunks serve it; with a tight TPOT
//!   the chunk stays as it was. Its batch cap is B plus the ⌈c/L_in⌉
//!   requests being prefilled, which hold batch slots too (without them a
//!   small-B group, e.g. short outputs after long prompts, ran at about
//!   half its estimate in replay).
//!
//! Background tiers have no SLO: each stage runs at its largest batch.

use crate::profile::Profile;
use crate::prompt_lengths::{self, PromptLengths, Subset};
use crate::quantiles::POINTS;
use crate::stats::TierStats;
use crate::tiers::{Tier, TierId};
use crate::topology::Cluster;

mod tpot_rule;
use tpot_rule::{Stages, TpotRule};

/// Share of a request's TPOT budget (TPOT × its output tokens) it may wait
/// for a decode slot after prefill: the wait comes after the first token,
/// so all of it is TPOT. The dispatcher waits this long at most; decode
/// batches are sized so their steps fit in the rest.
pub const HANDOFF_WAIT_SHARE: f64 = 0.05;

/// What one TP group achieves in one role for one tier.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct StageEstimate {
    /// SLO-compliant requests per second; 0 when the SLO cannot be met.
    pub throughput_rps: f64,
    /// Requests per batch (prefill: prompts; decode/colocated: running batch).
    pub batch_requests: u32,
    /// Prompt tokens per iteration (prefill batch, or colocated chunk).
    pub batch_tokens: u32,
    /// Time of one batch / iteration.
    pub batch_ms: f64,
    /// Share of the tier's prompts the stage serves in time (prefill and
    /// colocated; 1 for decode): the rest are too long for it.
    pub served_share: f64,
    /// Longest prompt the stage takes (prefill and colocated): the longest
    /// it prefills within the TTFT with nothing queued; 0: any.
    pub max_prompt_tokens: u32,
}

impl StageEstimate {
    pub fn feasible(&self) -> bool {
        self.throughput_rps > 0.0
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TpEstimate {
    pub tp: u32,
    pub prefill: StageEstimate,
    /// Decode for the tier's demand: what the planner counts on.
    pub decode: StageEstimate,
    /// Decode for the prompts that were prefilled lately
    /// (`TierStats::prefilled_prompt_tokens`; `decode` until observed): a
    /// decode group's batch and slots.
    pub decode_held: StageEstimate,
    pub colocated: StageEstimate,
}

#[derive(Debug, Clone, PartialEq)]
pub struct TierEstimate {
    pub tier: TierId,
    pub stats: TierStats,
    /// One entry per TP level the planner may use, ascending.
    pub per_tp: Vec<TpEstimate>,
}

/// A deployable unit for one tier, for reports and comparisons.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum CandidateMode {
    Colocated {
        tp: u32,
    },
    Disaggregated {
        prefill_tp: u32,
        decode_tp: u32,
        prefill_groups: u32,
        decode_groups: u32,
    },
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Candidate {
    pub mode: CandidateMode,
    pub gpus: u32,
    /// SLO-compliant requests per second of the whole unit.
    pub throughput_rps: f64,
    /// min(λ, throughput) / GPUs.
    pub goodput_efficiency: f64,
}

/// Largest stage group counts tried when balancing a disaggregated unit.
const MAX_GROUPS_PER_STAGE: u32 = 4;

impl TierEstimate {
    pub fn at(&self, tp: u32) -> Option<&TpEstimate> {
        self.per_tp.iter().find(|e| e.tp == tp)
    }

    /// The largest share of the tier's prompts any one prefill-capable
    /// stage serves in time (1 when none can serve any: nothing is then
    /// served for a reason other than prompt length).
    pub fn best_served_share(&self) -> f64 {
        prompt_lengths::best_served_share(
            self.per_tp
                .iter()
                .flat_map(|e| [e.prefill, e.colocated])
                .filter(StageEstimate::feasible)
                .map(|s| s.served_share),
        )
    }

    /// Every candidate configuration with a non-zero throughput.
    pub fn candidates(&self) -> Vec<Candidate> {
        let lambda = self.stats.arrival_rate;
        let ge = |x: f64, gpus: u32| if lambda > 0.0 { x.min(lambda) } else { x } / f64::from(gpus);
        let mut out = Vec::new();
        for e in &self.per_tp {
            if e.colocated.feasible() {
                let x = e.colocated.throughput_rps;
                out.push(Candidate {
                    mode: CandidateMode::Colocated { tp: e.tp },
                    gpus: e.tp,
                    throughput_rps: x,
                    goodput_efficiency: ge(x, e.tp),
                });
            }
        }
        for p in self.per_tp.iter().filter(|e| e.prefill.feasible()) {
            for d in self.per_tp.iter().filter(|e| e.decode.feasible()) {
                let mut best: Option<Candidate> = None;
                for n_p in 1..=MAX_GROUPS_PER_STAGE {
                    for n_d in 1..=MAX_GROUPS_PER_STAGE {
                        let x = (f64::from(n_p) * p.prefill.throughput_rps).min(f64::from(n_d) * d.decode.throughput_rps);
                        let gpus = n_p * p.tp + n_d * d.tp;
                        let c = Candidate {
                            mode: CandidateMode::Disaggregated {
                                prefill_tp: p.tp,
                                decode_tp: d.tp,
                                prefill_groups: n_p,
                                decode_groups: n_d,
                            },
                            gpus,
                            throughput_rps: x,
                            goodput_efficiency: ge(x, gpus),
                        };
                        if best.is_none_or(|b| c.goodput_efficiency > b.goodput_efficiency * (1.0 + 1e-9)) {
                            best = Some(c);
                        }
                    }
                }
                out.extend(best);
            }
        }
        out
    }
}

/// Estimates one tier at every TP level in `tp_levels` (together: decode
/// is sized for the prompts the prefill-capable stages serve); its groups
/// may take at most `room_gpus` of one node (see `room_gpus`).
pub fn estimate_tier(profile: &Profile, tier_id: TierId, tier: &Tier, stats: TierStats, tp_levels: &[u32], room_gpus: u32) -> TierEstimate {
    let l_in = stats.mean_prompt_tokens.max(1.0);
    let prompts_at = |tp: u32| Prompts {
        mean: l_in,
        lengths: &stats.prompt_lengths,
        longest_in_time: longest_in_time(profile, tp, tier.ttft_ms),
    };
    let slos = (tier.ttft_ms, tier.tpot_ms);
    // Decode groups serve the tier's demand: the prompts some
    // prefill-capable stage serves, at most the largest such subset, whose
    // mean sets the context.
    let decode_prompt = |prefilling: &[(u32, StageEstimate, StageEstimate)]| {
        let share = prompt_lengths::best_served_share(
            prefilling
                .iter()
                .flat_map(|(_, p, c)| [p, c])
                .filter(|s| s.feasible())
                .map(|s| s.served_share),
        );
        subset_mean(&stats, share)
    };
    let mut prefilling: Vec<(u32, StageEstimate, StageEstimate)> = tp_levels
        .iter()
        .map(|&tp| {
            let prompts = prompts_at(tp);
            (
                tp,
                prefill(profile, tp, tier.ttft_ms, &prompts),
                colocated(profile, tp, slos, &prompts, &stats, TpotRule::EveryIteration),
            )
        })
        .collect();
    let held_prompt = decode_prompt(&prefilling);
    let stages_at = |tp: u32| {
        let (prefill, colocated) = match prefilling.iter().find(|(t, ..)| *t == tp) {
            Some(&(_, p, c)) => (p, c),
            None => {
                let prompts = prompts_at(tp);
                let colocated = colocated(profile, tp, slos, &prompts, &stats, TpotRule::EveryIteration);
                (prefill(profile, tp, tier.ttft_ms, &prompts), colocated)
            }
        };
        Stages {
            prefill: prefill.feasible(),
            colocated: colocated.feasible(),
            decode: move || decode(profile, tp, tier.tpot_ms, &stats, held_prompt).feasible(),
        }
    };
    if tpot_rule::colocated_rule(profile, tier, room_gpus, stages_at) == TpotRule::RequestMean {
        for (tp, _, c) in &mut prefilling {
            *c = colocated(profile, *tp, slos, &prompts_at(*tp), &stats, TpotRule::RequestMean);
        }
    }
    let decode_prompt = decode_prompt(&prefilling);
    let per_tp = prefilling
        .into_iter()
        .map(|(tp, prefill, colocated)| {
            let decode = decode(profile, tp, tier.tpot_ms, &stats, decode_prompt);
            // What they hold is what was prefilled: under overload, the
            // short prompts that got through.
            let decode_held = stats
                .prefilled_prompt_tokens
                .filter(|_| decode.feasible())
                .map(|held| self::decode(profile, tp, tier.tpot_ms, &stats, held))
                .filter(StageEstimate::feasible)
                .unwrap_or(decode);
            TpEstimate {
                tp,
                prefill,
                decode,
                decode_held,
                colocated,
            }
        })
        .collect();
    TierEstimate {
        tier: tier_id,
        stats,
        per_tp,
    }
}

/// The mean prompt of the largest subset of the tier's prompts within
/// `share` of them (the whole set's mean at 1, and where only part of the
/// top 1/POINTS, which no smaller subset tells apart, is left out).
fn subset_mean(stats: &TierStats, share: f64) -> f64 {
    let l_in = stats.mean_prompt_tokens.max(1.0);
    let whole = share > 1.0 - 1.0 / POINTS as f64 + 1e-12;
    stats
        .prompt_lengths
        .subsets(l_in)
        .find(|s| s.share <= share + 1e-12 || (whole && s.share >= 1.0))
        .map_or(l_in, |s| s.mean_tokens)
}

/// Decode at `tp` for the prompts a plan serves: the largest subset within
/// `share` (the plan's served share for the tier) sets the context. The
/// estimate's own decode is sized for the largest subset any TP level
/// serves, which a plan whose prefill groups cap shorter prompts never
/// sends to decode.
pub fn decode_within_share(profile: &Profile, tier: &Tier, stats: &TierStats, tp: u32, share: f64) -> StageEstimate {
    decode(profile, tp, tier.tpot_ms, stats, subset_mean(stats, share))
}

/// Estimates every (tier, TP level): the candidate enumeration of the
/// control loop. Sequential: a cell takes microseconds, and handing the
/// few dozen cells to a thread pool cost more than it saved (`tiertp bench
/// scheduler`, 2 cores: 128 GPUs x 4 tiers 0.14 ms sequential against
/// 0.23-0.32 ms in parallel).
pub fn estimate_all(profile: &Profile, tiers: &[Tier], stats: &[TierStats], tp_levels: &[u32], cluster: &Cluster) -> Vec<TierEstimate> {
    assert_eq!(tiers.len(), stats.len(), "one TierStats per tier");
    (0..tiers.len())
        .map(|t| estimate_tier(profile, t, &tiers[t], stats[t], tp_levels, room_gpus(profile, cluster, stats, t)))
        .collect()
}

/// The most GPUs `tier`'s groups may take on one node: the largest node,
/// less a smallest group (the profile's smallest level) for each other
/// tier with demand, since each of those gets one first. A tier that only a
/// larger group serves step by step is one it cannot have without leaving
/// another tier nothing, so its colocated groups are held to the mean rule
/// (`TpotRule`): five tiers on 8 A100, a voice tier at 150 ms / 8 ms whose
/// only step-by-step group was a TP2 prefill + TP4 decode pair was served
/// nothing at any load, where SGLang at TP4 served it.
pub fn room_gpus(profile: &Profile, cluster: &Cluster, stats: &[TierStats], tier: usize) -> u32 {
    let smallest = profile.tp_levels().into_iter().filter(|tp| tp.is_power_of_two()).min().unwrap_or(1);
    let others = stats.iter().enumerate().filter(|&(t, s)| t != tier && s.arrival_rate > 0.0).count() as u32;
    cluster
        .largest_node()
        .min(cluster.num_gpus().saturating_sub(others.saturating_mul(smallest)))
}

/// One TP level's estimate (`estimate_tier` at that level alone, on a node
/// that holds a pair of it).
pub fn estimate_tp(profile: &Profile, tier: &Tier, stats: &TierStats, tp: u32) -> TpEstimate {
    estimate_tier(profile, 0, tier, *stats, &[tp], 2 * tp).per_tp[0]
}

/// A tier's prompts as a prefill-capable stage at one TP level sees them.
struct Prompts<'a> {
    mean: f64,
    lengths: &'a PromptLengths,
    /// `longest_in_time` at the stage's TP level.
    longest_in_time: f64,
}

impl Prompts<'_> {
    /// The subsets the stage may serve, largest first: all prompts (judged
    /// by their mean, as if all were that long), then those up to each
    /// cutoff it prefills in time alone.
    fn candidates(&self) -> impl Iterator<Item = Subset> + '_ {
        self.lengths
            .subsets(self.mean)
            .filter(|s| s.share >= 1.0 || s.longest <= self.longest_in_time)
    }

    /// The share of the tier's prompts a stage planning for `subset` serves:
    /// the whole set's still loses those past the cap, shed at dispatch.
    fn served_share(&self, subset: &Subset) -> f64 {
        if subset.share >= 1.0 {
            self.lengths.share_within(self.longest_in_time)
        } else {
            subset.share
        }
    }

    /// The dispatcher's cap: the longest prompt the stage prefills in time
    /// alone. It holds for the whole set too: a prompt past it would miss
    /// its TTFT whatever it waited for, and run ahead of prompts that can
    /// still meet theirs.
    fn cap(&self) -> u32 {
        prompt_cap(self.longest_in_time)
    }
}

/// The longest prompt a group at `tp` prefills within `ttft_ms` with
/// nothing queued (infinite without a TTFT). Past the profile's largest
/// batch the time is extrapolated linearly (prefill is at least linear in
/// tokens).
fn longest_in_time(profile: &Profile, tp: u32, ttft_ms: Option<f64>) -> f64 {
    let Some(ttft) = ttft_ms else { return f64::INFINITY };
    let table = profile.table(tp).expect("estimated TP levels come from the profile");
    let max_tokens = *table.prefill.x().last().expect("validated axis");
    let time = |q: f64| profile.prefill_ms(tp, q, 1.0);
    if time(1.0) > ttft {
        return 0.0;
    }
    let at_max = time(max_tokens);
    if at_max <= ttft {
        return max_tokens * ttft / at_max.max(f64::MIN_POSITIVE);
    }
    f64::from(largest_true(1, max_tokens as u32, |q| time(f64::from(q)) <= ttft))
}

/// A prefill batch's time, extrapolated linearly in its tokens past the
/// profile's largest batch (as `longest_in_time` does) instead of clamped.
fn prefill_ms_past_axis(profile: &Profile, tp: u32, tokens: f64, prompts: f64, max_tokens: f64) -> f64 {
    if tokens <= max_tokens {
        profile.prefill_ms(tp, tokens, prompts)
    } else {
        profile.prefill_ms(tp, max_tokens, prompts) * tokens / max_tokens
    }
}

/// `longest_in_time` as a cap for the dispatcher: 0 when there is none.
fn prompt_cap(longest: f64) -> u32 {
    if longest.is_finite() {
        longest.min(f64::from(u32::MAX)) as u32
    } else {
        0
    }
}

fn within(limit_ms: Option<f64>, ms: f64) -> bool {
    limit_ms.is_none_or(|limit| ms <= limit)
}

/// The prefill stage serves the largest candidate subset of the tier's
/// prompts (`Prompts::candidates`) whose mean-length batches meet the TTFT
/// behind one size-biased batch; longer prompts are shed at dispatch, so
/// the batches are sized for the subset's mean.
fn prefill(profile: &Profile, tp: u32, ttft_ms: Option<f64>, prompts: &Prompts) -> StageEstimate {
    let table = profile.table(tp).expect("estimated TP levels come from the profile");
    let max_tokens = *table.prefill.x().last().expect("validated axis");
    let max_prompts = *table.prefill.y().last().expect("validated axis");
    // Smaller subsets have shorter means: the first whose batch of one
    // meets the TTFT is the largest that does.
    for subset in prompts.candidates() {
        let l_in = subset.mean_tokens;
        let time = |n: u32| profile.prefill_ms(tp, f64::from(n) * l_in, f64::from(n));
        // The batch an arrival waits behind is size-biased: n prompts plus
        // the subset's excess (a batch's variance over its mean is one
        // prompt's, whatever n).
        let wait = |n: u32| prefill_ms_past_axis(profile, tp, f64::from(n) * l_in + subset.excess_tokens, f64::from(n), max_tokens);
        let ok = |n: u32| within(ttft_ms, wait(n) + time(n));
        if !ok(1) {
            continue;
        }
        let n_max = (max_tokens / l_in).min(max_prompts).floor().max(1.0) as u32;
        let n = largest_true(1, n_max, ok);
        let t = time(n);
        return StageEstimate {
            throughput_rps: f64::from(n) / (t / 1e3),
            batch_requests: n,
            batch_tokens: (f64::from(n) * l_in).ceil() as u32,
            batch_ms: t,
            served_share: prompts.served_share(&subset),
            max_prompt_tokens: prompts.cap(),
        };
    }
    StageEstimate::default()
}

/// Largest decode batch: bounded by the profile's axis and by KV capacity.
fn decode_batch_limit(profile: &Profile, tp: u32, l_in: f64, l_out: f64) -> u32 {
    let table = profile.table(tp).expect("estimated TP levels come from the profile");
    let axis_max = *table.decode.x().last().expect("validated axis");
    let kv_max = table.kv_capacity_tokens.map_or(f64::INFINITY, |cap| cap as f64 / (l_in + l_out));
    axis_max.min(kv_max).floor().max(0.0) as u32
}

/// Decode for the tier's outputs (`stats`) after prompts of mean `l_in`.
fn decode(profile: &Profile, tp: u32, tpot_ms: Option<f64>, stats: &TierStats, l_in: f64) -> StageEstimate {
    let l_out = stats.mean_output_tokens.max(1.0);
    let b_max = decode_batch_limit(profile, tp, l_in, l_out);
    let ctx = stats.decode_context_tokens(l_in);
    let time = |b: u32| profile.decode_ms(tp, f64::from(b), ctx);
    // The hand-off may hold a request up to its share of the TPOT budget;
    // the steps get the rest.
    let step_budget = tpot_ms.map(|t| t * (1.0 - HANDOFF_WAIT_SHARE));
    let ok = |b: u32| within(step_budget, time(b));
    if b_max == 0 || !ok(1) {
        return StageEstimate::default();
    }
    let b = largest_true(1, b_max, ok);
    let t = time(b);
    StageEstimate {
        throughput_rps: f64::from(b) / (l_out * t / 1e3),
        batch_requests: b,
        batch_tokens: 0,
        batch_ms: t,
        served_share: 1.0,
        max_prompt_tokens: 0,
    }
}

/// The colocated stage serves the largest subset of the tier's prompts
/// (as `prefill`) for which it meets both SLOs. A smaller subset has
/// shorter prompts, so feasibility only grows as subsets shrink: a binary
/// search finds the largest feasible one.
fn colocated(
    profile: &Profile,
    tp: u32,
    (ttft_ms, tpot_ms): (Option<f64>, Option<f64>),
    prompts: &Prompts,
    stats: &TierStats,
    rule: TpotRule,
) -> StageEstimate {
    let subsets: Vec<Subset> = prompts.candidates().collect();
    let at = |i: usize| {
        let e = colocated_for(profile, tp, (ttft_ms, tpot_ms), stats, subsets[i].mean_tokens, rule);
        StageEstimate {
            served_share: prompts.served_share(&subsets[i]),
            max_prompt_tokens: prompts.cap(),
            ..e
        }
    };
    let Some(last) = subsets.len().checked_sub(1) else {
        return StageEstimate::default();
    };
    let first = at(0);
    if first.feasible() || last == 0 {
        return if first.feasible() { first } else { StageEstimate::default() };
    }
    let smallest = at(last);
    if !smallest.feasible() {
        return StageEstimate::default();
    }
    // Invariant: subsets[lo] infeasible, subsets[hi] feasible.
    let (mut lo, mut hi, mut best) = (0, last, smallest);
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        let e = at(mid);
        if e.feasible() {
            (hi, best) = (mid, e);
        } else {
            lo = mid;
        }
    }
    best
}

fn colocated_for(
    profile: &Profile,
    tp: u32,
    (ttft_ms, tpot_ms): (Option<f64>, Option<f64>),
    stats: &TierStats,
    l_in: f64,
    rule: TpotRule,
) -> StageEstimate {
    let l_out = stats.mean_output_tokens.max(1.0);
    let b_max = decode_batch_limit(profile, tp, l_in, l_out);
    let table = profile.table(tp).expect("estimated TP levels come from the profile");
    let max_chunk = *table.prefill.x().last().expect("validated axis");
    let ctx = stats.decode_context_tokens(l_in);
    let mut best = StageEstimate::default();
    for b in geometric(b_max) {
        let decode_ms = profile.decode_ms(tp, f64::from(b), ctx);
        // The chunk that keeps pace with B decoding requests in every
        // iteration, then larger ones carried by fewer iterations.
        let steady = (f64::from(b) * l_in / l_out).ceil().min(max_chunk).max(1.0);
        for chunk in chunk_sizes(steady, l_in.ceil().min(max_chunk)) {
            let chunk_ms = profile.prefill_ms(tp, chunk, 1.0);
            match rule {
                TpotRule::EveryIteration if !within(tpot_ms, decode_ms + chunk_ms) => {
                    break; // a larger chunk takes longer still
                }
                TpotRule::RequestMean => {
                    let seen = (steady / chunk).min(1.0).max(1.0 / l_out);
                    if !within(tpot_ms, decode_ms + seen * chunk_ms) {
                        continue; // a larger chunk is rarer and may fit
                    }
                }
                TpotRule::EveryIteration => {}
            }
            let Some(e) = colocated_at((ttft_ms, rule), (b, decode_ms), (chunk, chunk_ms, steady), (l_in, l_out)) else {
                continue;
            };
            if e.throughput_rps > best.throughput_rps {
                best = e;
            }
        }
    }
    best
}

/// One colocated operating point: B decoding requests, prefill chunks of
/// `chunk` tokens in a share `steady / chunk` of the iterations (all of
/// them at the steady chunk). Larger, rarer chunks cost less per token (a
/// chunk's fixed cost is paid fewer times: 22-token chunks of a 700-token
/// prompt take about 4x the whole prompt in one, small-llama at TP2 on a
/// CPU), so the mean iteration, which sets throughput, is shorter, and a
/// prompt needs fewer of them. The caller holds the iterations to the TPOT
/// (`TpotRule`). None when the TTFT fails.
fn colocated_at(
    (ttft_ms, rule): (Option<f64>, TpotRule),
    (b, decode_ms): (u32, f64),
    (chunk, chunk_ms, steady): (f64, f64, f64),
    (l_in, l_out): (f64, f64),
) -> Option<StageEstimate> {
    let share = (steady / chunk).min(1.0);
    let mean_ms = decode_ms + share * chunk_ms;
    let with_chunk_ms = decode_ms + chunk_ms;
    // The prompt's chunks run back to back after the iteration under way:
    // a mean one, or under `RequestMean`, whose chunks are too long for a
    // TPOT, one with a chunk (as a prefill group's prompt waits one batch).
    let under_way = match rule {
        TpotRule::EveryIteration => mean_ms,
        TpotRule::RequestMean => with_chunk_ms,
    };
    let ttft = (l_in / chunk).ceil() * with_chunk_ms + under_way;
    if !within(ttft_ms, ttft) {
        return None;
    }
    // The steady chunk may be capped below what B decoding requests need:
    // then prefill, not decode, bounds the completion rate.
    let x = (f64::from(b) / l_out).min(steady / l_in) / (mean_ms / 1e3);
    Some(StageEstimate {
        throughput_rps: x,
        // Requests being chunk-prefilled hold batch slots too: the cap
        // leaves room for them beside the B decoding ones.
        batch_requests: b + (chunk / l_in).ceil() as u32,
        batch_tokens: chunk as u32,
        // An iteration that carries a chunk: the pace at which queued
        // prompt tokens are absorbed (the group's SLO budget).
        batch_ms: with_chunk_ms,
        served_share: 1.0,
        max_prompt_tokens: 0,
    })
}

/// `steady`, then doublings of it below `whole`, then `whole` (the
/// prompt in one chunk); just `steady` when it is no smaller.
fn chunk_sizes(steady: f64, whole: f64) -> impl Iterator<Item = f64> {
    let doublings = std::iter::successors(Some(steady * 2.0), |c| Some(c * 2.0)).take_while(move |&c| c < whole);
    std::iter::once(steady).chain(doublings).chain((whole > steady).then_some(whole))
}

/// 1, 2, 3, 4, 5, 6, 8, 10, 12, 15, ... up to and including `max`.
fn geometric(max: u32) -> impl Iterator<Item = u32> {
    let mut next = 1u32;
    let mut done = max == 0;
    std::iter::from_fn(move || {
        if done {
            return None;
        }
        let cur = next.min(max);
        done = cur == max;
        next = (cur + 1).max((f64::from(cur) * 1.25) as u32);
        Some(cur)
    })
}

/// Largest x in [lo, hi] with pred(x), given pred(lo) and pred monotone
/// (true then false).
fn largest_true(lo: u32, hi: u32, pred: impl Fn(u32) -> bool) -> u32 {
    let (mut lo, mut hi) = (lo, hi);
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if pred(mid) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    lo
}

#[cfg(test)]
mod tests;
