"""Reader for the BurstGPT trace CSV:
`Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type`,
Timestamp in seconds from the start of the recording. Rows with zero
response tokens (failed requests in BurstGPT) are left out and counted."""

from __future__ import annotations

from pathlib import Path

from tiertp.traces.rows import RowSink, csv_rows, parse_int, parse_seconds
from tiertp.traces.trace import Trace, make_trace

COLUMNS = ["Timestamp", "Model", "Request tokens", "Response tokens", "Total tokens", "Log Type"]


def read_burstgpt(path: str | Path, source: str | None = None) -> Trace:
    """Read a BurstGPT CSV; arrivals rebased to start at 0. An optional
    `tier` column is honoured."""
    path = Path(path)
    shown = str(path)
    sink = RowSink()
    for line, row, tier_col in csv_rows(path, COLUMNS):
        sink.add(
            parse_seconds(row["Timestamp"], shown, line, "Timestamp"),
            parse_int(row["Request tokens"], shown, line, "Request tokens"),
            parse_int(row["Response tokens"], shown, line, "Response tokens"),
            row[tier_col] if tier_col else None,
            shown,
            line,
        )
    return make_trace(source or path.stem, sink.arrival, sink.prompt, sink.output, sink.tier, sink.tier_names,
                      skipped=dict(sink.skipped), rebase=True)
