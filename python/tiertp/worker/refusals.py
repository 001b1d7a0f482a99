"""Warnings about peers a node agent refused, rate-limited: at most one line
per peer address per interval, saying how many more it refused meanwhile,
so that a flood of bad frames cannot fill the log. Past `max_peers`
addresses warned about within an interval, the rest share one line."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

_MANY = "one of many other peers"


class RefusalLog:
    def __init__(self, log: logging.Logger, interval_s: float = 10.0, max_peers: int = 256,
                 clock: Callable[[], float] = time.monotonic):
        self._log, self._interval, self._max, self._clock = log, interval_s, max_peers, clock
        self._quiet_until: dict[str, float] = {}
        self._held: dict[str, int] = {}  # refusals not warned about, per address

    def refused(self, address: str, connection: bytes, why: str) -> None:
        """One refused frame from `address` (its ZeroMQ routing id: `connection`) and why."""
        now = self._clock()
        if address not in self._quiet_until and len(self._quiet_until) >= self._max:
            self._quiet_until = {a: t for a, t in self._quiet_until.items() if t > now}
            if len(self._quiet_until) >= self._max:
                address = _MANY
        if now < self._quiet_until.get(address, 0.0):
            self._held[address] = self._held.get(address, 0) + 1
            return
        held = self._held.pop(address, 0)
        more = f" ({held} more refused from it since the last warning)" if held else ""
        self._log.warning("control plane: refused a frame from %s (connection %s): %s; nothing was answered%s",
                          address, connection.hex(), why, more)
        self._quiet_until[address] = now + self._interval
