//! `chiron`: an interactive pool (the tightest SLO tier) and a batch pool
//! (the others) of replicas at one static TP level.
//! - Local loop, per instance and decode-only iteration: the batch cap
//!   grows by one while the iteration (≈ TPOT) stays under 80% of the
//!   pool's TPOT SLO and shrinks by 30% when it exceeds the SLO.
//! - Global loop, every window: when the interactive pool's queue would
//!   take more than half the TTFT SLO to prefill, an instance moves from the
//!   batch pool to it; when it is nearly idle, one moves back.
//!   Moving an instance changes routing only (same TP level: no switch).

use rustc_hash::FxHashMap;
use serde_json::{json, Value};
use tiertp_scheduler::dispatcher::DispatchClass;
use tiertp_scheduler::stats::TierStats;

use super::{least_loaded, replicas, static_tp, throughput_caps, Ctx, Policy, Route};
use crate::engine::{GroupSim, GroupSpec};
use crate::rejection::Rejection;

const GROW_BELOW: f64 = 0.8;
const SHRINK_FACTOR: f64 = 0.7;
const START_BATCH: u32 = 16;

pub struct Chiron {
    tp: u32,
    interactive_tier: Vec<bool>,
    /// Group key -> in the interactive pool.
    interactive: FxHashMap<(u32, u32), bool>,
    interactive_tpot_ms: Option<f64>,
    batch_tpot_ms: Option<f64>,
    interactive_ttft_ms: f64,
    max_batch: u32,
    moves: u64,
}

impl Chiron {
    pub fn new(ctx: &Ctx) -> Result<Self, String> {
        let tiers = ctx.tiers.tiers();
        let tightest = tiers.iter().filter_map(|t| t.ttft_ms).fold(f64::INFINITY, f64::min);
        let interactive_tier: Vec<bool> = tiers.iter().map(|t| t.ttft_ms == Some(tightest)).collect();
        let tpot = |pick: bool| {
            tiers
                .iter()
                .zip(&interactive_tier)
                .filter(|(_, &i)| i == pick)
                .filter_map(|(t, _)| t.tpot_ms)
                .fold(None, |a: Option<f64>, b| Some(a.map_or(b, |a| a.min(b))))
        };
        let tp = static_tp(ctx)?;
        Ok(Self {
            tp,
            interactive_tpot_ms: tpot(true),
            batch_tpot_ms: tpot(false),
            interactive_ttft_ms: if tightest.is_finite() { tightest } else { f64::INFINITY },
            interactive_tier,
            interactive: FxHashMap::default(),
            max_batch: throughput_caps(ctx.profile, tp).0,
            moves: 0,
        })
    }

    fn pool_of(&self, g: &GroupSim) -> bool {
        self.interactive.get(&g.spec.key()).copied().unwrap_or(false)
    }
}

impl Policy for Chiron {
    fn name(&self) -> &'static str {
        "chiron"
    }

    fn describe(&self) -> Value {
        json!({"tp": self.tp, "instance_moves": self.moves})
    }

    fn initial(&mut self, ctx: &Ctx) -> Vec<GroupSpec> {
        let mut specs = replicas(ctx, self.tp);
        let total: f64 = ctx.trace_stats.iter().map(|s| s.arrival_rate).sum();
        let inter: f64 = ctx
            .trace_stats
            .iter()
            .zip(&self.interactive_tier)
            .filter(|(_, &i)| i)
            .map(|(s, _)| s.arrival_rate)
            .sum();
        let n = specs.len();
        let has_batch = inter < total;
        let k = if total > 0.0 {
            ((inter / total) * n as f64).round() as usize
        } else {
            n / 2
        };
        let k = k.clamp(1.min(n), if has_batch && n > 1 { n - 1 } else { n });
        for (j, s) in specs.iter_mut().enumerate() {
            s.batch_cap = START_BATCH.min(self.max_batch);
            self.interactive.insert(s.key(), j < k);
        }
        specs
    }

    fn route(&mut self, ctx: &Ctx, i: u32, _now: f64, groups: &[GroupSim]) -> Route {
        let inter = self.interactive_tier[ctx.reqs[i as usize].tier];
        let pick = least_loaded(groups, |g| self.pool_of(g) == inter, |g| g.outstanding() as f64)
            .or_else(|| least_loaded(groups, |_| true, |g| g.outstanding() as f64));
        match pick {
            Some(g) => Route::To(
                groups[g].spec.key(),
                if inter {
                    DispatchClass::Feasible
                } else {
                    DispatchClass::Background
                },
            ),
            None => Route::Reject(Rejection::NoGroup),
        }
    }

    fn on_iteration(&mut self, _ctx: &Ctx, group: &mut GroupSim, iteration_ms: f64) {
        let slo = if self.pool_of(group) {
            self.interactive_tpot_ms
        } else {
            self.batch_tpot_ms
        };
        let Some(slo) = slo else {
            return;
        };
        // The cap bounds the decode batch: an iteration that also prefilled
        // a chunk is long whatever the batch, and says nothing about it.
        if group.prefilled_last_iteration() {
            return;
        }
        let mut spec = group.spec;
        if iteration_ms > slo {
            spec.batch_cap = ((f64::from(spec.batch_cap) * SHRINK_FACTOR) as u32).max(1);
        } else if iteration_ms < GROW_BELOW * slo && group.running.len() as u32 >= spec.batch_cap {
            spec.batch_cap = (spec.batch_cap + 1).min(self.max_batch);
        }
        if spec.batch_cap != group.spec.batch_cap {
            group.set_spec(spec);
        }
    }

    fn on_window(&mut self, ctx: &Ctx, _now: f64, _future: &[TierStats], groups: &[GroupSim]) -> Option<Vec<GroupSpec>> {
        let live = |inter: bool| {
            groups
                .iter()
                .filter(|g| !g.retiring && self.pool_of(g) == inter)
                .collect::<Vec<_>>()
        };
        let (inter, batch) = (live(true), live(false));
        if inter.is_empty() {
            return None;
        }
        // Prefill rate of one instance at a typical chunk.
        let (_, chunk) = throughput_caps(ctx.profile, self.tp);
        let tokens_per_s = f64::from(chunk) / (ctx.profile.prefill_ms(self.tp, f64::from(chunk), 1.0) / 1e3);
        let wait_ms = inter.iter().map(|g| g.queued_tokens as f64).sum::<f64>() / inter.len() as f64 / tokens_per_s * 1e3;
        if wait_ms > 0.5 * self.interactive_ttft_ms && batch.len() > 1 {
            let g = batch.iter().min_by_key(|g| g.outstanding()).expect("non-empty");
            self.interactive.insert(g.spec.key(), true);
            self.moves += 1;
        } else if wait_ms < 0.05 * self.interactive_ttft_ms && inter.len() > 1 && batch.iter().any(|g| g.waiting() > 0) {
            let g = inter.iter().min_by_key(|g| g.outstanding()).expect("non-empty");
            self.interactive.insert(g.spec.key(), false);
            self.moves += 1;
        }
        None
    }
}
