"""`tiertp demo`: the control loop on embedded defaults.

Thirty seconds of traffic on 8 simulated H100s serving Llama-3.1-8B (the
shipped profile) with the embedded tiers (chat, agent, batch). The load
shifts from chat to agent to batch every ten seconds. tiertp re-plans every
1 s window (the production planner, dispatcher and batch policy, driven by
the cluster simulator); SGLang-style replicas at TP1 serve the same trace.
Prints tiertp's configuration each time it changes, then per-tier SLO
attainment of both.
"""

from __future__ import annotations

import argparse
from collections import Counter

import numpy as np

from tiertp import _scheduler
from tiertp.defaults import DEFAULT_TIERS
from tiertp.number_types import positive_int
from tiertp.profile_source import add_profile_arguments, load_profile

# (chat, agent, batch) requests/s in each 10-second phase.
PHASES = [(260.0, 15.0, 15.0), (30.0, 90.0, 15.0), (15.0, 15.0, 160.0)]
PHASE_S = 10.0
# Mean (prompt, output) tokens per tier; lengths are exponential around them.
LENGTHS = {"chat": (800, 200), "agent": (3000, 100), "batch": (1500, 300)}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="run the control loop on embedded defaults", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_profile_arguments(p)
    p.add_argument("--gpus", type=positive_int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=run)


def workload(names: list[str], seed: int) -> tuple[list[float], list[int], list[int], list[int]]:
    """Poisson arrivals per tier and phase, sorted by time."""
    rng = np.random.default_rng(seed)
    rows = []
    for k, rates in enumerate(PHASES):
        for tier, (name, rate) in enumerate(zip(names, rates)):
            n = rng.poisson(rate * PHASE_S)
            prompt, output = LENGTHS[name]
            for t in rng.uniform(k * PHASE_S, (k + 1) * PHASE_S, n):
                rows.append((float(t), tier, 1 + int(rng.exponential(prompt)), 1 + int(rng.exponential(output))))
    rows.sort()
    return [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows], [r[3] for r in rows]


def summarize(groups: list[dict]) -> str:
    per_tier: dict[str, Counter] = {}
    for g in groups:
        per_tier.setdefault(g["tier"], Counter())[f"TP{g['tp']}/{g['role'][:4]}"] += 1
    return "  ".join(f"{t}: " + ",".join(f"{k}x{n}" for k, n in sorted(c.items())) for t, c in sorted(per_tier.items()))


def attainment(res: dict, tiers: list[dict], tier_of: list[int]) -> dict[str, float]:
    good, total = Counter(), Counter()
    for i, t in enumerate(tier_of):
        slo = tiers[t]
        total[slo["name"]] += 1
        ok = res["status"][i] == "completed" and (slo["background"] or (
            res["ttft_ms"][i] <= slo["ttft_ms"] and res["tpot_ms"][i] <= slo["tpot_ms"]))
        good[slo["name"]] += ok
    return {name: good[name] / total[name] for name in total}


def run(args: argparse.Namespace) -> int:
    profile = load_profile(args, default_gpu="h100", default_model="llama-3.1-8b")
    tiers = _scheduler.TierSet.load(str(DEFAULT_TIERS))
    arrival, tier, prompt, output = workload(tiers.names, args.seed)
    print(f"profile {profile.name}; {args.gpus} GPUs; tiers {tiers.names}; {len(arrival)} requests over "
          f"{len(PHASES) * PHASE_S:.0f} s; load per phase (chat, agent, batch req/s): {PHASES}")
    results = {}
    for policy, settings in (("tiertp", {}), ("sglang", {"tp": 1})):
        results[policy] = _scheduler.simulate(profile, tiers, arrival, tier, prompt, output, args.gpus, policy, **settings)
    for entry in results["tiertp"]["timeline"]:
        print(f"  t={entry['time_s']:5.1f}s  tiertp plan  {summarize(entry['groups'])}")
    for policy, res in results.items():
        att = attainment(res, tiers.to_list(), tier)
        print(f"{policy:7s} SLO attainment " + "  ".join(f"{n} {a:6.1%}" for n, a in att.items())
              + f"   switches {res['switches']}, migrated requests {res['migrated_requests']}")
    return 0
