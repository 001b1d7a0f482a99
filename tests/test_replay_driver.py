"""The replay driver's own logic (workload building, hindsight choice of
baseline settings, conservation checks, report files) against a test double
of the simulator: FakeSimulatorForTests, never used by the CLI. Checks of
the real simulator are in test_replay_sim.py."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest

from tiertp import _scheduler as s
from tiertp.replay import (
    ConservationError, ReplayConfig, TierRule, build_workload, check_conservation, cut_load, parse_policies,
    replay, variants,
)
from tiertp.replay.policies import SWEPT, label
from tiertp.replay.tier_configs import TIER_CONFIGS, resolve_tiers
from tiertp.traces import TraceError

POLICIES = list(SWEPT)


class FakeSimulatorForTests:
    """Test double with simulate's signature: each request is served FIFO on
    gpus/tp identical servers, TTFT = queueing + prompt/(20k tok/s x tp),
    TPOT = 10 ms / tp; a request that would wait over 5 s is rejected.
    `lose` drops the last request from the result (a conservation bug)."""

    def __init__(self, lose: bool = False):
        self.calls: list[tuple[str, dict]] = []
        self.lose = lose

    def __call__(self, profile, tiers, arrival_s, tier, prompt_tokens, output_tokens, gpus, policy,
                 gpus_per_node=8, tp=None, prefill_share=None, window_s=1.0, switch_ms=None, kv_gbps=None,
                 progress=None):
        settings = {k: v for k, v in (("tp", tp), ("prefill_share", prefill_share)) if v is not None}
        self.calls.append((policy, settings))
        tp = tp or 1
        free = [0.0] * max(gpus // tp, 1)
        ttft, tpot, finish, status = [], [], [], []
        for a, p, o in zip(arrival_s, prompt_tokens, output_tokens):
            i = min(range(len(free)), key=free.__getitem__)
            start = max(a, free[i])
            if start - a > 5.0:
                ttft.append(math.nan), tpot.append(math.nan), finish.append(math.nan), status.append("rejected")
                continue
            first = start + p / (20_000.0 * tp)
            end = first + (o - 1) * 0.010 / tp
            free[i] = end
            ttft.append((first - a) * 1000), tpot.append(10.0 / tp), finish.append(end), status.append("completed")
        if progress:
            progress(1.0)
        n = len(arrival_s) - (1 if self.lose else 0)
        return {
            "policy": policy, "settings": settings, "num_gpus": gpus,
            "sim_end_s": max([f for f in finish if f == f] + [0.0]),
            "ttft_ms": ttft[:n], "tpot_ms": tpot[:n], "finish_s": finish[:n], "status": status[:n],
            "timeline": [{"time_s": 0.0, "groups": [{"tier": tiers.names[0], "role": "colocated", "tp": tp,
                                                     "first_gpu": g * tp} for g in range(len(free))]}],
            "switches": 0, "migrated_requests": 0, "wall_s": 0.001,
        }


@pytest.fixture()
def tiers():
    return s.TierSet.load(str(TIER_CONFIGS["azure-two-tier"]))


def synthetic(rate=4, duration=30, seed=0, output=20):
    return f"synthetic:poisson,rate={rate},prompt=512,output={output},duration={duration},seed={seed}"


def config(tmp_path, **kw):
    base = dict(traces=[synthetic()], tiers_path=TIER_CONFIGS["azure-two-tier"], profile=s.Profile.synthetic(),
                gpus=4, out=tmp_path / "report", tier_rule=TierRule(fractions={"chat": 0.6, "agent": 0.4}),
                rps=[2.0, 8.0], duration_s=20.0, progress=False)
    base.update(kw)
    return ReplayConfig(**base)


def test_settings_grid_fits_the_cluster():
    assert variants("tiertp", 8, 8, [1, 2, 4, 8]) == [{}]
    assert [v["tp"] for v in variants("sglang", 4, 8, [1, 2, 4, 8])] == [1, 2, 4]
    assert variants("sglang-pd", 4, 8, [1, 2, 4, 8]) == [
        {"tp": 1, "prefill_share": 0.25}, {"tp": 1, "prefill_share": 0.5}, {"tp": 2, "prefill_share": 0.5}]
    assert len(variants("sglang-pd", 8, 8, [1, 2, 4, 8])) == 5
    assert [v["tp"] for v in variants("llumnix", 16, 8, [1, 2, 4, 8])] == [1, 2, 4, 8]


def test_policy_names_are_checked():
    assert parse_policies("all", POLICIES) == POLICIES
    assert parse_policies("sglang,tiertp,sglang", POLICIES) == ["sglang", "tiertp"]
    with pytest.raises(ValueError, match="unknown policy \\['vllm'\\]; valid: all, tiertp"):
        parse_policies("tiertp,vllm", POLICIES)


def test_tiers_by_name_or_path(tmp_path):
    assert resolve_tiers("azure-two-tier").name == "tiers-azure-two-tier.toml"
    with pytest.raises(ValueError, match="nor one of default, azure-two-tier"):
        resolve_tiers("gold")


def test_workload_tier_rules(tiers):
    names = list(tiers.names)
    w = build_workload([synthetic(seed=1), synthetic(seed=2).replace("poisson", "gamma") + ",cv=2"],
                       TierRule.parse("synthetic-poisson-4rps=chat,synthetic-gamma-4rps=agent", None), names)
    assert set(w.tier.tolist()) == {0, 1}
    with pytest.raises(TraceError, match="have no tier; give --tier-map"):
        build_workload([synthetic()], TierRule(), names)
    with pytest.raises(TraceError, match="not in the tier config; valid tiers: \\['chat', 'agent'\\]"):
        build_workload([synthetic()], TierRule.parse(None, "gold=1"), names)
    with pytest.raises(TraceError, match="tier map names trace\\(s\\) \\['azure-chat'\\] not given"):
        build_workload([synthetic()], TierRule.parse("azure-chat=chat", None), names)
    with pytest.raises(TraceError, match="not both"):
        TierRule.parse("a=b", "chat=1")


def test_cut_load_scales_then_windows(tiers):
    w = build_workload([synthetic(rate=4, duration=100)], TierRule(fractions={"chat": 1.0}), list(tiers.names))
    load = cut_load(w, 8.0, 20.0)
    assert load.window_s == 20.0 and load.trace.arrival_s[-1] < 20.0
    assert load.offered_rps == pytest.approx(8.0, rel=0.25)
    whole = cut_load(w, None, None)
    assert len(whole.trace) == len(w)


def test_conservation_check_catches_lost_and_inconsistent_requests():
    arrival, out = np.array([0.0, 1.0]), np.array([5, 5])
    good = {"ttft_ms": [10.0, math.nan], "tpot_ms": [5.0, math.nan], "finish_s": [0.5, math.nan],
            "status": ["completed", "rejected"]}
    check_conservation(good, arrival, out, "ok")
    with pytest.raises(ConservationError, match="`status` has 1 entries for 2 requests"):
        check_conservation({**good, "status": ["completed"]}, arrival, out, "lost")
    with pytest.raises(ConservationError, match="status \\['running'\\]"):
        check_conservation({**good, "status": ["completed", "running"]}, arrival, out, "stuck")
    with pytest.raises(ConservationError, match="rejected yet given a finish time"):
        check_conservation({**good, "finish_s": [0.5, 2.0]}, arrival, out, "twice")
    with pytest.raises(ConservationError, match="without a finite TTFT"):
        check_conservation({**good, "ttft_ms": [math.nan, math.nan]}, arrival, out, "no ttft")


def test_replay_fails_loudly_when_the_simulator_loses_a_request(tmp_path):
    with pytest.raises(ConservationError, match="policy tiertp \\(default\\)"):
        replay(config(tmp_path, policies="tiertp"), simulate=FakeSimulatorForTests(lose=True), valid_policies=POLICIES)


def test_hindsight_picks_the_best_setting_and_writes_the_report(tmp_path):
    fake = FakeSimulatorForTests()
    # 6000-token prompts: 300 ms to first token at TP1 misses chat's 250 ms TTFT; TP2 and TP4 meet it
    cfg = config(tmp_path, traces=[synthetic(rate=16, duration=40, output=50).replace("prompt=512", "prompt=6000")],
                 rps=[1.0, 40.0], policies="sglang,tiertp")
    report = replay(cfg, simulate=fake, valid_policies=POLICIES)
    assert [p for p, _ in fake.calls] == ["sglang"] * 3 + ["tiertp"] + ["sglang"] * 3 + ["tiertp"]
    low, high = report.results
    tried = low.policies["sglang"].tried
    assert set(tried) == {"tp=1", "tp=2", "tp=4"} and tried["tp=1"] < max(tried["tp=2"], tried["tp=4"])
    # the best goodput wins; a tie keeps the first setting in grid order
    assert label(low.policies["sglang"].best.settings) == max(tried, key=tried.get)
    best = high.policies["sglang"]
    assert best.best.metrics.goodput_rps == max(best.tried.values())
    doc = json.loads((tmp_path / "report" / "report.json").read_text())
    assert [x["rps"] for x in doc["loads"]] == [1.0, 40.0]
    run = doc["loads"][1]["policies"]["sglang"]
    assert run["settings_label"] == label(best.best.settings)
    assert run["requests"] == run["completed"] + run["rejected"] > 0
    assert {t["tier"] for t in run["tiers"]} == {"chat", "agent"}
    assert set(run["tiers"][0]["ttft_ms"]) == {"p50", "p90", "p99"}
    assert doc["settings_grid"]["swept"]["sglang"] == ["tp"]
    rows = list(csv.DictReader(open(tmp_path / "report" / "report.csv")))
    assert len(rows) == 2 * 2 * 2  # policy x load x tier
    assert {p.name for p in report.files} >= {"report.json", "report.csv", "goodput.png"}
    assert all(p.stat().st_size > 0 for p in report.files)
    assert any(p.name.startswith("timeline-tiertp-") for p in report.files)
    assert "sglang" in report.table and label(best.best.settings) in report.table
