"""Reader for Mooncake JSONL traces: one object per line with `timestamp`
(milliseconds), `input_length`, `output_length` and `hash_ids` (prefix-cache
block ids; not modelled by the simulator, so not kept)."""

from __future__ import annotations

import json
from pathlib import Path

from tiertp.traces.errors import TraceError
from tiertp.traces.rows import TIER_FIELD, RowSink, parse_int, parse_seconds
from tiertp.traces.trace import Trace, make_trace

KEYS = ["timestamp", "input_length", "output_length"]


def read_mooncake(path: str | Path, source: str | None = None) -> Trace:
    """Read a Mooncake JSONL file; arrivals rebased to start at 0. An optional
    `tier` key is honoured."""
    path = Path(path)
    shown = str(path)
    sink = RowSink()
    with open(path, encoding="utf-8") as f:
        for line, text in enumerate(f, start=1):
            if not text.strip():
                continue
            try:
                row = json.loads(text)
            except json.JSONDecodeError as e:
                raise TraceError(f"not valid JSON ({e.msg} at column {e.colno})", shown, line) from None
            if not isinstance(row, dict):
                raise TraceError(f"expected a JSON object, got {type(row).__name__}", shown, line)
            missing = [k for k in KEYS if k not in row]
            if missing:
                raise TraceError(f"missing key(s) {missing}", shown, line)
            tier = next((v for k, v in row.items() if k.lower() == TIER_FIELD), None)
            if tier is not None and not isinstance(tier, str):
                raise TraceError(f"expected a tier name, got {tier!r}", shown, line, TIER_FIELD)
            sink.add(
                parse_seconds(row["timestamp"], shown, line, "timestamp", scale=1e-3),
                parse_int(row["input_length"], shown, line, "input_length"),
                parse_int(row["output_length"], shown, line, "output_length"),
                tier,
                shown,
                line,
            )
    return make_trace(source or path.stem, sink.arrival, sink.prompt, sink.output, sink.tier, sink.tier_names,
                      skipped=dict(sink.skipped), rebase=True)
