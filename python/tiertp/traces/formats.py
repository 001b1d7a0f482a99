"""Trace file formats: the one list of format names, their readers, and how
a path without a format prefix picks one (extension, then CSV header)."""

from __future__ import annotations

import csv
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from tiertp.traces import azure, burstgpt
from tiertp.traces.errors import TraceError
from tiertp.traces.mooncake import read_mooncake
from tiertp.traces.trace import Trace


class TraceFormat(NamedTuple):
    """A file format: `read(path, source)` returns a Trace; `extensions` pick
    it for unprefixed paths; `header` (CSV only) tells it apart from other CSV
    formats by required columns."""

    read: Callable[..., Trace]
    extensions: tuple[str, ...]
    header: tuple[str, ...] = ()


# The one list of file formats (the prefix in `FORMAT:PATH`).
FORMATS: dict[str, TraceFormat] = {
    "azure": TraceFormat(azure.read_azure, (".csv",), tuple(azure.COLUMNS)),
    "burstgpt": TraceFormat(burstgpt.read_burstgpt, (".csv",), tuple(burstgpt.COLUMNS)),
    "mooncake": TraceFormat(read_mooncake, (".jsonl", ".json")),
}


def get_format(name: str) -> TraceFormat:
    try:
        return FORMATS[name]
    except KeyError:
        raise TraceError(f"unknown trace format {name!r}; valid formats: {', '.join(FORMATS)}") from None


def detect_format(path: Path) -> str:
    """The format of an unprefixed path: by extension, CSV formats by header."""
    candidates = [name for name, fmt in FORMATS.items() if path.suffix.lower() in fmt.extensions]
    if not candidates:
        raise TraceError(
            f"cannot tell the trace format from extension {path.suffix!r}; prefix the path with one of "
            f"{', '.join(f'{n}:' for n in FORMATS)}",
            str(path),
        )
    if len(candidates) == 1:
        return candidates[0]
    with open(path, newline="", encoding="utf-8") as f:
        header = {h.strip() for h in next(csv.reader(f), [])}
    matching = [n for n in candidates if set(FORMATS[n].header) <= header]
    if len(matching) != 1:
        raise TraceError(
            f"cannot tell the format from the header {sorted(header)}; prefix the path with one of "
            f"{', '.join(f'{n}:' for n in candidates)}",
            str(path),
            1,
        )
    return matching[0]


def read_file(path: str | Path, format_name: str | None = None, source: str | None = None) -> Trace:
    """Read a trace file in the named format (detected when None)."""
    path = Path(path)
    if not path.is_file():
        raise TraceError("no such trace file", str(path))
    name = format_name or detect_format(path)
    return get_format(name).read(path, source=source)
