"""One simulator run: a policy with one setting on one load, checked for
conservation and reduced to its metrics."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from tiertp._scheduler import DEFAULT_GPUS_PER_NODE, DEFAULT_WINDOW_S
from tiertp.replay.conservation import check_conservation
from tiertp.replay.metrics import RunMetrics, TierSlo, compute_metrics
from tiertp.replay.policies import label
from tiertp.replay.workload import Load


@dataclass(frozen=True)
class SimContext:
    """What every run of a replay shares: the simulator entry point (the
    signature of tiertp._scheduler.simulate), profile, tiers, cluster and
    mechanism parameters (None = the simulator's default). The simulator is
    deterministic; `seed` is recorded with the run (it seeds the workload:
    synthetic traces, tier fractions). `engine_profile`: what the engine's
    iterations take when the policies plan with a `profile` that is not the
    engine (None: `profile`). `ttft_offset_ms`: a latency to each first
    token that no device spends (a live serving path's, calibrated by
    `tiertp fidelity`), added to every simulated TTFT before the metrics."""

    simulate: Callable[..., dict]
    profile: object
    tiers: object
    gpus: int
    gpus_per_node: int = DEFAULT_GPUS_PER_NODE
    window_s: float = DEFAULT_WINDOW_S
    switch_ms: float | None = None
    kv_gbps: float | None = None
    seed: int = 0
    engine_profile: object | None = None
    ttft_offset_ms: float = 0.0

    @property
    def slos(self) -> list[TierSlo]:
        return TierSlo.from_tierset(self.tiers)


@dataclass
class RunOutcome:
    """One run's figures and what the plots need of its raw result
    (per-request latencies, the cluster configuration timeline)."""

    policy: str
    settings: dict
    metrics: RunMetrics
    ttft_ms: np.ndarray
    tpot_ms: np.ndarray
    timeline: list[dict]
    sim_end_s: float
    switches: int
    migrated_requests: int
    wall_s: float

    def summary(self) -> dict:
        """JSON-able, without the per-request arrays."""
        return {
            "policy": self.policy,
            "settings": dict(self.settings),
            "settings_label": label(self.settings),
            **self.metrics.to_dict(),
            "sim_end_s": self.sim_end_s,
            "switches": self.switches,
            "migrated_requests": self.migrated_requests,
            "wall_s": self.wall_s,
            "timeline": self.timeline,
        }


def run_once(ctx: SimContext, load: Load, policy: str, settings: dict,
             progress: Callable[[float], None] | None = None) -> RunOutcome:
    """Simulate `policy` with `settings` (keywords of simulate: tp,
    prefill_share) on `load`; ConservationError when requests go missing."""
    t = load.trace
    engine = {} if ctx.engine_profile is None else {"engine_profile": ctx.engine_profile}
    result = ctx.simulate(
        ctx.profile, ctx.tiers,
        t.arrival_s.tolist(), t.tier.tolist(), t.prompt_tokens.tolist(), t.output_tokens.tolist(),
        ctx.gpus, policy,
        gpus_per_node=ctx.gpus_per_node, window_s=ctx.window_s, switch_ms=ctx.switch_ms, kv_gbps=ctx.kv_gbps,
        progress=progress, **engine, **settings,
    )
    what = f"policy {policy} ({label(settings)}) at {load.offered_rps:.2f} req/s"
    check_conservation(result, t.arrival_s, t.output_tokens, what)
    if ctx.ttft_offset_ms:
        result = {**result, "ttft_ms": np.asarray(result["ttft_ms"], dtype=np.float64) + ctx.ttft_offset_ms}
    metrics = compute_metrics(result, t.tier, t.output_tokens, ctx.slos, load.window_s)
    return RunOutcome(
        policy=policy,
        settings=dict(settings),
        metrics=metrics,
        ttft_ms=np.asarray(result["ttft_ms"], dtype=np.float64),
        tpot_ms=np.asarray(result["tpot_ms"], dtype=np.float64),
        timeline=list(result.get("timeline", [])),
        sim_end_s=float(result.get("sim_end_s", float("nan"))),
        switches=int(result.get("switches", 0)),
        migrated_requests=int(result.get("migrated_requests", 0)),
        wall_s=float(result.get("wall_s", float("nan"))),
    )
