"""`tiertp fidelity`: how well does the simulator predict the real system?

Profiles the local engine at the TP levels of --tp-levels (`tiertp profile
--tp L1,L2`, or --profile FILE with a table for each), starts `tiertp serve
--tp-levels L1,L2` (or uses --url), and for each load simulates the trace
with that profile on the same cluster (devices, the same TP levels and the
KV slots of the live workers, the gateway's control window, the same SLOs,
the same capped requests) and replays it live. Before the loads, two
probes calibrate the profile to the engine as served (its speed now, and a
decode step's cost per running request; `--no-calibrate`: skipped): the
calibrated prediction uses that profile, and a started server is restarted
to plan with it. Prints predicted vs measured
goodput, SLO attainment and TTFT/TPOT p50/p90/p99 per tier with relative
errors, and writes fidelity.json plus the replay report (both runs side by
side), with the TP switches and prefill->decode hand-offs of each side (the
gateway's plans and the agent's counters live, the simulator's own).

Example (this 2-core CPU host, SmolLM2-135M on 2 devices, two tiers):
  tiertp fidelity --trace azure-conv --tier-fractions chat=0.5,agent=0.5 \\
      --rps 0.3,0.6 --duration 120 --max-prompt-tokens 256 --max-output-tokens 32 --out fidelity/
Several TP levels (tiny-llama: 8 heads, TP 1/2/4; smollm2-135m: 9 heads, TP 1 only here):
  tiertp fidelity --model tiny-llama --devices 2 --tp-levels 1,2 --trace azure-conv ... --out fidelity-tp12/
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tiertp.commands.load_arguments import (add_client_limit_arguments, add_length_cap_arguments, add_load_arguments,
                                            add_output_switch_arguments, live_client_settings, output_settings,
                                            workload_settings)
from tiertp.commands.worker import parse_tp_levels
from tiertp.number_types import non_negative_float, positive_float, positive_int


def _cpus(spec: str) -> list[int]:
    try:
        cpus = sorted({int(x) for x in spec.split(",") if x.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated core numbers, got {spec!r}") from None
    if not cpus or min(cpus) < 0:
        raise argparse.ArgumentTypeError(f"expected core numbers >= 0, got {spec!r}")
    return cpus


def _concurrencies(spec: str) -> tuple[int, ...]:
    """Wave sizes of the loaded probe: comma-separated counts >= 1, or 0 for none."""
    try:
        sizes = sorted({int(x) for x in spec.split(",") if x.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated request counts, got {spec!r}") from None
    if sizes == [0]:
        return ()
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"expected request counts >= 1 (or 0 for no loaded probe), got {spec!r}")
    return tuple(sizes)


def register(sub: argparse._SubParsersAction) -> None:
    from tiertp._scheduler import DEFAULT_WINDOW_S
    from tiertp.fidelity.defaults import PROBE_CONCURRENCY, TIERS_CPU_TWO_TIER

    p = sub.add_parser("fidelity", help="simulated vs live replay of one trace: predicted vs measured goodput",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    w = p.add_argument_group("workload (as tiertp replay)")
    add_load_arguments(w, tiers_default=str(TIERS_CPU_TWO_TIER),
                       tiers_help="tier TOML given to both the server and the simulator (default: the CPU two-tier "
                                  "file shipped in tiertp/fidelity)",
                       loads_required=True)
    add_length_cap_arguments(w)
    c = p.add_argument_group("system")
    c.add_argument("--model", default="smollm2-135m", help="embedded model or model dir (default %(default)s)")
    c.add_argument("--devices", type=positive_int, default=2,
                   help="devices of the started server (default %(default)s)")
    c.add_argument("--tp-levels", type=parse_tp_levels, metavar="L1,L2,...",
                   help="TP levels to profile, serve (tiertp serve --tp-levels) and simulate, e.g. 1,2: the "
                        "gateway's planner and the simulator plan over exactly these (powers of two including 1, "
                        "at most --devices, splitting the model's heads; a --profile must have each). "
                        "Default: the worker's, 1 (no TP switching)")
    c.add_argument("--serve-cpus", type=_cpus, metavar="C1,C2,...",
                   help="pin the started server to these cores (its engines size their threads from them); "
                        "e.g. --devices 1 --serve-cpus 1 serves one single-threaded device as the profile measures")
    c.add_argument("--url", help="use this running tiertp serve instead of starting one (its --tiers must match)")
    c.add_argument("--tokenizer", metavar="MODEL", help="tokenizer for the prompts (default: --model, or with --url "
                   "the served model's name)")
    c.add_argument("--profile", type=Path, help="reuse this measured profile instead of running tiertp profile")
    c.add_argument("--quick-profile", action="store_true", help="tiertp profile --quick (a tiny grid; tests only)")
    c.add_argument("--sim-policy", default="tiertp",
                   help="simulator policies to compare, comma list; the first is the prediction (default %(default)s)")
    c.add_argument("--window", type=positive_float, default=DEFAULT_WINDOW_S, metavar="S",
                   help="simulator control window (default: the gateway's, %(default)s s)")
    c.add_argument("--iteration-overhead-ms", type=non_negative_float, default=0.0, metavar="MS",
                   help="add MS to every profile cell for the simulator (a step-runner overhead; default 0)")
    o = p.add_argument_group("client and output")
    add_client_limit_arguments(o)
    o.add_argument("--probe", type=int, default=2, metavar="N",
                   help="unloaded probe: N requests per tier and prompt length (the first load's median and a "
                        "quarter of it) sent one at a time before the loads (default 2; 0: none)")
    o.add_argument("--probe-concurrency", type=_concurrencies, default=PROBE_CONCURRENCY, metavar="N1,N2,...",
                   help="loaded probe: waves of N requests sent together, each size twice, after the unloaded "
                        f"probe (default {','.join(map(str, PROBE_CONCURRENCY))}; 0: none)")
    o.add_argument("--no-calibrate", action="store_true",
                   help="skip the calibration: no calibrated prediction, and the started server keeps planning "
                        "with the measured profile (by default the profile is calibrated by the probes, the "
                        "simulator predicts with it and the started server is restarted to plan with it)")
    o.add_argument("--cooldown", type=non_negative_float, default=5.0, metavar="S",
                   help="pause between loads (default 5)")
    o.add_argument("--out", type=Path, default=Path("fidelity"), help="output folder (default fidelity/)")
    add_output_switch_arguments(o)
    p.set_defaults(func=run)


def check_tp_levels(args: argparse.Namespace) -> tuple[int, ...] | None:
    """--tp-levels checked before anything starts, with the checks `tiertp
    serve` makes (powers of two including 1, at most --devices, the model's
    heads split evenly: AgentConfig, check_model_fits_tp_levels); with
    --profile, the file must have a table for each level. None: not given."""
    from tiertp.fidelity.sim_profile import check_profile_levels
    from tiertp.worker.config import AgentConfig, check_model_fits_tp_levels

    if args.tp_levels is None:
        return None
    levels = tuple(sorted(set(args.tp_levels)))
    # With --url the server's devices are learnt later (the driver checks max level <= them).
    AgentConfig(devices=max(levels) if args.url else args.devices, tp_levels=levels)
    if not args.url:
        check_model_fits_tp_levels(args.model, levels)
    if args.profile is not None:
        check_profile_levels(args.profile, levels)
    return levels


def run(args: argparse.Namespace) -> int:
    from tiertp.fidelity.experiment import FidelityConfig, run_fidelity

    if args.devices < 1:
        raise ValueError(f"--devices must be >= 1, got {args.devices}")
    if args.url and args.serve_cpus:
        raise ValueError("--serve-cpus pins a server this command starts; with --url the server is already running")
    if args.profile is not None and not args.profile.is_file():
        raise ValueError(f"--profile {args.profile}: no such file")
    tp_levels = check_tp_levels(args)
    cfg = FidelityConfig(
        **workload_settings(args),
        **live_client_settings(args),
        out=args.out,
        model=args.model,
        devices=args.devices,
        tp_levels=tp_levels,
        profile=args.profile,
        profile_quick=args.quick_profile,
        url=args.url,
        serve_cpus=args.serve_cpus,
        tokenizer=args.tokenizer,
        sim_policies=[x.strip() for x in args.sim_policy.split(",") if x.strip()],
        window_s=args.window,
        iteration_overhead_ms=args.iteration_overhead_ms,
        cooldown_s=args.cooldown,
        probe_per_tier=args.probe,
        probe_concurrency=args.probe_concurrency,
        calibrate=not args.no_calibrate,
        **output_settings(args),
        command_line=["tiertp", *sys.argv[1:]],  # `python -m tiertp.cli ...` is the same command
    )
    report = run_fidelity(cfg)
    print("wrote " + ", ".join(str(f) for f in report.files))
    if report.doc["aborted"]:
        print(f"tiertp fidelity: aborted: {report.doc['aborted']}", file=sys.stderr)
        return 1
    interrupted = any(load["live"]["interrupted"] for load in report.doc["loads"])
    return 130 if interrupted else 0
