//! Cluster policies: how GPUs are configured and where requests go. One
//! trait, one file per policy, one list of names.

mod chiron;
mod llumnix;
mod sglang;
mod split;
mod tiertp;

use std::sync::Arc;

use serde_json::Value;
use tiertp_scheduler::dispatcher::DispatchClass;
use tiertp_scheduler::plan::Role;
use tiertp_scheduler::profile::Profile;
use tiertp_scheduler::stats::TierStats;
use tiertp_scheduler::tiers::TierSet;
use tiertp_scheduler::topology::{Allocator, Cluster};

use crate::engine::{GroupSim, GroupSpec};
use crate::rejection::Rejection;
use crate::request::{Progress, TraceRequest};
use crate::settings::SimSettings;

/// Everything a policy may read.
pub struct Ctx<'a> {
    pub profile: &'a Arc<Profile>,
    pub tiers: &'a TierSet,
    pub settings: &'a SimSettings,
    pub cluster: &'a Cluster,
    /// Whole-trace per-tier stats: the hindsight baselines may size with.
    pub trace_stats: &'a [TierStats],
    pub reqs: &'a [TraceRequest],
}

/// Where a request goes: a group (by first GPU and TP) and its queue class.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Route {
    To((u32, u32), DispatchClass),
    /// Shed, for the reason given: it counts as missed.
    Reject(Rejection),
    /// The policy holds it (waiting for a decode slot) and hands it back
    /// through `take_released`.
    Wait,
}

pub trait Policy {
    fn name(&self) -> &'static str;

    /// The settings this run used (reported).
    fn describe(&self) -> Value;

    /// Whether groups shed queued requests whose TTFT deadline passed
    /// (the production batch policy's `take_expired`, with the deadline the
    /// policy gives: `deadline`); SLO-agnostic baselines serve strictly FCFS.
    fn deadline_aware(&self) -> bool {
        false
    }

    /// When a request must start prefilling to still meet its TTFT (the
    /// core's rule, `Tier::ttft_deadline`).
    fn deadline(&self, ctx: &Ctx, i: u32) -> f64 {
        let r = &ctx.reqs[i as usize];
        ctx.tiers.tiers()[r.tier].ttft_deadline(r.arrival_s)
    }

    /// Switch stop time for this policy's mechanism.
    fn switch_ms(&self, ctx: &Ctx) -> f64 {
        ctx.settings.switch_cost(ctx.profile).stop_ms
    }

    /// Groups at time 0.
    fn initial(&mut self, ctx: &Ctx) -> Vec<GroupSpec>;

    /// Every control window: the true stats of the coming window (only the
    /// oracle may look; a policy that observes demand keeps its own
    /// observer, as tiertp's control loop does). A new group list replaces
    /// the configuration.
    fn on_window(&mut self, _ctx: &Ctx, _now: f64, _future: &[TierStats], _groups: &[GroupSim]) -> Option<Vec<GroupSpec>> {
        None
    }

    /// A new request at `now`.
    fn route(&mut self, ctx: &Ctx, i: u32, now: f64, groups: &[GroupSim]) -> Route;

    /// A request whose prompt finished on a prefill group; None = decode
    /// where it is.
    fn route_decode(&mut self, _ctx: &Ctx, _i: u32, _now: f64, _groups: &[GroupSim]) -> Option<Route> {
        None
    }

    /// A request leaving a group that stopped at a plan change.
    fn route_migrated(&mut self, ctx: &Ctx, i: u32, prefilled: bool, now: f64, groups: &[GroupSim]) -> Route {
        if prefilled {
            if let Some(r) = self.route_decode(ctx, i, now, groups) {
                return r;
            }
        }
        self.route(ctx, i, now, groups)
    }

    /// A request ended (finished or shed).
    fn on_finish(&mut self, _i: u32, _now: f64) {}

    /// A request's prompt finished on a group that keeps decoding it.
    fn on_first_token(&mut self, _i: u32, _now: f64) {}

    /// Requests the policy held (`Route::Wait`) that now have a place or
    /// are shed.
    fn take_released(&mut self, _now: f64) -> Vec<(u32, Route)> {
        Vec::new()
    }

    /// After each iteration of a group (local control loops).
    fn on_iteration(&mut self, _ctx: &Ctx, _group: &mut GroupSim, _iteration_ms: f64) {}

    /// Live migrations to start now: (request, target group).
    fn rebalance(&mut self, _ctx: &Ctx, _groups: &[GroupSim], _progress: &[Progress]) -> Vec<(u32, (u32, u32))> {
        Vec::new()
    }
}

/// A policy's entry in the one list of policies.
#[derive(Clone, Copy)]
pub struct PolicyInfo {
    pub name: &'static str,
    /// What it is, in a line.
    pub about: &'static str,
    /// The settings of `SimSettings` it reads besides the cluster and
    /// mechanism (`tp`, `prefill_share`): what a sweep of its
    /// configurations varies.
    pub settings: &'static [&'static str],
    build: fn(&Ctx) -> Result<Box<dyn Policy>, String>,
}

const TP: &[&str] = &["tp"];

/// Every policy, once: its name, what it is, the settings it reads and how
/// it is built.
pub const POLICY_TABLE: [PolicyInfo; 11] = [
    PolicyInfo {
        name: "tiertp",
        about: "dynamic TP per tier: planner + dispatcher + batch policy",
        settings: &[],
        build: |ctx| Ok(Box::new(tiertp::Tiertp::new(ctx, tiertp::Variant::Full)?)),
    },
    PolicyInfo {
        name: "tiertp-no-fairness",
        about: "tiertp without the unmet-demand weighting",
        settings: &[],
        build: |ctx| Ok(Box::new(tiertp::Tiertp::new(ctx, tiertp::Variant::NoFairness)?)),
    },
    PolicyInfo {
        name: "tiertp-static-tp",
        about: "tiertp's scheduler at one static TP level (tp)",
        settings: TP,
        build: |ctx| Ok(Box::new(tiertp::Tiertp::new(ctx, tiertp::Variant::StaticTp)?)),
    },
    PolicyInfo {
        name: "tiertp-naive-switch",
        about: "tiertp with a switch that restarts the engine (seconds)",
        settings: &[],
        build: |ctx| Ok(Box::new(tiertp::Tiertp::new(ctx, tiertp::Variant::NaiveSwitch)?)),
    },
    PolicyInfo {
        name: "oracle",
        about: "tiertp's control loop fed the next window's true load, free switches; searched over every TP set (ceiling)",
        // Optional: without it, the oracle plans over every TP level.
        settings: TP,
        build: |ctx| Ok(Box::new(tiertp::Tiertp::new(ctx, tiertp::Variant::Oracle)?)),
    },
    PolicyInfo {
        name: "sglang",
        about: "replicas at one TP level, chunked prefill, least-load, FCFS, SLO-agnostic",
        settings: TP,
        build: |ctx| Ok(Box::new(sglang::Sglang::new(ctx, false)?)),
    },
    PolicyInfo {
        name: "sglang-slo",
        about: "sglang + the SLO-aware batch rule (queued requests past their TTFT deadline shed), one TP level",
        settings: TP,
        build: |ctx| Ok(Box::new(sglang::Sglang::slo_aware(ctx)?)),
    },
    PolicyInfo {
        name: "sglang-pd",
        about: "static prefill/decode disaggregation at one TP level (tp, prefill_share)",
        settings: &["tp", "prefill_share"],
        build: |ctx| Ok(Box::new(sglang::Sglang::new(ctx, true)?)),
    },
    PolicyInfo {
        name: "split",
        about: "a static partition per tier sized by its traffic share, best TP each; overflow rejected",
        settings: &[],
        build: |ctx| Ok(Box::new(tiertp::Tiertp::new(ctx, tiertp::Variant::Split)?)),
    },
    PolicyInfo {
        name: "llumnix",
        about: "replicas at one TP level, priority headroom dispatch, live migration",
        settings: TP,
        build: |ctx| Ok(Box::new(llumnix::Llumnix::new(ctx)?)),
    },
    PolicyInfo {
        name: "chiron",
        about: "interactive/batch pools, batch-size back-pressure, instance moves",
        settings: TP,
        build: |ctx| Ok(Box::new(chiron::Chiron::new(ctx)?)),
    },
];

/// Every policy's name and what it is (`POLICY_TABLE`, in its order).
pub const POLICIES: [(&str, &str); POLICY_TABLE.len()] = {
    let mut out = [("", ""); POLICY_TABLE.len()];
    let mut i = 0;
    while i < out.len() {
        out[i] = (POLICY_TABLE[i].name, POLICY_TABLE[i].about);
        i += 1;
    }
    out
};

/// The policy called `name`; an unknown name fails, listing the valid ones.
pub fn info(name: &str) -> Result<PolicyInfo, String> {
    POLICY_TABLE.into_iter().find(|p| p.name == name).ok_or_else(|| {
        let names: Vec<&str> = POLICY_TABLE.iter().map(|p| p.name).collect();
        format!("unknown policy {name:?}; valid policies: {names:?}")
    })
}

pub fn build(name: &str, ctx: &Ctx) -> Result<Box<dyn Policy>, String> {
    (info(name)?.build)(ctx)
}

/// Caps of an SLO-agnostic engine (the profile's).
pub fn throughput_caps(profile: &Profile, tp: u32) -> (u32, u32) {
    profile.throughput_caps(tp).expect("policy TP levels come from the profile")
}

/// The static TP level of a baseline: the setting, else 1; checked against
/// the profile.
pub fn static_tp(ctx: &Ctx) -> Result<u32, String> {
    let tp = ctx.settings.tp.unwrap_or(1);
    if ctx.profile.table(tp).is_err() {
        return Err(format!("tp = {tp}: the profile has TP levels {:?}", ctx.profile.tp_levels()));
    }
    Ok(tp)
}

/// As many aligned groups of `tp` as the cluster holds, SLO-agnostic caps.
pub fn replicas(ctx: &Ctx, tp: u32) -> Vec<GroupSpec> {
    let mut alloc = Allocator::new(ctx.cluster);
    let (batch_cap, token_cap) = throughput_caps(ctx.profile, tp);
    std::iter::from_fn(|| alloc.allocate(tp))
        .map(|first_gpu| GroupSpec {
            first_gpu,
            tp,
            role: Role::Colocated,
            tier: None,
            batch_cap,
            token_cap,
        })
        .collect()
}

/// The active group with the least outstanding work among those `ok`
/// accepts; ties go to the lowest index.
pub fn least_loaded(groups: &[GroupSim], ok: impl Fn(&GroupSim) -> bool, load: impl Fn(&GroupSim) -> f64) -> Option<usize> {
    let mut best: Option<(f64, usize)> = None;
    for (i, g) in groups.iter().enumerate() {
        if g.retiring || !ok(g) {
            continue;
        }
        let l = load(g);
        if best.is_none_or(|(b, _)| l < b) {
            best = Some((l, i));
        }
    }
    best.map(|(_, i)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_entry_per_name_and_only_known_settings() {
        let mut names: Vec<&str> = POLICY_TABLE.iter().map(|p| p.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), POLICY_TABLE.len());
        assert_eq!(POLICIES.map(|p| p.0), POLICY_TABLE.map(|p| p.name));
        for p in POLICY_TABLE {
            assert!(p.settings.iter().all(|s| ["tp", "prefill_share"].contains(s)), "{}", p.name);
        }
    }

    #[test]
    fn an_unknown_name_lists_the_valid_ones() {
        let e = info("vllm").err().unwrap();
        assert!(e.contains("vllm") && e.contains("\"chiron\""), "{e}");
        assert_eq!(info("sglang-pd").unwrap().settings, ["tp", "prefill_share"]);
    }
}
