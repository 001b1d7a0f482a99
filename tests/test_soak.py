"""The soak's bookkeeping (the soak itself is `tiertp bench soak`: minutes of
real processes, not a test)."""

from __future__ import annotations

from tiertp.bench.soak_load import COMPLETED_IN_SLO, COMPLETED_LATE, FAILED, LOST, TierLoad, classify

TIER = TierLoad("chat", "sk", ttft_s=1.0, tpot_s=0.1)


def test_every_request_ends_in_exactly_one_outcome():
    assert classify(TIER, 0.5, 0.05, True, None, False).kind == COMPLETED_IN_SLO
    assert classify(TIER, 1.5, 0.05, True, None, False).kind == COMPLETED_LATE
    assert classify(TIER, 0.5, 0.2, True, None, False).kind == COMPLETED_LATE
    failed = classify(TIER, None, None, False, "503 overloaded", False)
    assert (failed.kind, failed.reason) == (FAILED, "503 overloaded")
    # No answer in time, or a stream that just stops, is lost: never counted as served.
    assert classify(TIER, None, None, False, "timeout: x", True).kind == LOST
    assert classify(TIER, 0.5, 0.05, False, None, False).kind == LOST
