"""Request conservation: every replayed request is reported completed or
rejected, exactly once, with latencies consistent with its status."""

from __future__ import annotations

import numpy as np

STATUSES = ("completed", "rejected")
PER_REQUEST = ("ttft_ms", "tpot_ms", "finish_s", "status")


class ConservationError(RuntimeError):
    """The simulator lost, duplicated or mis-reported requests (a simulator bug)."""


def check_conservation(result: dict, arrival_s: np.ndarray, output_tokens: np.ndarray, what: str) -> None:
    """Raise ConservationError unless, for the n requests replayed:
    each per-request list has n entries (one per request, input order);
    each status is `completed` or `rejected`; completed + rejected == n;
    a completed request has a finite TTFT >= 0, a finish time >= its arrival
    and, when it produced more than one token, a finite TPOT >= 0;
    a rejected request has no finish time (NaN)."""
    n = len(arrival_s)
    problems = []
    for key in PER_REQUEST:
        got = len(result.get(key, ()))
        if got != n:
            problems.append(f"`{key}` has {got} entries for {n} requests")
    if problems:
        raise ConservationError(f"{what}: " + "; ".join(problems))
    status = np.asarray(result["status"], dtype=object)
    completed = status == "completed"
    rejected = status == "rejected"
    other = ~(completed | rejected)
    if other.any():
        bad = sorted({str(s) for s in status[other]})
        problems.append(f"{int(other.sum())} request(s) with status {bad}, not one of {list(STATUSES)}")
    if int(completed.sum()) + int(rejected.sum()) + int(other.sum()) != n:
        problems.append("status counts do not add up")
    ttft = np.asarray(result["ttft_ms"], dtype=np.float64)
    tpot = np.asarray(result["tpot_ms"], dtype=np.float64)
    finish = np.asarray(result["finish_s"], dtype=np.float64)
    checks = [
        (completed & ~(np.isfinite(ttft) & (ttft >= 0)), "completed without a finite TTFT >= 0"),
        (completed & ~(finish >= arrival_s - 1e-9), "completed with a finish time before arrival (or none)"),
        (completed & (output_tokens > 1) & ~(np.isfinite(tpot) & (tpot >= 0)), "completed (>1 token) without a finite TPOT"),
        (rejected & np.isfinite(finish), "rejected yet given a finish time"),
    ]
    for mask, message in checks:
        if mask.any():
            first = int(np.flatnonzero(mask)[0])
            problems.append(f"{int(mask.sum())} request(s) {message} (first: request {first})")
    if problems:
        raise ConservationError(f"{what}: " + "; ".join(problems))
