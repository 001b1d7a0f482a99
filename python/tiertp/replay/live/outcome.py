"""A live run as a replay RunOutcome: the same conservation check and the
same metrics as a simulated run, so reports, tables and plots treat both
alike."""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tiertp.replay.conservation import check_conservation
from tiertp.replay.live.records import RequestRecord, summarize, to_sim_result
from tiertp.replay.live.run import LiveRun
from tiertp.replay.metrics import TierSlo, compute_metrics
from tiertp.replay.sim_run import RunOutcome
from tiertp.replay.workload import Load

# The policy name a live run is reported under.
LIVE = "live"


@dataclass
class LiveOutcome(RunOutcome):
    """A RunOutcome measured on a server. `live` (in the report under the
    policy's entry) holds the failures by reason, early stops, send lag and
    anything else the caller adds (e.g. the length caps); `records` the
    per-request records."""

    live: dict = field(default_factory=dict)
    records: list[RequestRecord] = field(default_factory=list)

    def summary(self) -> dict:
        return {**super().summary(), "live": self.live}


def live_outcome(run: LiveRun, load: Load, slos: list[TierSlo], extra: dict | None = None) -> LiveOutcome:
    """Check that every request is accounted for (ConservationError if not)
    and reduce the run to the replay metrics. Failed requests count as
    missed (`rejected` in the report's columns)."""
    result = to_sim_result(run.records)
    t = load.trace
    check_conservation(result, t.arrival_s, result["output_tokens"], f"live run at {load.offered_rps:.2f} req/s")
    metrics = compute_metrics(result, t.tier, result["output_tokens"], slos, load.window_s)
    return LiveOutcome(
        policy=LIVE,
        settings={},
        metrics=metrics,
        ttft_ms=np.asarray(result["ttft_ms"], dtype=np.float64),
        tpot_ms=np.asarray(result["tpot_ms"], dtype=np.float64),
        timeline=run.timeline,
        sim_end_s=run.end_s,
        # TP switches and migrations are not observable from the client; the
        # gateway's plan changes are reported under `live`.
        switches=0,
        migrated_requests=0,
        wall_s=run.wall_s,
        live={**summarize(run.records), "gateway_plan_changes": run.plan_changes, "interrupted": run.interrupted,
              **(extra or {})},
        records=run.records,
    )


def write_requests_csv(path: Path, records: list[RequestRecord]) -> None:
    """One row per request: times, lengths, latencies, outcome and reason."""
    rows = [r.to_row() for r in records]
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["index"])
        writer.writeheader()
        writer.writerows(rows)
