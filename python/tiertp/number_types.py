"""argparse types for the numeric options the commands share: a value
outside its range is a usage error naming the option, before anything runs,
instead of a failure deep in the planner or simulator."""

from __future__ import annotations

import argparse
import math


def _number(text: str, kind: type, what: str, ok) -> float | int:
    try:
        value = kind(text)
    except ValueError:
        value = None
    if value is None or not math.isfinite(value) or not ok(value):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    return _number(text, int, "a whole number >= 1", lambda v: v >= 1)


def positive_float(text: str) -> float:
    return _number(text, float, "a number > 0", lambda v: v > 0)


def non_negative_float(text: str) -> float:
    return _number(text, float, "a number >= 0", lambda v: v >= 0)


def positive_floats(spec: str) -> list[float]:
    """Comma-separated numbers, each > 0."""
    try:
        values = [float(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {spec!r}") from None
    if not values or any(not (math.isfinite(v) and v > 0) for v in values):
        raise argparse.ArgumentTypeError(f"expected numbers > 0, got {spec!r}")
    return values
