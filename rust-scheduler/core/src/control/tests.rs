use super::*;
use crate::dispatcher::DispatchClass;
use crate::plan::Role;
use crate::profile::synthetic;
use crate::test_support::{group, plan};
use crate::tiers::Tier;

fn tiers() -> TierSet {
    TierSet::new(
        vec![
            Tier::slo_tier("chat", 500.0, 50.0, 1.0),
            Tier::slo_tier("agent", 2000.0, 100.0, 1.0),
        ],
        "t",
    )
    .unwrap()
}

fn control(gpus: u32) -> ControlLoop {
    ControlLoop::new(
        Arc::new(synthetic::llama8b_like()),
        tiers(),
        Cluster::uniform(gpus, 8).unwrap(),
        ControlConfig::default(),
    )
    .unwrap()
}

#[test]
fn every_tier_starts_with_capacity() {
    let c = control(4);
    assert!(c.plan().gpus_of_tier(0) > 0 && c.plan().gpus_of_tier(1) > 0, "{:?}", c.plan());
    assert_eq!(c.plan_id(), 1);
}

#[test]
fn over_budget_requests_are_shed_not_spilled() {
    let mut c = control(4);
    c.install(plan(vec![
        group(0, Role::Colocated, 0, 100, 2),
        group(1, Role::Colocated, 1, 100, 2),
    ]));
    let admitted = |a: Admission| matches!(a, Admission::Admitted(d) if d.class == DispatchClass::Feasible);
    assert!(admitted(c.admit(1, 0, 60, 10, 0.0, &[]).unwrap()));
    // 60 + 60 tokens > 100: the chat group is at its budget; the agent's
    // idle group must not take it.
    assert_eq!(
        c.admit(2, 0, 60, 10, 0.0, &[]).unwrap(),
        Admission::Shed {
            reason: ShedReason::OverBudget,
            retry_after_s: 1.0
        }
    );
    // Its prompt prefilled, the request gives its tokens back but keeps its
    // slot: a second fits, a third does not (batch cap 2).
    assert_eq!(c.first_token(1, 0.1).unwrap(), Handoff::Stay);
    assert!(admitted(c.admit(3, 0, 60, 10, 0.1, &[]).unwrap()));
    c.first_token(3, 0.2).unwrap();
    assert!(matches!(c.admit(4, 0, 1, 10, 0.2, &[]).unwrap(), Admission::Shed { .. }));
    c.finish(1, 0.3);
    assert!(admitted(c.admit(5, 0, 1, 10, 0.3, &[]).unwrap()));
}

#[test]
fn the_prompts_that_reach_decode_are_observed_for_the_decode_budgets() {
    let mut c = control(4);
    c.install(plan(vec![
        group(0, Role::Prefill, 0, 1_000_000, 8),
        group(0, Role::Decode, 1, 0, 1000),
    ]));
    // Long prompts arrive too, but only the short ones are prefilled.
    for id in 0..200u64 {
        let long = id % 2 == 1;
        let _ = c.admit(id, 0, if long { 5000 } else { 500 }, 100, 0.0, &[]).unwrap();
        if !long {
            c.first_token(id, 0.1).unwrap();
        }
    }
    let stats = c.window(1.0, None).unwrap().stats;
    assert_eq!(stats[0].mean_prompt_tokens, 2750.0, "the arrivals");
    assert_eq!(stats[0].prefilled_prompt_tokens, Some(500.0), "what decode holds");
    assert_eq!(stats[1].prefilled_prompt_tokens, None, "nothing seen");
    // The hindsight oracle plans for the future's arrivals and what this
    // run's prefill let through.
    let future = [TierStats::new(5.0, 3000.0, 100.0), TierStats::new(1.0, 100.0, 10.0)];
    let stats = c.window(2.0, Some(&future)).unwrap().stats;
    assert_eq!(
        (stats[0].mean_prompt_tokens, stats[0].prefilled_prompt_tokens),
        (3000.0, Some(500.0))
    );
}

#[test]
fn handoffs_wait_for_a_slot_then_are_granted_or_shed() {
    let mut c = control(4);
    let with_decode_cap = |cap| plan(vec![group(0, Role::Prefill, 0, 1000, 4), group(0, Role::Decode, 1, 0, cap)]);
    c.install(with_decode_cap(3));
    for id in 1..=3 {
        assert!(matches!(c.admit(id, 0, 10, 100, 0.0, &[]).unwrap(), Admission::Admitted(_)));
    }
    // A fourth prompt would find no decode slot.
    assert_eq!(
        c.admit(9, 0, 10, 100, 0.0, &[]).unwrap(),
        Admission::Shed {
            reason: ShedReason::OverBudget,
            retry_after_s: 1.0
        }
    );
    // A new plan lowers the decode cap to one slot.
    c.install(with_decode_cap(1));
    assert!(matches!(c.first_token(1, 0.1).unwrap(), Handoff::Move(d) if d.group_first_gpu == 1));
    assert_eq!(c.first_token(2, 0.1).unwrap(), Handoff::Wait);
    assert_eq!(c.first_token(3, 0.1).unwrap(), Handoff::Wait);
    // While hand-offs wait, the tier's prefill groups take no new work.
    assert_eq!(
        c.admit(4, 0, 10, 100, 0.1, &[]).unwrap(),
        Admission::Shed {
            reason: ShedReason::DecodeBacklog,
            retry_after_s: 1.0
        }
    );
    c.finish(1, 0.15);
    let r = c.take_released(0.15);
    assert_eq!(r.granted.len(), 1);
    assert_eq!(r.granted[0].0, 2, "first come, first served");
    // Request 3's wait budget (5% of 50 ms x 128 prior output tokens = 0.32 s)
    // runs out.
    let r = c.take_released(0.5);
    assert_eq!(r.shed, vec![3]);
    assert!(!c.dispatcher().is_in_flight(3));
}

#[test]
fn windows_commit_plans_and_bump_the_id_only_on_change() {
    let mut c = control(8);
    let before = c.plan_id();
    for k in 0..40 {
        let t = f64::from(k) * 0.05;
        let _ = c.admit(k as u64, 0, 500, 100, t, &[]).unwrap();
    }
    let out = c.window(2.0, None).unwrap();
    assert!(out.stats[0].arrival_rate > 0.0);
    assert_eq!(out.plan_changed, c.plan_id() > before);
    let again = c.window(2.0, None).unwrap();
    assert!(!again.layout_changed && !again.plan_changed, "same stats, same plan");
}

#[test]
fn a_background_request_on_a_stopping_group_moves_to_any_free_slot() {
    let tiers = TierSet::new(
        vec![Tier::slo_tier("chat", 500.0, 50.0, 1.0), Tier::background_tier("batch", 0.5)],
        "t",
    )
    .unwrap();
    let mut c = ControlLoop::new(
        Arc::new(synthetic::llama8b_like()),
        tiers,
        Cluster::uniform(4, 8).unwrap(),
        ControlConfig::default(),
    )
    .unwrap();
    c.install(plan(vec![group(0, Role::Prefill, 0, 1000, 4), group(0, Role::Decode, 1, 0, 4)]));
    // The background tier has no group of its own: it runs on chat's
    // prefill group and decodes there (chat does not lend it decode slots).
    assert!(matches!(c.admit(1, 1, 10, 100, 0.0, &[]).unwrap(), Admission::Admitted(d) if d.class == DispatchClass::Background));
    assert_eq!(c.first_token(1, 0.1).unwrap(), Handoff::Stay);
    // The prefill group stops: the request finishes on the decode group's
    // free slot rather than not at all.
    c.install(plan(vec![group(0, Role::Decode, 1, 0, 4)]));
    assert!(matches!(
        c.relocate(1, 0.2).unwrap(),
        Handoff::Move(d) if d.group_first_gpu == 1 && d.class == DispatchClass::Background
    ));
    // With no free slot anywhere on its node it waits for one (a
    // background request has no TPOT to run out), and gets the first that
    // comes free.
    c.install(plan(vec![group(0, Role::Prefill, 0, 1000, 4), group(0, Role::Decode, 1, 0, 4)]));
    assert!(matches!(c.admit(2, 1, 10, 100, 0.3, &[]).unwrap(), Admission::Admitted(_)));
    c.first_token(2, 0.4).unwrap();
    c.install(plan(vec![group(0, Role::Decode, 1, 0, 1)]));
    assert_eq!(c.relocate(2, 0.5).unwrap(), Handoff::Wait);
    assert_eq!(c.take_released(100.0), Released::default(), "still waiting, not shed");
    c.finish(1, 100.5);
    let r = c.take_released(100.5);
    assert!(matches!(r.granted[..], [(2, d)] if d.group_first_gpu == 1 && d.class == DispatchClass::Background));
}
