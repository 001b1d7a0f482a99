"""`tiertp plan`: run the planner once for given per-tier loads and print the
plan, the per-tier estimates and the GPU commands as JSON."""

from __future__ import annotations

import argparse
import json

from tiertp import _scheduler
from tiertp.defaults import DEFAULT_TIERS
from tiertp.number_types import positive_int
from tiertp.profile_source import add_profile_arguments, load_profile


def parse_load(spec: str) -> tuple[str, _scheduler.TierStats]:
    """TIER=RATE[:PROMPT[:OUTPUT]], e.g. chat=10:1024:128."""
    try:
        name, rest = spec.split("=", 1)
        parts = [float(x) for x in rest.split(":")]
        if not 1 <= len(parts) <= 3:
            raise ValueError
    except ValueError:
        raise ValueError(f"--load {spec!r}: expected TIER=RATE[:PROMPT_TOKENS[:OUTPUT_TOKENS]]") from None
    rate, prompt, output = (parts + [1024.0, 128.0][len(parts) - 1 :])[:3]
    return name, _scheduler.TierStats(rate, prompt, output)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="plan GPUs for given per-tier loads (prints JSON)", description=__doc__)
    add_profile_arguments(p)
    p.add_argument("--tiers", default=str(DEFAULT_TIERS), help="tier TOML (default: embedded example tiers)")
    p.add_argument("--gpus", type=positive_int, default=8, help="number of GPUs (default 8)")
    p.add_argument("--gpus-per-node", type=positive_int, default=_scheduler.DEFAULT_GPUS_PER_NODE,
                   help="default: %(default)s")
    p.add_argument("--load", action="append", default=[], metavar="TIER=RATE[:PROMPT[:OUTPUT]]",
                   help="observed load of a tier; unlisted tiers get rate 0")
    p.add_argument("--estimates", action="store_true", help="include per-tier estimates")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    profile = load_profile(args, default_gpu="h100", default_model="llama-3.1-8b")
    tiers = _scheduler.TierSet.load(args.tiers)
    loads = dict(parse_load(s) for s in args.load)
    stats = {name: loads.pop(name, _scheduler.TierStats(0.0, 1024.0, 128.0)) for name in tiers.names}
    if loads:
        raise ValueError(f"--load for unknown tier(s) {sorted(loads)}; valid tiers: {tiers.names}")
    planner = _scheduler.Planner(profile, tiers, gpus=args.gpus, gpus_per_node=args.gpus_per_node)
    out = planner.step(stats)
    result = {"profile": profile.name, "plan": out["plan"].to_dict(), "commands": out["commands"]}
    if args.estimates:
        result["estimates"] = planner.estimate(stats)
    print(json.dumps(result, indent=2))
    return 0
