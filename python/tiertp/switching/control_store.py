"""The store a switch's participants meet through, hosted by the coordinator.

Each TP instance is its own torch.distributed world, so the processes of two
instances share no process group; they run a migration's handshake over a
TCPStore instead (tiertp.kv.StoreControlGroup), one per coordinator, each
switch under its own key prefix.
"""

from __future__ import annotations

import datetime
import itertools
import os

import torch.distributed as dist


class ControlStore:
    """A TCPStore server on `host`, started on first use (port chosen by the OS)."""

    def __init__(self, host: str = "127.0.0.1", timeout_s: float = 120.0):
        self.host, self.timeout_s = host, timeout_s
        self._server = None
        self._names = itertools.count()

    @property
    def address(self) -> tuple[str, int]:
        if self._server is None:
            self._server = dist.TCPStore(self.host, 0, is_master=True, wait_for_workers=False,
                                         timeout=datetime.timedelta(seconds=self.timeout_s))
        return (self.host, self._server.port)

    def new_name(self) -> str:
        """A key prefix no earlier switch of this store used."""
        return f"switch-{os.getpid()}-{next(self._names)}"

    def close(self) -> None:
        self._server = None  # the server thread stops with its last reference
