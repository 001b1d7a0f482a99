//! `llumnix`: replicas at one static TP level. Dispatch goes to the replica
//! with the lowest load, counting queued work; low-priority requests see
//! every replica already running high-priority work as fuller by a reserved
//! headroom, so tight-tier requests keep room. Every window the most loaded
//! replica live-migrates running low-priority requests to the least loaded
//! one (the migration costs its KV bytes).

use serde_json::{json, Value};
use tiertp_scheduler::dispatcher::DispatchClass;
use tiertp_scheduler::tiers::TierId;

use super::{least_loaded, replicas, static_tp, Ctx, Policy, Route};
use crate::engine::{GroupSim, GroupSpec};
use crate::rejection::Rejection;
use crate::request::{Progress, TraceRequest};

/// Load fraction reserved for high-priority requests.
const HEADROOM: f64 = 0.2;
/// Load gap between the fullest and emptiest replica that triggers migration.
const MIGRATE_GAP: f64 = 0.2;
const MAX_MIGRATIONS_PER_WINDOW: usize = 4;

pub struct Llumnix {
    tp: u32,
    high_priority: Vec<bool>,
}

/// KV in use plus queued prompt tokens, over capacity.
fn load(g: &GroupSim) -> f64 {
    (g.kv_used + g.queued_tokens) as f64 / g.kv_capacity as f64
}

fn runs_high(g: &GroupSim, reqs: &[TraceRequest], high: &[bool]) -> bool {
    g.running.iter().any(|&i| high[reqs[i as usize].tier])
}

impl Llumnix {
    pub fn new(ctx: &Ctx) -> Result<Self, String> {
        let tiers = ctx.tiers.tiers();
        // High priority: the SLO tier(s) with the tightest TTFT.
        let tightest = tiers.iter().filter_map(|t| t.ttft_ms).fold(f64::INFINITY, f64::min);
        let high_priority = tiers.iter().map(|t| t.ttft_ms == Some(tightest)).collect();
        Ok(Self {
            tp: static_tp(ctx)?,
            high_priority,
        })
    }

    fn is_high(&self, tier: TierId) -> bool {
        self.high_priority[tier]
    }
}

impl Policy for Llumnix {
    fn name(&self) -> &'static str {
        "llumnix"
    }

    fn describe(&self) -> Value {
        json!({"tp": self.tp, "headroom": HEADROOM, "migrate_gap": MIGRATE_GAP})
    }

    fn initial(&mut self, ctx: &Ctx) -> Vec<GroupSpec> {
        replicas(ctx, self.tp)
    }

    fn route(&mut self, ctx: &Ctx, i: u32, _now: f64, groups: &[GroupSim]) -> Route {
        let tier = ctx.reqs[i as usize].tier;
        let high = self.is_high(tier);
        let hp = &self.high_priority;
        let pick = least_loaded(
            groups,
            |_| true,
            |g| load(g) + if !high && runs_high(g, ctx.reqs, hp) { HEADROOM } else { 0.0 },
        );
        match pick {
            Some(g) => Route::To(
                groups[g].spec.key(),
                if high { DispatchClass::Feasible } else { DispatchClass::BestEffort },
            ),
            None => Route::Reject(Rejection::NoGroup),
        }
    }

    fn rebalance(&mut self, ctx: &Ctx, groups: &[GroupSim], progress: &[Progress]) -> Vec<(u32, (u32, u32))> {
        let (Some(src), Some(dst)) = (
            least_loaded(groups, |g| !g.busy, |g| -load(g)),
            least_loaded(groups, |_| true, load),
        ) else {
            return Vec::new();
        };
        if src == dst || load(&groups[src]) - load(&groups[dst]) < MIGRATE_GAP {
            return Vec::new();
        }
        groups[src]
            .running
            .iter()
            .copied()
            .filter(|&i| {
                let (r, p) = (&ctx.reqs[i as usize], &progress[i as usize]);
                !self.is_high(r.tier) && p.prefilled == r.prompt_tokens
            })
            .take(MAX_MIGRATIONS_PER_WINDOW)
            .map(|i| (i, groups[dst].spec.key()))
            .collect()
    }
}
