"""The live client's time limits (no aiohttp import: the CLI reads the defaults)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    """Client time limits, seconds. `first_token_s` counts from sending (it
    covers connecting, queueing and prefill); `stall_s` is the longest
    silence between stream events after the first token; `total_s` bounds the
    whole request."""

    connect_s: float = 10.0
    first_token_s: float = 120.0
    stall_s: float = 60.0
    total_s: float = 600.0

    def __post_init__(self):
        for name, v in (("connect_s", self.connect_s), ("first_token_s", self.first_token_s),
                        ("stall_s", self.stall_s), ("total_s", self.total_s)):
            if not v > 0:
                raise ValueError(f"time limit {name} must be > 0 s, got {v}")
