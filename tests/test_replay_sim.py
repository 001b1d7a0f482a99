"""Replay against the real simulator (tiertp._scheduler.simulate):
conservation for every policy, ~100% attainment far below capacity,
identical seeds give identical results, the CLI writes its report, and the
replay benchmark's JSON shape. Short traces only."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest

from tiertp import _scheduler as s
from tiertp.replay import ReplayConfig, TierRule, build_workload, cut_load, replay, variants
from tiertp.replay.metrics import UNKNOWN_REASON
from tiertp.replay.policies import SWEPT
from tiertp.replay.sim_run import SimContext, run_once
from tiertp.replay.tier_configs import TIER_CONFIGS

pytestmark = pytest.mark.skipif(not hasattr(s, "simulate"), reason="this build of tiertp._scheduler has no simulator")

TWO_TIER = TIER_CONFIGS["azure-two-tier"]


def two_tier_trace(rate: float, duration: float, seed: int = 0) -> list[str]:
    """Chat-like (short prompts, long answers) and agent-like (long prompts, short answers) traffic."""
    return [
        f"synthetic:gamma,rate={rate * 0.6:g},cv=2,prompt=1000,prompt_cv=1,output=200,output_cv=1,duration={duration},seed={seed}",
        f"synthetic:poisson,rate={rate * 0.4:g},prompt=2000,prompt_cv=1,output=30,output_cv=1,duration={duration},seed={seed + 1}",
    ]


def tier_rule(rate: float) -> TierRule:
    return TierRule(tier_map={f"synthetic-gamma-{rate * 0.6:g}rps": "chat", f"synthetic-poisson-{rate * 0.4:g}rps": "agent"})


@pytest.fixture(scope="module")
def profile():
    from tiertp.profiles import resolve

    return s.Profile.load(str(resolve("h100", "llama-3.1-8b")))


@pytest.fixture(scope="module")
def tiers():
    return s.TierSet.load(str(TWO_TIER))


def test_grid_covers_every_simulator_policy():
    # a superset: the grid may name a policy a newer simulator adds (sglang-slo)
    assert set(s.SIM_POLICIES) <= set(SWEPT)


@pytest.mark.parametrize("gpus", [4, 8])
def test_every_policy_conserves_requests(profile, tiers, gpus):
    """Every request is reported completed or rejected, once (run_once checks
    it and raises ConservationError), under a load that overloads 4 GPUs."""
    rate = 30.0
    workload = build_workload(two_tier_trace(rate, 15), tier_rule(rate), list(tiers.names))
    load = cut_load(workload, None, None)
    ctx = SimContext(s.simulate, profile, tiers, gpus)
    for policy in s.SIM_POLICIES:
        for settings in variants(policy, gpus, 8, list(profile.tp_levels))[:2]:
            out = run_once(ctx, load, policy, settings)
            m = out.metrics
            assert m.completed + m.rejected == m.requests == len(load.trace), (policy, settings)
            assert sum(t.requests for t in m.tiers) == m.requests
            # Every rejection says why, in the report as in the result.
            assert sum(m.rejected_by.values()) == m.rejected and UNKNOWN_REASON not in m.rejected_by, (policy, m.rejected_by)
            assert all(sum(t.rejected_by.values()) == t.rejected for t in m.tiers)


def test_far_below_capacity_every_policy_meets_its_slos(profile, tmp_path):
    rate = 1.0
    cfg = ReplayConfig(traces=two_tier_trace(rate, 60), tiers_path=TWO_TIER, profile=profile, gpus=8,
                       out=tmp_path, tier_rule=tier_rule(rate), plots=False, progress=False)
    (result,) = replay(cfg).results
    assert len(result.load.trace) > 30
    for policy, entry in result.policies.items():
        m = entry.best.metrics
        assert m.rejected == 0, policy
        assert m.attainment >= 0.98, (policy, entry.best.settings, m.attainment)


@pytest.mark.parametrize("policy", getattr(s, "SIM_POLICIES", []))
def test_azure_traces_far_below_capacity_meet_their_slos(profile, tiers, policy):
    """Two minutes of the real Azure traces at 2 req/s on 8 GPUs (a few % of capacity)."""
    try:
        workload = build_workload(["azure-conv", "azure-code"], TierRule(), list(tiers.names))
    except FileNotFoundError as e:
        pytest.skip(str(e))
    load = cut_load(workload, 2.0, 120.0)
    ctx = SimContext(s.simulate, profile, tiers, 8)
    best = max((run_once(ctx, load, policy, v) for v in variants(policy, 8, 8, list(profile.tp_levels))),
               key=lambda o: o.metrics.goodput_rps)
    assert best.metrics.rejected == 0
    assert best.metrics.attainment >= 0.98


def test_identical_seeds_give_identical_results(profile, tiers):
    rate = 20.0
    workload = build_workload(two_tier_trace(rate, 10), tier_rule(rate), list(tiers.names))
    load = cut_load(workload, None, None)
    for policy in ("tiertp", "llumnix", "oracle"):
        a, b = (run_once(SimContext(s.simulate, profile, tiers, 4, seed=3), load, policy,
                         variants(policy, 4, 8, [1, 2, 4, 8])[0]) for _ in range(2))
        np.testing.assert_array_equal(a.ttft_ms, b.ttft_ms)
        np.testing.assert_array_equal(a.tpot_ms, b.tpot_ms)
        assert a.timeline == b.timeline and a.metrics == b.metrics


def test_cli_writes_the_report(tmp_path):
    from tiertp.cli import main

    out = tmp_path / "report"
    trace = two_tier_trace(5.0, 20)
    tier_map = ",".join(f"{k}={v}" for k, v in tier_rule(5.0).tier_map.items())
    rc = main(["replay", "--trace", trace[0], "--trace", trace[1], "--tier-map", tier_map,
               "--tiers", "azure-two-tier", "--gpus", "4", "--gpu", "h100", "--model", "llama-3.1-8b",
               "--policies", "tiertp,sglang,split", "--rps", "2,8", "--duration", "10", "--out", str(out),
               "--no-progress"])
    assert rc == 0
    names = {p.name for p in out.iterdir()}
    assert {"report.json", "report.csv", "goodput.png"} <= names
    assert any(n.startswith("timeline-tiertp-") for n in names) and any(n.startswith("cdf-") for n in names)
    doc = json.loads((out / "report.json").read_text())
    assert [sorted(load["policies"]) for load in doc["loads"]] == [["sglang", "split", "tiertp"]] * 2


def test_replay_bench_json_shape():
    from tiertp.bench.replay import run

    try:
        out = run(argparse.Namespace(quick=True, policies="tiertp,sglang"))
    except FileNotFoundError as e:
        pytest.skip(str(e))
    assert set(out["speedup_vs_realtime"]) == {"8", "64"}
    assert set(out["per_policy"]) == {"tiertp", "sglang"}
    assert all(v > 0 for v in out["speedup_vs_realtime"].values())


def test_no_request_is_left_unfinished():
    """Hand-offs granted (or shed) by a window step reach the simulator as
    those granted on a completion do. Before they did, a request granted
    a decode slot in a window step waited forever: here 4 of 4,500."""
    from tiertp.profiles import resolve

    profile = s.Profile.load(str(resolve("h100", "qwen2.5-14b")))
    tiers = s.TierSet.load(str(Path(__file__).parents[1] / "bench" / "tiers" / "qwen2.5-14b-h100.toml"))
    spec = "synthetic:poisson,rate=15,prompt=800,prompt_cv=1,output=1000,output_cv=1,duration=300"
    workload = build_workload([spec], TierRule(fractions={"chat": 0.5, "agent": 0.5}), list(tiers.names))
    load = cut_load(workload, 30, 300)
    out = run_once(SimContext(s.simulate, profile, tiers, 8), load, "tiertp", {})
    assert "unfinished" not in out.metrics.rejected_by, out.metrics.rejected_by
    assert out.sim_end_s < 2 * float(load.trace.arrival_s[-1])
