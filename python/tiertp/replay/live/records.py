"""Per-request records of a live replay and their reduction to the result
shape the simulator returns (so conservation and metrics are the same code).

Every request of the replayed trace gets exactly one RequestRecord, created
before anything is sent; it ends `completed` or `failed` with a
FailureReason. A record still open when the replay ends is a bug of the
client; `to_sim_result` refuses it.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass, field

import numpy as np

COMPLETED = "completed"
FAILED = "failed"

# Failure kinds, the one list (a report groups failures by them).
FAILURE_KINDS = {
    "http": "the server answered with an HTTP error status (OpenAI error JSON when it sent one)",
    "stream_error": "the server sent an error object inside the SSE stream",
    "timeout": "no first token, no stream activity, or no end within the client's time limits",
    "connection": "the connection failed or broke (server down or gone mid-stream)",
    "protocol": "the response was not the SSE stream the OpenAI API specifies",
    "cancelled": "the replay was interrupted before the request ended",
    "client": "an unexpected error in the client",
}


@dataclass(frozen=True)
class FailureReason:
    kind: str
    message: str
    http_status: int | None = None
    error_type: str | None = None  # the OpenAI error `type` (e.g. invalid_request_error)
    error_code: str | None = None

    def __post_init__(self):
        if self.kind not in FAILURE_KINDS:
            raise ValueError(f"unknown failure kind {self.kind!r}; valid: {', '.join(FAILURE_KINDS)}")

    def label(self) -> str:
        """Short grouping key: kind, HTTP status, error type."""
        parts = [self.kind]
        if self.http_status is not None:
            parts.append(str(self.http_status))
        if self.error_type:
            parts.append(self.error_type)
        return ":".join(parts)


@dataclass
class RequestRecord:
    """One request. Times are seconds since the replay's start (`scheduled_s`:
    the trace's arrival; `sent_s`: when the client sent it); latencies in
    ms, measured from `sent_s`. TPOT = (last token - first token) / (tokens - 1)."""

    index: int
    tier: str
    prompt_tokens: int
    max_tokens: int
    scheduled_s: float
    sent_s: float = math.nan
    first_token_s: float = math.nan
    end_s: float = math.nan
    completion_tokens: int = 0
    finish_reason: str | None = None
    status: str | None = None
    failure: FailureReason | None = None
    chunks: int = field(default=0, repr=False)

    @property
    def done(self) -> bool:
        return self.status is not None

    @property
    def ttft_ms(self) -> float:
        return (self.first_token_s - self.sent_s) * 1e3

    @property
    def tpot_ms(self) -> float:
        if self.completion_tokens <= 1:
            return 0.0 if self.status == COMPLETED else math.nan
        return (self.end_s - self.first_token_s) * 1e3 / (self.completion_tokens - 1)

    def complete(self, end_s: float, tokens: int, finish_reason: str | None) -> None:
        if self.done:
            raise RuntimeError(f"request {self.index} ended twice ({self.status}, then completed)")
        self.end_s, self.completion_tokens, self.finish_reason = end_s, tokens, finish_reason
        self.status = COMPLETED

    def fail(self, end_s: float, reason: FailureReason) -> None:
        if self.done:
            raise RuntimeError(f"request {self.index} ended twice ({self.status}, then failed: {reason.message})")
        self.end_s, self.failure = end_s, reason
        self.status = FAILED

    def to_row(self) -> dict:
        """A flat dict for requests.csv."""
        row = {k: v for k, v in asdict(self).items() if k not in ("failure", "chunks")}
        row["ttft_ms"] = self.ttft_ms if self.status == COMPLETED else math.nan
        row["tpot_ms"] = self.tpot_ms if self.status == COMPLETED else math.nan
        f = self.failure
        row.update(failure_kind=f and f.kind, http_status=f and f.http_status, error_type=f and f.error_type,
                   error_code=f and f.error_code, error_message=f and f.message)
        return row


def to_sim_result(records: list[RequestRecord]) -> dict:
    """The simulator's per-request result lists (trace order) for
    tiertp.replay.conservation and metrics: failed requests are `rejected`
    (no finish time); `output_tokens` holds what each completed request
    really produced (the trace's length for failed ones)."""
    open_ = [r.index for r in records if not r.done]
    if open_:
        raise RuntimeError(f"{len(open_)} request(s) never ended (first: {open_[0]}); the live client lost them")
    done = [r.status == COMPLETED for r in records]
    return {
        "status": ["completed" if d else "rejected" for d in done],
        "ttft_ms": [r.ttft_ms if d else math.nan for r, d in zip(records, done)],
        "tpot_ms": [r.tpot_ms if d else math.nan for r, d in zip(records, done)],
        "finish_s": [r.end_s if d else math.nan for r, d in zip(records, done)],
        "rejected_why": [None if d or r.failure is None else r.failure.label() for r, d in zip(records, done)],
        "output_tokens": np.array([r.completion_tokens if d else r.max_tokens for r, d in zip(records, done)],
                                  dtype=np.int64),
    }


def summarize(records: list[RequestRecord]) -> dict:
    """What the aggregate metrics do not show: failures by reason (with one
    example message each), early stops, client send lag."""
    failures = Counter(r.failure.label() for r in records if r.failure is not None)
    examples: dict[str, str] = {}
    for r in records:
        if r.failure is not None:
            examples.setdefault(r.failure.label(), r.failure.message)
    completed = [r for r in records if r.status == COMPLETED]
    short = [r for r in completed if r.completion_tokens < r.max_tokens]
    lag = np.array([r.sent_s - r.scheduled_s for r in records if math.isfinite(r.sent_s)])
    return {
        "requests": len(records),
        "completed": len(completed),
        "failed": sum(1 for r in records if r.status == FAILED),
        "failures": dict(failures),
        "failure_examples": examples,
        "early_stops": len(short),
        "early_stop_note": "completed with fewer tokens than max_tokens (end-of-sequence); their TPOT uses the "
                           "tokens really produced",
        "output_tokens_requested": int(sum(r.max_tokens for r in records)),
        "output_tokens_received": int(sum(r.completion_tokens for r in completed)),
        "send_lag_ms": ({"p50": float(np.percentile(lag, 50) * 1e3), "max": float(lag.max() * 1e3)}
                        if lag.size else None),
    }
