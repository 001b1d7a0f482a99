"""Live trace replay: send a trace's requests to a running OpenAI-compatible
server (`tiertp serve`) at their scaled arrival times, over streaming, and
measure what the simulator predicts (TTFT, TPOT, goodput per tier)."""

from tiertp.replay.live.caps import LengthCaps
from tiertp.replay.live.limits import Limits
from tiertp.replay.live.live_replay import LiveReplayConfig, LiveSession, capped_loads, live_replay
from tiertp.replay.live.outcome import LIVE, LiveOutcome
from tiertp.replay.live.records import FAILURE_KINDS, FailureReason, RequestRecord

__all__ = [
    "FAILURE_KINDS", "LIVE", "FailureReason", "LengthCaps", "Limits", "LiveOutcome", "LiveReplayConfig",
    "LiveSession", "RequestRecord", "capped_loads", "live_replay",
]
