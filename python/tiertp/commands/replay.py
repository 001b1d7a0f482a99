"""`tiertp replay`: replay request traces through the cluster simulator for
tiertp, its ablations and the baselines (each baseline at its best setting,
chosen with hindsight per load), over a load sweep; write report.json,
report.csv and PNG plots.

Example (the Azure traces, two SLO tiers, 8 H100s):
  tiertp replay --trace azure-conv --trace azure-code --tiers azure-two-tier \\
      --gpus 8 --gpu h100 --model llama-3.1-8b --policies all \\
      --rps 5,10,20,40,70 --duration 600 --out report/
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tiertp.profile_source import add_profile_arguments, load_profile
from tiertp.replay.driver import ReplayConfig, replay
from tiertp.replay.policies import ALL
from tiertp.replay.tier_configs import TIER_CONFIGS, resolve_tiers
from tiertp.replay.workload import DEFAULT_TIER_MAP, TierRule
from tiertp.traces import NAMED_TRACES


def _floats(spec: str) -> list[float]:
    try:
        values = [float(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {spec!r}") from None
    if not values or any(not v > 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected numbers > 0, got {spec!r}")
    return values


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("replay", help="replay traces through the cluster simulator; goodput report",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    w = p.add_argument_group("workload")
    w.add_argument("--trace", action="append", default=[], required=True, metavar="TRACE",
                   help=f"named trace ({', '.join(NAMED_TRACES)}), FORMAT:PATH, PATH, or "
                        "synthetic:poisson,rate=5,cv=1,prompt=1024,output=128,duration=600; repeat to merge")
    w.add_argument("--tier-map", metavar="TRACE=TIER,...",
                   help="tier per trace name (default for the named Azure traces: "
                        + ",".join(f"{k}={v}" for k, v in DEFAULT_TIER_MAP.items()) + ")")
    w.add_argument("--tier-fractions", metavar="TIER=F,...", help="random tier per request, e.g. chat=0.7,agent=0.3")
    w.add_argument("--tiers", default="default",
                   help=f"tier TOML file, or a shipped one: {', '.join(TIER_CONFIGS)} (default: default)")
    w.add_argument("--rps", type=_floats, metavar="R1,R2,...",
                   help="offered loads, req/s: arrival times scaled so the replayed window (--duration, else the "
                        "whole trace) offers each rate on average (default: as recorded)")
    w.add_argument("--duration", type=float, metavar="S", help="replay the first S seconds of each load (default: all)")
    w.add_argument("--seed", type=int, default=0, help="seed for synthetic traces, tier fractions and the simulator")
    c = p.add_argument_group("cluster")
    add_profile_arguments(p)
    c.add_argument("--gpus", type=int, default=8)
    c.add_argument("--gpus-per-node", type=int, default=8)
    c.add_argument("--policies", default=ALL, help=f"'{ALL}' or a comma list of simulator policies")
    c.add_argument("--window", type=float, default=1.0, metavar="S", help="control window (s)")
    c.add_argument("--switch-ms", type=float, help="TP switch stop time (default: the simulator's)")
    c.add_argument("--kv-gbps", type=float, help="KV transfer bandwidth, GB/s (default: the simulator's)")
    o = p.add_argument_group("output")
    o.add_argument("--out", type=Path, default=Path("report"), help="output folder (default: report/)")
    o.add_argument("--plot-rps", type=float, help="load (one of --rps) for the timeline and CDF plots (default: middle)")
    o.add_argument("--no-plots", action="store_true")
    o.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    cfg = ReplayConfig(
        traces=args.trace,
        tiers_path=resolve_tiers(args.tiers),
        profile=load_profile(args, default_gpu="h100", default_model="llama-3.1-8b"),
        gpus=args.gpus,
        out=args.out,
        tier_rule=TierRule.parse(args.tier_map, args.tier_fractions),
        policies=args.policies,
        rps=args.rps,
        duration_s=args.duration,
        gpus_per_node=args.gpus_per_node,
        window_s=args.window,
        switch_ms=args.switch_ms,
        kv_gbps=args.kv_gbps,
        seed=args.seed,
        plot_rps=args.plot_rps,
        plots=not args.no_plots,
        progress=not args.no_progress,
    )
    report = replay(cfg)
    print("goodput, req/s within SLO (winning setting):")
    print(report.table)
    print("wrote " + ", ".join(str(f) for f in report.files))
    return 0
