"""The replayed workload: load trace specs, assign tiers, merge, and cut out
one load level (rate scaling, then the first `duration` seconds)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tiertp.traces import (
    Trace, TraceError, assign_by_fractions, assign_by_map, load_trace, merge, parse_fractions,
    parse_pairs, rename_tiers, scale_to_rps, scale_window_to_rps, time_window,
)

# Tier map used when no rule is given, for the named traces, as the paper's evaluation maps them
# (code -> the looser agent tier, conversation -> chat).
DEFAULT_TIER_MAP = {"azure-code": "agent", "azure-conv": "chat"}


@dataclass(frozen=True)
class TierRule:
    """How requests get tiers: a trace-name -> tier map, fractions (drawn per
    request, seeded), or neither (the traces' tier columns, else
    DEFAULT_TIER_MAP for the traces it names)."""

    tier_map: dict[str, str] | None = None
    fractions: dict[str, float] | None = None

    @staticmethod
    def parse(tier_map: str | None, fractions: str | None) -> TierRule:
        if tier_map and fractions:
            raise TraceError("give --tier-map or --tier-fractions, not both")
        return TierRule(
            parse_pairs(tier_map, "tier map") if tier_map else None,
            parse_fractions(fractions) if fractions else None,
        )


def build_workload(specs: list[str], rule: TierRule, tier_names: list[str], seed: int = 0) -> Trace:
    """All traces merged, every request with a tier indexing `tier_names`."""
    if not specs:
        raise TraceError("no trace given (--trace NAME_OR_PATH; repeat to merge several)")
    traces = [load_trace(s, seed=seed) for s in specs]
    names = [t.source for t in traces]
    if len(set(names)) != len(names):
        raise TraceError(f"trace names repeat: {names}")
    if rule.tier_map is not None:
        unused = sorted(set(rule.tier_map) - set(names))
        if unused:
            raise TraceError(f"tier map names trace(s) {unused} not given; traces: {names}")
        traces = [assign_by_map(t, rule.tier_map) if t.source in rule.tier_map else t for t in traces]
    elif rule.fractions is None:
        traces = [assign_by_map(t, DEFAULT_TIER_MAP) if not t.has_tiers and t.source in DEFAULT_TIER_MAP else t
                  for t in traces]
    merged = merge(traces)
    if rule.fractions is not None:
        merged = assign_by_fractions(merged, rule.fractions, seed=seed)
    unassigned = int((merged.tier < 0).sum())
    if unassigned:
        lacking = [t.source for t in traces if not t.has_tiers]
        raise TraceError(f"{unassigned} request(s) of trace(s) {lacking} have no tier; "
                         "give --tier-map TRACE=TIER,... or --tier-fractions TIER=F,...")
    return rename_tiers(merged, tier_names)


@dataclass(frozen=True)
class Load:
    """One load level: the trace scaled so that it offers `rps` (None = as
    recorded) over its first `duration_s` seconds, and cut there. `window_s`
    is the length of the offered-load window (rates are requests / window_s)."""

    rps: float | None
    trace: Trace
    window_s: float

    @property
    def offered_rps(self) -> float:
        return len(self.trace) / self.window_s


def cut_load(workload: Trace, rps: float | None, duration_s: float | None) -> Load:
    """The workload at one load level (scale, then window). With a
    duration, the scaling makes the window itself offer `rps` (the trace's
    own burstiness and drift kept); without one, the whole trace's mean."""
    if rps is None:
        trace = workload
    elif duration_s is not None:
        trace = scale_window_to_rps(workload, rps, duration_s)
    else:
        trace = scale_to_rps(workload, rps)
    end = float(trace.arrival_s[-1]) if len(trace) else 0.0
    if duration_s is not None and end >= duration_s:
        trace = time_window(trace, duration_s)
        window = float(duration_s)
    else:
        # the whole trace: its window ends one mean gap after the last arrival
        window = end + (end / max(len(trace) - 1, 1))
    if len(trace) == 0:
        raise TraceError(f"no requests in the first {duration_s} s at {rps} req/s")
    return Load(rps, trace, max(window, np.finfo(float).tiny))
