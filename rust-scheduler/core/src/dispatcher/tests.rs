use super::*;
use crate::plan::GroupPlan;
use crate::tiers::Tier;

fn tiers() -> TierSet {
    TierSet::new(
        vec![Tier::slo_tier("chat", 500.0, 50.0, 1.0), Tier::background_tier("bg", 1.0)],
        "t",
    )
    .unwrap()
}

fn group(tier: usize, role: Role, first: u32, budget: u64) -> GroupPlan {
    GroupPlan {
        tier,
        role,
        tp: 1,
        first_gpu: first,
        capacity_rps: 1.0,
        batch_cap: 8,
        token_cap: 1000,
        slo_budget: budget,
    }
}

fn plan(groups: Vec<GroupPlan>) -> Plan {
    Plan {
        num_gpus: 8,
        groups,
        tier_capacity_rps: vec![1.0, 1.0],
    }
}

#[test]
fn feasible_goes_to_least_loaded_then_spills_round_robin() {
    let p = plan(vec![
        group(0, Role::Colocated, 0, 100),
        group(0, Role::Colocated, 1, 100),
        group(1, Role::Colocated, 2, 100),
    ]);
    let mut d = Dispatcher::new(&tiers(), &p);
    let a = d.dispatch(1, 0, 60).unwrap();
    let b = d.dispatch(2, 0, 60).unwrap();
    assert_eq!((a.group_first_gpu, a.class), (0, DispatchClass::Feasible));
    assert_eq!((b.group_first_gpu, b.class), (1, DispatchClass::Feasible));
    // Both chat groups have 40 left: a 50-token prompt spills, round robin.
    let c = d.dispatch(3, 0, 50).unwrap();
    let e = d.dispatch(4, 0, 50).unwrap();
    assert_eq!((c.class, e.class), (DispatchClass::BestEffort, DispatchClass::BestEffort));
    assert_ne!(c.group_first_gpu, e.group_first_gpu);
    assert_eq!(d.complete(1), Ok(60));
    assert_eq!(
        d.dispatch(5, 0, 50).unwrap(),
        Decision {
            group_first_gpu: 0,
            tp: 1,
            class: DispatchClass::Feasible,
            charge: 50
        }
    );
}

#[test]
fn an_idle_group_takes_a_prompt_larger_than_its_budget() {
    let p = plan(vec![group(0, Role::Colocated, 0, 100), group(0, Role::Colocated, 1, 0)]);
    let mut d = Dispatcher::new(&tiers(), &p);
    let big = d.dispatch(1, 0, 500).unwrap();
    assert_eq!((big.group_first_gpu, big.class), (0, DispatchClass::Feasible));
    // Now busy: the next one spills; the zero-budget group is never feasible.
    assert_eq!(d.dispatch(2, 0, 10).unwrap().class, DispatchClass::BestEffort);
}

#[test]
fn background_round_robins_over_background_groups() {
    let p = plan(vec![
        group(0, Role::Colocated, 0, 100),
        group(1, Role::Colocated, 1, 100),
        group(1, Role::Colocated, 2, 100),
    ]);
    let mut d = Dispatcher::new(&tiers(), &p);
    let gpus: Vec<u32> = (0..4).map(|i| d.dispatch(i, 1, 10).unwrap().group_first_gpu).collect();
    assert_eq!(gpus, vec![1, 2, 1, 2]);
}

#[test]
fn errors_are_typed() {
    let p = plan(vec![group(0, Role::Colocated, 0, 100)]);
    let mut d = Dispatcher::new(&tiers(), &p);
    assert_eq!(d.dispatch(1, 7, 10), Err(DispatchError::UnknownTier { tier: 7, num_tiers: 2 }));
    d.dispatch(1, 0, 10).unwrap();
    assert_eq!(d.dispatch(1, 0, 10), Err(DispatchError::Duplicate(1)));
    assert_eq!(d.complete(9), Err(DispatchError::UnknownRequest(9)));
    let mut empty = Dispatcher::new(&tiers(), &plan(vec![]));
    assert!(matches!(empty.dispatch(1, 0, 10), Err(DispatchError::NoCapacity(_))));
}

#[test]
fn decode_handoff_returns_the_prefill_charge() {
    let p = plan(vec![group(0, Role::Prefill, 0, 1000), group(0, Role::Decode, 1, 2)]);
    let mut d = Dispatcher::new(&tiers(), &p);
    d.dispatch(1, 0, 300).unwrap();
    assert_eq!(d.load_of((0, 1)), 300);
    let dec = d.dispatch_decode(1, 0).unwrap();
    assert_eq!((dec.group_first_gpu, dec.charge), (1, 1));
    assert_eq!(d.load_of((0, 1)), 0);
    assert_eq!(d.complete(1), Ok(1));
    assert_eq!(d.total_load(), 0);
}

#[test]
fn plan_change_keeps_charges_exact() {
    let mut d = Dispatcher::new(
        &tiers(),
        &plan(vec![group(0, Role::Colocated, 0, 100), group(0, Role::Colocated, 1, 100)]),
    );
    d.dispatch(1, 0, 30).unwrap();
    d.dispatch(2, 0, 40).unwrap();
    // GPU 1 leaves the plan; GPU 0 stays.
    d.set_plan(
        &tiers(),
        &plan(vec![group(0, Role::Colocated, 0, 100), group(1, Role::Colocated, 2, 100)]),
    );
    assert_eq!(d.total_load(), 70);
    assert_eq!(d.complete(2), Ok(40));
    assert_eq!(d.complete(1), Ok(30));
    assert_eq!(d.total_load(), 0);
    assert_eq!(d.load_of((1, 1)), 0);
}
