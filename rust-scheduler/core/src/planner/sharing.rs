//! How a plan's groups serve the tiers: each tier on its own groups, or a
//! pool of tiers on one host tier's groups.
//!
//! The dispatcher already lets a tier whose groups are full take room on
//! the groups of a tier that lends to it (`Tier::lends_to`: an SLO at least
//! as strict, a weight no higher). A plan can build on that: when a tier
//! with demand lends to others, giving their SLO capacity to that host,
//! sized for their merged load, avoids splitting a few GPUs into
//! per-tier groups that each run half empty (on 4 GPUs, one TP2
//! prefill + decode pair for both tiers instead of a pair for one and
//! nothing that meets its SLO for the other). The planner proposes both
//! and values them with the same objective; the commit rule picks.
//!
//! A tier worth more than others lends them nothing at dispatch, but a
//! plan may still pool every tier on its groups where its SLO meets all
//! of theirs (`whole_pool`): the plan names the members
//! (`Plan::pooled_on`) and the dispatcher puts them there. Such a pool is
//! weighed where the other proposals leave demand unserved, and taken
//! where it leaves fewer SLO tiers without capacity, or as few and is
//! worth more (`Planner::best_proposal`).
//!
//! A pooled plan's groups belong to the host and are sized by the host's
//! estimate for the merged load (their budgets hold the host's SLO for
//! the members' mix of prompts); the greedy picks them for the same load.
//! A committed pool keeps the host its groups belong to while the members'
//! rates change (`Planner::sharing_of`), and groups whose tier went idle
//! host the tiers with demand and no group of their own whose SLO theirs
//! meets (`idle_host_pool`).
//! Each member is credited its share of what the pool serves, so the
//! objective, the fairness and the starvation rules see what it is served.

use std::borrow::Cow;

use crate::estimator::{estimate_tier, room_gpus, TierEstimate};
use crate::profile::Profile;
use crate::prompt_lengths::PromptLengths;
use crate::rate_shape::RateShape;
use crate::stats::TierStats;
use crate::tiers::Tier;
use crate::topology::Cluster;

#[derive(Debug, Clone, PartialEq)]
pub enum Sharing {
    /// Every tier on its own groups (a full tier still borrows at dispatch).
    PerTier,
    /// Every tier in `members` (`host` among them) on `host`'s groups;
    /// `load`: the members' load merged into one (`merged_stats`).
    Pooled {
        host: usize,
        members: Vec<usize>,
        load: Box<TierStats>,
    },
}

/// The tiers with arrivals, in tier order.
pub fn tiers_with_demand(estimates: &[TierEstimate]) -> impl Iterator<Item = usize> + '_ {
    (0..estimates.len()).filter(|&t| estimates[t].stats.arrival_rate > 0.0)
}

/// The pool the current demand allows: hosted by an SLO tier with demand,
/// with the tiers with demand it lends to as its other members (the most
/// of them; the busiest host if several lend to as many, the first of
/// equally busy ones). A tier the host does not lend to (worth more, or an
/// SLO the host's would not meet) keeps groups of its own beside the pool:
/// a background tier worth less than chat left chat and agent unpooled,
/// and chat alone on one TP1 prefill group shed 4% of its prompts at a
/// tenth of its load (14B on 8 H100 at 10 req/s, three tiers). A pool that
/// cannot hold every tier with demand holds no background tier either: on
/// groups of its own that tier runs at its largest batch, not sized under
/// the host's SLO, and still borrows the pool's spare room at dispatch (in
/// a pool with a background tier, chat's TTFT crossing agent's cost 2.2
/// req/s at 70 req/s). `None` when no tier lends to another with demand.
pub fn pool_for(tiers: &[Tier], estimates: &[TierEstimate]) -> Option<Sharing> {
    let with_demand: Vec<usize> = tiers_with_demand(estimates).collect();
    let members_of = |h: usize| -> Vec<usize> {
        let mut members: Vec<usize> = with_demand
            .iter()
            .copied()
            .filter(|&m| m == h || tiers[h].lends_to(&tiers[m]))
            .collect();
        if members.len() < with_demand.len() {
            members.retain(|&m| !tiers[m].background);
        }
        members
    };
    let (host, members) = with_demand
        .iter()
        .copied()
        .filter(|&h| !tiers[h].background)
        .map(|h| (h, members_of(h)))
        .rev()
        .max_by(|(a, ma), (b, mb)| {
            ma.len()
                .cmp(&mb.len())
                .then(estimates[*a].stats.arrival_rate.total_cmp(&estimates[*b].stats.arrival_rate))
        })?;
    if members.len() < 2 {
        return None;
    }
    let load = Box::new(merged_stats(estimates, &members));
    Some(Sharing::Pooled { host, members, load })
}

/// The pool of every tier with demand on the groups of the one SLO tier
/// whose SLO meets all of theirs (the busiest of such), whatever their
/// weights; `None` where no tier's does, or where `pool_for` already pools
/// them all. A tier worth more than the others lends them nothing at
/// dispatch, so its groups serve only it: where its SLO needs a large
/// group, giving every other tier a group of its own first leaves it
/// none (14B on 8 A100, a voice tier at 150 ms / 8 ms that only TP8
/// decodes in time, beside four others: voice served nothing at any load,
/// where one TP8 group for all served every tier). The plan puts the
/// members on the host's groups (`Plan::pooled_on`); each is credited its
/// share of what the pool serves, so the objective weighs what the host
/// gives up.
pub fn whole_pool(tiers: &[Tier], estimates: &[TierEstimate], pool: Option<&Sharing>) -> Option<Sharing> {
    let with_demand: Vec<usize> = tiers_with_demand(estimates).collect();
    if with_demand.len() < 2 || pool.is_some_and(|p| pools_every_tier_with_demand(p, estimates)) {
        return None;
    }
    let host = with_demand
        .iter()
        .copied()
        .filter(|&h| can_host(tiers, h, &with_demand))
        .rev()
        .max_by(|&a, &b| estimates[a].stats.arrival_rate.total_cmp(&estimates[b].stats.arrival_rate))?;
    let load = Box::new(merged_stats(estimates, &with_demand));
    Some(Sharing::Pooled {
        host,
        members: with_demand,
        load,
    })
}

/// The pool a tier without demand hosts on the groups it still holds
/// (`owners`: the tiers the plan's groups belong to): the tiers with
/// demand and no group of their own, where its SLO meets all of theirs (it
/// lends them its groups at dispatch, and has no requests of its own to
/// protect). Without it a plan whose groups belong to a tier gone idle
/// counted a tier that arrived meanwhile as served by nothing, and the
/// starvation rule forced a switch whatever it gained: Qwen2.5-32B on 8
/// A100, the first agent request replaced the idle chat tier's TP4 pair by
/// agent groups, and the first chat request a second later switched back.
pub fn idle_host_pool(tiers: &[Tier], estimates: &[TierEstimate], host: usize, owners: &[usize]) -> Option<Sharing> {
    if estimates[host].stats.arrival_rate > 0.0 {
        return None;
    }
    let groupless: Vec<usize> = tiers_with_demand(estimates).filter(|t| !owners.contains(t)).collect();
    if groupless.is_empty() || !can_host(tiers, host, &groupless) {
        return None;
    }
    let mut members = groupless;
    members.push(host);
    members.sort_unstable();
    let load = Box::new(merged_stats(estimates, &members));
    Some(Sharing::Pooled { host, members, load })
}

/// Whether `sharing` is a pool of every tier with demand: only such a
/// pool may lay out all GPUs its own way (beside a tier outside it, one TP
/// level alone could leave that tier no group: one TP4 group on 4 GPUs).
pub fn pools_every_tier_with_demand(sharing: &Sharing, estimates: &[TierEstimate]) -> bool {
    let with_demand = tiers_with_demand(estimates).count();
    matches!(sharing, Sharing::Pooled { members, .. } if members.len() == with_demand)
}

/// Whether `host` can host a pool of `members`: an SLO tier whose SLO
/// meets every one of theirs.
pub fn can_host(tiers: &[Tier], host: usize, members: &[usize]) -> bool {
    !tiers[host].background && members.iter().all(|&m| tiers[host].meets_slo_of(&tiers[m]))
}

/// Per tier, the tier whose groups serve it under `sharing` (a pool's
/// members other than its host), for `Plan::pooled_on`.
pub fn pooled_on(num_tiers: usize, sharing: &Sharing) -> Vec<Option<usize>> {
    let mut out = vec![None; num_tiers];
    if let Sharing::Pooled { host, members, .. } = sharing {
        for &m in members.iter().filter(|&&m| m != *host) {
            out[m] = Some(*host);
        }
    }
    out
}

/// The one tier with demand, if only one has any.
pub fn sole_tier_with_demand(estimates: &[TierEstimate]) -> Option<usize> {
    let mut with_demand = tiers_with_demand(estimates);
    let only = with_demand.next()?;
    with_demand.next().is_none().then_some(only)
}

/// Each member's share of the requests a full pool serves (the shares sum
/// to 1). With no room left, each place that frees goes to whoever
/// arrives next, so a member gets its share of the arrivals averaged over
/// windows (`RateShape::time_share`), not its share of the mean rate: a
/// member whose requests come in bursts finds the place free in few of
/// its windows. The lengths that set how long a served request holds the
/// pool's groups are then mostly the steady members'. Valued at the
/// arrivals' mix, a pool of a steady chat tier (long outputs) and a bursty
/// agent tier (long prompts, short outputs) counted its TP2 decode group at
/// 111 req/s where it served about 70, and moved GPUs from decode to
/// prefill that served no more (Llama-3.2-3B on 4 H100 at 160 req/s, 150
/// ms TTFT: 72.1 -> 77.2 req/s). Where every member is steady, the
/// shares are the rate shares.
fn served_weights(estimates: &[TierEstimate], members: &[usize], rate: f64) -> Vec<f64> {
    let shares: Vec<f64> = members
        .iter()
        .map(|&m| {
            let s = &estimates[m].stats;
            s.rate_shape.time_share(s.arrival_rate, rate - s.arrival_rate)
        })
        .collect();
    let total: f64 = shares.iter().sum();
    if total <= 0.0 {
        return vec![1.0 / members.len() as f64; members.len()];
    }
    shares.iter().map(|s| s / total).collect()
}

/// The members' load merged into one: summed rate, mean lengths weighted
/// by each member's share of what the pool serves (`served_weights`), the
/// rate-weighted prompt-length mixture (its spread; the subsets the
/// estimator plans for are scaled to the mean), and the shape of the
/// summed rate (`RateShape::pooled`).
fn merged_stats(estimates: &[TierEstimate], members: &[usize]) -> TierStats {
    let rate: f64 = members.iter().map(|&m| estimates[m].stats.arrival_rate).sum();
    let host = estimates[members[0]].stats;
    if rate <= 0.0 {
        return TierStats { arrival_rate: 0.0, ..host };
    }
    let weights = served_weights(estimates, members, rate);
    let mean = |f: fn(&TierStats) -> f64| members.iter().zip(&weights).map(|(&m, w)| w * f(&estimates[m].stats)).sum::<f64>();
    let shapes: Vec<(f64, RateShape)> = members
        .iter()
        .map(|&m| (estimates[m].stats.arrival_rate, estimates[m].stats.rate_shape))
        .collect();
    let lengths: Vec<(f64, PromptLengths)> = members
        .iter()
        .map(|&m| (estimates[m].stats.arrival_rate, estimates[m].stats.prompt_lengths))
        .collect();
    // The members whose prefilled prompts were seen, weighted by rate.
    let (seen_rate, seen_tokens) = members
        .iter()
        .filter_map(|&m| {
            let s = &estimates[m].stats;
            s.prefilled_prompt_tokens.map(|p| (s.arrival_rate, s.arrival_rate * p))
        })
        .fold((0.0, 0.0), |(r, p), (dr, dp)| (r + dr, p + dp));
    TierStats {
        arrival_rate: rate,
        mean_prompt_tokens: mean(|s| s.mean_prompt_tokens),
        mean_output_tokens: mean(|s| s.mean_output_tokens),
        // E[o²]/E[o] of the mixture: the members' E[o²] over their E[o],
        // each weighted by the member's served share.
        resident_output_tokens: mean(|s| s.mean_output_tokens * s.resident_output_tokens) / mean(|s| s.mean_output_tokens).max(1.0),
        rate_shape: RateShape::pooled(&shapes),
        prompt_lengths: PromptLengths::mixture(&lengths).unwrap_or(host.prompt_lengths),
        prefilled_prompt_tokens: (seen_rate > 0.0).then(|| seen_tokens / seen_rate),
        sustained_rate: members.iter().map(|&m| estimates[m].stats.sustained_rate).sum(),
        // A pool's burst lasts as long as its most persistent member's.
        burst_s: members.iter().map(|&m| estimates[m].stats.burst_s).fold(0.0, f64::max),
    }
}

/// What the greedy and the group sizing see under `sharing`: the host's
/// estimate made for the merged load, the other members without demand (so
/// the greedy gives them no groups of their own); per tier, the estimates
/// themselves.
pub fn planning_estimates<'a>(
    profile: &Profile,
    tiers: &[Tier],
    estimates: &'a [TierEstimate],
    sharing: &Sharing,
    (tp_levels, cluster): (&[u32], &Cluster),
) -> Cow<'a, [TierEstimate]> {
    let Sharing::Pooled { host, members, load } = sharing else {
        return Cow::Borrowed(estimates);
    };
    let mut out = estimates.to_vec();
    for &m in members.iter().filter(|&&m| m != *host) {
        out[m].stats.arrival_rate = 0.0;
    }
    out[*host].stats = **load;
    let stats: Vec<TierStats> = out.iter().map(|e| e.stats).collect();
    let room = room_gpus(profile, cluster, &stats, *host);
    out[*host] = estimate_tier(profile, *host, &tiers[*host], **load, tp_levels, room);
    Cow::Owned(out)
}

/// Each member's credit of the pool's capacity (the host's entry holds the
/// whole pool on entry): the pool serves E[min(Λ, C)] of the members'
/// summed rate, first come first served, so each member gets that in
/// proportion to its demand; it is credited the capacity that serves as
/// much of its own rate (`RateShape::capacity_for`), so what the objective
/// and the fairness rules compute per tier is the pool's share.
pub fn credit_members(capacities: &mut [f64], served_shares: &mut [f64], estimates: &[TierEstimate], sharing: &Sharing) {
    let Sharing::Pooled { host, members, load: pool } = sharing else {
        return;
    };
    let pool_share = served_shares[*host];
    let served = pool.served_within(1.0, capacities[*host], pool_share);
    for &m in members {
        let s = &estimates[m].stats;
        let part = if pool.arrival_rate > 0.0 {
            served * s.arrival_rate / pool.arrival_rate
        } else {
            0.0
        };
        // Each member is credited the pool's share of prompts served in
        // time (the pool's groups take everyone's within the same caps).
        served_shares[m] = pool_share;
        capacities[m] = s.capacity_within(part, pool_share);
    }
}
