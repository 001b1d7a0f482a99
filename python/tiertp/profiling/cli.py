"""Measure the real SGLang engine at each TP level and write a validated profile.

e.g. tiertp profile --model smollm2-135m --tp 1,3 --device cpu --out profiles/cpu-smollm2.json

Interrupted runs resume from <out>.partial.jsonl (--restart discards it); the
engine's log goes to <out>.log while measuring.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import fields
from pathlib import Path

from tiertp.engine.isolated import IsolatedRunError
from tiertp.engine.models import EMBEDDED_MODELS
from tiertp.engine.sglang_compat import DEVICES, DeviceUnavailable
from tiertp.number_types import positive_float, positive_int
from tiertp.profiling.grid import CPU_CORES_PER_RANK, parse_tp_list


def _tp_list(text: str) -> list[int]:
    try:
        return parse_tp_list(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        default="smollm2-135m",
        help=f"model directory (HF safetensors) or embedded model: {', '.join(EMBEDDED_MODELS)} (default: %(default)s)",
    )
    parser.add_argument("--tp", dest="tp_levels", type=_tp_list, default=[1], metavar="TP",
                        help="comma-separated TP levels, e.g. 1,2,4 (default: 1)")
    parser.add_argument("--device", choices=DEVICES, default="cpu", help="where to run the engine (default: %(default)s)")
    parser.add_argument("--out", type=Path, required=True, help="profile JSON to write")
    parser.add_argument("--quick", action="store_true", help="a small grid (minutes, not hours)")
    parser.add_argument("--restart", action="store_true", help="discard a partial run's checkpoint instead of resuming")
    parser.add_argument("--cores-per-rank", type=positive_int, default=CPU_CORES_PER_RANK, metavar="N",
                        help="CPU: cores each TP rank runs on (default %(default)s: a core stands in for a device, "
                             "so the table compares TP levels; `tiertp serve` measures with its cores per device)")
    parser.add_argument("--gpu", help="value of the profile's gpu field (default: cpu, or the CUDA device name)")
    parser.add_argument(
        "--level-timeout", dest="level_timeout_s", type=positive_float, default=3600.0, metavar="S",
        help="give up on a TP level after S seconds",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    from tiertp.profiling.run_profile import ProfileRequest, run_profile

    # Every option is named after the ProfileRequest field it sets (its dest).
    req = ProfileRequest(**{f.name: getattr(args, f.name) for f in fields(ProfileRequest) if hasattr(args, f.name)})
    try:
        doc = run_profile(req, progress_bar=not args.no_progress)
    except DeviceUnavailable as e:
        print(f"tiertp profile: error: {e}", file=sys.stderr)
        return 2
    except IsolatedRunError as e:
        print(f"tiertp profile: measurement failed; completed cells are kept in the checkpoint: {e}", file=sys.stderr)
        return 1
    levels = ", ".join(f"TP{tp}" for tp in doc["tp_levels"])
    print(f"wrote {args.out} ({doc['gpu']}/{doc['model']}/{doc['dtype']}: {levels})")
    return 0
