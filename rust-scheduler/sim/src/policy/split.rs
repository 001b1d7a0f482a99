//! `split`: one static partition per tier, sized by the tier's share of the
//! trace's requests, each at the TP level best for that tier (the highest
//! SLO-compliant throughput per GPU). Admission uses the production
//! dispatcher's SLO bandwidth; a request its partition cannot take in time
//! is rejected (counted as missed), never spilled to another tier.

use serde_json::{json, Value};
use tiertp_scheduler::dispatcher::{DispatchClass, Dispatcher};
use tiertp_scheduler::estimator::estimate_tp;
use tiertp_scheduler::plan::{Plan, Role};
use tiertp_scheduler::planner::{group_plan, PlannerConfig};
use tiertp_scheduler::topology::Allocator;

use super::{throughput_caps, Ctx, Policy, Route};
use crate::engine::{GroupSim, GroupSpec};

pub struct Split {
    dispatcher: Dispatcher,
    specs: Vec<GroupSpec>,
    layout: Vec<(String, u32, u32)>,
}

/// GPUs per tier by largest remainder, each tier with traffic at least one.
fn shares(gpus: u32, rates: &[f64]) -> Vec<u32> {
    let total: f64 = rates.iter().sum();
    if total <= 0.0 {
        return vec![gpus / rates.len().max(1) as u32; rates.len()];
    }
    let exact: Vec<f64> = rates.iter().map(|r| r / total * f64::from(gpus)).collect();
    let mut out: Vec<u32> = exact.iter().map(|e| e.floor() as u32).collect();
    for (o, r) in out.iter_mut().zip(rates) {
        if *r > 0.0 && *o == 0 {
            *o = 1;
        }
    }
    while out.iter().sum::<u32>() > gpus {
        let i = (0..out.len())
            .filter(|&i| out[i] > 1)
            .max_by(|&a, &b| out[a].cmp(&out[b]))
            .unwrap_or(0);
        out[i] -= 1;
    }
    let mut order: Vec<usize> = (0..out.len()).collect();
    order.sort_by(|&a, &b| (exact[b] - exact[b].floor()).total_cmp(&(exact[a] - exact[a].floor())));
    let mut k = 0;
    while out.iter().sum::<u32>() < gpus {
        out[order[k % order.len()]] += 1;
        k += 1;
    }
    out
}

impl Split {
    pub fn new(ctx: &Ctx) -> Result<Self, String> {
        let tiers = ctx.tiers.tiers();
        let rates: Vec<f64> = ctx.trace_stats.iter().map(|s| s.arrival_rate).collect();
        let gpus = shares(ctx.cluster.num_gpus(), &rates);
        let levels: Vec<u32> = ctx
            .profile
            .tp_levels()
            .into_iter()
            .filter(|k| PlannerConfig::default().tp_levels.contains(k))
            .collect();
        let mut alloc = Allocator::new(ctx.cluster);
        let mut groups = Vec::new();
        let mut specs = Vec::new();
        let mut layout = Vec::new();
        // Largest partitions first keep the aligned blocks they need.
        let mut order: Vec<usize> = (0..tiers.len()).collect();
        order.sort_by_key(|&t| std::cmp::Reverse(gpus[t]));
        for t in order {
            let est: Vec<_> = levels
                .iter()
                .map(|&k| estimate_tp(ctx.profile, &tiers[t], &ctx.trace_stats[t], k))
                .collect();
            let best = est
                .iter()
                .filter(|e| e.tp <= gpus[t] && e.tp <= ctx.settings.gpus_per_node)
                .max_by(|a, b| (a.colocated.throughput_rps / f64::from(a.tp)).total_cmp(&(b.colocated.throughput_rps / f64::from(b.tp))))
                .copied()
                .unwrap_or(est[0]);
            let mut left = gpus[t];
            layout.push((tiers[t].name.clone(), best.tp, gpus[t]));
            while left > 0 {
                // Fall back to smaller groups where the partition's
                // remainder or fragmentation leaves no room for `best`.
                let Some(e) = est
                    .iter()
                    .rev()
                    .filter(|e| e.tp <= best.tp && e.tp <= left)
                    .find(|e| alloc.available(e.tp) > 0)
                else {
                    break;
                };
                let first = alloc.allocate(e.tp).expect("available");
                left -= e.tp;
                let g = group_plan(&tiers[t], e, t, Role::Colocated, first);
                let (batch_cap, token_cap) = if g.capacity_rps > 0.0 {
                    (g.batch_cap, g.token_cap)
                } else {
                    throughput_caps(ctx.profile, g.tp)
                };
                specs.push(GroupSpec {
                    first_gpu: first,
                    tp: e.tp,
                    role: Role::Colocated,
                    tier: Some(t),
                    batch_cap,
                    token_cap,
                });
                groups.push(g);
            }
        }
        let plan = Plan {
            num_gpus: ctx.cluster.num_gpus(),
            groups,
            tier_capacity_rps: vec![0.0; tiers.len()],
        };
        Ok(Self {
            dispatcher: Dispatcher::new(ctx.tiers, &plan),
            specs,
            layout,
        })
    }
}

impl Policy for Split {
    fn name(&self) -> &'static str {
        "split"
    }

    fn describe(&self) -> Value {
        json!({"partitions": self.layout.iter().map(|(t, tp, g)| json!({"tier": t, "tp": tp, "gpus": g})).collect::<Vec<_>>()})
    }

    fn initial(&mut self, _ctx: &Ctx) -> Vec<GroupSpec> {
        self.specs.clone()
    }

    fn route(&mut self, ctx: &Ctx, i: u32, _groups: &[GroupSim]) -> Route {
        let r = &ctx.reqs[i as usize];
        let id = u64::from(i);
        let background = ctx.tiers.tiers()[r.tier].background;
        match self.dispatcher.dispatch(id, r.tier, r.prompt_tokens) {
            Ok(d) if d.class == DispatchClass::Feasible || (background && d.class == DispatchClass::Background) => {
                // Background tiers have their own partition when they have
                // traffic; without one they are rejected like overflow.
                let own = self
                    .specs
                    .iter()
                    .any(|s| s.key() == (d.group_first_gpu, d.tp) && s.tier == Some(r.tier));
                if own {
                    return Route::To((d.group_first_gpu, d.tp), d.class);
                }
                let _ = self.dispatcher.complete(id);
                Route::Reject
            }
            Ok(_) => {
                let _ = self.dispatcher.complete(id);
                Route::Reject
            }
            Err(_) => Route::Reject,
        }
    }

    fn on_finish(&mut self, i: u32) {
        let _ = self.dispatcher.complete(u64::from(i));
    }
}

#[cfg(test)]
mod tests {
    use super::shares;

    #[test]
    fn shares_sum_to_the_cluster_and_give_every_tier_one() {
        assert_eq!(shares(8, &[3.0, 1.0]), vec![6, 2]);
        assert_eq!(shares(8, &[100.0, 0.1]), vec![7, 1]);
        assert_eq!(shares(4, &[0.0, 0.0]), vec![2, 2]);
        assert_eq!(shares(9, &[1.0, 1.0, 1.0]).iter().sum::<u32>(), 9);
    }
}
