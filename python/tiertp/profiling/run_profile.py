"""Run a whole `tiertp profile` measurement: every TP level, resumably, then write.

One isolated process per TP level (tiertp.engine.isolated) runs
tiertp.profiling.measure.measure_level on the cells not yet in the
checkpoint; this process follows the checkpoint to drive the progress bar,
and finally writes the validated profile (tiertp.profiling.writer).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from tiertp.engine import sglang_compat
from tiertp.engine.isolated import run_isolated
from tiertp.engine.models import model_name, resolve_model
from tiertp.profiles.models import DecoderShape
from tiertp.profiling import provenance
from tiertp.profiling.checkpoint import checkpoint_path, open_checkpoint, read_records
from tiertp.profiling.grid import CPU_CORES_PER_RANK, Grid, check_tp_fits_model, grid_for, measured_cells
from tiertp.profiling.measure import measure_level
from tiertp.profiling.writer import build_profile, write_validated
from tiertp.weights.checkpoint import read_config

log = logging.getLogger(__name__)

_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# Extra KV slots beyond what the grid needs (page rounding, the padding slot).
_KV_MARGIN_TOKENS = 256


@dataclass(frozen=True)
class ProfileRequest:
    model: str  # embedded name or model directory
    tp_levels: list[int]
    device: str
    out: Path
    quick: bool = False
    restart: bool = False
    gpu: str | None = None  # the profile's "gpu" field; default from the device
    level_timeout_s: float = 3600.0
    seed: int = 0
    # CPU: cores each TP rank runs on. 1 makes the table compare TP levels;
    # `tiertp serve` measures with its worker's cores per device instead.
    cores_per_rank: int = CPU_CORES_PER_RANK


def kv_bytes_per_token(shape: DecoderShape, dtype: str) -> int:
    """K and V of one token, all layers, all KV heads (the whole model, not one rank), in `dtype`."""
    return shape.layers * 2 * shape.kv_dim * _DTYPE_BYTES[dtype]


def checkpoint_header(model: str, device: str, grid: Grid, seed: int,
                      cores_per_rank: int = CPU_CORES_PER_RANK) -> dict:
    """What a checkpoint must match to be resumed: everything that changes the numbers."""
    return {
        "model": model,
        "device": device,
        "dtype": sglang_compat.engine_kwargs(device, 1)["dtype"],
        "grid": grid.to_dict(),
        "seed": seed,
        "cores_per_rank": cores_per_rank if device == "cpu" else None,
        "sglang": provenance.package_version("sglang"),
    }


def run_profile(req: ProfileRequest, progress_bar: bool = True) -> dict:
    """Measure (or resume) and write the profile for `req`; returns the profile document."""
    sglang_compat.check_device(req.device)
    if req.device == "cuda":
        sglang_compat.check_cuda_available()
    path = resolve_model(req.model)
    shape = DecoderShape(**DecoderShape.fields_from_config(read_config(path)))
    name = model_name(req.model)
    check_tp_fits_model(req.tp_levels, shape.heads, shape.kv_heads, name)
    grid = grid_for(req.device, req.quick)
    dtype = sglang_compat.engine_kwargs(req.device, 1)["dtype"]
    run = checkpoint_header(name, req.device, grid, req.seed, req.cores_per_rank)
    ckpt = checkpoint_path(req.out)
    progress = open_checkpoint(ckpt, run, restart=req.restart)
    todo = {tp: [c for c in measured_cells(grid) if not progress.done(tp, c)] for tp in req.tp_levels}
    total = len(measured_cells(grid)) * len(req.tp_levels)
    bar = _Bar(total, total - sum(len(v) for v in todo.values()), ckpt, enabled=progress_bar)
    log_path = req.out.with_name(req.out.name + ".log")
    # CPU: a pool just big enough for the grid; CUDA: SGLang sizes it from
    # free memory, which is then the profile's kv_capacity_tokens.
    kv_pool = grid.kv_tokens_needed() + _KV_MARGIN_TOKENS if req.device == "cpu" else None
    try:
        for tp in req.tp_levels:
            if not todo[tp] and tp in progress.levels:
                continue
            bar.set_level(tp)
            job = {
                "model_path": str(path),
                "tp": tp,
                "device": req.device,
                "grid": grid.to_dict(),
                "cells": [[c.table, c.x, c.y] for c in todo[tp]],
                "checkpoint": str(ckpt),
                "max_total_tokens": kv_pool,
                "cores_per_rank": req.cores_per_rank if req.device == "cpu" else None,
                "seed": req.seed,
            }
            run_isolated(
                measure_level,
                job,
                timeout_s=req.level_timeout_s,
                log_path=log_path,
                poll=bar.refresh,
            )
            bar.refresh()
    finally:
        bar.close()
    progress = open_checkpoint(ckpt, run)  # everything measured, this run and earlier ones
    doc = build_profile(
        gpu=req.gpu or provenance.device_name(req.device),
        model=name,
        dtype=dtype,
        kv_bytes_per_token=kv_bytes_per_token(shape, dtype),
        grid=grid,
        tp_levels=req.tp_levels,
        progress=progress,
        provenance=provenance.describe(
            req, grid, path, progress, max_total_tokens=kv_pool, cores_per_rank=req.cores_per_rank
        ),
    )
    write_validated(doc, req.out)
    ckpt.unlink()
    log_path.unlink(missing_ok=True)
    return doc


class _Bar:
    """A tqdm bar over cells, advanced by counting the checkpoint's cell records."""

    def __init__(self, total: int, initial: int, ckpt: Path, enabled: bool):
        from tqdm import tqdm

        self._ckpt = ckpt
        self._base = _count_cells(ckpt)  # already there before this run
        self._initial = initial
        self._bar = tqdm(total=total, initial=initial, unit="cell", disable=not enabled, desc="profile")

    def set_level(self, tp: int) -> None:
        self._bar.set_description(f"TP{tp}")

    def refresh(self) -> None:
        done = self._initial + _count_cells(self._ckpt) - self._base
        delta = min(done, self._bar.total) - self._bar.n
        if delta > 0:  # update(0) would redraw the bar every poll
            self._bar.update(delta)

    def close(self) -> None:
        self._bar.close()


def _count_cells(ckpt: Path) -> int:
    try:
        return sum(1 for r in read_records(ckpt) if r.get("kind") == "cell")
    except FileNotFoundError:
        return 0


__all__ = ["ProfileRequest", "checkpoint_header", "run_profile"]
