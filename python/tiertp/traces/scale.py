"""Rate scaling: stretch or compress inter-arrival times to a target mean
rate, keeping the shape of the arrival process (burstiness, diurnal pattern)."""

from __future__ import annotations

import math
from dataclasses import replace

from tiertp.traces.errors import TraceError
from tiertp.traces.trace import Trace


def scale_to_rps(trace: Trace, target_rps: float) -> Trace:
    """The trace with every arrival time multiplied by mean_rps / target_rps,
    so its mean rate ((n-1) gaps over the span) becomes `target_rps`.
    `start_epoch_s` is dropped: the scaled trace no longer runs on wall-clock time."""
    if not (math.isfinite(target_rps) and target_rps > 0):
        raise TraceError(f"target rate must be a finite number > 0 req/s, got {target_rps}")
    factor = trace.mean_rps / target_rps
    return replace(trace, arrival_s=trace.arrival_s * factor, start_epoch_s=None)


def scale_window_to_rps(trace: Trace, target_rps: float, duration_s: float) -> Trace:
    """The trace scaled so that its first `duration_s` seconds offer
    `target_rps` on average: the first round(target_rps * duration_s)
    requests arrive inside [0, duration_s) and the next one does not. When
    the trace has no more requests than that, it is scaled to `target_rps`
    over its whole span (scale_to_rps) and the window is not filled."""
    if not (math.isfinite(duration_s) and duration_s > 0):
        raise TraceError(f"window must be a finite number of seconds > 0, got {duration_s}")
    want = round(target_rps * duration_s)
    if want >= len(trace):
        return scale_to_rps(trace, target_rps)
    if want < 1:
        raise TraceError(f"{target_rps} req/s over {duration_s} s is less than one request")
    last_in, first_out = float(trace.arrival_s[want - 1]), float(trace.arrival_s[want])
    edge = (last_in + first_out) / 2 if first_out > last_in else first_out
    if edge <= 0:
        raise TraceError(f"trace {trace.source!r}: its first {want + 1} requests arrive at once; cannot scale")
    return replace(trace, arrival_s=trace.arrival_s * (duration_s / edge), start_epoch_s=None)
