"""Resumable results of a `tiertp profile` run: a JSON-lines file beside --out.

Layout (``<out>.partial.jsonl``):
- line 1, the header: ``{"kind": "header", "run": {...}}`` where ``run`` says
  what is being measured (model, device, dtype, grid, sglang version). A run
  resumes only from a checkpoint whose header matches exactly; otherwise it
  fails and says to delete the file or pass --restart.
- then one line per result, appended as soon as it is measured:
  ``{"kind": "cell", "tp": 1, "table": "prefill", "x": 64, "y": 2,
  "latency_ms": .., "spread_ms": .., "samples_ms": [..]}`` or, once per TP
  level, ``{"kind": "level", "tp": 1, "kv_capacity_tokens": .., ...}``.

Appends are single ``write`` calls of whole lines, flushed at once, so an
interrupted run leaves at most a torn line, which loading ignores.
The file is removed after the final profile is written.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from tiertp.profiling.grid import Cell


class CheckpointMismatch(ValueError):
    """The checkpoint on disk belongs to a different run."""


@dataclass
class Progress:
    """What a checkpoint holds, by TP level: measured cells, cells found not to
    fit the device (KV pool), and per-level facts."""

    cells: dict[int, dict[Cell, dict]] = field(default_factory=dict)
    infeasible: dict[int, dict[Cell, dict]] = field(default_factory=dict)
    levels: dict[int, dict] = field(default_factory=dict)

    def done(self, tp: int, cell: Cell) -> bool:
        """Nothing left to do for `cell`: measured, or known not to fit."""
        return cell in self.cells.get(tp, {}) or cell in self.infeasible.get(tp, {})

    def add(self, record: dict) -> None:
        tp = int(record["tp"])
        kind = record["kind"]
        if kind in ("cell", "infeasible"):
            cell = Cell(record["table"], int(record["x"]), int(record["y"]))
            (self.cells if kind == "cell" else self.infeasible).setdefault(tp, {})[cell] = record
        elif kind == "level":
            self.levels[tp] = record


def checkpoint_path(out: Path) -> Path:
    out = Path(out)
    return out.with_name(out.name + ".partial.jsonl")


def open_checkpoint(path: Path, run: dict, *, restart: bool = False) -> Progress:
    """Start or resume the checkpoint at `path` for `run`; returns what is already measured."""
    path = Path(path)
    if restart and path.exists():
        path.unlink()
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        _append_line(path, {"kind": "header", "run": run})
        return Progress()
    records = read_records(path)
    if not records or records[0].get("kind") != "header":
        raise CheckpointMismatch(f"{path} is not a tiertp profile checkpoint; delete it or pass --restart")
    if records[0]["run"] != run:
        diff = sorted(k for k in set(run) | set(records[0]["run"]) if run.get(k) != records[0]["run"].get(k))
        raise CheckpointMismatch(
            f"{path} holds a run with different settings ({', '.join(diff)}); "
            "delete it or pass --restart to discard it"
        )
    progress = Progress()
    for r in records[1:]:
        progress.add(r)
    return progress


def read_records(path: Path) -> list[dict]:
    """All complete lines of `path`.

    A line that does not parse is a write torn by an interruption: it is
    dropped, and its cell is simply measured again.
    """
    records = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return records


def append_record(path: Path, record: dict) -> None:
    """Append one result line (called by the measuring process after each cell)."""
    _append_line(Path(path), record)


def _append_line(path: Path, obj: dict) -> None:
    data = (json.dumps(obj, sort_keys=True) + "\n").encode()
    # A torn line from an earlier crash must not swallow this one.
    if path.exists() and path.stat().st_size > 0:
        with open(path, "rb") as f:
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                data = b"\n" + data
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
