"""Turn measured cells into a profile file, validated by the planner's loader.

The output is exactly the format of rust-scheduler/core/src/profile/schema.rs
(`format` "tiertp-profile", `version` 1). Every table is a full rectangle:
cells that cannot run take the value of a measured cell (FILL_RULE) and are
listed in provenance.filled_cells with the reason.

The file is first written beside --out, loaded with
`tiertp._scheduler.Profile.load` (the Rust loader the planner uses), and
only then renamed to --out: an invalid profile never lands at --out.
"""

from __future__ import annotations

import os
from pathlib import Path

from tiertp.profiling.checkpoint import Progress
from tiertp.profiling.grid import TABLES, Cell, Grid, cells, feasible, nearest_feasible

FORMAT_NAME = "tiertp-profile"
FORMAT_VERSION = 1

FILL_RULE = (
    "cells that cannot be run hold the value of a measured cell: a prefill cell with "
    "batch_size > batch_tokens takes the same batch_tokens with the largest feasible batch_size; "
    "a decode cell whose requests exceed the KV pool takes the measured cell with the largest "
    "(context_len, batch_size) not above it on either axis, a lower bound (the profile's "
    "kv_capacity_tokens keeps the planner from such batches)"
)


class IncompleteProfile(RuntimeError):
    """Some cells were never measured; the checkpoint still holds what was."""


def build_profile(
    *,
    gpu: str,
    model: str,
    dtype: str,
    kv_bytes_per_token: int,
    grid: Grid,
    tp_levels: list[int],
    progress: Progress,
    provenance: dict,
) -> dict:
    """The profile document for `tp_levels` from `progress` (all cells must be measured)."""
    levels = {}
    filled = []
    for tp in tp_levels:
        measured = progress.cells.get(tp, {})
        level = {}
        for table in TABLES:
            xs, ys = grid.axes(table)
            lat, spread = [], []
            for x in xs:
                lat_row, spread_row = [], []
                for y in ys:
                    cell = Cell(table, x, y)
                    source = _source(tp, cell, grid, progress)
                    rec = measured[source]
                    lat_row.append(float(rec["latency_ms"]))
                    spread_row.append(float(rec["spread_ms"]))
                    if source != cell:
                        reason = (progress.infeasible.get(tp, {}).get(cell) or {}).get("reason", "batch_size > batch_tokens")
                        filled.append(
                            {"tp": tp, "table": table, "x": x, "y": y, "from": {"x": source.x, "y": source.y}, "reason": reason}
                        )
                lat.append(lat_row)
                spread.append(spread_row)
            names = ("batch_tokens", "batch_size") if table == "prefill" else ("batch_size", "context_len")
            level[table] = {names[0]: [float(x) for x in xs], names[1]: [float(y) for y in ys], "latency_ms": lat, "spread_ms": spread}
        kv = progress.levels.get(tp, {}).get("kv_capacity_tokens")
        if kv:
            level["kv_capacity_tokens"] = int(kv)
        levels[str(tp)] = level
    provenance = dict(provenance)
    provenance["filled_cells"] = {
        "rule": FILL_RULE,
        "cells": filled,
    }
    return {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "gpu": gpu,
        "model": model,
        "dtype": dtype,
        "kv_bytes_per_token": int(kv_bytes_per_token),
        "provenance": provenance,
        "tp_levels": levels,
    }


def _source(tp: int, cell: Cell, grid: Grid, progress: Progress) -> Cell:
    """The measured cell whose value `cell` takes (itself when measured)."""
    measured = progress.cells.get(tp, {})
    if cell in measured:
        return cell
    if not feasible(cell):
        source = nearest_feasible(cell, grid)
        if source in measured:
            return source
    elif cell in progress.infeasible.get(tp, {}):
        below = [c for c in measured if c.table == cell.table and c.x <= cell.x and c.y <= cell.y]
        if below:
            return max(below, key=lambda c: (c.y, c.x))
        raise IncompleteProfile(f"TP{tp}: no {cell.table} cell fits the device, not even the smallest")
    raise IncompleteProfile(f"TP{tp} {cell.table} cell x={cell.x}, y={cell.y} was not measured")


def missing_cells(grid: Grid, tp_levels: list[int], progress: Progress) -> list[tuple[int, Cell]]:
    return [
        (tp, c)
        for tp in tp_levels
        for t in TABLES
        for c in cells(grid, t)
        if feasible(c) and not progress.done(tp, c)
    ]


def write_validated(doc: dict, out: Path) -> None:
    """Write `doc` to `out` only if the Rust loader accepts it (raises its ProfileError otherwise)."""
    import json

    from tiertp import _scheduler

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    try:
        _scheduler.Profile.load(str(tmp))
    except _scheduler.ProfileError:
        bad = out.with_name(out.name + ".invalid.json")
        os.replace(tmp, bad)
        raise
    os.replace(tmp, out)
