"""The workload, live-client and output options that `tiertp replay` and
`tiertp fidelity` share, and the objects each command builds from them, so
both read a trace, its tiers, loads, length caps, client time limits and
report switches the same way."""

from __future__ import annotations

import argparse

from tiertp.number_types import positive_float, positive_floats
from tiertp.replay.live.caps import LengthCaps
from tiertp.replay.live.limits import Limits
from tiertp.replay.tier_configs import resolve_tiers
from tiertp.replay.workload import DEFAULT_TIER_MAP, TierRule
from tiertp.traces import NAMED_TRACES


def add_load_arguments(group, *, tiers_default: str | None, tiers_help: str, loads_required: bool,
                       traces_required: bool = True) -> None:
    """--trace, --tier-map, --tier-fractions, --tiers, --rps, --duration, --seed.

    `tiers_default`/`tiers_help`: each command ships its own default tier file.
    `loads_required`: --rps and --duration must be given (else the trace's
    recorded rate and whole length are replayed).
    `traces_required`: False where the traces may come from elsewhere (a
    replay preset); the command then checks that there are some.
    """
    group.add_argument("--trace", action="append", default=[], required=traces_required, metavar="TRACE",
                       help=f"named trace ({', '.join(NAMED_TRACES)}), FORMAT:PATH, PATH, or "
                            "synthetic:poisson,rate=5,cv=1,prompt=1024,output=128,duration=600; repeat to merge")
    group.add_argument("--tier-map", metavar="TRACE=TIER,...",
                       help="tier per trace name (default for the named Azure traces: "
                            + ",".join(f"{k}={v}" for k, v in DEFAULT_TIER_MAP.items()) + ")")
    group.add_argument("--tier-fractions", metavar="TIER=F,...",
                       help="random tier per request, e.g. chat=0.7,agent=0.3")
    group.add_argument("--tiers", default=tiers_default, help=tiers_help)
    rps_help = ("offered loads, req/s: arrival times scaled so the replayed window (--duration, else the whole "
                "trace) offers each rate on average")
    group.add_argument("--rps", type=positive_floats, required=loads_required, metavar="R1,R2,...",
                       help=rps_help if loads_required else rps_help + " (default: as recorded)")
    group.add_argument("--duration", type=positive_float, required=loads_required, metavar="S",
                       help="replay the first S seconds of each load" + ("" if loads_required else " (default: all)"))
    group.add_argument("--seed", type=int, default=0,
                       help="seed for synthetic traces, tier fractions and the simulator")


def add_length_cap_arguments(group) -> None:
    """--max-prompt-tokens, --max-output-tokens (see `length_caps`)."""
    group.add_argument("--max-prompt-tokens", type=int, metavar="N", help="cap prompt lengths (recorded in the report)")
    group.add_argument("--max-output-tokens", type=int, metavar="N", help="cap output lengths (recorded in the report)")


def add_client_limit_arguments(group) -> None:
    """--first-token-timeout, --stall-timeout, --request-timeout (see `client_limits`)."""
    group.add_argument("--first-token-timeout", type=float, default=Limits.first_token_s, metavar="S",
                       help="fail a request with no first token S seconds after sending (default %(default)s)")
    group.add_argument("--stall-timeout", type=float, default=Limits.stall_s, metavar="S",
                       help="fail a stream silent for S seconds (default %(default)s)")
    group.add_argument("--request-timeout", type=float, default=Limits.total_s, metavar="S",
                       help="fail a request not finished S seconds after sending (default %(default)s)")


def add_output_switch_arguments(group) -> None:
    """--no-plots, --no-progress (see `output_settings`)."""
    group.add_argument("--no-plots", action="store_true", help="write the report without its PNG plots")
    group.add_argument("--no-progress", action="store_true", help="no progress bar")


def tier_rule(args: argparse.Namespace) -> TierRule:
    return TierRule.parse(args.tier_map, args.tier_fractions)


def length_caps(args: argparse.Namespace) -> LengthCaps:
    return LengthCaps(args.max_prompt_tokens, args.max_output_tokens)


def client_limits(args: argparse.Namespace) -> Limits:
    return Limits(first_token_s=args.first_token_timeout, stall_s=args.stall_timeout, total_s=args.request_timeout)


def workload_settings(args: argparse.Namespace) -> dict:
    """What `add_load_arguments` asked for, as the keyword arguments the
    replay and fidelity configs share (traces, tiers, tier rule, loads, seed)."""
    return dict(traces=args.trace, tiers_path=resolve_tiers(args.tiers), tier_rule=tier_rule(args), rps=args.rps,
                duration_s=args.duration, seed=args.seed)


def live_client_settings(args: argparse.Namespace) -> dict:
    """What `add_length_cap_arguments` and `add_client_limit_arguments` asked
    for, as the config keyword arguments `caps` and `limits`."""
    return dict(caps=length_caps(args), limits=client_limits(args))


def output_settings(args: argparse.Namespace) -> dict:
    """What `add_output_switch_arguments` asked for, as the config keyword
    arguments `plots` and `progress`."""
    return dict(plots=not args.no_plots, progress=not args.no_progress)
