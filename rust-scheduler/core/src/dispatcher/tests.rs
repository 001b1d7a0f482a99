use super::*;
use crate::plan::GroupPlan;
use crate::test_support::{self, plan};
use crate::tiers::Tier;
use crate::topology::Cluster;

fn tiers() -> TierSet {
    TierSet::new(
        vec![Tier::slo_tier("chat", 500.0, 50.0, 1.0), Tier::background_tier("bg", 1.0)],
        "t",
    )
    .unwrap()
}

/// A TP1 group with an 8-request batch cap.
fn group(tier: usize, role: Role, first: u32, budget: u64) -> GroupPlan {
    test_support::group(tier, role, first, budget, 8)
}

#[test]
fn feasible_goes_to_least_loaded_and_over_budget_is_refused() {
    let p = plan(vec![
        group(0, Role::Colocated, 0, 100),
        group(0, Role::Colocated, 1, 100),
        group(1, Role::Colocated, 2, 100),
    ]);
    let mut d = Dispatcher::new(&tiers(), &p);
    let a = d.dispatch(1, 0, 60, true).unwrap();
    let b = d.dispatch(2, 0, 60, true).unwrap();
    assert_eq!((a.group_first_gpu, a.class), (0, DispatchClass::Feasible));
    assert_eq!((b.group_first_gpu, b.class), (1, DispatchClass::Feasible));
    // Both chat groups have 40 left: a 50-token prompt fits neither, and
    // never goes to the background tier's group.
    assert_eq!(d.dispatch(3, 0, 50, true), Err(DispatchError::OverBudget { tier: 0 }));
    assert!(!d.is_in_flight(3));
    assert_eq!(d.complete(1), Ok(60));
    assert_eq!(
        d.dispatch(5, 0, 50, true).unwrap(),
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
    let big = d.dispatch(1, 0, 500, true).unwrap();
    assert_eq!((big.group_first_gpu, big.class), (0, DispatchClass::Feasible));
    // The zero-budget group is idle, so it takes one; then it is full.
    assert_eq!(d.dispatch(2, 0, 10, true).unwrap().group_first_gpu, 1);
    assert!(d.dispatch(3, 0, 10, true).is_err());
}

#[test]
fn slots_are_a_hard_cap_and_prompt_tokens_return_at_the_first_token() {
    let mut g = group(0, Role::Colocated, 0, 1000);
    g.batch_cap = 2;
    let mut d = Dispatcher::new(&tiers(), &plan(vec![g]));
    d.dispatch(1, 0, 100, true).unwrap();
    d.dispatch(2, 0, 100, true).unwrap();
    assert_eq!(d.load_of((0, 1)), Load { tokens: 200, slots: 2 });
    assert_eq!(d.dispatch(3, 0, 1, true), Err(DispatchError::OverBudget { tier: 0 }));
    assert_eq!(d.prefill_done(1), Ok(false));
    assert_eq!(d.load_of((0, 1)), Load { tokens: 100, slots: 2 });
    assert_eq!(d.complete(1), Ok(0));
    assert!(d.dispatch(3, 0, 1, true).is_ok());
}

#[test]
fn background_round_robins_over_background_groups() {
    let p = plan(vec![
        group(0, Role::Colocated, 0, 100),
        group(1, Role::Colocated, 1, 100),
        group(1, Role::Colocated, 2, 100),
    ]);
    let mut d = Dispatcher::new(&tiers(), &p);
    let gpus: Vec<u32> = (0..4).map(|i| d.dispatch(i, 1, 10, true).unwrap().group_first_gpu).collect();
    assert_eq!(gpus, vec![1, 2, 1, 2]);
}

#[test]
fn background_without_own_groups_takes_only_room_to_spare() {
    let mut g = group(0, Role::Colocated, 0, 100);
    g.batch_cap = 1;
    let mut d = Dispatcher::new(&tiers(), &plan(vec![g]));
    assert_eq!(d.dispatch(1, 1, 10, true).unwrap().class, DispatchClass::Background);
    assert_eq!(d.dispatch(2, 1, 10, true), Err(DispatchError::OverBudget { tier: 1 }));
}

#[test]
fn errors_are_typed() {
    let p = plan(vec![group(0, Role::Colocated, 0, 100)]);
    let mut d = Dispatcher::new(&tiers(), &p);
    assert_eq!(
        d.dispatch(1, 7, 10, true),
        Err(DispatchError::UnknownTier { tier: 7, num_tiers: 2 })
    );
    d.dispatch(1, 0, 10, true).unwrap();
    assert_eq!(d.dispatch(1, 0, 10, true), Err(DispatchError::Duplicate(1)));
    assert_eq!(d.complete(9), Err(DispatchError::UnknownRequest(9)));
    let mut empty = Dispatcher::new(&tiers(), &plan(vec![]));
    assert!(matches!(empty.dispatch(1, 0, 10, true), Err(DispatchError::NoCapacity(_))));
}

#[test]
fn a_tier_without_a_live_group_fails_over_to_room_elsewhere() {
    let p = plan(vec![group(1, Role::Colocated, 0, 100)]);
    let mut d = Dispatcher::new(&tiers(), &p);
    let moved = d.dispatch(1, 0, 60, true).unwrap();
    assert_eq!((moved.group_first_gpu, moved.class), (0, DispatchClass::BestEffort));
    // Only with room: the background group is now at its budget.
    assert!(matches!(d.dispatch(2, 0, 60, true), Err(DispatchError::NoCapacity(_))));
    assert!(matches!(
        d.dispatch_avoiding(3, 0, 1, true, &[(0, 1)]),
        Err(DispatchError::NoCapacity(_))
    ));
}

#[test]
fn decode_handoff_moves_the_request_to_a_free_slot() {
    let decode = |cap| test_support::group(0, Role::Decode, 1, 0, cap);
    let mut d = Dispatcher::new(&tiers(), &plan(vec![group(0, Role::Prefill, 0, 1000), decode(2)]));
    d.dispatch(1, 0, 300, true).unwrap();
    d.dispatch(2, 0, 300, true).unwrap();
    // Prefill groups hold prompt tokens, no slots.
    assert_eq!(d.load_of((0, 1)), Load { tokens: 600, slots: 0 });
    // Without its prefill-only groups the tier has nothing.
    assert!(d.dispatch(3, 0, 10, false).is_err());
    assert_eq!(d.prefill_done(1), Ok(true));
    let moved = d.dispatch_decode(1, false).unwrap().unwrap();
    assert_eq!((moved.group_first_gpu, moved.charge), (1, 0));
    assert_eq!(d.load_of((1, 1)), Load { tokens: 0, slots: 1 });
    // A new plan lowers the decode group's cap to the one slot it holds.
    d.set_plan(&tiers(), &plan(vec![group(0, Role::Prefill, 0, 1000), decode(1)]));
    d.prefill_done(2).unwrap();
    assert_eq!(d.dispatch_decode(2, false), Ok(None), "the decode group is full");
    assert_eq!(d.group_of(2), Some((0, 1)));
    assert_eq!(d.complete(1), Ok(0));
    assert!(d.dispatch_decode(2, false).unwrap().is_some());
    d.complete(2).unwrap();
    assert!(d.total_load().is_zero());
}

#[test]
fn prefill_groups_take_no_more_prompts_than_decode_slots_are_free() {
    let p = plan(vec![
        group(0, Role::Prefill, 0, 1000),
        test_support::group(0, Role::Decode, 1, 0, 2),
    ]);
    let mut d = Dispatcher::new(&tiers(), &p);
    d.dispatch(1, 0, 10, true).unwrap();
    d.dispatch(2, 0, 10, true).unwrap();
    // Two prompts prefilling claim both decode slots: the prefill group has
    // token room but no slot in view.
    let refused = Err(DispatchError::OverBudget { tier: 0 });
    assert_eq!(d.dispatch(3, 0, 10, true), refused);
    d.prefill_done(1).unwrap();
    d.dispatch_decode(1, false).unwrap().unwrap();
    assert_eq!(d.dispatch(4, 0, 10, true), refused, "one slot free, one prompt to claim it");
    d.complete(1).unwrap();
    assert_eq!(d.dispatch(5, 0, 10, true).unwrap().group_first_gpu, 0);
}

#[test]
fn prefill_counts_on_the_slots_a_fast_decode_group_surely_frees_before_the_prompt_is_prefilled() {
    // Both decode slots taken; a 500-token prompt is prefilled in half the
    // budget's drain (the 500 ms TTFT): 250 ms.
    let full_decode = |frees_per_s: f64| {
        let decode = GroupPlan {
            capacity_rps: frees_per_s,
            ..test_support::group(0, Role::Decode, 1, 0, 2)
        };
        let mut d = Dispatcher::new(&tiers(), &plan(vec![group(0, Role::Prefill, 0, 1000), decode]));
        for id in [1, 2] {
            d.dispatch(id, 0, 10, true).unwrap();
            d.prefill_done(id).unwrap();
            d.dispatch_decode(id, false).unwrap().unwrap();
        }
        d
    };
    let refused = Err(DispatchError::OverBudget { tier: 0 });
    // One request a second: none surely finishes within 250 ms.
    assert_eq!(full_decode(1.0).dispatch(3, 0, 500, true), refused);
    // 400 a second: ~100 would, far more than the two running; the two
    // slots they free are in view, for two prompts and no more.
    let mut d = full_decode(400.0);
    d.dispatch(3, 0, 500, true).unwrap();
    d.dispatch(4, 0, 100, true).unwrap();
    assert_eq!(d.dispatch(5, 0, 100, true), refused);
}

#[test]
fn plan_change_keeps_charges_exact() {
    let mut d = Dispatcher::new(
        &tiers(),
        &plan(vec![group(0, Role::Colocated, 0, 100), group(0, Role::Colocated, 1, 100)]),
    );
    d.dispatch(1, 0, 30, true).unwrap();
    d.dispatch(2, 0, 40, true).unwrap();
    // GPU 1 leaves the plan; GPU 0 stays.
    d.set_plan(
        &tiers(),
        &plan(vec![group(0, Role::Colocated, 0, 100), group(1, Role::Colocated, 2, 100)]),
    );
    assert_eq!(d.total_load(), Load { tokens: 70, slots: 2 });
    assert_eq!(d.complete(2), Ok(40));
    assert_eq!(d.complete(1), Ok(30));
    assert!(d.total_load().is_zero());
    assert!(d.load_of((1, 1)).is_zero());
}

#[test]
fn hand_offs_stay_on_the_requests_node() {
    // Two nodes of 8 GPUs: prefill on node 0; decode groups on node 1
    // (GPU 8) and, in the second plan, also on node 0 (GPU 1).
    let cluster = Cluster::uniform(16, 8).unwrap();
    let far = plan(vec![group(0, Role::Prefill, 0, 1000), group(0, Role::Decode, 8, 1000)]);
    let mut d = Dispatcher::new(&tiers(), &far);
    d.set_nodes(&cluster);
    d.dispatch(1, 0, 10, true).unwrap();
    assert!(d.prefill_done(1).unwrap());
    assert_eq!(d.decode_reachable(1, false), Ok(false));
    assert_eq!(d.dispatch_decode(1, false), Ok(None), "its KV cannot reach node 1");

    let near = plan(vec![
        group(0, Role::Prefill, 0, 1000),
        group(0, Role::Decode, 1, 1000),
        group(0, Role::Decode, 8, 1000),
    ]);
    d.set_plan(&tiers(), &near);
    d.dispatch(2, 0, 10, true).unwrap();
    d.prefill_done(2).unwrap();
    assert_eq!(d.dispatch_decode(2, false).unwrap().unwrap().group_first_gpu, 1);
    // Node 0's decode group is now busier than node 1's, and still chosen.
    assert_eq!(d.decode_reachable(1, false), Ok(true));
    assert_eq!(d.dispatch_decode(1, false).unwrap().unwrap().group_first_gpu, 1);
}

fn strict_and_loose() -> TierSet {
    TierSet::new(
        vec![Tier::slo_tier("chat", 200.0, 10.0, 1.0), Tier::slo_tier("agent", 500.0, 30.0, 1.0)],
        "t",
    )
    .unwrap()
}

#[test]
fn a_full_tier_borrows_room_from_a_stricter_tier_never_a_looser_one() {
    let p = plan(vec![group(0, Role::Colocated, 0, 100), group(1, Role::Colocated, 1, 100)]);
    let mut d = Dispatcher::new(&strict_and_loose(), &p);
    assert_eq!(d.dispatch(1, 1, 80, true).unwrap().group_first_gpu, 1);
    // The agent's group is full: chat's group serves the agent within the
    // agent's SLO (chat's is stricter), charged against chat's budget.
    let lent = d.dispatch(2, 1, 50, true).unwrap();
    assert_eq!((lent.group_first_gpu, lent.class), (0, DispatchClass::Feasible));
    assert_eq!(d.tier_of(2), Some(1));
    // Chat's group is now at 50 of 100: a 60-token chat prompt does not fit,
    // and never goes to the agent's group, whose TPOT is looser than chat's.
    assert_eq!(d.dispatch(3, 0, 60, true), Err(DispatchError::OverBudget { tier: 0 }));
    assert_eq!(d.complete(2), Ok(50));
    assert_eq!(d.dispatch(4, 0, 60, true).unwrap().group_first_gpu, 0);
}

#[test]
fn a_tier_worth_more_does_not_lend_its_room() {
    let tiers = TierSet::new(
        vec![Tier::slo_tier("chat", 200.0, 10.0, 2.0), Tier::slo_tier("agent", 500.0, 30.0, 1.0)],
        "t",
    )
    .unwrap();
    let p = plan(vec![group(0, Role::Colocated, 0, 100), group(1, Role::Colocated, 1, 100)]);
    let mut d = Dispatcher::new(&tiers, &p);
    assert_eq!(d.dispatch(1, 1, 80, true).unwrap().group_first_gpu, 1);
    assert_eq!(d.dispatch(2, 1, 50, true), Err(DispatchError::OverBudget { tier: 1 }));
}

#[test]
fn a_prefilled_request_takes_a_stricter_tiers_decode_slot_when_its_own_are_taken() {
    let p = plan(vec![
        group(1, Role::Prefill, 0, 1000),
        test_support::group(1, Role::Decode, 1, 0, 1),
        test_support::group(0, Role::Decode, 2, 0, 1),
    ]);
    let mut d = Dispatcher::new(&strict_and_loose(), &p);
    for id in [1, 2, 3] {
        d.dispatch(id, 1, 10, true).unwrap();
        assert!(d.prefill_done(id).unwrap());
    }
    assert_eq!(d.dispatch_decode(1, false).unwrap().unwrap().group_first_gpu, 1);
    assert_eq!(d.dispatch_decode(2, false).unwrap().unwrap().group_first_gpu, 2);
    assert_eq!(d.dispatch_decode(3, false).unwrap(), None);
    assert!(d.decode_reachable(3, false).unwrap());
}

#[test]
fn a_prompt_goes_only_to_a_group_that_can_prefill_it_in_time() {
    let capped = |first: u32, max_prompt_tokens: u32| GroupPlan {
        max_prompt_tokens,
        ..group(0, Role::Colocated, first, 10_000)
    };
    let p = plan(vec![capped(0, 1000), capped(1, 3000)]);
    let mut d = Dispatcher::new(&tiers(), &p);
    // Both idle; only group 1 can prefill 2000 tokens in time.
    assert_eq!(d.dispatch(1, 0, 2000, true).unwrap().group_first_gpu, 1);
    assert_eq!(d.dispatch(2, 0, 500, true).unwrap().group_first_gpu, 0);
    // Too long for every group of the tier: shed, not run late.
    assert_eq!(
        d.dispatch(3, 0, 5000, true),
        Err(DispatchError::PromptTooLong {
            tier: 0,
            prompt_tokens: 5000
        })
    );
    assert!(!d.is_in_flight(3));
}

/// A TP2 group on GPUs `first`, `first + 1`.
fn tp2(tier: usize, role: Role, first: u32) -> GroupPlan {
    GroupPlan {
        tp: 2,
        ..group(tier, role, first, 1000)
    }
}

#[test]
fn a_split_settles_prefilled_requests_on_decode_and_waiting_ones_on_prefill_over_the_same_gpus() {
    let t = tiers();
    let mut d = Dispatcher::new(&t, &plan(vec![tp2(0, Role::Colocated, 0), group(1, Role::Colocated, 2, 1000)]));
    d.dispatch(1, 0, 100, true).unwrap();
    d.dispatch(2, 0, 100, true).unwrap();
    assert_eq!(d.prefill_done(1), Ok(false));
    let kept = d.dispatch(3, 1, 100, true).unwrap();
    assert_eq!(kept.key(), (2, 1));
    // The TP2 group splits into a prefill and a decode group; GPU 2 stays.
    d.set_plan(
        &t,
        &plan(vec![
            group(0, Role::Prefill, 0, 1000),
            group(0, Role::Decode, 1, 1000),
            group(1, Role::Colocated, 2, 1000),
        ]),
    );
    let settled = d.settle_stopped(|_| false);
    let at = |id: u64| {
        settled
            .iter()
            .find(|(i, _)| *i == id)
            .map(|(_, dec)| (dec.key(), dec.class, dec.charge))
    };
    assert_eq!(settled.len(), 2);
    assert_eq!(at(1), Some(((1, 1), DispatchClass::Feasible, 0)));
    assert_eq!(at(2), Some(((0, 1), DispatchClass::Feasible, 100)));
    assert_eq!(d.load_of((1, 1)), Load { tokens: 0, slots: 1 });
    assert_eq!(d.load_of((0, 1)), Load { tokens: 100, slots: 0 });
    assert_eq!(d.load_of((0, 2)), Load::default());
    assert_eq!(d.group_of(3), Some((2, 1)));
    // Settled once: a second call moves nothing.
    assert!(d.settle_stopped(|_| false).is_empty());
}

#[test]
fn a_merge_settles_everything_on_the_merged_group_even_another_tiers() {
    let t = tiers();
    let mut d = Dispatcher::new(
        &t,
        &plan(vec![group(0, Role::Colocated, 0, 1000), group(0, Role::Colocated, 1, 1000)]),
    );
    d.dispatch(1, 0, 100, true).unwrap();
    d.dispatch(2, 0, 100, true).unwrap();
    assert_eq!(d.prefill_done(2), Ok(false));
    let held = d.dispatch(3, 0, 100, true).unwrap().key();
    // The background tier's TP2 group is all the new plan has over them.
    d.set_plan(&t, &plan(vec![tp2(1, Role::Colocated, 0)]));
    // A request held by no group (waiting for a decode slot) stays put.
    let settled = d.settle_stopped(|id| id == 3);
    let keys: Vec<_> = settled.iter().map(|(id, dec)| (*id, dec.key(), dec.class)).collect();
    assert_eq!(
        keys,
        vec![(1, (0, 2), DispatchClass::BestEffort), (2, (0, 2), DispatchClass::BestEffort)]
    );
    assert_eq!(d.load_of((0, 2)), Load { tokens: 100, slots: 2 });
    assert_eq!(d.group_of(3), Some(held));
}

#[test]
fn a_group_kept_under_a_new_role_keeps_its_requests_in_that_role() {
    let t = tiers();
    let mut d = Dispatcher::new(&t, &plan(vec![group(0, Role::Colocated, 0, 1000), group(0, Role::Decode, 1, 1000)]));
    d.dispatch(1, 0, 100, true).unwrap();
    // GPU 0 turns prefill-only: the request stays, and its first token now
    // needs a decode slot elsewhere.
    d.set_plan(&t, &plan(vec![group(0, Role::Prefill, 0, 1000), group(0, Role::Decode, 1, 1000)]));
    assert!(d.settle_stopped(|_| false).is_empty());
    assert_eq!(d.group_of(1), Some((0, 1)));
    assert_eq!(d.prefill_done(1), Ok(true));
    assert_eq!(d.dispatch_decode(1, false).unwrap().map(|x| x.key()), Some((1, 1)));
}
