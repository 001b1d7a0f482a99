"""Channels through shared memory between processes on one host (CPU pools).

Each (source, destination) pair gets one file in /dev/shm: a small header of
sequence flags, then `slots` staging buffers (plus two FIFOs as doorbells). The sender gathers straight
into a slot and publishes it by writing the chunk's sequence number; the
receiver scatters straight out of it and hands the slot back the same way.
So every KV byte is copied exactly twice (gather, scatter), by two processes
running at once. Ordering relies on the host's store order (x86 TSO): the
data stores of a finished torch copy are visible before the later flag store.
"""

from __future__ import annotations

import mmap
import os
import select
import time
import uuid

import numpy as np
import torch

from tiertp.kv.channel import RecvChannel, SendChannel, Transport
from tiertp.kv.context import MigrationContext
from tiertp.kv.errors import KVMigrationError

_HEADER = 4096  # flags live here; keeps slots page-aligned
_SHM_DIR = "/dev/shm"
_BELLS = (".filled", ".consumed")
FILLED, CONSUMED = 0, 1  # doorbell index: which side is woken


class _Segment:
    """One mapped file: flags[0:slots] = filled seq + 1, flags[slots:2*slots]
    = consumed seq + 1, then the slots. Two FIFOs beside it are doorbells
    (FILLED: sender -> receiver, CONSUMED: receiver -> sender), so a waiting
    side sleeps in poll() instead of burning the core its peer needs; the
    flags stay the truth, a doorbell byte only means "look again"."""

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
        self.n = slots

    @staticmethod
    def unlink(path: str) -> None:
        for name in (path, *(path + bell for bell in _BELLS)):
            try:
                os.unlink(name)
            except FileNotFoundError:
                pass

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
                try:
                    os.read(self.bells[bell], 4096)
                except BlockingIOError:  # another waiter drained it
                    pass

    def close(self) -> None:
        for fd in self.bells:
            os.close(fd)
        self.bells, self.flags, self.slots = [], None, None
        try:
            self.map.close()
        except BufferError:  # a view still alive elsewhere; the mapping goes with it
            pass


class ShmSendChannel(SendChannel):
    def __init__(self, ctx: MigrationContext, peer: int, seg: _Segment):
        self.ctx, self.peer, self.seg = ctx, peer, seg
        self.bytes_sent = 0
        self.posted = 0

    def acquire(self, seq: int) -> torch.Tensor:
        prev = seq - self.seg.n
        if prev >= 0:
            self.seg.wait_flag(self.seg.n + seq % self.seg.n, prev + 1, CONSUMED, self.ctx,
                               f"for GPU {self.peer} to drain")
        return self.seg.slots[seq % self.seg.n]

    def post(self, seq: int, nbytes: int) -> None:
        self.seg.set_flag(seq % self.seg.n, seq + 1, FILLED)
        self.bytes_sent += nbytes
        self.posted = seq + 1

    def finish(self) -> None:
        # The last chunks must be consumed before the pages they came from may change.
        for seq in range(max(0, self.posted - self.seg.n), self.posted):
            self.seg.wait_flag(self.seg.n + seq % self.seg.n, seq + 1, CONSUMED, self.ctx,
                               f"for GPU {self.peer} to drain")
        self.seg.close()


class ShmRecvChannel(RecvChannel):
    def __init__(self, ctx: MigrationContext, peer: int, sizes: list[int], seg: _Segment):
        self.ctx, self.peer, self.sizes, self.seg = ctx, peer, sizes, seg
        self.bytes_received = 0

    def wait(self, seq: int) -> torch.Tensor:
        self.seg.wait_flag(seq % self.seg.n, seq + 1, FILLED, self.ctx, f"receiving from GPU {self.peer}")
        self.bytes_received += self.sizes[seq]
        return self.seg.slots[seq % self.seg.n][: self.sizes[seq]]

    def release(self, seq: int) -> None:
        self.seg.set_flag(self.seg.n + seq % self.seg.n, seq + 1, CONSUMED)

    def finish(self) -> None:
        self.seg.close()


class ShmTransport(Transport):
    """Same-host, CPU tensors only. `open` is collective over ctx.group: a
    session id is agreed, senders create their files, everyone maps, and the
    files are unlinked at once (the mappings stay), so nothing is left in
    /dev/shm even if a process dies mid-migration."""

    name = "shm"

    def open(self, ctx, sends, recvs, capacity, slots, device):
        if torch.device(device).type != "cpu":
            raise KVMigrationError("ShmTransport moves CPU tensors only; use DistTransport (NCCL) on GPU")
        control = ctx.control
        session = control.all_gather_object(uuid.uuid4().hex[:12])[0]

        def path(src: int, dst: int) -> str:
            return os.path.join(_SHM_DIR, f"tiertp-kv-{session}-{src}-{dst}")

        created: dict[int, _Segment] = {}
        try:
            for p in sends:
                created[p] = _Segment(path(ctx.gpu, p), capacity, slots, create=True)
            control.barrier()
            opened = {p: _Segment(path(p, ctx.gpu), capacity, slots, create=False) for p in recvs}
            control.barrier()  # every receiver has mapped its files
        finally:
            for p in sends:
                _Segment.unlink(path(ctx.gpu, p))
        return ({p: ShmSendChannel(ctx, p, seg) for p, seg in created.items()},
                {p: ShmRecvChannel(ctx, p, recvs[p], seg) for p, seg in opened.items()})
