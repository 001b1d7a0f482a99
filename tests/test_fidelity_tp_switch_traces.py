"""The input of the live TP-switch fidelity runs (docs/fidelity.md, "Live TP
switches", bench/fidelity/): the generator rewrites the shipped traces byte
for byte, and each loads with its tier file in its phases: short prompts
for chat, then long ones for agent (and chat again in the hand-off run)."""

from __future__ import annotations

import runpy
from pathlib import Path

import numpy as np

from tiertp import _scheduler
from tiertp.replay.workload import TierRule, build_workload

FOLDER = Path(__file__).resolve().parents[1] / "bench" / "fidelity"
TRACE = "tp-switch.csv"
HANDOFF_TRACE = "tp-switch-handoff.csv"


def test_generator_rewrites_the_shipped_traces(tmp_path):
    runpy.run_path(str(FOLDER / "make_tp_switch_traces.py"), run_name="generator")["main"](tmp_path)
    for name in (TRACE, HANDOFF_TRACE):
        assert (tmp_path / name).read_bytes() == (FOLDER / name).read_bytes()


def test_trace_loads_as_two_phases_with_its_tier_column():
    tiers = _scheduler.TierSet.load(str(FOLDER / "tiers-tp-switch.toml"))
    trace = build_workload([f"azure:{FOLDER / TRACE}"], TierRule(), list(tiers.names))
    chat, agent = (trace.tier == list(tiers.names).index(n) for n in ("chat", "agent"))
    assert (chat.sum(), agent.sum()) == (58, 53)
    # Rebased to the first arrival: chat for its first 70 s, agent from 60 s to 180 s.
    assert trace.arrival_s[chat].max() < 70 and trace.arrival_s.max() < 180
    assert trace.arrival_s[agent].min() > 55 and trace.arrival_s[agent].max() > 160
    # Short prompts TP1 prefills within the 600 ms TTFT, long ones it cannot.
    assert np.mean(trace.prompt_tokens[chat]) < 200 and np.min(trace.prompt_tokens[agent]) > 800


def test_handoff_trace_loads_as_chat_agent_chat_each_past_the_demand_memory():
    from tiertp._scheduler import DEFAULT_DEMAND_MEMORY_S

    tiers = _scheduler.TierSet.load(str(FOLDER / "tiers-tp-switch-handoff.toml"))
    names = list(tiers.names)
    trace = build_workload([f"azure:{FOLDER / HANDOFF_TRACE}"], TierRule(), names)
    chat, agent = (trace.tier == names.index(n) for n in ("chat", "agent"))
    first, second = chat & (trace.arrival_s < 100), chat & (trace.arrival_s >= 100)
    assert first.sum() > 30 and second.sum() > 30 and agent.sum() > 30
    # Each phase outlasts the control loop's demand memory, so the planner can follow it.
    assert trace.arrival_s[agent].max() - trace.arrival_s[first].max() > DEFAULT_DEMAND_MEMORY_S
    assert trace.arrival_s[second].min() > trace.arrival_s[agent].min() + DEFAULT_DEMAND_MEMORY_S
    assert np.mean(trace.prompt_tokens[chat]) < 200 and np.min(trace.prompt_tokens[agent]) > 800
    # chat's TPOT leaves no room for a prefill chunk beside its decodes; agent's is loose
    slo = {t["name"]: t for t in tiers.to_list()}
    assert slo["chat"]["tpot_ms"] < slo["agent"]["ttft_ms"] < slo["agent"]["tpot_ms"]
