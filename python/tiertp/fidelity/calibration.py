"""The profile as served: the measured profile calibrated by the probes.

`tiertp profile` times the engine's forward passes alone. Served, a step
also carries the serving stack's work, and the host may be faster or slower
than when it was profiled. Two numbers, both measured on the running
server before the loads, correct for it:

- `scale` (the unloaded probe, `CellScale`): measured / predicted TPOT of
  a request running alone, median over tiers and prompt lengths,
  multiplies the decode cells.
  For prefill, the probe's TTFTs at each tier's two prompt lengths are fitted as
  measured = factor x predicted + offset (least squares, offset >= 0): the
  factor multiplies the prefill cells, and the offset, the serving path's
  own latency to a first token (client, gateway, agent and execution
  process, then the token back), is added to each simulated TTFT
  (`SimContext.ttft_offset_ms`), not to device time. At one length the
  factor is the median measured / predicted TTFT and the offset 0. One
  factor from the TPOT for both made prefill 13% faster than served in a
  run whose probe decoded faster than profiled but prefilled as profiled;
  a factor from one 174-token prompt's TTFT made a TP2 prefill of 950
  tokens 1.56x slower than served, because most of that prompt's excess
  was the fixed latency (docs/fidelity.md).
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

from tiertp.fidelity.probe import LoadedProbe, probe_blocks
from tiertp.fidelity.sim_profile import CellScale
from tiertp.replay.live.records import COMPLETED
from tiertp.replay.sim_run import SimContext, run_once
from tiertp.replay.workload import Load
from tiertp.traces import make_trace

# Suffix of the calibrated prediction's name in the reports.
CALIBRATED = "-calibrated"
CALIBRATION_RULE = ("decode scale = median over tiers and prompt lengths of the unloaded probe's measured / "
                    "predicted TPOT; "
                    "prefill scale and TTFT offset = measured = scale x predicted + offset (offset >= 0) fitted to "
                    "the probe's TTFTs at each tier's two prompt lengths (one length: the median TTFT ratio, offset 0); "
                    "decode_ms_per_extra_request = the decode step's cost per running request beyond the first "
                    "that best reproduces the loaded probe's per-wave median TPOTs in the simulator")
# Candidate per-request costs: this many steps from 0 to the batch-1 decode step.
FIT_STEPS = 20


def _median_ratio(unloaded: dict, figure: str) -> float | None:
    ratios = [t["ratio"][figure] for block in probe_blocks(unloaded) for t in block.values() if t["ratio"][figure]]
    return float(np.median(ratios)) if ratios else None


def prefill_fit(unloaded: dict) -> tuple[float, float] | None:
    """(factor, offset_ms) with measured TTFT = factor x predicted + offset
    over the probe's requests (module doc); None where the probe measured
    TTFTs at fewer than two predicted values, or the fit has no positive
    factor."""
    points = [(t["predicted"]["ttft_ms"], t["measured"]["ttft_ms"]) for block in probe_blocks(unloaded)
              for t in block.values() if t["measured"]["ttft_ms"] and t["predicted"]["ttft_ms"] > 0]
    predicted = np.array([p for p, _ in points], dtype=np.float64)
    measured = np.array([m for _, m in points], dtype=np.float64)
    if len(points) < 2 or np.ptp(predicted) < 1e-9 * predicted.max():
        return None
    factor, offset = np.polyfit(predicted, measured, 1)
    if offset < 0:  # no latency below the forward pass: the best line through the origin
        factor, offset = float(predicted @ measured / (predicted @ predicted)), 0.0
    return (float(factor), float(offset)) if factor > 0 else None


def calibration_scale(unloaded: dict) -> CellScale | None:
    """The unloaded probe's `scale` (above); None when it measured no TPOT
    (prefill takes the TPOT's factor when it measured no TTFT)."""
    decode = _median_ratio(unloaded, "tpot_ms")
    if decode is None:
        return None
    fit = prefill_fit(unloaded)
    prefill = fit[0] if fit else _median_ratio(unloaded, "ttft_ms")
    return CellScale(prefill=prefill or decode, decode=decode)


def ttft_offset_ms(unloaded: dict) -> float:
    """The serving path's latency to a first token (above); 0 without a
    two-length fit."""
    fit = prefill_fit(unloaded)
    return fit[1] if fit else 0.0


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
