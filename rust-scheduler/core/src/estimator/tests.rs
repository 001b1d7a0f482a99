//! Hand-computed cases. The profile is linear along every axis, so
//! interpolation is exact and each figure below can be checked on paper.

use super::*;
use crate::profile::synthetic::{tabulate, Axes, LINEAR_AXES};

fn profile() -> Profile {
    let axes = LINEAR_AXES;
    tabulate(
        &[1, 2],
        &axes,
        // TP1: 0.2 ms per prompt token; TP2: 0.12 ms.
        |tp, tokens, _| tokens * if tp == 1 { 0.2 } else { 0.12 },
        // TP1: 10 ms + 1 ms per extra request; TP2: 6 ms + 0.5 ms.
        |tp, b, _| if tp == 1 { 10.0 + (b - 1.0) } else { 6.0 + 0.5 * (b - 1.0) },
        None,
    )
}

fn chat() -> Tier {
    Tier::slo_tier("chat", 300.0, 31.8, 1.0)
}

fn stats() -> TierStats {
    TierStats::new(100.0, 1000.0, 100.0)
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9 * b.abs().max(1.0)
}

#[test]
fn tp2_meets_a_ttft_slo_that_tp1_cannot() {
    let p = profile();
    let e1 = estimate_tp(&p, &chat(), &stats(), 1);
    let e2 = estimate_tp(&p, &chat(), &stats(), 2);
    // TP1: one 1000-token prompt takes 200 ms; 2 x 200 > 300 ms TTFT.
    assert!(!e1.prefill.feasible());
    // TP2: 120 ms; 2 x 120 = 240 <= 300; X = 1 / 0.120 s.
    assert!(close(e2.prefill.throughput_rps, 1.0 / 0.120), "{:?}", e2.prefill);
    assert_eq!(e2.prefill.batch_requests, 1);
    assert!(close(e2.prefill.batch_ms, 120.0));
}

#[test]
fn decode_batch_is_the_largest_within_tpot() {
    let p = profile();
    // TPOT 31.8 ms, of which steps get 95% (the rest is the hand-off's):
    // 30.21 ms, off the grid point, so rounding cannot flip it.
    // TP1: 10 + (B-1) <= 30.21 -> B = 21, T = 30 ms; X = 21 / (100 x 0.030) = 7.
    let e1 = estimate_tp(&p, &chat(), &stats(), 1);
    assert_eq!(e1.decode.batch_requests, 21);
    assert!(close(e1.decode.throughput_rps, 7.0), "{:?}", e1.decode);
    // TP2: 6 + 0.5 (B-1) <= 30.21 -> B = 49, T = 30 ms; X = 49 / 3.0.
    let e2 = estimate_tp(&p, &chat(), &stats(), 2);
    assert_eq!(e2.decode.batch_requests, 49);
    assert!(close(e2.decode.throughput_rps, 49.0 / 3.0), "{:?}", e2.decode);
}

#[test]
fn colocated_is_infeasible_when_chunks_cannot_meet_ttft() {
    // B = 1: chunk 10 tokens (clamped to 20 ms), iteration 30 ms, but the
    // prompt needs 100 iterations: TTFT 3.03 s. B = 2 still needs 50
    // (1.55 s), larger B breaks TPOT.
    let every = colocated_for(&profile(), 1, (Some(300.0), Some(31.8)), &stats(), 1000.0, TpotRule::EveryIteration);
    assert!(!every.feasible(), "{every:?}");
    // On a one-GPU node no pair fits (nor would a TP1 prefill group meet
    // the TTFT: a prompt takes 200 ms, twice 400), so colocation is tried
    // on each request's mean step: larger chunks, but a prompt that waits
    // behind one and then runs its own misses the TTFT as a prefill
    // group's does (the whole prompt: 2 x 210 ms).
    let e1 = estimate_tier(&profile(), 0, &chat(), stats(), &[1], 1).per_tp[0];
    assert!(!e1.prefill.feasible());
    assert!(!e1.colocated.feasible(), "{:?}", e1.colocated);
}

#[test]
fn a_tier_another_level_serves_on_every_step_is_not_estimated_on_the_mean() {
    // TPOT 12 ms and 100-token prompts (as below). TP2 planned alone on a
    // node of 3 GPUs (a static-TP plan, a split partition): its pair does
    // not fit, and its chunks (12 ms beside a 6 ms step) break the TPOT in
    // their iteration, though not on a request's mean step. A TP1 pair
    // (20 ms prefill, 10 ms step) fits and serves the tier on every step,
    // so TP2 keeps the every-step rule: no colocated point.
    let tier = Tier::slo_tier("tight", 300.0, 12.0, 1.0);
    let stats = TierStats::new(1.0, 100.0, 100.0);
    let slos = (Some(300.0), Some(12.0));
    let on_mean = colocated_for(&profile(), 2, slos, &stats, 100.0, TpotRule::RequestMean);
    assert!(on_mean.feasible(), "{on_mean:?}");
    let tp2 = estimate_tier(&profile(), 0, &tier, stats, &[2], 3).per_tp[0];
    assert!(!tp2.colocated.feasible(), "{:?}", tp2.colocated);
}

#[test]
fn colocated_throughput_by_hand() {
    // Loose SLOs: TTFT 10 s, TPOT 1 s; L_in = 100, L_out = 100, so the
    // steady chunk is B tokens. B = 64 (axis max): decode 73 ms. The steady
    // chunk of 64 tokens is clamped to the 100-token row (20 ms), so the
    // whole prompt in one chunk costs the same and is carried by 64% of the
    // iterations: mean iteration 73 + 0.64 x 20 = 85.8 ms; an iteration
    // with the chunk, 93 ms, meets the TPOT.
    let tier = Tier::slo_tier("loose", 10_000.0, 1_000.0, 1.0);
    let e = estimate_tp(&profile(), &tier, &TierStats::new(1.0, 100.0, 100.0), 1);
    // 64 decoding plus the ceil(100/100) = 1 request being prefilled.
    assert_eq!(e.colocated.batch_requests, 65);
    assert_eq!(e.colocated.batch_tokens, 100);
    assert!(close(e.colocated.batch_ms, 93.0), "{:?}", e.colocated);
    assert!(close(e.colocated.throughput_rps, (64.0 / 100.0) / 0.0858), "{:?}", e.colocated);
}

#[test]
fn colocated_prefills_in_fewer_larger_chunks_when_the_tpot_allows() {
    // A prefill with a fixed cost (50 ms + 0.1 ms per token) and a 10 ms
    // decode step; prompts of 1,000 tokens, outputs of 20; TTFT 800 ms,
    // TPOT 200 ms. At B = 1 the steady chunk is 50 tokens (55 ms): 20
    // chunks of 65 ms miss the TTFT. The whole prompt in one chunk (150 ms)
    // keeps every iteration within the TPOT, starts in 150 + 17.5 ms and
    // is carried by 1 iteration in 20: mean iteration 10 + 7.5 = 17.5 ms.
    let axes = LINEAR_AXES;
    let p = tabulate(&[1], &axes, |_, t, _| 50.0 + 0.1 * t, |_, _, _| 10.0, None);
    let tier = Tier::slo_tier("long-prompts", 800.0, 200.0, 1.0);
    let stats = TierStats::new(0.5, 1000.0, 20.0);
    let chunks = |b: u32| {
        let chunk = 50.0 * f64::from(b);
        colocated_at(
            (Some(800.0), TpotRule::EveryIteration),
            (b, 10.0),
            (chunk, p.prefill_ms(1, chunk, 1.0), chunk),
            (1000.0, 20.0),
        )
    };
    assert!(chunks(1).is_none(), "20 steady chunks of 65 ms: 1.3 s");
    let whole = colocated_at(
        (Some(800.0), TpotRule::EveryIteration),
        (1, 10.0),
        (1000.0, p.prefill_ms(1, 1000.0, 1.0), 50.0),
        (1000.0, 20.0),
    )
    .unwrap();
    assert!(close(whole.batch_ms, 160.0), "{whole:?}");
    assert!(close(whole.throughput_rps, (1.0 / 20.0) / 0.0175), "{whole:?}");
    // The estimate finds such a point (its best B is larger).
    let e = estimate_tp(&p, &tier, &stats, 1);
    assert!(
        e.colocated.feasible() && e.colocated.throughput_rps >= whole.throughput_rps,
        "{:?}",
        e.colocated
    );
    assert!(e.colocated.batch_tokens > 50, "{:?}", e.colocated);
}

#[test]
fn a_tpot_one_step_nearly_fills_is_met_on_each_requests_mean() {
    // One GPU per node (no prefill + decode pair fits). TPOT 12 ms against
    // a 10 ms step at B = 1 and chunks of at least 20 ms (the 100-token
    // row): no iteration with a chunk fits, so no colocated point holds
    // every iteration to the TPOT either. A request's TPOT is its
    // mean step: at B = 2 (11 ms) the whole 100-token prompt in one chunk
    // rides on 2 iterations in 100, mean step 11 + 0.02 x 20 = 11.4 ms;
    // B = 3 (12 ms) leaves no room. X = (2 / 100) / 0.0114 s.
    let tier = Tier::slo_tier("tight", 300.0, 12.0, 1.0);
    let one_gpu = |stats: TierStats| estimate_tier(&profile(), 0, &tier, stats, &[1], 1).per_tp[0];
    let e = one_gpu(TierStats::new(1.0, 100.0, 100.0));
    assert_eq!(e.colocated.batch_tokens, 100, "{:?}", e.colocated);
    assert_eq!(e.colocated.batch_requests, 3, "{:?}", e.colocated);
    assert!(close(e.colocated.batch_ms, 31.0), "{:?}", e.colocated);
    assert!(close(e.colocated.throughput_rps, 0.02 / 0.0114), "{:?}", e.colocated);
    // Two output tokens: the one chunk a request sees is half its steps
    // (10 + 0.5 x 20 = 20 ms), so still none.
    let short = one_gpu(TierStats::new(1.0, 100.0, 2.0));
    assert!(!short.colocated.feasible(), "{:?}", short.colocated);
    // On two GPUs a TP1 prefill + decode pair meets both SLOs on every
    // step (a 20 ms prefill, a 10 ms step), so colocation keeps that rule.
    let two = estimate_tier(&profile(), 0, &tier, TierStats::new(1.0, 100.0, 100.0), &[1], 2).per_tp[0];
    assert!(two.prefill.feasible() && two.decode.feasible(), "{two:?}");
    assert!(!two.colocated.feasible(), "{:?}", two.colocated);
}

#[test]
fn a_pair_that_would_leave_another_tier_no_gpu_is_not_the_tiers_to_have() {
    // The tier above on one node of 2 GPUs: alone, a TP1 pair serves it
    // step by step, so colocation keeps that rule. Beside another tier
    // with demand, that tier gets a GPU first: one is left, no pair fits
    // it, and colocation is held to each request's mean step instead.
    let tier = Tier::slo_tier("tight", 300.0, 12.0, 1.0);
    let other = Tier::slo_tier("other", 1_000.0, 100.0, 1.0);
    let node = Cluster::new(vec![2]).unwrap();
    let load = TierStats::new(1.0, 100.0, 100.0);
    let idle = TierStats::new(0.0, 100.0, 100.0);
    let colocated = |other_load: TierStats| {
        let stats = [load, other_load];
        assert_eq!(
            room_gpus(&profile(), &node, &stats, 0),
            if other_load.arrival_rate > 0.0 { 1 } else { 2 }
        );
        estimate_all(&profile(), &[tier.clone(), other.clone()], &stats, &[1], &node)[0].per_tp[0].colocated
    };
    assert!(!colocated(idle).feasible());
    let shared = colocated(load);
    assert!(close(shared.throughput_rps, 0.02 / 0.0114), "{shared:?}");
}

#[test]
fn background_tier_runs_the_largest_batches() {
    let e = estimate_tp(&profile(), &Tier::background_tier("bg", 1.0), &stats(), 1);
    // Prefill: at most floor(1000 / 1000) = 1 prompt per batch: 1 / 0.2 s.
    assert!(close(e.prefill.throughput_rps, 5.0));
    // Decode: B = 64, 73 ms: 64 / (100 x 0.073).
    assert_eq!(e.decode.batch_requests, 64);
    assert!(close(e.decode.throughput_rps, 64.0 / 7.3));
}

#[test]
fn kv_capacity_bounds_the_decode_batch() {
    let axes = LINEAR_AXES;
    let p = tabulate(&[1], &axes, |_, t, _| t * 0.1, |_, b, _| 10.0 + b * 0.1, Some(11_000));
    // 11,000 tokens / (1000 + 100) per request = 10 requests.
    let e = estimate_tp(&p, &Tier::background_tier("bg", 1.0), &stats(), 1);
    assert_eq!(e.decode.batch_requests, 10);
}

#[test]
fn disaggregated_candidate_balances_stages() {
    let p = profile();
    let tiers = [chat()];
    let est = estimate_all(&p, &tiers, &[stats()], &[1, 2], &Cluster::new(vec![4]).unwrap());
    let cands = est[0].candidates();
    // TP2 prefill (8.33 rps) + TP2 decode (16.33 rps): 2 prefill groups and
    // 1 decode group serve min(16.67, 16.33) = 16.33 rps on 6 GPUs.
    let c = cands
        .iter()
        .find(|c| {
            matches!(
                c.mode,
                CandidateMode::Disaggregated {
                    prefill_tp: 2,
                    decode_tp: 2,
                    ..
                }
            )
        })
        .unwrap();
    assert_eq!(
        c.mode,
        CandidateMode::Disaggregated {
            prefill_tp: 2,
            decode_tp: 2,
            prefill_groups: 2,
            decode_groups: 1
        }
    );
    assert!(close(c.throughput_rps, 49.0 / 3.0));
    assert!(close(c.goodput_efficiency, 49.0 / 3.0 / 6.0));
    // No TP1 prefill candidates: TP1 cannot meet the TTFT SLO.
    assert!(!cands
        .iter()
        .any(|c| matches!(c.mode, CandidateMode::Disaggregated { prefill_tp: 1, .. })));
}

#[test]
fn goodput_efficiency_is_capped_by_demand() {
    let p = profile();
    let est = estimate_all(
        &p,
        &[chat()],
        &[TierStats::new(2.0, 1000.0, 100.0)],
        &[1, 2],
        &Cluster::new(vec![4]).unwrap(),
    );
    for c in est[0].candidates() {
        assert!(c.goodput_efficiency <= 2.0 / f64::from(c.gpus) + 1e-12);
    }
}

#[test]
fn geometric_covers_range_and_ends_at_max() {
    let v: Vec<u32> = geometric(20).collect();
    assert_eq!(v.first(), Some(&1));
    assert_eq!(v.last(), Some(&20));
    assert!(v.windows(2).all(|w| w[0] < w[1]));
    assert_eq!(geometric(0).count(), 0);
    assert_eq!(geometric(1).collect::<Vec<_>>(), vec![1]);
}

/// 12 of 16 prompts of `short` tokens, 4 of `long`, as observed.
fn long_tailed(short: u32, long: u32) -> TierStats {
    let samples = (0..160).map(|i| if i % 4 == 3 { long } else { short });
    let lengths = crate::prompt_lengths::PromptLengths::from_samples(samples).unwrap();
    let mean = 0.75 * f64::from(short) + 0.25 * f64::from(long);
    TierStats::new(100.0, mean, 100.0).with_prompt_lengths(lengths)
}

#[test]
fn a_tp_level_too_slow_for_the_mean_prompt_serves_the_shorter_ones() {
    let p = profile();
    // Mean 975 tokens: at TP1 2 x 195 ms > 300 ms TTFT, all or nothing
    // when only the mean is known.
    let stats = long_tailed(500, 2400);
    assert!(!estimate_tp(&p, &chat(), &TierStats::new(100.0, 975.0, 100.0), 1).prefill.feasible());
    // Knowing the lengths: TP1 prefills up to 300 / 0.2 = 1500 tokens alone
    // in time, so the 500-token three quarters; one per batch (2 x 100 ms
    // <= 300), 10 per second.
    let e1 = estimate_tp(&p, &chat(), &stats, 1).prefill;
    assert_eq!((e1.served_share, e1.max_prompt_tokens, e1.batch_requests), (0.75, 1500, 1));
    assert!(close(e1.throughput_rps, 10.0), "{e1:?}");
    // TP2 prefills the mean alone in 117 ms, twice within the TTFT, but a
    // prompt arrives behind a 2400-token one (288 ms) more often than a
    // quarter of the time: the batch it waits behind averages 975 + 694
    // tokens (E[l²]/E[l]), 200 ms, and 200 + 117 > 300. So TP2 too serves
    // the 500-token three quarters (two per batch: 2 x 120 ms), capped at
    // 300 / 0.12 = 2500 tokens.
    let e2 = estimate_tp(&p, &chat(), &stats, 2).prefill;
    assert_eq!((e2.served_share, e2.max_prompt_tokens, e2.batch_requests), (0.75, 2500, 2));
    assert!(close(e2.batch_ms, 0.12 * 1000.0), "{e2:?}");
    // The same mean with every prompt alike waits behind a mean batch.
    let alike = estimate_tp(&p, &chat(), &TierStats::new(100.0, 975.0, 100.0), 2).prefill;
    assert_eq!((alike.served_share, alike.batch_requests), (1.0, 1));
}

#[test]
fn planning_for_every_prompt_still_loses_those_past_the_cap() {
    // 1 prompt in 32 is 3,000 tokens, the rest 100: TP2 prefills batches of
    // the 191-token mean within the 300 ms TTFT, but no 3,000-token prompt
    // even alone (its cap is 300 / 0.12 = 2,500 tokens). Those are shed at
    // dispatch, so the stage serves 31 of 32 prompts, not all.
    let samples = (0..640).map(|i| if i >= 620 { 3000 } else { 100 });
    let lengths = crate::prompt_lengths::PromptLengths::from_samples(samples).unwrap();
    let stats = TierStats::new(100.0, (31.0 * 100.0 + 3000.0) / 32.0, 100.0).with_prompt_lengths(lengths);
    let e2 = estimate_tp(&profile(), &chat(), &stats, 2).prefill;
    assert_eq!((e2.served_share, e2.max_prompt_tokens), (31.0 / 32.0, 2500), "{e2:?}");
    // Its batches are still of the whole set's mean.
    let batch_tokens = (f64::from(e2.batch_requests) * stats.mean_prompt_tokens).ceil() as u32;
    assert_eq!(e2.batch_tokens, batch_tokens, "{e2:?}");
}

#[test]
fn without_a_ttft_every_prompt_is_served() {
    let e = estimate_tp(&profile(), &Tier::background_tier("bg", 1.0), &long_tailed(500, 2400), 1);
    assert_eq!((e.prefill.served_share, e.prefill.max_prompt_tokens), (1.0, 0));
}

#[test]
fn decode_slots_follow_the_prompts_that_were_prefilled() {
    // One decode step: 2 ms + 1 ms per request per 1,000 tokens of context.
    let axes = Axes {
        prefill_tokens: &[100.0, 10_000.0],
        prefill_sizes: &[1.0, 10.0],
        decode_sizes: &[1.0, 64.0],
        decode_contexts: &[100.0, 10_000.0],
    };
    let p = tabulate(&[1], &axes, |_, tokens, _| tokens * 0.01, |_, b, ctx| 2.0 + b * ctx / 1000.0, None);
    let tier = Tier::slo_tier("chat", 1000.0, 20.0, 1.0);
    // Step budget 19 ms (the hand-off keeps 5%): context 1,000 + 100/2.
    let demand = estimate_tp(&p, &tier, &TierStats::new(10.0, 1000.0, 100.0), 1);
    assert_eq!((demand.decode.batch_requests, demand.decode_held), (16, demand.decode));
    // Only 450-token prompts got through prefill lately: the group's batch
    // is sized for what it holds (context 500), its planned capacity for
    // the tier's demand.
    let held = TierStats::new(10.0, 1000.0, 100.0).with_prefilled_prompt_tokens(Some(450.0));
    let e = estimate_tp(&p, &tier, &held, 1);
    assert_eq!(e.decode, demand.decode);
    assert_eq!(e.decode_held.batch_requests, 34);
}

#[test]
fn decode_batches_are_sized_for_the_outputs_they_hold() {
    // A step costs 5 ms + 0.01 ms per request per token of context. Mean
    // output 200 after 1000-token prompts: the mean context is 1100 when
    // every output is 200 tokens (B = 9: 5 + 9 x 11 = 104 ms fits 105 ms
    // less the hand-off's share); with outputs of 20 and 380 tokens the
    // batch holds the 380-token ones 19 times as often (resident 362, mean
    // context 1181, B = 8).
    let axes = LINEAR_AXES;
    let p = tabulate(&[1], &axes, |_, tokens, _| tokens * 0.2, |_, b, ctx| 5.0 + 0.01 * b * ctx, None);
    let tier = Tier::slo_tier("chat", 3000.0, 105.0 / (1.0 - HANDOFF_WAIT_SHARE), 1.0);
    let alike = TierStats::new(1.0, 1000.0, 200.0);
    let spread = alike.with_resident_output_tokens((20.0 * 20.0 + 380.0 * 380.0) / 400.0);
    assert_eq!(estimate_tp(&p, &tier, &alike, 1).decode.batch_requests, 9);
    let e = estimate_tp(&p, &tier, &spread, 1);
    assert_eq!(e.decode.batch_requests, 8);
    assert!(close(e.decode.throughput_rps, 8.0 / (200.0 * (5.0 + 0.08 * 1181.0) / 1e3)), "{e:?}");
}
