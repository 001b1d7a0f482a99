"""Interpolation over measured kernel latencies.

Kernel latency against a size (m, n, k, sequence length, message size) is
flat while a kernel is launch- or latency-bound and a power law once it is
throughput-bound, so every interpolation here is linear in
(log size, log latency). Outside the measured range:
- below the smallest measured size: the smallest size's latency (a kernel
  does not get faster than its floor);
- above the largest: a rule per axis, stated where the axis is used
  (`PROPORTIONAL`, `affine`, `power`), each from how the kernel's cost
  grows (slopes read off the measurements), not a curve fit.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Callable, Sequence

# above(xs, ys, x) -> latency at x > xs[-1]
AboveRule = Callable[[Sequence[float], Sequence[float], float], float]


def PROPORTIONAL(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """Work linear in x beyond the largest measurement (GEMM m/n/k, batch,
    message size): as if the largest measured kernel ran x/x_max times."""
    return ys[-1] * x / xs[-1]


def affine(slope: float) -> AboveRule:
    """Continue from the last measurement as a straight line of `slope`
    (memory-bound decode attention: time = floor + bytes / bandwidth)."""

    def rule(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
        return ys[-1] + slope * (x - xs[-1])

    rule.__name__ = f"affine[{slope:g}]"
    return rule


def power(lo: float, hi: float) -> AboveRule:
    """Continue the last measured segment's log-log slope, clamped to
    [lo, hi] (prefill attention: cost grows as length^1 to length^2)."""

    def rule(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
        if len(xs) < 2:
            p = hi
        else:
            p = math.log(ys[-1] / ys[-2]) / math.log(xs[-1] / xs[-2])
            p = min(hi, max(lo, p))
        return ys[-1] * (x / xs[-1]) ** p

    rule.__name__ = f"power[{lo},{hi}]"
    return rule


def bracket(axis: Sequence[float], x: float) -> list[tuple[int, float]]:
    """Indices and weights (linear in log x) of the axis points around x.

    Clamped: below axis[0] gives [(0, 1.0)], above axis[-1] gives
    [(last, 1.0)] (the caller applies its above-range rule). Zero-weight
    neighbours are left out, so an exact hit needs only that point.
    """
    if x <= axis[0]:
        return [(0, 1.0)]
    if x >= axis[-1]:
        return [(len(axis) - 1, 1.0)]
    i = bisect_left(axis, x)
    if axis[i] == x:
        return [(i, 1.0)]
    lo, hi = axis[i - 1], axis[i]
    w = math.log(x / lo) / math.log(hi / lo)
    return [(i - 1, 1.0 - w), (i, w)]


def curve_at(xs: Sequence[float], ys: Sequence[float], x: float, above: AboveRule) -> float:
    """y(x) on one measured curve: log-log inside, floor below, `above` beyond."""
    if x > xs[-1]:
        return above(xs, ys, x)
    return blend([(ys[i], w) for i, w in bracket(xs, x)])


def blend(values_weights: Sequence[tuple[float, float]]) -> float:
    """Weighted mean in log space (weights sum to 1; values > 0)."""
    return math.exp(sum(w * math.log(v) for v, w in values_weights))
