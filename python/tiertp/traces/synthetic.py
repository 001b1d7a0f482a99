"""Synthetic traces: renewal arrival processes with a given rate and
coefficient of variation (CV) of inter-arrival times, and length
distributions, all from one seeded generator."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tiertp.traces.errors import TraceError
from tiertp.traces.trace import Trace, make_trace

# The one list of arrival processes.
ARRIVALS = ("poisson", "gamma", "weibull")


@dataclass(frozen=True)
class LengthDist:
    """Token lengths: lognormal with this mean and CV (fixed at `mean` when
    cv == 0), rounded and clamped to [1, max_tokens]."""

    mean: float
    cv: float = 0.0
    max_tokens: int = 1 << 20

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if not (self.mean >= 1 and self.cv >= 0):
            raise TraceError(f"length distribution needs mean >= 1 and cv >= 0, got mean={self.mean}, cv={self.cv}")
        if self.cv == 0:
            values = np.full(n, self.mean)
        else:
            sigma2 = math.log1p(self.cv**2)
            values = rng.lognormal(math.log(self.mean) - sigma2 / 2, math.sqrt(sigma2), n)
        return np.clip(np.rint(values), 1, self.max_tokens).astype(np.int64)


def weibull_shape_for_cv(cv: float) -> float:
    """The Weibull shape k whose CV is `cv` (CV decreases monotonically in k)."""

    def cv_of(k: float) -> float:
        g1 = math.lgamma(1 + 1 / k)
        return math.sqrt(max(math.exp(math.lgamma(1 + 2 / k) - 2 * g1) - 1, 0.0))

    lo, hi = 0.05, 500.0
    if not cv_of(hi) <= cv <= cv_of(lo):
        raise TraceError(f"weibull arrivals support CV in [{cv_of(hi):.3g}, {cv_of(lo):.3g}], got {cv}")
    for _ in range(200):
        mid = math.sqrt(lo * hi)
        if cv_of(mid) > cv:
            lo = mid
        else:
            hi = mid
    return math.sqrt(lo * hi)


def inter_arrivals(process: str, rate: float, cv: float, n: int, rng: np.random.Generator) -> np.ndarray:
    """`n` inter-arrival gaps (s) with mean 1/rate and the given CV."""
    if not (rate > 0 and math.isfinite(rate)):
        raise TraceError(f"arrival rate must be a finite number > 0, got {rate}")
    if process == "poisson":
        if cv != 1:
            raise TraceError(f"poisson arrivals have CV 1, got cv={cv}; use gamma or weibull for other CVs")
        return rng.exponential(1 / rate, n)
    if not cv > 0:
        raise TraceError(f"{process} arrivals need cv > 0, got {cv}")
    if process == "gamma":
        shape = 1 / cv**2
        return rng.gamma(shape, 1 / (rate * shape), n)
    if process == "weibull":
        shape = weibull_shape_for_cv(cv)
        scale = 1 / (rate * math.exp(math.lgamma(1 + 1 / shape)))
        return scale * rng.weibull(shape, n)
    raise TraceError(f"unknown arrival process {process!r}; valid: {', '.join(ARRIVALS)}")


@dataclass(frozen=True)
class SyntheticSpec:
    """A synthetic trace: `process` arrivals at `rate` req/s with inter-arrival
    CV `cv`, over `duration_s` seconds (first arrival at 0), prompt and output
    lengths from their distributions; identical specs give identical traces."""

    process: str = "poisson"
    rate: float = 1.0
    cv: float = 1.0
    duration_s: float = 60.0
    prompt: LengthDist = LengthDist(1024)
    output: LengthDist = LengthDist(128)
    seed: int = 0

    def name(self) -> str:
        return f"synthetic-{self.process}-{self.rate:g}rps"


def generate(spec: SyntheticSpec) -> Trace:
    """Generate the trace `spec` describes."""
    if spec.process not in ARRIVALS:
        raise TraceError(f"unknown arrival process {spec.process!r}; valid: {', '.join(ARRIVALS)}")
    if not spec.duration_s > 0:
        raise TraceError(f"duration must be > 0 s, got {spec.duration_s}")
    rng = np.random.default_rng(spec.seed)
    times: list[np.ndarray] = []
    elapsed = 0.0
    chunk = max(16, int(spec.rate * spec.duration_s * 1.2) + 16)
    while elapsed < spec.duration_s:
        gaps = inter_arrivals(spec.process, spec.rate, spec.cv, chunk, rng)
        block = elapsed + np.concatenate([[0.0], np.cumsum(gaps[:-1])])
        times.append(block[block < spec.duration_s])
        elapsed = float(block[-1] + gaps[-1])
    arrival = np.concatenate(times)
    n = arrival.size
    return make_trace(spec.name(), arrival, spec.prompt.sample(rng, n), spec.output.sample(rng, n))
