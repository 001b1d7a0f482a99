"""Channels over torch.distributed point-to-point (gloo on CPU, NCCL on GPU)."""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

from tiertp.kv.channel import RecvChannel, SendChannel, Transport
from tiertp.kv.context import MigrationContext
from tiertp.kv.errors import KVMigrationError


def _wait(work, ctx: MigrationContext, what: str) -> None:
    try:
        if not work.wait(timedelta(seconds=ctx.timeout_s)):
            raise KVMigrationError(f"GPU {ctx.gpu}: timed out {what}")
    except RuntimeError as e:  # gloo reports a timeout or a dead peer as RuntimeError
        raise KVMigrationError(f"GPU {ctx.gpu}: {what} failed: {e}") from e


class DistSendChannel(SendChannel):
    """isend is asynchronous (gloo's I/O thread, NCCL's stream): the chunk in
    one slot is in flight while the caller fills the other."""

    def __init__(self, ctx: MigrationContext, peer: int, capacity: int, slots: int, device: torch.device):
        self.ctx, self.peer = ctx, peer
        self.buffers = [torch.empty(capacity, dtype=torch.uint8, device=device) for _ in range(slots)]
        self.works: list = [None] * slots
        self.bytes_sent = 0

    def acquire(self, seq: int) -> torch.Tensor:
        slot = seq % len(self.buffers)
        if self.works[slot] is not None:
            _wait(self.works[slot], self.ctx, f"sending to GPU {self.peer}")
            self.works[slot] = None
        return self.buffers[slot]

    def post(self, seq: int, nbytes: int) -> None:
        slot = seq % len(self.buffers)
        self.works[slot] = dist.isend(self.buffers[slot][:nbytes], group=self.ctx.data_group or self.ctx.group,
                                      group_dst=self.ctx.rank(self.peer))
        self.bytes_sent += nbytes

    def finish(self) -> None:
        for slot, work in enumerate(self.works):
            if work is not None:
                _wait(work, self.ctx, f"sending to GPU {self.peer}")
                self.works[slot] = None


class DistRecvChannel(RecvChannel):
    """Receives are posted `slots` chunks ahead, so a sender never waits on
    an unposted receive."""

    def __init__(self, ctx: MigrationContext, peer: int, sizes: list[int], capacity: int, slots: int,
                 device: torch.device):
        self.ctx, self.peer, self.sizes = ctx, peer, sizes
        self.buffers = [torch.empty(capacity, dtype=torch.uint8, device=device) for _ in range(slots)]
        self.works: dict[int, object] = {}
        self.bytes_received = 0
        for seq in range(min(slots, len(sizes))):
            self._post(seq)

    def _post(self, seq: int) -> None:
        buf = self.buffers[seq % len(self.buffers)][: self.sizes[seq]]
        self.works[seq] = dist.irecv(buf, group=self.ctx.data_group or self.ctx.group,
                                     group_src=self.ctx.rank(self.peer))

    def wait(self, seq: int) -> torch.Tensor:
        _wait(self.works.pop(seq), self.ctx, f"receiving from GPU {self.peer}")
        self.bytes_received += self.sizes[seq]
        return self.buffers[seq % len(self.buffers)][: self.sizes[seq]]

    def release(self, seq: int) -> None:
        nxt = seq + len(self.buffers)
        if nxt < len(self.sizes):
            self._post(nxt)

    def finish(self) -> None:
        self.works.clear()


class DistTransport(Transport):
    """torch.distributed p2p over ctx.data_group (or ctx.group); nothing to
    set up collectively."""

    name = "dist"

    def open(self, ctx, sends, recvs, capacity, slots, device):
        if ctx.data_group is None and not isinstance(ctx.group, dist.ProcessGroup):
            raise KVMigrationError("DistTransport needs a torch.distributed group for the bytes: set "
                                   "MigrationContext.data_group (the control group is not a process group)")
        out = {p: DistSendChannel(ctx, p, capacity, slots, device) for p in sends}
        inc = {p: DistRecvChannel(ctx, p, sizes, capacity, slots, device) for p, sizes in recvs.items()}
        return out, inc
