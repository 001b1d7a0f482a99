"""Per-tier goodput in the replay reports (tiertp.replay.report): the
printed table has a row per tier under each policy's total, marks unfair
totals, and report.json / report.csv carry the fairness flag. Hand-made
results, no simulator."""

from __future__ import annotations

import numpy as np

from tiertp.replay.metrics import RunMetrics, TierMetrics
from tiertp.replay.report import csv_rows, goodput_table, report_dict
from tiertp.replay.sim_run import RunOutcome
from tiertp.replay.sweep import LoadResult, PolicyAtLoad
from tiertp.replay.workload import Load

NO_LATENCY = {"p50": None, "p90": None, "p99": None}


def outcome(policy: str, settings: dict, window_s: float, tiers: dict[str, tuple[int, int]]) -> RunOutcome:
    """tiers: name -> (requests, met); everything met completed, the rest rejected."""
    tm = [TierMetrics(name, n, met, n - met, met, met / n if n else None, met / window_s, NO_LATENCY, NO_LATENCY)
          for name, (n, met) in tiers.items()]
    n, met = sum(t.requests for t in tm), sum(t.met for t in tm)
    m = RunMetrics(n, met, n - met, met, met / n, met / window_s, n / window_s, window_s, tm)
    return RunOutcome(policy, settings, m, np.array([]), np.array([]), [], window_s, 0, 0, 0.0)


def results() -> list[LoadResult]:
    low = Load(10.0, list(range(100)), 10.0)
    high = Load(40.0, list(range(400)), 10.0)
    return [
        LoadResult(low, {
            "tiertp": PolicyAtLoad(outcome("tiertp", {}, 10.0, {"chat": (60, 60), "agent": (40, 40)}), {"default": 10.0}),
            "sglang": PolicyAtLoad(outcome("sglang", {"tp": 1}, 10.0, {"chat": (60, 57), "agent": (40, 40)}),
                                   {"tp=1": 9.7, "tp=2": 9.0}),
        }),
        LoadResult(high, {
            "tiertp": PolicyAtLoad(outcome("tiertp", {}, 10.0, {"chat": (240, 200), "agent": (160, 120)}), {"default": 32.0}),
            # agent has 40% of the requests and gets 1 of 151 met: starved
            "sglang": PolicyAtLoad(outcome("sglang", {"tp": 2}, 10.0, {"chat": (240, 150), "agent": (160, 1)}),
                                   {"tp=1": 3.0, "tp=2": 15.1}),
        }),
    ]


def test_table_shows_total_and_per_tier_goodput():
    lines = goodput_table(results()).splitlines()
    cells = [line.split() for line in lines]
    assert cells[0] == ["policy", "10.0", "rps", "40.0", "rps"]
    assert cells[1:4] == [["tiertp", "10.00", "(default)", "32.00", "(default)"],
                          ["chat", "6.00", "20.00"], ["agent", "4.00", "12.00"]]
    assert lines[2].startswith("  chat")  # tiers indented under their policy
    assert cells[4:7] == [["sglang", "9.70", "(tp=1)", "15.10*", "(tp=2)"],
                          ["chat", "5.70", "15.00"], ["agent", "4.00", "0.10"]]
    assert lines[-1].startswith("* unfair: a tier with >= 10% of the requests got < 0.25x its proportional share")


def test_no_footnote_when_everything_is_fair():
    fair_only = [LoadResult(r.load, {"tiertp": r.policies["tiertp"]}) for r in results()]
    assert "unfair" not in goodput_table(fair_only)


def test_report_json_and_csv_carry_the_fairness_flag():
    doc = report_dict({"command": "test"}, results())
    flags = [{p: e["fair"] for p, e in load["policies"].items()} for load in doc["loads"]]
    assert flags == [{"tiertp": True, "sglang": True}, {"tiertp": True, "sglang": False}]
    assert doc["loads"][1]["policies"]["sglang"]["tried"] == {"tp=1": 3.0, "tp=2": 15.1}
    rows = csv_rows(results())
    assert len(rows) == 2 * 2 * 2  # load x policy x tier
    starved = [r for r in rows if r["rps"] == 40.0 and r["policy"] == "sglang"]
    assert [(r["tier"], r["goodput_rps"], r["policy_goodput_rps"], r["policy_fair"]) for r in starved] == [
        ("chat", 15.0, 15.1, False), ("agent", 0.1, 15.1, False)]
