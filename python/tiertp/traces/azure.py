"""Reader for the Azure LLM inference trace CSV (Splitwise, 2023/2024):
`TIMESTAMP,ContextTokens,GeneratedTokens`, TIMESTAMP a wall-clock string
such as `2023-11-16 18:15:46.6805900` (read as UTC) or a number of seconds."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

from tiertp.traces.errors import TraceError
from tiertp.traces.rows import RowSink, csv_rows, parse_int, parse_seconds
from tiertp.traces.trace import Trace, make_trace

COLUMNS = ["TIMESTAMP", "ContextTokens", "GeneratedTokens"]


def parse_timestamp(text: str, path: str, line: int) -> float:
    """Unix seconds of a TIMESTAMP cell; fractions beyond microseconds kept."""
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        pass
    base, _, frac = text.partition(".")
    try:
        stamp = datetime.fromisoformat(base).replace(tzinfo=timezone.utc).timestamp()
        if frac and not frac.isdigit():
            raise ValueError
        return stamp + (float("0." + frac) if frac else 0.0)
    except ValueError:
        raise TraceError(f"expected a timestamp like '2023-11-16 18:15:46.6805900', got {text!r}", path, line, "TIMESTAMP") from None


def read_azure(path: str | Path, source: str | None = None) -> Trace:
    """Read an Azure trace CSV; arrivals rebased to start at 0 (the wall-clock
    start kept in `start_epoch_s`). An optional `tier` column is honoured."""
    path = Path(path)
    shown = str(path)
    sink = RowSink()
    for line, row, tier_col in csv_rows(path, COLUMNS):
        stamp = parse_timestamp(row["TIMESTAMP"], shown, line)
        parse_seconds(stamp, shown, line, "TIMESTAMP")
        sink.add(
            stamp,
            parse_int(row["ContextTokens"], shown, line, "ContextTokens"),
            parse_int(row["GeneratedTokens"], shown, line, "GeneratedTokens"),
            row[tier_col] if tier_col else None,
            shown,
            line,
        )
    return make_trace(
        source or path.stem, sink.arrival, sink.prompt, sink.output, sink.tier, sink.tier_names,
        start_epoch_s=0.0, skipped=dict(sink.skipped), rebase=True,
    )
