"""The profile as served: the measured profile calibrated by the probes.

`tiertp profile` times the engine's forward passes alone. Served, a step
also carries the serving stack's work, and the host may be faster or slower
than when it was profiled. Two numbers, both measured on the running
server before the loads, correct for it:

- `scale` (the unloaded probe, `CellScale`): measured / predicted TTFT of
  a request running alone, median over tiers, multiplies the prefill cells;
  measured / predicted TPOT the decode cells. One factor from the TPOT for
  both made prefill 13% faster than served in a run whose probe decoded
  faster than profiled but prefilled as profiled (docs/fidelity.md).
- `decode_ms_per_extra_request` (the loaded probe): what a decode step
  costs per running request beyond the first, over the profile. The probe's
  waves are simulated at their real send times with each candidate value;
  the value whose simulated per-wave median TPOTs are closest to the
  measured ones (least squares of the log ratio) is taken.

On a host whose devices are its CPU cores, the stack's per-token work
(stepping, streaming, the client) competes with the ranks for the cores,
so the second number is large there; on a GPU host it is the scheduler's
per-request work. Either way it is a property of the deployment, which a
forward-pass profile cannot carry.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from tiertp.fidelity.probe import LoadedProbe
from tiertp.fidelity.sim_profile import CellScale
from tiertp.replay.live.records import COMPLETED
from tiertp.replay.runner import SimContext, run_once
from tiertp.replay.workload import Load
from tiertp.traces import make_trace

# Suffix of the calibrated prediction's name in the reports.
CALIBRATED = "-calibrated"
CALIBRATION_RULE = ("scale = median over tiers of the unloaded probe's measured / predicted TTFT for prefill cells, "
                    "TPOT for decode cells; "
                    "decode_ms_per_extra_request = the decode step's cost per running request beyond the first "
                    "that best reproduces the loaded probe's per-wave median TPOTs in the simulator")
# Candidate per-request costs: this many steps from 0 to the batch-1 decode step.
FIT_STEPS = 20


def calibration_scale(unloaded: dict) -> CellScale | None:
    """The unloaded probe's `scale` (above); None when it measured no TPOT
    (prefill takes the TPOT's factor when it measured no TTFT)."""

    def median(figure: str) -> float | None:
        ratios = [t["ratio"][figure] for t in unloaded["tiers"].values() if t["ratio"][figure]]
        return float(np.median(ratios)) if ratios else None

    decode = median("tpot_ms")
    if decode is None:
        return None
    return CellScale(prefill=median("ttft_ms") or decode, decode=decode)


@dataclass
class OverheadFit:
    decode_ms_per_extra_request: float
    at_bound: bool  # the best candidate was the largest tried
    waves: list[dict]  # per wave size: requests, completed, measured and simulated median TPOT

    def to_doc(self) -> dict:
        return {"decode_ms_per_extra_request": self.decode_ms_per_extra_request, "at_bound": self.at_bound,
                "waves": self.waves}


def _wave_medians(concurrency: list[int], tpot_ms) -> dict[int, float]:
    out = {}
    for size in sorted(set(concurrency)):
        vals = [t for c, t in zip(concurrency, tpot_ms) if c == size and math.isfinite(t)]
        if vals:
            out[size] = float(np.median(vals))
    return out


def fit_decode_overhead(probe: LoadedProbe, tier_names: list[str], ctx_with: Callable[[float], SimContext],
                        policy: str, largest_ms: float) -> OverheadFit | None:
    """The per-request decode cost (module doc) among FIT_STEPS + 1 values
    from 0 to `largest_ms`; `ctx_with(c)` is the simulator with an engine
    whose decode steps carry c. None when no wave completed a request live."""
    done = [r for r in probe.records if r.status == COMPLETED]
    measured = _wave_medians([probe.concurrency[r.index] for r in done], [r.tpot_ms for r in done])
    if not measured:
        return None
    sent = [r.sent_s for r in probe.records]
    trace = make_trace("loaded-probe", sent, [r.prompt_tokens for r in probe.records],
                       [r.max_tokens for r in probe.records], tier=[tier_names.index(r.tier) for r in probe.records],
                       tier_names=tier_names, rebase=True)
    # make_trace sorts by arrival (stably): the waves' sizes follow the same order.
    order = np.argsort(np.asarray(sent), kind="stable")
    sizes = [probe.concurrency[i] for i in order]

    def simulate(c: float) -> dict[int, float]:
        sim = run_once(ctx_with(c), Load(None, trace, 1.0), policy, {})
        return _wave_medians(sizes, sim.tpot_ms.tolist())

    def loss(sim: dict[int, float]) -> float:
        common = [s for s in measured if s in sim and sim[s] > 0 and measured[s] > 0]
        if not common:
            return math.inf
        return sum(math.log(sim[s] / measured[s]) ** 2 for s in common)

    candidates = [largest_ms * k / FIT_STEPS for k in range(FIT_STEPS + 1)]
    sims = [simulate(c) for c in candidates]
    best = min(range(len(candidates)), key=lambda k: loss(sims[k]))
    waves = [{"concurrency": s,
              "requests": sum(1 for c in probe.concurrency if c == s),
              "completed": sum(1 for r in done if probe.concurrency[r.index] == s),
              "measured_tpot_ms": measured.get(s),
              "scaled_tpot_ms": sims[0].get(s),
              "calibrated_tpot_ms": sims[best].get(s)} for s in sorted(set(probe.concurrency))]
    return OverheadFit(candidates[best], best == FIT_STEPS, waves)


def loaded_probe_table(fit: OverheadFit) -> str:
    lines = ["loaded probe (waves of requests sent together), median TPOT simulated with the scaled profile / "
             "calibrated / measured:"]
    for w in fit.waves:
        cells = "/".join("-" if w[k] is None else f"{w[k]:.1f}"
                         for k in ("scaled_tpot_ms", "calibrated_tpot_ms", "measured_tpot_ms"))
        lines.append(f"  {w['concurrency']:>3} at once ({w['completed']}/{w['requests']} completed): {cells} ms")
    lines.append(f"  decode step cost per running request beyond the first: {fit.decode_ms_per_extra_request:.2f} ms"
                 + (" (the largest value tried)" if fit.at_bound else ""))
    return "\n".join(lines)
