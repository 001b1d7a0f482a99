"""The replay sweep: every policy at every load, baselines over their
settings grid with the best variant chosen in hindsight (the highest goodput
among the settings that serve every tier)."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from tiertp.replay.policies import label, variants
from tiertp.replay.sim_run import RunOutcome, SimContext, run_once
from tiertp.replay.workload import Load

log = logging.getLogger(__name__)


@dataclass
class PolicyAtLoad:
    """A policy at one load: the winning run and every variant tried
    (settings label -> goodput req/s, or the error that refused it)."""

    best: RunOutcome | None
    tried: dict[str, float | str] = field(default_factory=dict)


@dataclass
class LoadResult:
    """All policies at one load level."""

    load: Load
    policies: dict[str, PolicyAtLoad]


def _better(a: RunOutcome, b: RunOutcome) -> bool:
    """Whether setting `a` beats `b`: a setting that serves every tier
    (`RunMetrics.fair`) beats one that abandons a tier, whatever their totals
    (a total won by starving a tier is no comparison); then the higher
    goodput, strictly (ties keep the earlier, smaller setting)."""
    if a.metrics.fair != b.metrics.fair:
        return a.metrics.fair
    return a.metrics.goodput_rps > b.metrics.goodput_rps


ORACLE = "oracle"


def _oracle_searches_all(per_policy: dict[str, PolicyAtLoad]) -> None:
    """The oracle is the hindsight ceiling: the best of its own runs (the
    control loop fed the next window's true load, free switches, at every
    TP set) and of every configuration any other policy ran at this load
    (each at its best setting), so it is at or above every policy that
    serves every tier. A configuration it takes from another policy is
    labelled `via=<policy> <setting>`."""
    oracle = per_policy.get(ORACLE)
    if oracle is None or oracle.best is None:
        return
    for policy, entry in per_policy.items():
        if policy == ORACLE or entry.best is None:
            continue
        via = {"via": f"{policy} {label(entry.best.settings)}"}
        oracle.tried[label(via)] = entry.best.metrics.goodput_rps
        if _better(entry.best, oracle.best):
            oracle.best = dataclasses.replace(entry.best, policy=ORACLE, settings=via)


def plan_runs(policies: list[str], ctx: SimContext) -> list[tuple[str, dict]]:
    """(policy, settings) for every run at one load, in report order."""
    tp_levels = list(ctx.profile.tp_levels)
    return [(p, s) for p in policies for s in variants(p, ctx.gpus, ctx.gpus_per_node, tp_levels)]


def run_sweep(ctx: SimContext, loads: list[Load], policies: list[str],
              on_progress: Callable[[float, str], None] | None = None) -> list[LoadResult]:
    """Replay every (policy, setting) at every load. A variant the simulator
    refuses (ValueError: a setting it cannot build) is recorded and skipped;
    a policy all of whose variants are refused fails the sweep.
    `on_progress(runs_done_fraction_total, description)` drives a bar."""
    runs = plan_runs(policies, ctx)
    out: list[LoadResult] = []
    done = 0
    for load in loads:
        per_policy: dict[str, PolicyAtLoad] = {}
        for policy, settings in runs:
            desc = f"{load.offered_rps:.1f} rps {policy} {label(settings)}"

            def tick(frac: float, base=done, desc=desc) -> None:
                if on_progress:
                    on_progress(base + min(max(frac, 0.0), 1.0), desc)

            tick(0.0)
            try:
                outcome = run_once(ctx, load, policy, settings, progress=tick if on_progress else None)
            except ValueError as e:
                log.warning("%s: refused by the simulator: %s", desc, e)
                per_policy.setdefault(policy, PolicyAtLoad(best=None)).tried[label(settings)] = f"error: {e}"
                done += 1
                continue
            done += 1
            tick(0.0, base=done)
            entry = per_policy.setdefault(policy, PolicyAtLoad(best=None))
            entry.tried[label(settings)] = outcome.metrics.goodput_rps
            if entry.best is None or _better(outcome, entry.best):
                entry.best = outcome
        _oracle_searches_all(per_policy)
        for policy, entry in per_policy.items():
            if entry.best is None:
                raise ValueError(f"policy {policy}: every setting was refused at {load.offered_rps:.2f} req/s: {entry.tried}")
        out.append(LoadResult(load, per_policy))
    return out
