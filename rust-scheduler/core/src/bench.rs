//! `tiertp bench scheduler`: planning latency per (GPUs, tiers) and dispatch
//! throughput, measured the way criterion does it (warm-up, many timed
//! samples, median and spread), without criterion's process model so the
//! numbers come back to the Python CLI as JSON.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::dispatcher::Dispatcher;
use crate::planner::{Planner, PlannerConfig};
use crate::profile::{synthetic, Profile};
use crate::stats::TierStats;
use crate::tiers::{Tier, TierSet};
use crate::topology::Cluster;

pub struct BenchSettings {
    pub gpu_counts: Vec<u32>,
    pub tier_counts: Vec<usize>,
    /// Time budget per planning configuration.
    pub plan_budget: Duration,
    pub dispatch_requests: u64,
    pub dispatch_replicas: u32,
    pub dispatch_repeats: usize,
}

impl Default for BenchSettings {
    fn default() -> Self {
        Self {
            gpu_counts: vec![8, 64, 128, 1024],
            tier_counts: vec![2, 4, 8],
            plan_budget: Duration::from_millis(400),
            dispatch_requests: 50_000,
            dispatch_replicas: 128,
            dispatch_repeats: 7,
        }
    }
}

/// `n` tiers from tight (interactive) to loose; with 4 or more, the last is
/// background. Weights fall from tight to loose, so no tier lends to all
/// the others (planned per tier); `pooled`: every weight 1, so the tightest
/// lends to all and the planner also plans the pool (`planner::sharing`).
pub fn bench_tiers(n: usize, pooled: bool) -> TierSet {
    let tiers = (0..n)
        .map(|i| {
            let name = format!("tier{i}");
            let weight = |w: f64| if pooled { 1.0 } else { w };
            if n >= 4 && i == n - 1 {
                Tier::background_tier(&name, weight(0.5))
            } else {
                let f = f64::from(1u32 << i.min(6));
                Tier::slo_tier(&name, 400.0 * f, 40.0 + 30.0 * i as f64, weight((n - i) as f64))
            }
        })
        .collect();
    TierSet::new(tiers, "<bench tiers>").expect("bench tiers are valid")
}

/// Demand of roughly `load` requests/s per GPU, split over the tiers.
fn bench_stats(gpus: u32, tiers: usize, jitter: f64) -> Vec<TierStats> {
    (0..tiers)
        .map(|i| {
            let rate = 2.0 * f64::from(gpus) / tiers as f64 * (1.0 + 0.2 * jitter * if i % 2 == 0 { 1.0 } else { -1.0 });
            TierStats::new(rate, 512.0 * (1 + i % 3) as f64, 128.0 + 64.0 * (i % 2) as f64)
        })
        .collect()
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    let idx = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[idx]
}

fn time_planning(profile: &Arc<Profile>, gpus: u32, tiers: usize, pooled: bool, budget: Duration) -> Value {
    let cluster = Cluster::uniform(gpus, 8).expect("bench cluster");
    let mut planner = Planner::new(profile.clone(), bench_tiers(tiers, pooled), cluster, PlannerConfig::default()).expect("bench planner");
    let stats: Vec<Vec<TierStats>> = (0..8).map(|k| bench_stats(gpus, tiers, f64::from(k) / 4.0 - 1.0)).collect();
    for s in stats.iter().cycle().take(10) {
        planner.step(s).expect("bench step");
    }
    let mut samples = Vec::new();
    let start = Instant::now();
    let mut k = 0;
    while (start.elapsed() < budget || samples.len() < 30) && samples.len() < 20_000 {
        let s = &stats[k % stats.len()];
        k += 1;
        let t0 = Instant::now();
        let out = planner.step(s).expect("bench step");
        samples.push(t0.elapsed().as_secs_f64() * 1e3);
        std::hint::black_box(out);
    }
    samples.sort_by(f64::total_cmp);
    json!({
        "median_ms": percentile(&samples, 0.5),
        "p90_ms": percentile(&samples, 0.9),
        "min_ms": samples[0],
        "samples": samples.len(),
    })
}

fn time_dispatch(profile: &Arc<Profile>, settings: &BenchSettings) -> Value {
    let tiers = bench_tiers(4, false);
    let cluster = Cluster::uniform(settings.dispatch_replicas, 8).expect("bench cluster");
    // One replica per GPU: TP1, colocated.
    let config = PlannerConfig {
        tp_levels: vec![1],
        allow_disaggregated: false,
        ..PlannerConfig::default()
    };
    let planner = Planner::new(profile.clone(), tiers.clone(), cluster, config).expect("bench planner");
    let (plan, _) = planner
        .propose(&bench_stats(settings.dispatch_replicas, 4, 0.0))
        .expect("bench plan");
    let n = settings.dispatch_requests;
    let in_flight_window = 2_000;
    let mut rates = Vec::new();
    for _ in 0..settings.dispatch_repeats {
        let mut d = Dispatcher::new(&tiers, &plan);
        let t0 = Instant::now();
        for id in 0..n {
            let tier = (id % 4) as usize;
            let prompt = 128 + (id % 7) as u32 * 97;
            // An over-budget answer (the request is shed) is a decision too.
            let _ = std::hint::black_box(d.dispatch(id, tier, prompt, true));
            if id >= in_flight_window {
                let _ = d.complete(id - in_flight_window);
            }
        }
        let secs = t0.elapsed().as_secs_f64();
        rates.push(n as f64 / secs);
    }
    rates.sort_by(f64::total_cmp);
    json!({
        "requests": n,
        "replicas": plan.groups.len(),
        "decisions_per_s_median": percentile(&rates, 0.5),
        "decisions_per_s_min": rates[0],
        "note": "each decision is one dispatch (admitted or over budget) plus one completion returning bandwidth",
    })
}

/// Runs the whole scheduler benchmark.
pub fn run(settings: &BenchSettings) -> Value {
    let profile = Arc::new(synthetic::llama8b_like());
    let mut medians = BTreeMap::new();
    let mut detail = BTreeMap::new();
    for &g in &settings.gpu_counts {
        for &t in &settings.tier_counts {
            let r = time_planning(&profile, g, t, false, settings.plan_budget);
            medians.insert(format!("{g}x{t}"), r["median_ms"].clone());
            detail.insert(format!("{g}x{t}"), r);
        }
    }
    // Large clusters of 4 tiers again with a pool to plan besides (one
    // greedy run per TP level more).
    for &g in settings.gpu_counts.iter().filter(|&&g| g >= 128) {
        let t = 4;
        let r = time_planning(&profile, g, t, true, settings.plan_budget);
        medians.insert(format!("{g}x{t}-pooled"), r["median_ms"].clone());
        detail.insert(format!("{g}x{t}-pooled"), r);
    }
    let dispatch = time_dispatch(&profile, settings);
    json!({
        "benchmark": "scheduler",
        "plan_median_ms": medians,
        "plan_detail": detail,
        "dispatch_decisions_per_s": dispatch["decisions_per_s_median"].clone(),
        "dispatch": dispatch,
        "profile": profile.name,
    })
}
