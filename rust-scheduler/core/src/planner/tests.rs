use super::*;
use crate::dispatcher::{DispatchClass, Dispatcher};
use crate::profile::synthetic::{self, tabulate, LINEAR_AXES};

fn planner(tiers: Vec<Tier>, gpus: u32) -> Planner {
    let set = TierSet::new(tiers, "test").unwrap();
    Planner::new(
        Arc::new(synthetic::llama8b_like()),
        set,
        Cluster::uniform(gpus, 8).unwrap(),
        PlannerConfig::default(),
    )
    .unwrap()
}

fn check_plan_shape(plan: &Plan, cluster: &Cluster) {
    let mut seen = vec![false; plan.num_gpus as usize];
    for g in &plan.groups {
        cluster.check_group(g.first_gpu, g.tp).unwrap();
        for gpu in g.gpus() {
            assert!(!seen[gpu as usize], "GPU {gpu} in two groups");
            seen[gpu as usize] = true;
        }
    }
}

#[test]
fn assigns_every_gpu_and_meets_modest_demand() {
    let mut p = planner(vec![Tier::slo_tier("chat", 1000.0, 60.0, 1.0)], 8);
    let out = p.step(&[TierStats::new(3.0, 512.0, 128.0)]).unwrap();
    check_plan_shape(&out.plan, p.cluster());
    assert_eq!(out.plan.gpus_of_tier(0), 8);
    assert!(out.plan.tier_capacity_rps[0] >= 3.0, "{:?}", out.plan);
    assert!(out.changed);
    assert_eq!(out.commands.len(), 8);
}

#[test]
fn picks_tp2_when_only_tp2_meets_the_slo() {
    let mut p = linear_planner(300.0);
    let out = p.step(&[TierStats::new(20.0, 1000.0, 100.0)]).unwrap();
    for g in &out.plan.groups {
        if g.role.takes_prefill() && g.capacity_rps > 0.0 {
            assert_eq!(g.tp, 2, "prefill at TP1 cannot meet TTFT: {g:?}");
        }
    }
    assert!(out.plan.tier_capacity_rps[0] > 0.0);
}

/// One SLO tier (TPOT 30 ms) on 8 GPUs of a linear profile: TP1 prefills
/// 0.2 ms per token, TP2 0.12 ms; a decode step is 10 ms + 1 ms per extra
/// request at TP1, 6 ms + 0.5 ms at TP2.
fn linear_planner(ttft_ms: f64) -> Planner {
    let tiers = TierSet::new(vec![Tier::slo_tier("chat", ttft_ms, 30.0, 1.0)], "t").unwrap();
    Planner::new(
        Arc::new(linear_profile()),
        tiers,
        Cluster::uniform(8, 8).unwrap(),
        PlannerConfig::default(),
    )
    .unwrap()
}

fn linear_profile() -> Profile {
    tabulate(
        &[1, 2],
        &LINEAR_AXES,
        |tp, tokens, _| tokens * if tp == 1 { 0.2 } else { 0.12 },
        |tp, b, _| if tp == 1 { 10.0 + (b - 1.0) } else { 6.0 + 0.5 * (b - 1.0) },
        None,
    )
}

#[test]
fn a_tier_no_group_serves_step_by_step_gets_a_colocated_group_on_its_mean_step() {
    // The linear profile on one node of 2 GPUs; TPOT 8 ms. A decode step
    // fits only at TP2 (6 ms; TP1's is 10), which leaves no GPU for a
    // prefill group, and every chunk (12 ms at least at TP2) breaks the
    // TPOT in its iteration. A request's TPOT is its mean step: one
    // 500-token chunk (60 ms) every 100 steps adds 0.6 ms, so a TP2
    // colocated group serves the tier rather than nothing.
    let profile = linear_profile();
    let tiers = TierSet::new(vec![Tier::slo_tier("chat", 300.0, 8.0, 1.0)], "t").unwrap();
    let mut p = Planner::new(Arc::new(profile), tiers, Cluster::uniform(2, 2).unwrap(), PlannerConfig::default()).unwrap();
    let out = p.step(&[TierStats::new(1.0, 500.0, 100.0)]).unwrap();
    assert!(out.plan.tier_capacity_rps[0] > 0.0, "{:?}", out.plan);
    assert!(
        out.plan
            .groups
            .iter()
            .any(|g| g.role == Role::Colocated && g.tp == 2 && g.capacity_rps > 0.0),
        "{:?}",
        out.plan
    );
}

/// Three quarters of the prompts `short` tokens long, a quarter `long`.
fn long_tailed(rate: f64, short: u32, long: u32) -> TierStats {
    let samples = (0..160).map(|i| if i % 4 == 3 { long } else { short });
    let lengths = crate::prompt_lengths::PromptLengths::from_samples(samples).unwrap();
    TierStats::new(rate, 0.75 * f64::from(short) + 0.25 * f64::from(long), 100.0).with_prompt_lengths(lengths)
}

#[test]
fn a_long_tailed_tier_is_served_where_its_mean_prompt_cannot_be() {
    // TTFT 150 ms: a mean 1000-token prompt takes 2 x 120 ms at TP2 at best.
    let mut p = linear_planner(150.0);
    let mean_only = p.propose(&[TierStats::new(5.0, 1000.0, 100.0)]).unwrap().0;
    assert_eq!(mean_only.tier_capacity_rps[0], 0.0, "{mean_only:?}");
    // The 300-token three quarters fit at either level; the 3100-token
    // quarter at none, and is shed at dispatch rather than run late.
    let out = p.step(&[long_tailed(5.0, 300, 3100)]).unwrap();
    assert!(out.plan.tier_capacity_rps[0] > 0.0, "{:?}", out.plan);
    assert_eq!(out.plan.tier_served_share[0], 0.75);
    for g in out.plan.groups.iter().filter(|g| g.role.takes_prefill() && g.capacity_rps > 0.0) {
        assert!((300..3100).contains(&g.max_prompt_tokens), "{g:?}");
    }
}

#[test]
fn long_prompts_get_a_group_that_can_prefill_them_in_time() {
    // TTFT 300 ms: TP1 prefills up to 1500 tokens in time, TP2 2500. TP1
    // serves more per GPU, but only the short three quarters: the plan
    // also needs a TP2 prefill group for the 2300-token quarter.
    let mut p = linear_planner(300.0);
    let out = p.step(&[long_tailed(5.0, 567, 2300)]).unwrap();
    assert_eq!(out.plan.tier_served_share[0], 1.0, "{:?}", out.plan);
    assert!(
        out.plan
            .groups
            .iter()
            .any(|g| g.role.takes_prefill() && g.tp == 2 && g.max_prompt_tokens >= 2300),
        "{:?}",
        out.plan
    );
}

#[test]
fn hysteresis_keeps_the_plan_under_small_changes() {
    let tiers = vec![
        Tier::slo_tier("chat", 800.0, 50.0, 2.0),
        Tier::slo_tier("agent", 4000.0, 150.0, 1.0),
    ];
    let mut p = planner(tiers, 16);
    let first = p
        .step(&[TierStats::new(10.0, 800.0, 150.0), TierStats::new(5.0, 2000.0, 300.0)])
        .unwrap();
    let second = p
        .step(&[TierStats::new(10.3, 820.0, 150.0), TierStats::new(4.9, 2000.0, 290.0)])
        .unwrap();
    assert!(!second.changed, "{second:?}");
    assert!(second.commands.is_empty());
    let firsts: Vec<_> = first.plan.groups.iter().map(|g| (g.tier, g.role, g.tp, g.first_gpu)).collect();
    let seconds: Vec<_> = second.plan.groups.iter().map(|g| (g.tier, g.role, g.tp, g.first_gpu)).collect();
    assert_eq!(firsts, seconds);
}

/// A tight tier and a loose one, weighted alike.
fn chat_and_agent() -> Vec<Tier> {
    vec![
        Tier::slo_tier("chat", 800.0, 50.0, 1.0),
        Tier::slo_tier("agent", 4000.0, 150.0, 1.0),
    ]
}

#[test]
fn a_real_shift_moves_only_the_gpus_that_change() {
    let tiers = chat_and_agent();
    let mut p = planner(tiers, 16);
    p.step(&[TierStats::new(20.0, 800.0, 150.0), TierStats::new(1.0, 2000.0, 300.0)])
        .unwrap();
    let before = p.current().unwrap().clone();
    let out = p
        .step(&[TierStats::new(1.0, 800.0, 150.0), TierStats::new(30.0, 2000.0, 300.0)])
        .unwrap();
    assert!(out.changed);
    check_plan_shape(&out.plan, p.cluster());
    assert!(out.plan.gpus_of_tier(1) > before.gpus_of_tier(1));
    assert!(out.commands.len() < 16, "stable placement keeps some GPUs: {:?}", out.commands);
    // Every command is for a GPU whose assignment really changed.
    let old = before.group_of_gpu();
    for c in &out.commands {
        let g = &before.groups[old[c.gpu as usize].unwrap()];
        assert!(!(g.tier == c.tier && g.role == c.role && g.tp == c.tp && g.first_gpu == c.group_first_gpu));
    }
}

#[test]
fn a_burst_moves_gpus_only_if_bursts_outlast_the_switch() {
    let tiers = chat_and_agent();
    let calm = [TierStats::new(20.0, 800.0, 150.0), TierStats::new(1.0, 2000.0, 300.0)];
    let burst = |burst_s: f64| [calm[0], TierStats::new(30.0, 2000.0, 300.0).with_sustained(1.0, burst_s)];
    let step_after_calm = |burst_s: f64| {
        let mut p = planner(tiers.clone(), 16);
        p.step(&calm).unwrap();
        p.step(&burst(burst_s)).unwrap()
    };
    // Read as lasting (unknown length, or longer than the commit horizon),
    // the burst moves GPUs to the agent tier; a burst of this tier lasts a
    // second, and moving for it would not repay the switch.
    assert!(step_after_calm(f64::INFINITY).changed);
    assert!(step_after_calm(20.0).changed);
    let out = step_after_calm(1.0);
    assert!(!out.changed, "{out:?}");
}

#[test]
fn no_demand_spreads_gpus_over_tiers() {
    let tiers = vec![
        Tier::slo_tier("a", 800.0, 50.0, 1.0),
        Tier::slo_tier("b", 800.0, 50.0, 1.0),
        Tier::background_tier("c", 1.0),
    ];
    let mut p = planner(tiers, 6);
    let out = p.step(&[TierStats::new(0.0, 512.0, 128.0); 3]).unwrap();
    for t in 0..3 {
        assert_eq!(out.plan.gpus_of_tier(t), 2, "{:?}", out.plan);
    }
}

#[test]
fn bad_stats_are_rejected_naming_the_tier() {
    let mut p = planner(vec![Tier::slo_tier("chat", 800.0, 50.0, 1.0)], 8);
    assert_eq!(p.step(&[]).unwrap_err(), PlanError::StatsCount { got: 0, expected: 1 });
    let e = p.step(&[TierStats::new(f64::NAN, 10.0, 10.0)]).unwrap_err().to_string();
    assert!(e.contains("chat") && e.contains("arrival_rate"), "{e}");
}

#[test]
fn tp_levels_are_limited_by_node_size_and_config() {
    let set = TierSet::new(vec![Tier::slo_tier("chat", 800.0, 50.0, 1.0)], "t").unwrap();
    let prof = Arc::new(synthetic::llama8b_like());
    let p = Planner::new(
        prof.clone(),
        set.clone(),
        Cluster::new(vec![2, 2]).unwrap(),
        PlannerConfig::default(),
    )
    .unwrap();
    assert_eq!(p.tp_levels(), &[1, 2]);
    let cfg = PlannerConfig {
        tp_levels: vec![16],
        ..PlannerConfig::default()
    };
    assert!(matches!(
        Planner::new(prof, set, Cluster::new(vec![2]).unwrap(), cfg),
        Err(PlanError::NoTpLevel { .. })
    ));
}

/// Served rate the plan gives each tier at `stats`.
fn planned_served(plan: &Plan, stats: &[TierStats]) -> Vec<f64> {
    stats.iter().zip(&plan.tier_capacity_rps).map(|(s, &c)| s.served(1.0, c)).collect()
}

#[test]
fn a_bursty_tier_is_planned_for_what_its_capacity_serves() {
    use crate::rate_shape::RateShape;
    // Neither tier's SLO is at least as strict as the other's on both
    // targets, so neither lends to the other: the plan is per tier.
    let tiers = vec![
        Tier::slo_tier("steady", 1000.0, 60.0, 1.0),
        Tier::slo_tier("bursty", 900.0, 70.0, 1.0),
    ];
    // Same mean rate and lengths; one tier gets its requests in every
    // other window. Far more demand than 8 GPUs serve.
    let mut counts = vec![0.0; 30];
    for w in (0..30).step_by(2) {
        counts[w] = 2.0;
    }
    let steady = TierStats::new(200.0, 1000.0, 200.0);
    let bursty = steady.with_rate_shape(RateShape::from_counts(&counts));
    let mut p = planner(tiers, 8);
    let out = p.step(&[steady, bursty]).unwrap();
    assert!(
        out.plan.gpus_of_tier(0) > out.plan.gpus_of_tier(1),
        "a GPU serves more of the steady tier: {:?}",
        out.plan
    );
    assert!(out.plan.gpus_of_tier(1) > 0, "no tier with demand starves");
}

#[test]
fn the_fairness_floor_keeps_an_expensive_tier_served() {
    let tiers = vec![
        Tier::slo_tier("long", 1000.0, 40.0, 1.0),
        Tier::slo_tier("short", 1000.0, 40.0, 1.0),
    ];
    // Equal request rates, both far beyond 8 GPUs; the long tier's requests
    // cost ~30x the short ones', so goodput alone would hand it nothing
    // beyond its first group.
    let stats = [TierStats::new(300.0, 2000.0, 600.0), TierStats::new(300.0, 200.0, 20.0)];
    let mut p = planner(tiers, 8);
    let out = p.step(&stats).unwrap();
    let served = planned_served(&out.plan, &stats);
    let total: f64 = served.iter().sum();
    // Without the floor the long tier keeps its first pair (2 GPUs). With it,
    // it is planned at least the judged floor (0.25x its proportional
    // share); the planned aim is met to within the last group handed out.
    assert!(out.plan.gpus_of_tier(0) >= 4, "{:?}", out.plan);
    assert!(served[0] >= 0.25 * 0.5 * total, "{served:?}");
}

#[test]
fn a_pool_is_hosted_by_the_tier_that_lends_to_every_other() {
    let stats = |a: f64, b: f64| [TierStats::new(a, 512.0, 128.0), TierStats::new(b, 2048.0, 32.0)];
    let p = planner(
        vec![Tier::slo_tier("chat", 300.0, 15.0, 1.0), Tier::slo_tier("agent", 600.0, 30.0, 1.0)],
        4,
    );
    let e = p.estimate(&stats(10.0, 5.0)).unwrap();
    let Some(Sharing::Pooled { host, members, load }) = sharing::pool_for(p.tiers().tiers(), &e) else {
        panic!("chat lends to agent: a pool");
    };
    assert_eq!((host, members), (0, vec![0, 1]));
    // The merged load: summed rate, rate-weighted mean lengths.
    assert_eq!(load.arrival_rate, 15.0);
    assert!(
        (load.mean_prompt_tokens - (10.0 * 512.0 + 5.0 * 2048.0) / 15.0).abs() < 1e-9,
        "{load:?}"
    );
    // One tier with demand: nothing to pool.
    assert_eq!(sharing::pool_for(p.tiers().tiers(), &p.estimate(&stats(10.0, 0.0)).unwrap()), None);
    // A strict tier worth more does not lend its room, so it hosts no pool.
    let worth_more = planner(
        vec![Tier::slo_tier("chat", 300.0, 15.0, 2.0), Tier::slo_tier("agent", 600.0, 30.0, 1.0)],
        4,
    );
    assert_eq!(
        sharing::pool_for(worth_more.tiers().tiers(), &worth_more.estimate(&stats(10.0, 5.0)).unwrap()),
        None
    );
}

#[test]
fn groups_of_a_tier_gone_idle_serve_a_tier_that_arrives_without_a_switch() {
    let mut p = planner(chat_and_agent(), 4);
    let first = p
        .step(&[TierStats::new(5.0, 800.0, 150.0), TierStats::new(0.0, 2000.0, 300.0)])
        .unwrap();
    assert_eq!(first.plan.gpus_of_tier(0), 4, "{:?}", first.plan);
    // Chat went quiet and a little agent traffic came: chat's groups meet
    // agent's SLO, so they serve it as its pool's host; moving GPUs to
    // agent for this would gain nothing worth a switch.
    let out = p
        .step(&[TierStats::new(0.0, 800.0, 150.0), TierStats::new(0.5, 2000.0, 300.0)])
        .unwrap();
    assert!(!out.changed, "{:?}", out.plan);
    assert_eq!(out.plan.pooled_on, vec![None, Some(0)]);
    assert!(out.plan.tier_capacity_rps[1] >= 0.5, "{:?}", out.plan);
    // An idle tier whose SLO does not meet the newcomer's hosts nothing.
    let loose_first = vec![
        Tier::slo_tier("agent", 4000.0, 150.0, 1.0),
        Tier::slo_tier("chat", 800.0, 50.0, 1.0),
    ];
    let mut q = planner(loose_first, 4);
    q.step(&[TierStats::new(5.0, 2000.0, 300.0), TierStats::new(0.0, 800.0, 150.0)])
        .unwrap();
    let out = q
        .step(&[TierStats::new(0.0, 2000.0, 300.0), TierStats::new(0.5, 800.0, 150.0)])
        .unwrap();
    assert!(out.changed && out.plan.gpus_of_tier(1) > 0, "{:?}", out.plan);
}

#[test]
fn an_idle_tier_hosts_a_tier_that_arrives_beside_a_busy_one() {
    // Only chat's SLO meets code's; chat goes quiet while agent stays busy
    // on groups of its own.
    let mut tiers = chat_and_agent();
    tiers.push(Tier::slo_tier("code", 800.0, 50.0, 1.0));
    let mut p = planner(tiers, 8);
    let before = p
        .step(&[
            TierStats::new(5.0, 800.0, 150.0),
            TierStats::new(5.0, 2000.0, 300.0),
            TierStats::new(0.0, 800.0, 150.0),
        ])
        .unwrap()
        .plan;
    assert!(before.gpus_of_tier(0) > 0 && before.gpus_of_tier(1) > 0, "{before:?}");
    let out = p
        .step(&[
            TierStats::new(0.0, 800.0, 150.0),
            TierStats::new(5.0, 2000.0, 300.0),
            TierStats::new(0.5, 800.0, 150.0),
        ])
        .unwrap();
    assert!(!out.changed, "{:?}", out.plan);
    assert_eq!(out.plan.pooled_on, vec![None, None, Some(0)]);
}

#[test]
fn a_tier_the_host_does_not_lend_to_stays_out_of_the_pool_on_groups_of_its_own() {
    // A background tier worth less than chat: chat lends to agent, not to it.
    let tiers = vec![
        Tier::slo_tier("chat", 300.0, 15.0, 1.0),
        Tier::slo_tier("agent", 600.0, 30.0, 1.0),
        Tier::background_tier("batch", 0.5),
    ];
    let mut p = planner(tiers, 8);
    let stats = [
        TierStats::new(4.0, 1024.0, 256.0),
        TierStats::new(5.0, 1024.0, 256.0),
        TierStats::new(2.0, 1024.0, 256.0),
    ];
    let e = p.estimate(&stats).unwrap();
    let Some(Sharing::Pooled { host, members, load }) = sharing::pool_for(p.tiers().tiers(), &e) else {
        panic!("chat lends to agent: a pool of the two");
    };
    assert_eq!((host, members), (0, vec![0, 1]));
    assert_eq!(load.arrival_rate, 9.0);
    // Every tier is served: the pool's members by its groups, batch by its own.
    let out = p.step(&stats).unwrap();
    assert!(out.plan.tier_capacity_rps.iter().all(|&c| c > 0.0), "{:?}", out.plan);
    assert!(out.plan.groups.iter().any(|g| g.tier == 2), "batch has no group: {:?}", out.plan);
    assert!(
        out.plan.groups.iter().all(|g| g.tier != 1),
        "agent is served by the pool: {:?}",
        out.plan
    );
}

#[test]
fn a_tier_worth_more_hosts_everyone_where_groups_of_their_own_would_leave_it_none() {
    // Only a TP8 group decodes voice within 2.5 ms: with a group for each
    // other tier first, voice would get none, and voice lends to no one.
    let tiers = vec![
        Tier::slo_tier("voice", 300.0, 2.5, 2.0),
        Tier::slo_tier("chat", 600.0, 30.0, 1.0),
        Tier::slo_tier("agent", 1000.0, 60.0, 1.0),
        Tier::background_tier("batch", 0.3),
    ];
    let mut p = planner(tiers, 8);
    let out = p.step(&[TierStats::new(10.0, 1024.0, 256.0); 4]).unwrap();
    assert!(out.plan.tier_capacity_rps.iter().all(|&c| c > 0.0), "{:?}", out.plan);
    assert!(out.plan.groups.iter().all(|g| g.tier == 0 && g.tp == 8), "{:?}", out.plan);
    assert_eq!(out.plan.pooled_on, vec![None, Some(0), Some(0), Some(0)]);
    // The dispatcher puts the members on the host's group.
    let mut d = Dispatcher::new(p.tiers(), &out.plan);
    let placed = d.dispatch(1, 1, 512, true).unwrap();
    assert_eq!((placed.key(), placed.class), ((0, 8), DispatchClass::Feasible));
}

#[test]
fn a_pool_across_weights_is_taken_where_it_is_worth_more_though_groups_of_their_own_starve_no_one() {
    // Chat is worth twice the others, so it lends agent and batch nothing
    // at dispatch. On 4 GPUs a group for each tier starves no SLO tier,
    // but runs each half empty; one pair of chat's for all serves more.
    let tiers = vec![
        Tier::slo_tier("chat", 300.0, 10.0, 2.0),
        Tier::slo_tier("agent", 300.0, 20.0, 1.0),
        Tier::background_tier("batch", 0.5),
    ];
    let mut p = planner(tiers, 4);
    let stats = [
        TierStats::new(9.0, 1200.0, 200.0),
        TierStats::new(15.0, 1200.0, 200.0),
        TierStats::new(6.0, 1200.0, 200.0),
    ];
    let out = p.step(&stats).unwrap();
    assert_eq!(out.plan.pooled_on, vec![None, Some(0), Some(0)], "{:?}", out.plan);
    assert!(out.plan.groups.iter().all(|g| g.tier == 0), "{:?}", out.plan);
    assert!(out.plan.tier_capacity_rps[..2].iter().all(|&c| c > 0.0), "{:?}", out.plan);
}

#[test]
fn pool_members_are_credited_their_share_of_what_the_pool_serves() {
    let p = planner(
        vec![Tier::slo_tier("chat", 300.0, 15.0, 1.0), Tier::slo_tier("agent", 600.0, 30.0, 1.0)],
        4,
    );
    let e = p
        .estimate(&[TierStats::new(30.0, 512.0, 128.0), TierStats::new(10.0, 2048.0, 32.0)])
        .unwrap();
    let pool = sharing::pool_for(p.tiers().tiers(), &e).unwrap();
    // The host's groups serve 20 req/s of the 40 offered (steady rates): each gets half of its demand.
    let mut caps = vec![20.0, 0.0];
    let mut shares = vec![1.0, 1.0];
    sharing::credit_members(&mut caps, &mut shares, &e, &pool);
    assert!((caps[0] - 15.0).abs() < 1e-9 && (caps[1] - 5.0).abs() < 1e-9, "{caps:?}");
    // With only half the pool's prompts short enough for its groups, each
    // member is credited the pool's share and half its served requests.
    let mut caps = vec![10.0, 0.0];
    let mut shares = vec![0.5, 1.0];
    sharing::credit_members(&mut caps, &mut shares, &e, &pool);
    assert_eq!(shares, vec![0.5, 0.5]);
    assert!((caps[0] - 7.5).abs() < 1e-9 && (caps[1] - 2.5).abs() < 1e-9, "{caps:?}");
    // Per tier, nothing is pooled or moved.
    let mut own = vec![20.0, 0.0];
    let mut own_shares = vec![0.5, 1.0];
    sharing::credit_members(&mut own, &mut own_shares, &e, &Sharing::PerTier);
    assert_eq!((own, own_shares), (vec![20.0, 0.0], vec![0.5, 1.0]));
}

#[test]
fn the_proposal_is_the_better_of_per_tier_and_pooled_and_a_pooled_member_is_served() {
    // Few GPUs, a strict tier that lends to a loose one with long prompts.
    for (gpus, chat, agent) in [(2, 4.0, 2.0), (4, 10.0, 5.0), (4, 30.0, 15.0), (8, 40.0, 20.0)] {
        let mut p = planner(
            vec![Tier::slo_tier("chat", 500.0, 40.0, 1.0), Tier::slo_tier("agent", 1000.0, 60.0, 1.0)],
            gpus,
        );
        let stats = [TierStats::new(chat, 512.0, 128.0), TierStats::new(agent, 2048.0, 32.0)];
        let e = p.estimate(&stats).unwrap();
        let basis = p.basis(&e, Sharing::PerTier);
        let per_tier = objective(p.tiers().tiers(), &e, &p.propose_at(&e, &basis, p.tp_levels()));
        let out = p.step(&stats).unwrap();
        check_plan_shape(&out.plan, p.cluster());
        assert!(
            out.proposed_objective >= per_tier - 1e-9,
            "{gpus} GPUs: {} < per tier {per_tier}",
            out.proposed_objective
        );
        assert!(
            out.plan.tier_capacity_rps.iter().all(|&c| c > 0.0),
            "{gpus} GPUs: a tier unserved: {:?}",
            out.plan
        );
    }
}

/// Two tiers of the same SLOs and weight: each lends to the other.
fn twin_tiers() -> Vec<Tier> {
    vec![
        Tier::slo_tier("chat", 1000.0, 100.0, 1.0),
        Tier::slo_tier("agent", 1000.0, 100.0, 1.0),
    ]
}

#[test]
fn a_committed_pool_is_judged_under_its_own_host_when_the_busiest_tier_changes() {
    // Two tiers with the same SLOs lend to each other; one GPU, so they
    // share one group, hosted by the busier tier when it was planned.
    let mut p = planner(twin_tiers(), 1);
    let stats = |chat: f64, agent: f64| [TierStats::new(chat, 256.0, 64.0), TierStats::new(agent, 1024.0, 64.0)];
    let first = p.step(&stats(2.0, 1.0)).unwrap();
    assert_eq!(first.plan.groups[0].tier, 0, "{:?}", first.plan);
    // The rates cross a little: the same group still serves both tiers as
    // a pool, valued as such, and is kept.
    let crossed = stats(1.0, 1.05);
    let out = p.step(&crossed).unwrap();
    assert!(!out.changed, "{:?}", out.plan);
    assert!(out.plan.tier_capacity_rps.iter().all(|&c| c > 0.0), "{:?}", out.plan);
    let e = p.estimate(&crossed).unwrap();
    let kept = objective(p.tiers().tiers(), &e, &p.refresh(&first.plan, &e));
    assert!((out.current_objective.unwrap() - kept).abs() < 1e-9);
    assert!(kept >= 0.9 * out.proposed_objective, "{kept} against {}", out.proposed_objective);
}

#[test]
fn a_pool_runs_at_the_caps_of_the_estimate_that_values_it() {
    // One GPU shared by two tiers of the same SLOs: the busier one, whose
    // prompts are short, hosts the pool; the other's prompts are 4x longer.
    // The objective credits the group with the merged load's capacity, so
    // its batch and token caps are the merged load's too: the host's own
    // (short chunks, many requests) would turn that load's long prompts
    // into more iterations than their TTFT holds.
    let mut p = planner(twin_tiers(), 1);
    let stats = [TierStats::new(2.0, 256.0, 64.0), TierStats::new(1.0, 1024.0, 64.0)];
    let out = p.step(&stats).unwrap();
    let [g] = &out.plan.groups[..] else { panic!("{:?}", out.plan) };
    assert_eq!(g.tier, 0, "{g:?}");
    assert!(out.plan.tier_capacity_rps.iter().all(|&c| c > 0.0), "{:?}", out.plan);
    let estimates = p.estimate(&stats).unwrap();
    let pool = sharing::pool_for(p.tiers().tiers(), &estimates).unwrap();
    let levels = (p.tp_levels(), p.cluster());
    let merged = sharing::planning_estimates(p.profile(), p.tiers().tiers(), &estimates, &pool, levels);
    let sized_by = |e: &TierEstimate| group_plan(p.profile(), &p.tiers().tiers()[0], e.at(g.tp).unwrap(), 0, g.role, g.first_gpu);
    let (expected, own) = (sized_by(&merged[0]), sized_by(&estimates[0]));
    assert_ne!(
        (own.batch_cap, own.token_cap),
        (expected.batch_cap, expected.token_cap),
        "the test needs caps that differ"
    );
    assert_eq!(
        (g.batch_cap, g.token_cap, g.slo_budget, g.max_prompt_tokens, g.served_share),
        (
            expected.batch_cap,
            expected.token_cap,
            expected.slo_budget,
            expected.max_prompt_tokens,
            expected.served_share
        )
    );
}

#[test]
fn a_prefill_group_queues_as_many_batches_as_fit_in_the_ttft() {
    // 0.1 ms per prompt token, at most 1,000 tokens a batch: a batch of ten
    // 100-token prompts takes 100 ms, whatever the TTFT.
    let axes = LINEAR_AXES;
    let profile = tabulate(&[1], &axes, |_, tokens, _| 0.1 * tokens, |_, b, _| 5.0 + b, None);
    let stats = TierStats::new(10.0, 100.0, 100.0);
    let budget = |tier: Tier| {
        let e = crate::estimator::estimate_tp(&profile, &tier, &stats, 1);
        assert_eq!((e.prefill.batch_tokens, e.prefill.batch_ms), (1000, 100.0), "{e:?}");
        group_plan(&profile, &tier, &e, 0, Role::Prefill, 0).slo_budget
    };
    // A TTFT of ten batches: ten batches' tokens may be outstanding.
    assert_eq!(budget(Tier::slo_tier("loose", 1000.0, 50.0, 1.0)), 10_000);
    // A TTFT of two and a half: the running batch and one queued.
    assert_eq!(budget(Tier::slo_tier("tight", 250.0, 50.0, 1.0)), 2_000);
    // No TTFT: one running, one queued.
    assert_eq!(budget(Tier::background_tier("batch", 1.0)), 2_000);
}

#[test]
fn a_decode_group_is_planned_for_the_demand_and_budgeted_for_what_it_holds() {
    let profile = synthetic::llama8b_like();
    let tier = Tier::slo_tier("chat", 1000.0, 30.0, 1.0);
    let stats = TierStats::new(10.0, 4000.0, 200.0).with_prefilled_prompt_tokens(Some(1000.0));
    let e = crate::estimator::estimate_tp(&profile, &tier, &stats, 2);
    assert!(e.decode_held.batch_requests > e.decode.batch_requests, "{e:?}");
    let g = group_plan(&profile, &tier, &e, 0, Role::Decode, 0);
    assert_eq!(g.capacity_rps, e.decode.throughput_rps);
    assert_eq!(
        (g.slo_budget, g.batch_cap),
        (u64::from(e.decode_held.batch_requests), e.decode_held.batch_requests)
    );
}

#[test]
fn a_prefill_group_is_placed_on_a_node_with_a_decode_group_of_its_tier() {
    // Two nodes of 8 GPUs; a prompt prefilled on one node cannot move its
    // KV to the other, so a prefill group with its tier's decode groups
    // only on the other node would decode its prompts itself.
    let tiers = vec![Tier::slo_tier("chat", 200.0, 10.0, 1.0), Tier::slo_tier("agent", 200.0, 15.0, 1.0)];
    for rate in [5.0, 10.0, 20.0, 40.0, 80.0] {
        let mut p = planner(tiers.clone(), 16);
        let out = p
            .step(&[TierStats::new(rate * 0.7, 1000.0, 200.0), TierStats::new(rate * 0.3, 2000.0, 100.0)])
            .unwrap();
        let node = |g: &GroupPlan| g.first_gpu / 8;
        for g in out.plan.groups.iter().filter(|g| g.role == Role::Prefill) {
            assert!(
                out.plan
                    .groups
                    .iter()
                    .any(|d| d.role == Role::Decode && d.tier == g.tier && node(d) == node(g)),
                "at {rate} req/s: {g:?} has no decode group of its tier on its node: {:?}",
                out.plan.groups
            );
        }
    }
}

#[test]
fn decode_is_counted_for_the_prompts_the_plans_prefill_serves() {
    // TTFT 320 ms: TP1 prefills up to 1600 tokens in time, TP2 2666; a
    // decode step grows with the context, so the 567-token three quarters
    // that a TP1 prefill group serves decode in larger batches than the
    // whole set (mean 1000) a TP2 one serves.
    let axes = LINEAR_AXES;
    let profile = tabulate(
        &[1, 2],
        &axes,
        |tp, tokens, _| tokens * if tp == 1 { 0.2 } else { 0.12 },
        |tp, b, ctx| if tp == 1 { 10.0 + b * ctx / 1000.0 } else { 6.0 + b * ctx / 2000.0 },
        None,
    );
    let tier = Tier::slo_tier("chat", 320.0, 30.0, 1.0);
    let tiers = TierSet::new(vec![tier.clone()], "t").unwrap();
    let p = Planner::new(Arc::new(profile), tiers, Cluster::uniform(8, 8).unwrap(), PlannerConfig::default()).unwrap();
    let stats = long_tailed(5.0, 567, 2300);
    let estimates = p.estimate(&[stats]).unwrap();
    // A decode group is valued at its whole throughput (`counted_utilization`).
    let whole_set = estimates[0].at(2).unwrap().decode.throughput_rps;
    let decode_capacity = |prefill_tp: u32| {
        let plan = p.build_plan(&[(0, Role::Prefill, prefill_tp, 0), (0, Role::Decode, 2, 2)], &estimates, None);
        let d = plan.groups.iter().find(|g| g.role == Role::Decode).unwrap();
        (plan.tier_served_share[0], d.capacity_rps)
    };
    assert_eq!(decode_capacity(2), (1.0, whole_set));
    let (share, capacity) = decode_capacity(1);
    assert_eq!(share, 0.75);
    let short = crate::estimator::decode_within_share(p.profile(), &tier, &stats, 2, 0.75);
    assert_eq!(capacity, short.throughput_rps);
    assert!(capacity > 1.2 * whole_set, "{capacity} against {whole_set}");
}

#[test]
fn a_pool_takes_its_lengths_from_what_it_serves_when_full_not_from_a_bursty_members_rate() {
    // Chat is steady with long outputs; agent has the same mean rate in
    // bursts, with short outputs. When the pool is full, a freed place goes
    // to chat in most windows, so the pool's mean output is mostly chat's.
    use crate::rate_shape::RateShape;
    let mut counts = vec![1.0; 9];
    counts.push(91.0);
    let stats = [
        TierStats::new(10.0, 1000.0, 160.0),
        TierStats::new(10.0, 2000.0, 30.0).with_rate_shape(RateShape::from_counts(&counts)),
    ];
    let p = planner(
        vec![Tier::slo_tier("chat", 500.0, 40.0, 1.0), Tier::slo_tier("agent", 1000.0, 60.0, 1.0)],
        4,
    );
    let e = p.estimate(&stats).unwrap();
    let Some(Sharing::Pooled { members, load, .. }) = sharing::pool_for(p.tiers().tiers(), &e) else {
        panic!("chat lends to agent: a pool");
    };
    assert_eq!(members.len(), 2);
    assert_eq!(load.arrival_rate, 20.0, "the demand is both members' whole rate");
    let by_rate = (160.0 + 30.0) / 2.0;
    // Chat gets about three places in four (its rate share is a half).
    assert!(
        load.mean_output_tokens > by_rate + 20.0,
        "{} (by rate: {by_rate})",
        load.mean_output_tokens
    );
    assert!(load.mean_prompt_tokens < 1300.0, "{} (by rate: 1500)", load.mean_prompt_tokens);
    // Both steady: the rate shares.
    let steady = [stats[0], TierStats::new(10.0, 2000.0, 30.0)];
    let e = p.estimate(&steady).unwrap();
    let Some(Sharing::Pooled { load, .. }) = sharing::pool_for(p.tiers().tiers(), &e) else {
        panic!("a pool");
    };
    assert!((load.mean_output_tokens - by_rate).abs() < 1e-9, "{}", load.mean_output_tokens);
}

#[test]
fn a_lone_prefill_group_with_little_slack_is_valued_below_the_target_and_pooled_ones_at_it() {
    // TP1 prefills a 1,000-token prompt in 200 ms: a 450 ms TTFT holds two
    // such batches, so a lone TP1 prefill group may have one prompt ahead of
    // a new one; four of them drain one queue four times as fast.
    let p = linear_planner(450.0);
    let estimates = p.estimate(&[TierStats::new(5.0, 1000.0, 100.0)]).unwrap();
    let prefill = estimates[0].at(1).unwrap().prefill;
    let slack = queueing::slack_prompts(&p.tiers().tiers()[0], &prefill).unwrap();
    assert!(slack > 0.0 && slack < 3.0, "{prefill:?}");
    let prefill_capacity = |groups: &[(usize, Role, u32, u32)]| {
        let plan = p.build_plan(groups, &estimates, None);
        plan.groups.iter().find(|g| g.role == Role::Prefill).unwrap().capacity_rps
    };
    let lone = prefill_capacity(&[(0, Role::Prefill, 1, 0), (0, Role::Decode, 2, 2)]);
    assert_eq!(lone, prefill.throughput_rps * queueing::prefill_utilization(slack, 0.85));
    assert!(lone < 0.8 * prefill.throughput_rps, "{lone} of {}", prefill.throughput_rps);
    let pooled = prefill_capacity(&[
        (0, Role::Prefill, 1, 0),
        (0, Role::Prefill, 1, 1),
        (0, Role::Prefill, 1, 2),
        (0, Role::Prefill, 1, 3),
        (0, Role::Decode, 2, 4),
    ]);
    assert_eq!(pooled, prefill.throughput_rps * 0.85);
}

#[test]
fn gpus_no_group_serves_in_time_on_become_prefill_headroom_beside_a_decode_bound_pair() {
    // TP1 prefills a 1,000-token prompt in 200 ms but decodes at 44 ms a
    // step against a 20 ms TPOT (no TP1 group serves a request in time);
    // TP4 decodes within it. On 7 GPUs one TP4 decode group binds; the GPU
    // left was a best-effort TP1 group that served nothing.
    let profile = tabulate(
        &[1, 4],
        &LINEAR_AXES,
        |tp, tokens, _| tokens * if tp == 1 { 0.2 } else { 0.07 },
        |tp, b, _| if tp == 1 { 44.0 + 0.1 * b } else { 12.0 + 0.2 * b },
        None,
    );
    let tiers = TierSet::new(vec![Tier::slo_tier("chat", 500.0, 20.0, 1.0)], "t").unwrap();
    let planner = Planner::new(Arc::new(profile), tiers, Cluster::uniform(7, 8).unwrap(), PlannerConfig::default()).unwrap();
    let (plan, _) = planner.propose(&[TierStats::new(100.0, 1000.0, 200.0)]).unwrap();
    let shape: Vec<(Role, u32)> = plan.groups.iter().map(|g| (g.role, g.tp)).collect();
    assert!(plan.groups.iter().all(|g| g.capacity_rps > 0.0), "{shape:?}");
    assert_eq!(shape.iter().filter(|&&g| g == (Role::Prefill, 1)).count(), 3, "{shape:?}");
    assert_eq!(shape.iter().filter(|&&g| g == (Role::Decode, 4)).count(), 1, "{shape:?}");
}
