"""`tiertp replay`: replay request traces through the cluster simulator for
tiertp, its ablations and the baselines (each baseline at its best setting,
chosen with hindsight per load), over a load sweep; write report.json,
report.csv, goodput.txt (goodput per policy, total and per tier) and PNG
plots.

With --live URL the same workload is replayed against a running server
(`tiertp serve`) instead: requests sent at their scaled arrival times with
the trace's prompt lengths (token-id prompts) and max_tokens = output length,
streamed, with each tier's API key; measured TTFT/TPOT give the same report
(plus requests-<rps>rps.csv: every request, completed or failed with why).

Example (the Azure traces, two SLO tiers, 8 H100s):
  tiertp replay --trace azure-conv --trace azure-code --tiers azure-two-tier \\
      --gpus 8 --gpu h100 --model llama-3.1-8b --policies all \\
      --rps 5,10,20,40,70 --duration 600 --out report/
Live, against `tiertp serve --devices 2` on this machine:
  tiertp replay --live http://127.0.0.1:8000/v1 --trace azure-conv --trace azure-code \\
      --rps 0.5 --duration 60 --max-prompt-tokens 256 --max-output-tokens 32 --out report-live/

The paper's settings, from bench/presets.toml in a source checkout (flags
given override the preset's; the report goes to bench/results/NAME/ unless
--out says otherwise; `--preset all` runs every preset):
  tiertp replay --preset 14b-h100x8 --duration 60 --rps 70
The robustness grid, settings the paper does not evaluate (other SLO scales,
GPUs, models, tier mixes and traces; reports under bench/results/robustness/),
then the acceptance checks over every report it wrote:
  tiertp replay --presets bench/robustness.toml --preset all --no-plots
  tiertp replay --presets bench/robustness.toml --preset all --verdict
Any finished reports (folders searched for report.json), judged the same way:
  tiertp replay --verdict bench/results/
The ablation chain of a finished report (runs nothing):
  tiertp replay --ablation bench/results/14b-h100x8 [--rps 70]
  tiertp replay --preset 14b-h100x8 --ablation
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tiertp._scheduler import DEFAULT_GPUS_PER_NODE, DEFAULT_WINDOW_S
from tiertp.commands.load_arguments import (add_client_limit_arguments, add_length_cap_arguments, add_load_arguments,
                                            add_output_switch_arguments, live_client_settings, output_settings,
                                            workload_settings)
from tiertp.number_types import non_negative_float, positive_float, positive_int
from tiertp.profile_source import add_profile_arguments, load_profile
from tiertp.profiles import from_config
from tiertp.replay import ablation, presets, report_files, verdict
from tiertp.replay.simulated_replay import ReplayConfig, replay
from tiertp.replay.policies import ALL
from tiertp.replay.tier_configs import TIER_CONFIGS

# The values of the arguments a preset may also set. The parser leaves them
# None, so that a flag given on the command line can be told from one left
# out (and override the preset); `fill_defaults` puts these in last.
DEFAULTS = {"gpus": 8, "policies": ALL, "tiers": "default"}
# --out without a preset (with one: presets.RESULTS_DIR / NAME).
DEFAULT_OUT = Path("report")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("replay", help="replay traces through the cluster simulator; goodput report",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    pr = p.add_argument_group("presets and ablation")
    pr.add_argument("--preset", metavar="NAME",
                    help=f"a setting of the presets file (source checkout only), or '{presets.ALL_PRESETS}'; "
                         "flags given override its values")
    pr.add_argument("--verdict", nargs="*", type=Path, metavar="REPORT",
                    help="judge finished reports (folders searched for report.json, or the files; none given, "
                         "with --preset: the presets' results) by the acceptance checks, load by load; runs nothing")
    pr.add_argument("--presets", type=Path, default=presets.PRESETS_FILE, metavar="FILE",
                    help="presets file (default: bench/presets.toml, the paper's settings; "
                         "bench/robustness.toml: settings beyond them)")
    pr.add_argument("--ablation", nargs="?", const="", metavar="REPORT",
                    help="print the paper's ablation chain from a finished report (folder or report.json; "
                         "default with --preset: the preset's results) at --rps (one load, default "
                         f"{ablation.DEFAULT_RPS:g}, else the report's nearest); runs nothing")
    add_load_arguments(p.add_argument_group("workload"), tiers_default=None,
                       tiers_help=f"tier TOML file, or a shipped one: {', '.join(TIER_CONFIGS)} "
                                  f"(default: {DEFAULTS['tiers']})",
                       loads_required=False, traces_required=False)
    c = p.add_argument_group("cluster")
    add_profile_arguments(p)
    c.add_argument("--gpus", type=positive_int, help=f"default: {DEFAULTS['gpus']}")
    c.add_argument("--gpus-per-node", type=positive_int, default=DEFAULT_GPUS_PER_NODE, help="default: %(default)s")
    c.add_argument("--policies", help=f"'{ALL}' or a comma list of simulator policies (default: {DEFAULTS['policies']})")
    c.add_argument("--window", type=positive_float, default=DEFAULT_WINDOW_S, metavar="S",
                   help="control window (s; default: %(default)s)")
    c.add_argument("--switch-ms", type=non_negative_float, help="TP switch stop time (default: the simulator's)")
    c.add_argument("--kv-gbps", type=positive_float, help="KV transfer bandwidth, GB/s (default: the simulator's)")
    lv = p.add_argument_group("live replay (--live)")
    lv.add_argument("--live", metavar="URL", help="replay against this running server (e.g. http://127.0.0.1:8000/v1) "
                    "instead of the simulator; --tiers must be the server's (API keys)")
    add_length_cap_arguments(lv)
    add_client_limit_arguments(lv)
    lv.add_argument("--tokenizer", metavar="MODEL", help="embedded model name or model directory whose tokenizer "
                    "makes the prompts (default: the served model's name)")
    lv.add_argument("--served-model", metavar="NAME", help="model to request when the server lists several")
    lv.add_argument("--api-key", action="append", default=[], metavar="TIER=KEY",
                    help="API key for a tier (default: the first of the tier's api_keys in --tiers); repeatable")
    o = p.add_argument_group("output")
    o.add_argument("--out", type=Path, help=f"output folder (default: {DEFAULT_OUT}/; with --preset: "
                   "bench/results/NAME/, or OUT/NAME/ for --preset all)")
    o.add_argument("--plot-rps", type=float, help="load (one of --rps) for the timeline and CDF plots (default: middle)")
    add_output_switch_arguments(o)
    p.set_defaults(func=run)


def fill_defaults(args: argparse.Namespace) -> argparse.Namespace:
    """`args` with DEFAULTS (and DEFAULT_OUT) in place of what is unset."""
    for dest, value in {**DEFAULTS, "out": DEFAULT_OUT}.items():
        if getattr(args, dest) is None:
            setattr(args, dest, value)
    return args


def run(args: argparse.Namespace) -> int:
    if args.verdict is not None:
        return run_verdict(args)
    if args.ablation is not None:
        return run_ablation(args)
    if args.preset:
        return run_presets(args)
    if not args.trace:
        raise ValueError("give --trace (repeatable), or --preset NAME for one of the paper's settings")
    fill_defaults(args)
    if args.live:
        return run_live(args)
    return run_sim(args)


def preset_args(args: argparse.Namespace, preset: presets.Preset, many: bool) -> argparse.Namespace:
    """`args` with the preset's values wherever no flag was given; the
    report goes to bench/results/NAME/ (or OUT/NAME/ when one --out serves
    several presets)."""
    merged = preset.merged(vars(args))
    if args.profile:  # --profile replaces the preset's model
        merged["gpu"], merged["model"], merged["config"] = args.gpu, args.model, None
    elif args.model:  # so does --model (a shipped table) a preset's config.json
        merged["config"] = None
    if args.out is None:
        out = presets.results_dir(args.presets) / preset.name
    else:
        out = args.out / preset.name if many else args.out
    return fill_defaults(argparse.Namespace(**{**vars(args), **merged, "out": out}))


def run_presets(args: argparse.Namespace) -> int:
    if args.live:
        raise ValueError("--preset names simulated clusters; it does not go with --live")
    chosen = presets.select(args.preset, args.presets)
    for preset in chosen:
        a = compose_profile(preset_args(args, preset, many=len(chosen) > 1))
        table = a.profile or f"{a.model} on {a.gpu}"
        print(f"== preset {preset.name}: {table}, {a.gpus} GPUs, {a.duration:g} s per load, "
              f"loads {','.join(f'{r:g}' for r in a.rps)} req/s -> {a.out}", flush=True)
        rc = run_sim(a)
        if rc:
            return rc
    return 0


def compose_profile(args: argparse.Namespace) -> argparse.Namespace:
    """`args` of a preset that names its model by a config.json, with the
    profile composed for its GPU written into its report folder and named
    by --profile; any other `args` as they are."""
    if not args.config:
        return args
    out = args.out / f"profile-{Path(args.config).stem}-{args.gpu}.json"
    _, problem = from_config.compose(Path(args.config), args.gpu, out)
    if problem:
        raise ValueError(f"the profile composed from {args.config} for {args.gpu} does not load: {problem}")
    return argparse.Namespace(**{**vars(args), "profile": str(out), "gpu": None, "model": None})


def run_verdict(args: argparse.Namespace) -> int:
    if args.verdict:
        sources = args.verdict
    elif args.preset:
        chosen = presets.select(args.preset, args.presets)
        sources = [preset_args(args, p, many=len(chosen) > 1).out for p in chosen]
    else:
        raise ValueError("--verdict needs reports (--verdict DIR_OR_REPORT_JSON ...) or --preset NAME|all")
    print(verdict.verdict_text(sources))
    return 0


def run_ablation(args: argparse.Namespace) -> int:
    if args.ablation:
        source = Path(args.ablation)
    elif args.preset and args.preset != presets.ALL_PRESETS:
        (preset,) = presets.select(args.preset, args.presets)
        source = args.out or presets.results_dir(args.presets) / preset.name
    else:
        raise ValueError("--ablation needs a report (--ablation DIR_OR_REPORT_JSON) or one --preset NAME")
    if args.rps and len(args.rps) != 1:
        raise ValueError(f"--ablation reads one load: give one --rps, got {args.rps}")
    rps = args.rps[0] if args.rps else ablation.DEFAULT_RPS
    print(ablation.chain_text(report_files.load_report(source), rps))
    return 0


def run_sim(args: argparse.Namespace) -> int:
    if args.max_prompt_tokens or args.max_output_tokens:
        raise ValueError("--max-prompt-tokens/--max-output-tokens go with --live (the simulated replay "
                         "replays the trace's lengths)")
    cfg = ReplayConfig(
        **workload_settings(args),
        profile=load_profile(args, default_gpu="h100", default_model="llama-3.1-8b"),
        gpus=args.gpus,
        out=args.out,
        policies=args.policies,
        gpus_per_node=args.gpus_per_node,
        window_s=args.window,
        switch_ms=args.switch_ms,
        kv_gbps=args.kv_gbps,
        plot_rps=args.plot_rps,
        **output_settings(args),
    )
    report = replay(cfg)
    print("goodput, req/s within SLO (winning setting), total and per tier:")
    print(report.table)
    print("wrote " + ", ".join(str(f) for f in report.files))
    return 0


def parse_api_keys(items: list[str]) -> dict[str, str]:
    keys = {}
    for item in items:
        for pair in item.split(","):
            tier, sep, key = pair.partition("=")
            if not sep or not tier.strip() or not key.strip():
                raise ValueError(f"--api-key {item!r}: expected TIER=KEY")
            keys[tier.strip()] = key.strip()
    return keys


def run_live(args: argparse.Namespace) -> int:
    from tiertp.replay.live import LiveReplayConfig, live_replay

    if args.profile or args.gpu or args.model:
        raise ValueError("--live replays against a server: --profile/--gpu/--model do not apply")
    cfg = LiveReplayConfig(
        **workload_settings(args),
        **live_client_settings(args),
        url=args.live,
        out=args.out,
        tokenizer=args.tokenizer,
        served_model=args.served_model,
        api_keys=parse_api_keys(args.api_key),
        plot_rps=args.plot_rps,
        **output_settings(args),
    )
    report = live_replay(cfg)
    print("goodput, req/s within SLO (measured):")
    print(report.table)
    for r in report.results:
        live = r.policies["live"].best.live
        print(f"{r.load.offered_rps:.2f} req/s: {live['completed']} completed, {live['failed']} failed"
              + (f" {live['failures']}" if live["failures"] else ""))
    print("wrote " + ", ".join(str(f) for f in report.files))
    interrupted = any(r.policies["live"].best.live["interrupted"] for r in report.results)
    return 130 if interrupted else 0
