"""Time-window slicing: the requests arriving in [start_s, start_s + duration_s)."""

from __future__ import annotations

import math
from dataclasses import replace

from tiertp.traces.errors import TraceError
from tiertp.traces.trace import Trace


def time_window(trace: Trace, duration_s: float, start_s: float = 0.0) -> Trace:
    """Requests with start_s <= arrival < start_s + duration_s, rebased so the
    window starts at 0 (the first request arrives at its offset into the
    window, keeping the idle lead-in)."""
    if not (duration_s > 0 and start_s >= 0 and math.isfinite(start_s)):
        raise TraceError(f"window needs duration > 0 and start >= 0, got duration={duration_s}, start={start_s}")
    mask = (trace.arrival_s >= start_s) & (trace.arrival_s < start_s + duration_s)
    out = trace.take(mask)
    epoch = None if trace.start_epoch_s is None else trace.start_epoch_s + start_s
    return replace(out, arrival_s=out.arrival_s - start_s, start_epoch_s=epoch)
