"""Simulator speed: simulated seconds per wall second replaying the one-hour Azure conversation trace."""

from __future__ import annotations

import argparse
import time

from tiertp.replay.policies import parse_policies, sim_policies, variants
from tiertp.replay.tier_configs import TIER_CONFIGS
from tiertp.traces import assign_by_map, load_trace, rename_tiers, time_window

TRACE = "azure-conv"
TIER = "chat"
TIERS = "azure-two-tier"
GPU, MODEL = "h100", "llama-3.1-8b"
GPU_COUNTS = (8, 64)
TARGET_SPEEDUP_8 = 1000.0
QUICK_SECONDS = 120.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help=f"the first {QUICK_SECONDS:g} s of the trace only (for tests)")
    parser.add_argument("--policies", default="all", help="'all' or a comma list of simulator policies")


def run(args: argparse.Namespace) -> dict:
    """Per policy and GPU count: sim_end_s / wall seconds of one simulate call
    (wall measured around the call, argument conversion included). Baselines
    run their first grid setting (smallest TP: the most replicas, the most
    events). speedup_vs_realtime[gpus] is the slowest policy's figure."""
    from tiertp import _scheduler
    from tiertp.profiles import resolve

    policies = parse_policies(args.policies, sim_policies())
    profile = _scheduler.Profile.load(str(resolve(GPU, MODEL)))
    tiers = _scheduler.TierSet.load(str(TIER_CONFIGS[TIERS]))
    trace = rename_tiers(assign_by_map(load_trace(TRACE), {TRACE: TIER}), list(tiers.names))
    if args.quick:
        trace = time_window(trace, QUICK_SECONDS)
    columns = [trace.arrival_s.tolist(), trace.tier.tolist(), trace.prompt_tokens.tolist(), trace.output_tokens.tolist()]
    per_policy: dict[str, dict] = {}
    for policy in policies:
        per_policy[policy] = {}
        for gpus in GPU_COUNTS:
            settings = variants(policy, gpus, 8, list(profile.tp_levels))[0]
            start = time.perf_counter()
            result = _scheduler.simulate(profile, tiers, *columns, gpus, policy, **settings)
            wall = time.perf_counter() - start
            completed = sum(1 for s in result["status"] if s == "completed")
            per_policy[policy][str(gpus)] = {
                "settings": settings,
                "sim_s": result["sim_end_s"],
                "wall_s": wall,
                "speedup": result["sim_end_s"] / wall,
                "completed": completed,
                "rejected": len(trace) - completed,
            }
    slowest = {str(g): min(per_policy, key=lambda p: per_policy[p][str(g)]["speedup"]) for g in GPU_COUNTS}
    speedup = {g: per_policy[p][g]["speedup"] for g, p in slowest.items()}
    return {
        "trace": {**trace.summary(), "tier": TIER},
        "profile": profile.name,
        "speedup_vs_realtime": speedup,
        "slowest_policy": slowest,
        "target_speedup_8_gpus": TARGET_SPEEDUP_8,
        "meets_target_8_gpus": speedup["8"] >= TARGET_SPEEDUP_8,
        "per_policy": per_policy,
    }
