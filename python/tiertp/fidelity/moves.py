"""TP switches and prefill->decode hand-offs of a fidelity load, on both
sides, so a run with several TP levels can show that it exercised them.

- From a configuration timeline (the simulator's `timeline`, or the gateway's
  plans polled from /v1/plan during the live run; both are lists of
  {time_s, groups: [{tier, role, tp, first_gpu}]}): how often the TP layout
  (the set of (first_gpu, tp) groups) changed, the TP levels planned, and for
  how long a plan had prefill/decode groups (where hand-offs happen).
- From the live agent (its `stats` message over ZeroMQ, asked before and
  after the load): TP switches applied and rolled back, hand-offs made and
  the requests they moved.
The simulator's own counts: `switches` (groups started by plan changes, one
per new group) and `migrated_requests` (requests moved off stopping or
overloaded groups). It does not report its hand-offs (tiertp._scheduler.simulate
returns no count of them).
"""

from __future__ import annotations

import logging

from tiertp.worker.seal import ControlKey
from tiertp.worker.stats_query import StatsUnanswered, ask_stats

log = logging.getLogger(__name__)

PREFILL = "prefill"
AGENT_MOVES = ("switches", "rolled_back", "hand_offs", "handed_off_requests")


def _layout(groups: list[dict]) -> frozenset:
    return frozenset((int(g["first_gpu"]), int(g["tp"])) for g in groups)


def _assignment(groups: list[dict]) -> frozenset:
    return frozenset((g.get("tier"), g.get("role"), int(g["first_gpu"]), int(g["tp"])) for g in groups)


def timeline_summary(timeline: list[dict], end_s: float) -> dict:
    """What a configuration timeline says about switches and hand-offs, up to `end_s`."""
    entries = sorted(timeline, key=lambda e: e["time_s"])
    layouts = [_layout(e["groups"]) for e in entries]
    tp_changes = sum(1 for a, b in zip(layouts, layouts[1:]) if a != b)
    assignments = [_assignment(e["groups"]) for e in entries]
    group_changes = sum(1 for a, b in zip(assignments, assignments[1:]) if a != b)
    disaggregated_s = 0.0
    for i, e in enumerate(entries):
        if any(g.get("role") == PREFILL for g in e["groups"]):
            until = entries[i + 1]["time_s"] if i + 1 < len(entries) else max(end_s, e["time_s"])
            disaggregated_s += max(0.0, until - e["time_s"])
    return {
        "configurations": len(entries),
        "group_changes": group_changes,
        "tp_layout_changes": tp_changes,
        "tp_levels_planned": sorted({int(g["tp"]) for e in entries for g in e["groups"]}),
        "max_tp_planned": max((int(g["tp"]) for e in entries for g in e["groups"]), default=None),
        "roles_planned": sorted({g.get("role") for e in entries for g in e["groups"] if g.get("role")}),
        "prefill_decode_planned_s": round(disaggregated_s, 3),
    }


def agent_moves(endpoint: str, key: ControlKey, timeout_s: float = 5.0) -> dict | None:
    """The agent's move counters ({switches, rolled_back, hand_offs,
    handed_off_requests}, since it started), asked over its ZeroMQ socket
    with its key; None when it does not answer in time."""
    try:
        moves = ask_stats(endpoint, key, timeout_s).get("moves") or {}
    except StatsUnanswered as e:
        log.warning("%s", e)
        return None
    return {k: int(moves.get(k, 0)) for k in AGENT_MOVES}


def moves_delta(before: dict | None, after: dict | None) -> dict | None:
    """after - before per counter; None when either is missing."""
    if before is None or after is None:
        return None
    return {k: after.get(k, 0) - before.get(k, 0) for k in AGENT_MOVES}


def summarize(sims: dict, live_timeline: list[dict], agent: dict | None, end_s: float) -> dict:
    """The `moves` block of one load in fidelity.json: per simulated policy
    its counts and timeline summary; live, the gateway's plans and what the
    agent did (None when the agent was not asked: a server given with --url)."""
    return {
        "simulated": {p: {"switches": o.switches, "migrated_requests": o.migrated_requests,
                          **timeline_summary(o.timeline, end_s)} for p, o in sims.items()},
        "live": {"agent": agent, "gateway_plans": timeline_summary(live_timeline, end_s)},
        "note": ("simulated switches: groups started by plan changes; agent switches: TP switches applied "
                 "(one per merge or split); group_changes: consecutive configurations whose groups (tier, role, "
                 "first_gpu, tp) differ; tp_layout_changes: those whose set of (first_gpu, tp) differs, i.e. TP "
                 "switches planned (same rules on both sides); the simulator reports no hand-off count, "
                 "prefill_decode_planned_s says how long its plans had prefill groups"),
    }


def moves_text(moves: dict, primary: str) -> str:
    """One line per side."""
    s = moves["simulated"].get(primary)
    g = moves["live"]["gateway_plans"]
    a = moves["live"]["agent"]
    lines = []
    if s is not None:
        lines.append(f"moves, simulated {primary}: {s['switches']} group(s) started by switches, "
                     f"{s['group_changes']} group change(s), {s['tp_layout_changes']} of the TP layout, "
                     f"TP planned {s['tp_levels_planned']}, "
                     f"prefill/decode groups planned for {s['prefill_decode_planned_s']:g} s, "
                     f"{s['migrated_requests']} migrated request(s)")
    live = (f"moves, live: gateway plans {g['group_changes']} group change(s), {g['tp_layout_changes']} of the TP "
            f"layout, over {g['configurations']} plan(s), "
            f"TP planned {g['tp_levels_planned']}, prefill/decode groups planned for "
            f"{g['prefill_decode_planned_s']:g} s")
    if a is not None:
        live += (f"; agent {a['switches']} TP switch(es) applied, {a['rolled_back']} rolled back, "
                 f"{a['hand_offs']} hand-off(s) moving {a['handed_off_requests']} request(s)")
    lines.append(live)
    return "\n".join(lines)
