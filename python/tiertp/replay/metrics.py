"""Per-run figures: goodput, per-tier SLO attainment, latency percentiles."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

# The fairness rule (see `fair`), owned by the planner that plans for it:
# tiers below this share of the requests are exempt; the others need at
# least this fraction of their proportional goodput.
from tiertp._scheduler import FAIR_MIN_GOODPUT_FRACTION, FAIR_MIN_REQUEST_SHARE

PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class TierSlo:
    """A tier's SLOs (None for a background tier: completing is enough)."""

    name: str
    ttft_ms: float | None
    tpot_ms: float | None

    @staticmethod
    def from_tierset(tiers) -> list[TierSlo]:
        return [TierSlo(t["name"], t["ttft_ms"], t["tpot_ms"]) for t in tiers.to_list()]


@dataclass(frozen=True)
class TierMetrics:
    """One tier in one run. `met`: requests completed within both SLOs (a
    background tier: completed); `attainment` = met / requests (None when the
    tier had no requests); percentiles over completed requests (None when
    none completed); TPOT over requests with more than one output token;
    `rejected_by`: the rejected requests by why (`rejected_reasons`)."""

    tier: str
    requests: int
    completed: int
    rejected: int
    met: int
    attainment: float | None
    goodput_rps: float
    ttft_ms: dict[str, float | None]
    tpot_ms: dict[str, float | None]
    rejected_by: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class RunMetrics:
    """One run (policy, settings, load). goodput_rps = met / window_s: SLO-
    meeting requests per second of offered-load window."""

    requests: int
    completed: int
    rejected: int
    met: int
    attainment: float
    goodput_rps: float
    offered_rps: float
    window_s: float
    tiers: list[TierMetrics]
    rejected_by: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def fair(self) -> bool:
        """`fair` over this run's tiers."""
        return fair([t.requests for t in self.tiers], [t.goodput_rps for t in self.tiers])


def fair(requests: Sequence[int], goodput_rps: Sequence[float]) -> bool:
    """Whether a run's goodput is shared fairly among its tiers (one entry
    per tier in both lists).

    A high total goodput can hide a starved tier (e.g. a scheduler that
    serves only the cheap tier), so reports flag it. The rule: every tier
    with at least FAIR_MIN_REQUEST_SHARE (10%) of the requests gets at least
    FAIR_MIN_GOODPUT_FRACTION (0.25x) of its proportional share of the
    goodput, where share = tier requests / all requests and proportional
    goodput = share x total goodput. Smaller tiers are exempt (too few
    requests to judge); a run with no goodput at all is trivially fair (it
    is judged by its goodput, not by this flag)."""
    total_requests = sum(requests)
    total_goodput = sum(goodput_rps)
    if total_requests == 0:
        return True
    for n, g in zip(requests, goodput_rps, strict=True):
        share = n / total_requests
        # the tolerance keeps a tier exactly at its bound fair despite rounding
        if share >= FAIR_MIN_REQUEST_SHARE and g < FAIR_MIN_GOODPUT_FRACTION * share * total_goodput - 1e-12:
            return False
    return True


def percentiles(values: np.ndarray) -> dict[str, float | None]:
    values = values[np.isfinite(values)]
    if values.size == 0:
        return {f"p{p}": None for p in PERCENTILES}
    return {f"p{p}": float(v) for p, v in zip(PERCENTILES, np.percentile(values, PERCENTILES))}


def slo_met(slos: list[TierSlo], tier: np.ndarray, completed: np.ndarray, ttft: np.ndarray, tpot: np.ndarray,
            output_tokens: np.ndarray) -> np.ndarray:
    """Per request: completed within its tier's TTFT and TPOT SLOs (a
    one-token request has no TPOT to miss; background: completed)."""
    ttft_slo = np.array([s.ttft_ms if s.ttft_ms is not None else np.inf for s in slos])[tier]
    tpot_slo = np.array([s.tpot_ms if s.tpot_ms is not None else np.inf for s in slos])[tier]
    with np.errstate(invalid="ignore"):
        tpot_ok = (output_tokens <= 1) | (tpot <= tpot_slo) | np.isinf(tpot_slo)
        return completed & (ttft <= ttft_slo) & tpot_ok


# A rejected request whose result does not say why.
UNKNOWN_REASON = "unknown"


def rejected_reasons(result: dict, completed: np.ndarray) -> np.ndarray:
    """Per request, why it was rejected (None where it completed): the
    result's `rejected_why` (the simulator's shed reasons, as the gateway
    names them, or its other causes; a live run's failure labels), else
    UNKNOWN_REASON."""
    why = result.get("rejected_why")
    if why is None:
        why = [None] * len(completed)
    return np.array([None if done else (w or UNKNOWN_REASON) for w, done in zip(why, completed, strict=True)],
                    dtype=object)


def _count(reasons: np.ndarray) -> dict[str, int]:
    return dict(sorted(Counter(r for r in reasons if r is not None).items()))


def compute_metrics(result: dict, tier: np.ndarray, output_tokens: np.ndarray, slos: list[TierSlo],
                    window_s: float) -> RunMetrics:
    """The figures of one conserved simulator result (see conservation.py)."""
    completed = np.asarray(result["status"], dtype=object) == "completed"
    ttft = np.asarray(result["ttft_ms"], dtype=np.float64)
    tpot = np.asarray(result["tpot_ms"], dtype=np.float64)
    met = slo_met(slos, tier, completed, ttft, tpot, output_tokens)
    why = rejected_reasons(result, completed)
    tiers = []
    for i, slo in enumerate(slos):
        mine = tier == i
        n = int(mine.sum())
        done = mine & completed
        tiers.append(TierMetrics(
            tier=slo.name,
            requests=n,
            completed=int(done.sum()),
            rejected=int((mine & ~completed).sum()),
            met=int((mine & met).sum()),
            attainment=float((mine & met).sum() / n) if n else None,
            goodput_rps=float((mine & met).sum() / window_s),
            ttft_ms=percentiles(ttft[done]),
            tpot_ms=percentiles(tpot[done & (output_tokens > 1)]),
            rejected_by=_count(why[mine]),
        ))
    n = len(tier)
    return RunMetrics(
        requests=n,
        completed=int(completed.sum()),
        rejected=int(n - completed.sum()),
        met=int(met.sum()),
        attainment=float(met.sum() / n) if n else 0.0,
        goodput_rps=float(met.sum() / window_s),
        offered_rps=n / window_s,
        window_s=window_s,
        tiers=tiers,
        rejected_by=_count(why),
    )
