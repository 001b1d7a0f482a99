"""The input of the live TP-switch fidelity run (docs/fidelity.md, "Live TP
switches", bench/fidelity/): the generator rewrites the shipped trace byte
for byte, and it loads with the tier file as two phases, short prompts for
chat, then long ones for agent."""

from __future__ import annotations

import runpy
from pathlib import Path

import numpy as np

from tiertp import _scheduler
from tiertp.replay.workload import TierRule, build_workload

FOLDER = Path(__file__).resolve().parents[1] / "bench" / "fidelity"
TRACE = "tp-switch.csv"


def test_generator_rewrites_the_shipped_trace(tmp_path):
    runpy.run_path(str(FOLDER / "make_tp_switch_traces.py"), run_name="generator")["main"](tmp_path)
    assert (tmp_path / TRACE).read_bytes() == (FOLDER / TRACE).read_bytes()


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
