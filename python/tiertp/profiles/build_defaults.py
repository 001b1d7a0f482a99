"""Compose the shipped default TP profiles (tiertp/profiles/defaults/) from
measured GPU kernel latencies (<data>/gpu-kernels/<gpu>/, the public
aiconfigurator SGLang collections): every GPU in gpus.GPUS and model in
models.MODELS unless --gpu/--model narrow it, at the TP levels the model
fits at. Each file written is checked by the planner's profile loader.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import re
from pathlib import Path
from typing import Any

from tiertp import __version__
from tiertp.data import data_dir
from tiertp.profiles import capacity, compose, kernels
from tiertp.profiles.compose import Composer
from tiertp.profiles.gpus import GPUS, GpuSpec, get_gpu
from tiertp.profiles.kernels import KernelTables
from tiertp.profiles.models import MODELS, ModelShape, get_model
from tiertp.profiles.registry import DEFAULTS_DIR, table_name

log = logging.getLogger(__name__)

# The grids every shipped table uses (the planner interpolates between
# points and clamps outside them).
PREFILL_BATCH_TOKENS = (64, 128, 256, 512, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768)
PREFILL_BATCH_SIZE = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
DECODE_BATCH_SIZE = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256, 320, 384, 448, 512)
DECODE_CONTEXT_LEN = (
    128, 256, 512, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384,
    24576, 32768, 49152, 65536, 98304, 131072,
)

SOURCE = {
    "dataset": "gpu-kernels/{gpu} of tiertp's public data (../shared/data)",
    "upstream": "ai-dynamo/aiconfigurator, commit 095f58a, "
    "aic-core/src/aiconfigurator_core/systems/data/{gpu}/ (SGLang 0.5.10 collections, "
    "plus the newest NCCL collection); Apache-2.0",
}
SIGNIFICANT_DIGITS = 5
# The command recorded as each shipped file's generator.
GENERATOR = "tiertp profile build-defaults (tiertp.profiles.build_defaults)"

# Written into each file's provenance beside the composer's own description.
MONOTONE_NOTE = (
    "Each table is then made non-decreasing along batch tokens (prefill), batch size and "
    "context length (decode) by taking, at every point, the minimum over the larger points "
    "of that axis: a smaller batch can always run padded to a larger one (SGLang pads decode "
    "batches to the captured CUDA-graph size), so a measured kernel that is a little faster "
    "at a larger size (up to about 6% in these data, e.g. GEMMs at m = 2..4 against m = 1) "
    "sets the time of the smaller sizes too."
)


def _round(x: float) -> float:
    return float(f"{x:.{SIGNIFICANT_DIGITS}g}")


def suffix_min(rows: list[list[float]], axis: int) -> list[list[float]]:
    """`rows` made non-decreasing along `axis` (0: down the rows, 1: along
    each row) by the running minimum from the far end."""
    if axis == 1:
        out = []
        for row in rows:
            acc, new = float("inf"), []
            for v in reversed(row):
                acc = min(acc, v)
                new.append(acc)
            out.append(new[::-1])
        return out
    return [list(col) for col in zip(*suffix_min([list(c) for c in zip(*rows)], 1))]


def load_tables(root: Path, gpu: GpuSpec) -> KernelTables:
    """`gpu`'s kernel tables from the public data folder `root`."""
    gpu_dir = root / "gpu-kernels" / gpu.data_dir
    if not gpu_dir.is_dir():
        raise FileNotFoundError(f"{gpu_dir}: kernel tables for {gpu.name} not found (give --data or set TIERTP_DATA)")
    return KernelTables.load(gpu_dir, expect_device=gpu.device)


def build_profile(
    gpu: GpuSpec, model: ModelShape, tables: KernelTables, generated: str, generator: str = GENERATOR
) -> dict[str, Any]:
    """The profile (schema: rust-scheduler/core/src/profile/schema.rs) of
    `model` on `gpu` at every TP level it fits at; raises if it fits at none."""
    levels = capacity.fitting_tp_levels(model, gpu)
    if not levels:
        why = "; ".join(f"TP {tp}: {_why_not(model, gpu, tp)}" for tp in capacity.TP_CANDIDATES)
        raise ValueError(f"{model.name} fits on {gpu.name} at no TP level ({why})")
    tp_levels: dict[str, Any] = {}
    for tp in levels:
        c = Composer(model, tables, tp)
        prefill = [[c.prefill(t, b).total_ms for b in PREFILL_BATCH_SIZE] for t in PREFILL_BATCH_TOKENS]
        decode = [[c.decode(b, ctx).total_ms for ctx in DECODE_CONTEXT_LEN] for b in DECODE_BATCH_SIZE]
        prefill = suffix_min(prefill, axis=0)
        decode = suffix_min(suffix_min(decode, axis=0), axis=1)
        tp_levels[str(tp)] = {
            "prefill": {
                "batch_tokens": list(PREFILL_BATCH_TOKENS),
                "batch_size": list(PREFILL_BATCH_SIZE),
                "latency_ms": [[_round(v) for v in row] for row in prefill],
            },
            "decode": {
                "batch_size": list(DECODE_BATCH_SIZE),
                "context_len": list(DECODE_CONTEXT_LEN),
                "latency_ms": [[_round(v) for v in row] for row in decode],
            },
            "kv_capacity_tokens": capacity.kv_capacity_tokens(model, gpu, tp),
        }
    return {
        "format": "tiertp-profile",
        "version": 1,
        "gpu": gpu.name,
        "model": model.name,
        "dtype": "bfloat16",
        "kv_bytes_per_token": model.kv_bytes_per_token,
        "provenance": _provenance(gpu, model, tables, levels, generated, generator),
        "tp_levels": tp_levels,
    }


def _provenance(
    gpu: GpuSpec, model: ModelShape, tables: KernelTables, levels: list[int], generated: str, generator: str
) -> dict[str, Any]:
    ew = compose.Elementwise.from_kernels(tables)
    skipped = [tp for tp in capacity.TP_CANDIDATES if tp not in levels]
    return {
        "kind": "composed from measured kernel latencies (not an end-to-end measurement)",
        "generator": f"tiertp {__version__}, {generator}",
        "generated": generated,
        "source": {k: v.format(gpu=gpu.data_dir) for k, v in SOURCE.items()},
        "source_versions": tables.versions,
        "measured_on": sorted(tables.devices),
        "model_shape": model.describe(),
        "method": [*_paragraphs(compose.__doc__), MONOTONE_NOTE],
        "interpolation": _paragraphs((kernels.__doc__ or "").split("\n\n", 2)[-1]),
        "constants": {
            "scheduler_overhead_ms_per_step": compose.SCHEDULER_OVERHEAD_MS,
            "elementwise_hbm_bytes_per_ms": round(ew.bandwidth),
            "elementwise_kernel_floor_ms": _round(ew.floor_ms),
            "mem_fraction_static": capacity.MEM_FRACTION_STATIC,
            "hbm_bytes_per_gpu": gpu.hbm_bytes,
            "min_kv_tokens_to_fit": capacity.MIN_KV_TOKENS,
        },
        "tp_levels_left_out": {str(tp): _why_not(model, gpu, tp) for tp in skipped},
    }


def _why_not(model: ModelShape, gpu: GpuSpec, tp: int) -> str:
    if not model.tp_ok(tp):
        return "heads do not split evenly"
    kv = capacity.kv_capacity_tokens(model, gpu, tp)
    if kv <= 0:
        return "bf16 weights exceed the memory left after the activation reserve"
    return f"KV cache holds only {kv} tokens (< {capacity.MIN_KV_TOKENS})"


def _paragraphs(doc: str | None) -> list[str]:
    """A docstring as one string per paragraph or bullet, for provenance."""
    items = re.split(r"\n\s*\n|\n(?=- )", (doc or "").strip())
    return [" ".join(i.split()) for i in items if i.strip()]


def write_profile(profile: dict[str, Any], path: Path) -> None:
    """JSON with one line per grid row (small, diffable)."""
    text = json.dumps(profile, indent=1)
    # collapse each innermost list of numbers onto one line
    text = re.sub(r"\[\s+([-0-9.eE+,\s]+?)\s+\]", lambda m: "[" + re.sub(r",\s+", ", ", m.group(1)) + "]", text)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def loader_complaint(path: Path) -> str | None:
    """The planner's loader's complaint about `path`, or None; skipped (with a
    warning) when the Rust bindings are not built."""
    try:
        from tiertp import _scheduler
    except ImportError:
        log.warning("tiertp._scheduler not built: %s not checked by the profile loader", path.name)
        return None
    try:
        _scheduler.Profile.load(str(path))
    except _scheduler.ProfileError as e:
        return str(e)
    return None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", type=Path, help="public data folder holding gpu-kernels/ (default: $TIERTP_DATA or ../shared/data)")
    parser.add_argument("--out", type=Path, default=DEFAULTS_DIR, help=f"output folder (default: {DEFAULTS_DIR})")
    parser.add_argument("--gpu", action="append", help=f"GPU to build (repeatable; default all: {', '.join(GPUS)})")
    parser.add_argument("--model", action="append", help=f"model to build (repeatable; default all: {', '.join(MODELS)})")
    parser.add_argument("--date", default=None, help="date recorded as provenance.generated (default: today, UTC)")


def run(args: argparse.Namespace) -> int:
    gpus = [get_gpu(g) for g in args.gpu] if args.gpu else list(GPUS.values())
    models = [get_model(m) for m in args.model] if args.model else list(MODELS.values())
    root = args.data if args.data else data_dir()
    generated = args.date or dt.datetime.now(dt.timezone.utc).date().isoformat()
    problems = []
    for gpu in gpus:
        tables = load_tables(root, gpu)
        for model in models:
            profile = build_profile(gpu, model, tables, generated)
            path = args.out / table_name(gpu, model)
            write_profile(profile, path)
            log.info("wrote %s (TP %s, %.0f KB)", path, ",".join(profile["tp_levels"]), path.stat().st_size / 1024)
            problem = loader_complaint(path)
            if problem:
                problems.append(problem)
    for p in problems:
        log.error("profile loader rejects: %s", p)
    return 1 if problems else 0
