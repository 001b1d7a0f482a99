"""The paper's ablation chain (EVALUATION.md, "Ablation": Qwen-14B on 8 H100
at 70 req/s) read from a finished replay report: each step's goodput next to
the paper's, from SGLang at TP1 to the full system, and the headline ratios.

Nothing is simulated here: the steps are policies (or one variant of a
policy, from the report's `tried` map) of a `tiertp replay --policies all`
report, e.g. `tiertp replay --preset 14b-h100x8`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tiertp.replay.policies import label
from tiertp.replay.report_files import text_table

# The paper's ablation load, req/s.
DEFAULT_RPS = 70.0
NOT_RUN = "not run"


@dataclass(frozen=True)
class Pick:
    """A goodput in a report: `policy` at its winning setting, or at the one
    setting `settings` (looked up in the policy's `tried` map)."""

    policy: str
    settings: dict | None = None

    def describe(self, entry: dict | None) -> str:
        """`policy (tp=1)` for one setting, `policy (best: tp=4)` for the
        winner of a swept policy, the bare name for one without settings."""
        if self.settings is not None:
            return f"{self.policy} ({label(self.settings)})"
        if entry is None:
            return self.policy
        won = entry.get("settings_label", label(entry.get("settings", {})))
        return self.policy if won == label({}) else f"{self.policy} (best: {won})"

    def goodput(self, load: dict) -> float | None:
        """req/s at `load` (a report.json load entry); None if not run."""
        entry = load["policies"].get(self.policy)
        if entry is None:
            return None
        if self.settings is None:
            return entry["goodput_rps"]
        value = entry.get("tried", {}).get(label(self.settings))
        # a variant the simulator refused is recorded as "error: ..."
        return value if isinstance(value, (int, float)) else None


@dataclass(frozen=True)
class Step:
    """One rung of the chain and the paper's goodput there (req/s)."""

    what: str
    pick: Pick
    paper: float


@dataclass(frozen=True)
class Ratio:
    what: str
    num: Pick
    den: Pick
    paper: float


FULL = Pick("tiertp")
CHAIN: tuple[Step, ...] = (
    Step("SGLang, TP1", Pick("sglang", {"tp": 1}), 13.2),
    Step("+ P/D disaggregation", Pick("sglang-pd"), 0.0),
    Step("SGLang + SLO-aware batching, best static TP", Pick("sglang-slo"), 16.7),
    Step("+ a partition per tier (Split)", Pick("split"), 17.2),
    Step("+ tiertp's scheduler, static TP", Pick("tiertp-static-tp"), 28.0),
    Step("+ dynamic TP, naive switching", Pick("tiertp-naive-switch"), 0.0),
    Step("+ fast switching (full tiertp)", FULL, 33.3),
)
RATIOS: tuple[Ratio, ...] = (
    Ratio("full / static-TP scheduler", FULL, Pick("tiertp-static-tp"), 1.19),
    Ratio("full / Split", FULL, Pick("split"), 1.94),
    # the paper divides by its SGLang row (13.2); ours by SGLang at its best TP
    Ratio("full / SGLang (best TP)", FULL, Pick("sglang"), 2.5),
)


def nearest_load(report: dict, rps: float) -> dict:
    """The report's load entry closest to `rps` (its requested rate, else
    the offered one)."""
    loads = report.get("loads") or []
    if not loads:
        raise ValueError("the report has no loads")
    return min(loads, key=lambda x: abs((x["rps"] if x.get("rps") is not None else x["offered_rps"]) - rps))


def _fmt(value: float | None) -> str:
    return NOT_RUN if value is None else f"{value:.2f}"


def chain_text(report: dict, rps: float = DEFAULT_RPS) -> str:
    """The chain at the report's load nearest `rps`, as plain text."""
    load = nearest_load(report, rps)
    at = load["rps"] if load.get("rps") is not None else load["offered_rps"]
    duration = report.get("duration_s")
    where = (f"{report.get('profile', '?')}, {report.get('gpus', '?')} GPUs, "
             + (f"{duration:g} s per load" if duration else "whole trace per load"))
    head = f"ablation at {at:g} req/s ({load['offered_rps']:.2f} offered; {where})"
    if abs(at - rps) > 1e-9:
        head += f"; {rps:g} req/s is not in the report, this is the nearest load"
    rows = [["step", "policy (setting)", "goodput req/s", "paper"]]
    for s in CHAIN:
        rows.append([s.what, s.pick.describe(load["policies"].get(s.pick.policy)), _fmt(s.pick.goodput(load)),
                     f"{s.paper:.1f}"])
    ratios = [["ratio", "ours", "paper"]]
    for r in RATIOS:
        num, den = r.num.goodput(load), r.den.goodput(load)
        ours = "n/a" if num is None or den is None or den <= 0 or not math.isfinite(den) else f"{num / den:.2f}"
        ratios.append([r.what, ours, f"{r.paper:g}"])
    return "\n".join([head, *text_table(rows), "", *text_table(ratios)])
