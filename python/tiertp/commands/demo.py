"""`tiertp demo`: the control loop on embedded defaults.

Twelve 1-second control windows on 8 simulated GPUs with the embedded tiers
(chat, agent, batch). Load shifts from chat to agent to batch; every window
the planner re-plans from observed arrivals, the dispatcher places each
arrival, and each group's batch policy picks its next batch. Prints one line
per window: offered load, the plan (tier: groups as TPxcount/role), whether
it changed and how many GPUs got commands.
"""

from __future__ import annotations

import argparse
from collections import Counter

import numpy as np

from tiertp import _scheduler
from tiertp.defaults import DEFAULT_TIERS
from tiertp.profile_source import add_profile_arguments, load_profile

# (chat, agent, batch) requests/s per phase of four windows.
PHASES = [(120.0, 10.0, 10.0), (20.0, 50.0, 10.0), (10.0, 10.0, 80.0)]
LENGTHS = {"chat": (800, 200), "agent": (3000, 400), "batch": (1500, 300)}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="run the control loop on embedded defaults", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_profile_arguments(p)
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=run)


def summarize(plan: _scheduler.Plan) -> str:
    per_tier: dict[str, Counter] = {}
    for g in plan.groups():
        per_tier.setdefault(g["tier"], Counter())[f"TP{g['tp']}/{g['role'][:4]}"] += 1
    return "  ".join(f"{t}: " + ",".join(f"{k}x{n}" for k, n in sorted(c.items())) for t, c in per_tier.items())


def run(args: argparse.Namespace) -> int:
    profile = load_profile(args, default_gpu="h100", default_model="llama-3.1-8b")
    tiers = _scheduler.TierSet.load(str(DEFAULT_TIERS))
    names = tiers.names
    planner = _scheduler.Planner(profile, tiers, gpus=args.gpus)
    prior = _scheduler.TierStats(0.0, 1024.0, 128.0)
    observer = _scheduler.ArrivalObserver(tiers, 2.0, prior, memory_s=30.0)
    rng = np.random.default_rng(args.seed)
    print(f"profile {profile.name}; {args.gpus} GPUs; tiers {names}")
    plan = planner.step({n: prior for n in names})["plan"]
    dispatcher = _scheduler.Dispatcher(tiers, plan)
    policies: dict[tuple[int, int], _scheduler.BatchPolicy] = {}
    next_id = 0
    classes: Counter = Counter()
    for window in range(12):
        rates = PHASES[window // 4]
        arrivals = []
        for name, rate in zip(names, rates):
            for t in np.sort(rng.uniform(window, window + 1, rng.poisson(rate))):
                prompt, output = LENGTHS[name]
                observer.record(name, float(t), prompt, output)
                arrivals.append((float(t), name, prompt))
        for _, name, prompt in sorted(arrivals):
            first, tp, cls, _ = dispatcher.dispatch(next_id, name, prompt)
            classes[cls] += 1
            group_caps = {(g["first_gpu"], g["tp"]): g for g in plan.groups()}
            g = group_caps[(first, tp)]
            policy = policies.setdefault((first, tp), _scheduler.BatchPolicy(g["batch_cap"], g["token_cap"]))
            policy.enqueue(next_id, cls, prompt)
            next_id += 1
        batched = 0
        for key, policy in policies.items():
            for rid in policy.next_batch(0):
                dispatcher.complete(rid)
                batched += 1
        out = planner.step(dict(observer.snapshot(window + 1.0)))
        plan = out["plan"]
        dispatcher.set_plan(plan)
        for g in plan.groups():
            if (g["first_gpu"], g["tp"]) in policies:
                policies[(g["first_gpu"], g["tp"])].set_caps(g["batch_cap"], g["token_cap"])
        load = " ".join(f"{n}={r:>4.0f}" for n, r in zip(names, rates))
        change = f"changed, {len(out['commands'])} GPU commands" if out["changed"] else "kept"
        print(f"window {window:2d}  offered {load}  batched {batched:3d}  -> {change:26s} {summarize(plan)}")
    print(f"dispatched {next_id} requests: " + ", ".join(f"{k} {v}" for k, v in sorted(classes.items())))
    return 0
