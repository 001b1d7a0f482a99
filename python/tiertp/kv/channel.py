"""Byte channels between two GPUs' processes, with alternating staging slots.

A Transport opens, for one migration, a SendChannel to each destination and
a RecvChannel from each source. Each channel owns `slots` staging buffers
(2 for double buffering: one filled while the other is in flight; 1 for
send-and-wait). The executor gathers straight into a SendChannel's slot and
scatters straight out of a RecvChannel's slot, so a transport that can share
memory (ShmTransport) moves each byte with no extra copy.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from tiertp.kv.context import MigrationContext


class SendChannel(ABC):
    """Chunks 0, 1, 2, ... in order; chunk `seq` uses slot seq % slots."""

    bytes_sent: int = 0

    @abstractmethod
    def acquire(self, seq: int) -> torch.Tensor:
        """The uint8 slot buffer for chunk `seq`, once chunk seq - slots (the
        slot's previous user) has left it. Blocks at most the context timeout."""

    @abstractmethod
    def post(self, seq: int, nbytes: int) -> None:
        """The first `nbytes` of chunk seq's slot are filled: send them."""

    @abstractmethod
    def finish(self) -> None:
        """Wait until every posted chunk has left; then release resources."""


class RecvChannel(ABC):
    """Receives the chunk sizes the plan announced, in order."""

    bytes_received: int = 0

    @abstractmethod
    def wait(self, seq: int) -> torch.Tensor:
        """Chunk seq's bytes (a uint8 view into its slot), once arrived."""

    @abstractmethod
    def release(self, seq: int) -> None:
        """The caller is done with chunk seq's slot; the sender may refill it."""

    @abstractmethod
    def finish(self) -> None:
        """Release resources (every chunk was waited for and released)."""


class Transport(ABC):
    """Opens the channels of one migration. `open` is collective: every
    process of ctx.group calls it with matching sizes."""

    name: str

    @abstractmethod
    def open(self, ctx: MigrationContext, sends: dict[int, list[int]], recvs: dict[int, list[int]],
             capacity: int, slots: int, device: torch.device) -> tuple[dict[int, SendChannel], dict[int, RecvChannel]]:
        """sends / recvs: peer GPU -> byte size of each chunk to send / receive."""
