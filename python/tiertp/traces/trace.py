"""The in-memory trace: one request per index, numpy arrays sorted by arrival."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from tiertp.traces.errors import TraceError

# Tier index of a request no rule has assigned a tier yet.
UNASSIGNED = -1


@dataclass(frozen=True)
class Trace:
    """A request trace.

    Contract (checked by `validate`, which every constructor in this package
    calls):
    - `arrival_s`, `prompt_tokens`, `output_tokens`, `tier` have one entry per
      request and equal length; `arrival_s` is float64, non-decreasing, >= 0,
      and starts at 0 for traces read from files.
    - `prompt_tokens` >= 1 and `output_tokens` >= 1 (int64).
    - `tier` (int64) indexes `tier_names`, or is UNASSIGNED (-1).
    - `start_epoch_s`: wall-clock time (Unix seconds) of arrival 0 when the
      source has one (Azure), so traces of one recording merge on a common
      clock; None otherwise.
    - `skipped`: rows the reader left out on purpose, reason -> count (never
      malformed rows: those raise TraceError).
    """

    source: str
    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    tier: np.ndarray
    tier_names: tuple[str, ...] = ()
    start_epoch_s: float | None = None
    skipped: dict[str, int] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.arrival_s.shape[0])

    @property
    def span_s(self) -> float:
        """Time from the first to the last arrival."""
        return float(self.arrival_s[-1] - self.arrival_s[0]) if len(self) else 0.0

    @property
    def mean_rps(self) -> float:
        """Mean arrival rate: (n - 1) gaps over the span."""
        if len(self) < 2 or self.span_s <= 0:
            raise TraceError(f"trace {self.source!r} has fewer than two distinct arrival times; its rate is undefined")
        return (len(self) - 1) / self.span_s

    @property
    def has_tiers(self) -> bool:
        """Every request has a tier."""
        return bool(len(self)) and bool(np.all(self.tier >= 0))

    def tier_of(self) -> list[str | None]:
        """Per request tier name (None when unassigned)."""
        return [self.tier_names[t] if t >= 0 else None for t in self.tier.tolist()]

    def take(self, index: np.ndarray) -> Trace:
        """The requests at `index` (a boolean mask or sorted indices)."""
        return replace(
            self,
            arrival_s=self.arrival_s[index],
            prompt_tokens=self.prompt_tokens[index],
            output_tokens=self.output_tokens[index],
            tier=self.tier[index],
        )

    def summary(self) -> dict:
        """A small JSON-able description (for reports and logs)."""
        out = {"source": self.source, "requests": len(self), "span_s": round(self.span_s, 3)}
        if len(self) >= 2 and self.span_s > 0:
            out["mean_rps"] = round(self.mean_rps, 4)
        if len(self):
            out["prompt_tokens_mean"] = round(float(self.prompt_tokens.mean()), 1)
            out["output_tokens_mean"] = round(float(self.output_tokens.mean()), 1)
        if self.tier_names:
            out["per_tier"] = {n: int((self.tier == i).sum()) for i, n in enumerate(self.tier_names)}
        if self.skipped:
            out["skipped"] = dict(self.skipped)
        return out


def make_trace(
    source: str,
    arrival_s,
    prompt_tokens,
    output_tokens,
    tier=None,
    tier_names: tuple[str, ...] | list[str] = (),
    start_epoch_s: float | None = None,
    skipped: dict[str, int] | None = None,
    rebase: bool = False,
) -> Trace:
    """Build a validated Trace, stably sorted by arrival.

    `rebase` shifts arrivals so the first is at 0 (and moves `start_epoch_s`
    with it).
    """
    arrival = np.asarray(arrival_s, dtype=np.float64)
    prompt = np.asarray(prompt_tokens, dtype=np.int64)
    output = np.asarray(output_tokens, dtype=np.int64)
    tiers = np.full(arrival.shape, UNASSIGNED, dtype=np.int64) if tier is None else np.asarray(tier, dtype=np.int64)
    order = np.argsort(arrival, kind="stable")
    arrival, prompt, output, tiers = arrival[order], prompt[order], output[order], tiers[order]
    if rebase and arrival.size:
        first = float(arrival[0])
        arrival = arrival - first
        if start_epoch_s is not None:
            start_epoch_s = start_epoch_s + first
    trace = Trace(source, arrival, prompt, output, tiers, tuple(tier_names), start_epoch_s, dict(skipped or {}))
    validate(trace)
    return trace


def validate(trace: Trace) -> None:
    """Raise TraceError unless `trace` meets the Trace contract."""
    n = trace.arrival_s.shape[0]
    for name in ("prompt_tokens", "output_tokens", "tier"):
        if getattr(trace, name).shape != (n,):
            raise TraceError(f"trace {trace.source!r}: `{name}` has shape {getattr(trace, name).shape}, expected ({n},)")
    if n == 0:
        return
    if not np.all(np.isfinite(trace.arrival_s)) or trace.arrival_s[0] < 0:
        raise TraceError(f"trace {trace.source!r}: arrival times must be finite and >= 0")
    if np.any(np.diff(trace.arrival_s) < 0):
        raise TraceError(f"trace {trace.source!r}: arrival times are not sorted")
    for name in ("prompt_tokens", "output_tokens"):
        bad = np.flatnonzero(getattr(trace, name) < 1)
        if bad.size:
            raise TraceError(f"trace {trace.source!r}: request {int(bad[0])} has `{name}` < 1")
    bad = np.flatnonzero((trace.tier < UNASSIGNED) | (trace.tier >= len(trace.tier_names)))
    if bad.size:
        raise TraceError(
            f"trace {trace.source!r}: request {int(bad[0])} has tier index {int(trace.tier[bad[0]])}, "
            f"outside tier names {list(trace.tier_names)}"
        )
