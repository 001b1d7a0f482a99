"""Row-level helpers shared by the readers: typed fields with file/line
errors, the optional tier column, and counts of rows left out on purpose."""

from __future__ import annotations

import csv
import math
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from tiertp.traces.errors import TraceError

# The optional per-request tier column/key, matched case-insensitively.
TIER_FIELD = "tier"

# Rows left out on purpose, counted in Trace.skipped (not errors: the request
# carries no work a serving system would do).
SKIP_ZERO_PROMPT = "zero prompt tokens"
SKIP_ZERO_OUTPUT = "zero output tokens"


def parse_int(value, path: str, line: int, field: str) -> int:
    """A non-negative integer field (JSON ints, or decimal text like "12")."""
    if isinstance(value, bool):
        raise TraceError(f"expected a non-negative integer, got {value!r}", path, line, field)
    if isinstance(value, int):
        number = value
    elif isinstance(value, float) and value.is_integer():
        number = int(value)
    else:
        try:
            number = int(str(value).strip())
        except ValueError:
            raise TraceError(f"expected a non-negative integer, got {value!r}", path, line, field) from None
    if number < 0:
        raise TraceError(f"expected a non-negative integer, got {value!r}", path, line, field)
    return number


def parse_seconds(value, path: str, line: int, field: str, scale: float = 1.0) -> float:
    """A finite, non-negative time given as a number (times `scale` to get seconds)."""
    try:
        number = float(value) * scale
    except (TypeError, ValueError):
        raise TraceError(f"expected a number, got {value!r}", path, line, field) from None
    if not math.isfinite(number) or number < 0:
        raise TraceError(f"expected a finite number >= 0, got {value!r}", path, line, field)
    return number


class RowSink:
    """Collects parsed requests; keeps the tier names in first-seen order and
    counts rows left out on purpose (zero-token requests)."""

    def __init__(self) -> None:
        self.arrival: list[float] = []
        self.prompt: list[int] = []
        self.output: list[int] = []
        self.tier: list[int] = []
        self.tier_names: list[str] = []
        self.skipped: Counter = Counter()
        self._tier_ids: dict[str, int] = {}

    def add(self, arrival_s: float, prompt: int, output: int, tier: str | None, path: str, line: int) -> None:
        if tier is not None:
            tier = tier.strip()
            if not tier:
                raise TraceError("empty tier name (the tier column, when present, names every row's tier)", path, line, TIER_FIELD)
        if prompt == 0:
            self.skipped[SKIP_ZERO_PROMPT] += 1
            return
        if output == 0:
            self.skipped[SKIP_ZERO_OUTPUT] += 1
            return
        self.arrival.append(arrival_s)
        self.prompt.append(prompt)
        self.output.append(output)
        if tier is None:
            self.tier.append(-1)
        else:
            self.tier.append(self._tier_ids.setdefault(tier, len(self._tier_ids)))
            if len(self._tier_ids) > len(self.tier_names):
                self.tier_names.append(tier)


def csv_rows(path: Path, required: list[str]) -> Iterator[tuple[int, dict[str, str], str | None]]:
    """(line number, row by column name, tier column name or None) per data row.

    Checks the header has `required` columns; a row with the wrong number of
    fields is a TraceError naming its line.
    """
    shown = str(path)
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        try:
            header = [h.strip() for h in next(reader)]
        except StopIteration:
            raise TraceError("empty file (expected a header line)", shown, 1) from None
        missing = [c for c in required if c not in header]
        if missing:
            raise TraceError(f"header lacks column(s) {missing}; it has {header}", shown, 1)
        tier_col = next((h for h in header if h.lower() == TIER_FIELD), None)
        for fields in reader:
            line = reader.line_num
            if not fields or (len(fields) == 1 and not fields[0].strip()):
                continue  # blank line
            if len(fields) != len(header):
                raise TraceError(f"expected {len(header)} fields ({','.join(header)}), got {len(fields)}", shown, line)
            yield line, dict(zip(header, fields)), tier_col
