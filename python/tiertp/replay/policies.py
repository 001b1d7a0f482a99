"""Which policies replay runs and the settings each is given.

The policy names, and the settings each policy reads, are the simulator's
(`tiertp._scheduler.SIM_POLICIES` and `SIM_POLICY_SETTINGS`: the one list,
defined in Rust). Baselines get their best settings with hindsight: every
variant in their grid (every combination of KNOB_VALUES over the settings
the policy reads) is replayed at each load and the one with the highest
goodput is reported (DESIGN.md §5).
"""

from __future__ import annotations

import itertools

from tiertp import _scheduler

TP_LEVELS = (1, 2, 4, 8)
PREFILL_SHARES = (0.25, 0.5)
# knob (a keyword of _scheduler.simulate) -> the values swept.
KNOB_VALUES: dict[str, tuple] = {"tp": TP_LEVELS, "prefill_share": PREFILL_SHARES}
# policy -> knobs swept with hindsight (() = one run with the policy's own
# settings). The ceiling (oracle) searches plans with hindsight: its own loop
# over every TP level, and every static level (WITH_OWN_SETTINGS); the sweep
# adds every other policy's configuration (sweep._oracle_searches_all).
SWEPT: dict[str, tuple[str, ...]] = {p: tuple(knobs) for p, knobs in _scheduler.SIM_POLICY_SETTINGS.items()}
# Policies whose sweep also includes a run with the policy's own settings.
WITH_OWN_SETTINGS = frozenset({"oracle"})
ALL = "all"


def sim_policies() -> list[str]:
    """The simulator's policy names, each with a settings grid."""
    unknown = [k for knobs in SWEPT.values() for k in knobs if k not in KNOB_VALUES]
    if unknown:
        raise RuntimeError(f"simulator settings {unknown} have no values in tiertp.replay.policies.KNOB_VALUES")
    return list(_scheduler.SIM_POLICIES)


def parse_policies(spec: str, valid: list[str]) -> list[str]:
    """`all` or a comma list of names from `valid` (order kept, no repeats)."""
    if spec.strip() == ALL:
        return list(valid)
    names = [p.strip() for p in spec.split(",") if p.strip()]
    unknown = [p for p in names if p not in valid]
    if unknown or not names:
        raise ValueError(f"unknown policy {unknown or spec!r}; valid: {ALL}, {', '.join(valid)}")
    return list(dict.fromkeys(names))


def pd_split_fits(gpus: int, tp: int, share: float) -> bool:
    """A prefill/decode split needs whole TP groups on both sides."""
    prefill = round(gpus * share)
    decode = gpus - prefill
    return prefill >= tp and decode >= tp and prefill % tp == 0 and decode % tp == 0


def variants(policy: str, gpus: int, gpus_per_node: int, tp_levels: list[int]) -> list[dict]:
    """The settings replayed for `policy` on this cluster: the grid with the
    combinations that cannot be built (TP group larger than a node or the
    cluster, replicas that do not tile the GPUs, a P/D split without whole
    groups on both sides) left out. Never empty for a sweepable policy on a
    cluster of at least one GPU."""
    knobs = SWEPT[policy]
    if not knobs:
        return [{}]
    grid = [{}] if policy in WITH_OWN_SETTINGS else []
    for values in itertools.product(*(KNOB_VALUES[k] for k in knobs)):
        s = dict(zip(knobs, values))
        tp = s.get("tp")
        if tp is not None and (tp not in tp_levels or tp > min(gpus, gpus_per_node) or gpus % tp):
            continue
        if "prefill_share" in s and not pd_split_fits(gpus, tp or 1, s["prefill_share"]):
            continue
        grid.append(s)
    if not grid:
        raise ValueError(f"policy {policy!r}: no setting of {dict((k, KNOB_VALUES[k]) for k in knobs)} fits {gpus} GPUs")
    return grid


def label(settings: dict) -> str:
    """`tp=2,prefill_share=0.5`; `default` for a policy's own settings."""
    return ",".join(f"{k}={v:g}" if isinstance(v, (int, float)) else f"{k}={v}" for k, v in settings.items()) or "default"
