"""The inputs of the live TP-switch fidelity run (docs/fidelity.md, "Live TP
switches", bench/fidelity/): the generator rewrites the shipped traces
byte for byte, and they load with the documented tier map and tier file as
two phases, short prompts for chat, then long ones for agent."""

from __future__ import annotations

import runpy
from pathlib import Path

import numpy as np

from tiertp import _scheduler
from tiertp.replay.workload import TierRule, build_workload

FOLDER = Path(__file__).resolve().parents[1] / "bench" / "fidelity"
TRACES = ("tp-switch-short.csv", "tp-switch-long.csv")


def test_generator_rewrites_the_shipped_traces(tmp_path):
    runpy.run_path(str(FOLDER / "make_tp_switch_traces.py"), run_name="generator")["main"](tmp_path)
    for name in TRACES:
        assert (tmp_path / name).read_bytes() == (FOLDER / name).read_bytes(), name


def test_traces_load_as_two_phases_with_the_documented_tier_map():
    tiers = _scheduler.TierSet.load(str(FOLDER / "tiers-tp-switch.toml"))
    rule = TierRule.parse("tp-switch-short=chat,tp-switch-long=agent", None)
    trace = build_workload([f"azure:{FOLDER / n}" for n in TRACES], rule, list(tiers.names))
    chat, agent = (trace.tier == list(tiers.names).index(n) for n in ("chat", "agent"))
    assert (chat.sum(), agent.sum()) == (58, 53)
    # Merged on the files' clock, rebased to the first arrival: chat for
    # its first 70 s, agent from 60 s to 180 s.
    assert trace.arrival_s[chat].max() < 70 and trace.arrival_s.max() < 180
    assert trace.arrival_s[agent].min() > 55 and trace.arrival_s[agent].max() > 160
    # Short prompts TP1 prefills within the 600 ms TTFT, long ones it cannot.
    assert np.mean(trace.prompt_tokens[chat]) < 200 and np.min(trace.prompt_tokens[agent]) > 800
