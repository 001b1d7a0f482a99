"""Byte channels between two GPUs' processes, with alternating staging slots.

A Transport opens, for one migration, a SendChannel to each destination and
a RecvChannel from each source. Each channel owns `slots` staging buffers
(2 for double buffering: one filled while the other is in flight; 1 for
send-and-wait). The executor gathers straight into a SendChannel's slot and
scatters straight out of a RecvChannel's slot, so a transport that can share
memory (ShmTransport) moves each byte with no extra copy. A transport may
also let receivers read a sender's old pool directly (`offer` / `accept`,
during the handshake): those pairs need no channel at all.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import torch

from tiertp.kv.context import MigrationContext
from tiertp.kv.pool import KVPool


@dataclass(frozen=True)
class PeerPool:
    """A sender's old pool as a receiver reads it: a KVPool view (read-only)
    and the CPU cores the sender runs on (None: not known). The sender only
    waits while its receivers copy, so its cores are free for that."""

    pool: KVPool
    cores: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Pulls:
    """`pairs`: the (source, destination) pairs whose destination copies the
    KV itself, straight out of the source's old pool (the same on every
    participant). `pools`: on a destination, each such source's PeerPool."""

    pairs: frozenset = frozenset()
    pools: dict = field(default_factory=dict)


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

    def offer(self, old_pool):
        """What this participant offers its receivers before the migration
        (picklable; None: nothing), e.g. a way to read its old pool. Sent
        with the handshake's manifest."""
        return None

    def accept(self, ctx: MigrationContext, plan, offers: dict) -> dict:
        """On a receiver, given every participant's offer (by GPU): the
        senders whose KV it will pull itself, straight out of their old
        pools, each with its PeerPool; those pairs skip the channels.
        Default: none."""
        return {}

    @abstractmethod
    def open(self, ctx: MigrationContext, sends: dict[int, list[int]], recvs: dict[int, list[int]],
             capacity: int, slots: int, device: torch.device) -> tuple[dict[int, SendChannel], dict[int, RecvChannel]]:
        """sends / recvs: peer GPU -> byte size of each chunk to send / receive."""
