"""One shared-memory staging segment between a sender and a receiver process.

A file in /dev/shm (unlinked as soon as both sides mapped it): a header of
sequence flags, then `slots` staging buffers of `capacity` bytes, plus two
FIFOs beside it as doorbells. tiertp.kv.shm_transport keeps segments mapped
from one migration to the next, so the flags count per use (`reset`) and the
segment records whether its last use ended cleanly (`clean`).
"""

from __future__ import annotations

import mmap
import os
import select
import time

import numpy as np
import torch

from tiertp.kv.context import MigrationContext
from tiertp.kv.errors import KVMigrationError

_HEADER = 4096  # flags live here; keeps slots page-aligned
_BELLS = (".filled", ".consumed")
FILLED, CONSUMED = 0, 1  # doorbell index: which side is woken


class ShmSegment:
    """flags[0:slots] = filled seq + 1, flags[slots:2*slots] = consumed seq + 1,
    then the slots. The doorbells (FILLED: sender -> receiver, CONSUMED:
    receiver -> sender) let a waiting side sleep in poll() instead of burning
    the core its peer needs; the flags stay the truth, a doorbell byte only
    means "look again"."""

    def __init__(self, path: str, capacity: int, slots: int, create: bool):
        size = _HEADER + capacity * slots
        if create:
            for bell in _BELLS:
                os.mkfifo(path + bell, 0o600)
        fd = os.open(path, os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0), 0o600)
        try:
            if create:
                os.ftruncate(fd, size)
            self.map = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        # O_RDWR: opening a FIFO never blocks that way, and we hold both ends.
        self.bells = [os.open(path + bell, os.O_RDWR | os.O_NONBLOCK) for bell in _BELLS]
        self.flags = np.frombuffer(self.map, dtype=np.int64, count=_HEADER // 8)
        raw = torch.frombuffer(self.map, dtype=torch.uint8)
        self.slots = [raw[_HEADER + i * capacity:_HEADER + (i + 1) * capacity] for i in range(slots)]
        self.path, self.capacity, self.n = path, capacity, slots
        # Set by the channel that finished its part of a migration; a segment
        # left mid-use (a failed migration) is never handed out again.
        self.clean = False

    @staticmethod
    def unlink(path: str) -> None:
        for name in (path, *(path + bell for bell in _BELLS)):
            try:
                os.unlink(name)
            except FileNotFoundError:
                pass

    @property
    def name(self) -> str:
        return os.path.basename(self.path)

    def fits(self, capacity: int, slots: int) -> bool:
        return self.flags is not None and self.n == slots and self.capacity >= capacity

    def reset(self) -> None:
        """Before a new use (sender side, while nobody else touches it): flags
        back to zero, stale doorbell bytes drained."""
        self.flags[: 2 * self.n] = 0
        for fd in self.bells:
            self._drain(fd)

    def set_flag(self, index: int, value: int, bell: int) -> None:
        self.flags[index] = value
        try:
            os.write(self.bells[bell], b"\0")
        except BlockingIOError:  # FIFO full: the peer has wake-ups pending anyway
            pass

    def wait_flag(self, index: int, value: int, bell: int, ctx: MigrationContext, what: str) -> None:
        """Until flags[index] >= value: a short spin (the peer is often about
        to post), then sleep on the doorbell."""
        flags = self.flags
        for _ in range(64):
            if flags[index] >= value:
                return
        deadline = time.monotonic() + ctx.timeout_s
        poller = select.poll()
        poller.register(self.bells[bell], select.POLLIN)
        while flags[index] < value:
            if time.monotonic() > deadline:
                raise KVMigrationError(f"GPU {ctx.gpu}: timed out {what}")
            if poller.poll(100):
                self._drain(self.bells[bell])

    @staticmethod
    def _drain(fd: int) -> None:
        try:
            while len(os.read(fd, 4096)) == 4096:
                pass
        except BlockingIOError:  # empty, or another waiter drained it
            pass

    def close(self) -> None:
        for fd in self.bells:
            os.close(fd)
        self.bells, self.flags, self.slots, self.clean = [], None, None, False
        try:
            self.map.close()
        except BufferError:  # a view still alive elsewhere; the mapping goes with it
            pass
