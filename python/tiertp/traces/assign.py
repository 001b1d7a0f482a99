"""Tier assignment: by a mapping from trace name to tier name, or by
fractions (each request drawn independently, seeded). Both parse from the
CLI spelling `a=x,b=y`."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from tiertp.traces.errors import TraceError
from tiertp.traces.trace import Trace


def parse_pairs(spec: str, what: str) -> dict[str, str]:
    """`a=x,b=y` -> {"a": "x", "b": "y"}; each key once."""
    out: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        key, sep, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key or not value:
            raise TraceError(f"{what} {spec!r}: expected NAME=VALUE[,NAME=VALUE...], got {part!r}")
        if key in out:
            raise TraceError(f"{what} {spec!r}: {key!r} given twice")
        out[key] = value
    if not out:
        raise TraceError(f"{what} {spec!r}: empty")
    return out


def parse_fractions(spec: str) -> dict[str, float]:
    """`chat=0.7,agent=0.3` -> fractions; each >= 0, summing to 1 (within 1e-6)."""
    out = {}
    for name, value in parse_pairs(spec, "tier fractions").items():
        try:
            out[name] = float(value)
        except ValueError:
            raise TraceError(f"tier fractions {spec!r}: {name}={value!r} is not a number") from None
        if not (math.isfinite(out[name]) and out[name] >= 0):
            raise TraceError(f"tier fractions {spec!r}: {name}={value!r} must be >= 0")
    if abs(sum(out.values()) - 1) > 1e-6:
        raise TraceError(f"tier fractions {spec!r} sum to {sum(out.values()):g}, not 1")
    return out


def assign_by_map(trace: Trace, mapping: dict[str, str]) -> Trace:
    """Every request of `trace` gets tier mapping[trace.source]."""
    if trace.source not in mapping:
        raise TraceError(f"tier map has no entry for trace {trace.source!r}; it maps {sorted(mapping)}")
    return replace(trace, tier=np.zeros(len(trace), dtype=np.int64), tier_names=(mapping[trace.source],))


def assign_by_fractions(trace: Trace, fractions: dict[str, float], seed: int = 0) -> Trace:
    """Each request independently gets tier t with probability fractions[t]."""
    names = tuple(fractions)
    rng = np.random.default_rng(seed)
    probs = np.array([fractions[n] for n in names], dtype=np.float64)
    tier = rng.choice(len(names), size=len(trace), p=probs / probs.sum()).astype(np.int64)
    return replace(trace, tier=tier, tier_names=names)


def rename_tiers(trace: Trace, names: list[str]) -> Trace:
    """Re-index the trace's tiers into `names` (e.g. a TierSet's order);
    a tier name not in `names` fails listing the valid ones."""
    unknown = sorted(set(trace.tier_names) - set(names))
    if unknown:
        raise TraceError(f"trace {trace.source!r} uses tier(s) {unknown} not in the tier config; valid tiers: {names}")
    lookup = np.array([names.index(n) for n in trace.tier_names] + [-1], dtype=np.int64)
    return replace(trace, tier=lookup[trace.tier], tier_names=tuple(names))
