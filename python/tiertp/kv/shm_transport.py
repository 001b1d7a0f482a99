"""Channels through shared memory between processes on one host (CPU pools).

Each (source, destination) pair stages its chunks in a ShmSegment
(tiertp.kv.shm_segment): `slots` buffers in a file in /dev/shm. The sender
gathers straight into a slot and publishes it by writing the chunk's
sequence number; the receiver scatters straight out of it and hands the slot
back the same way. So every KV byte is copied exactly twice (gather,
scatter), by two processes running at once. Ordering relies on the host's
store order (x86 TSO): the data stores of a finished copy are visible before
the later flag store.

A ShmTransport keeps its segments mapped after a migration and reuses them
for the next one between the same two processes (the same two ShmTransport
objects): creating a segment and first touching its pages (a page fault per
4 KiB) cost more than copying the bytes through pages already mapped, and
TP switches go back and forth between the same execution processes.

Faster still, when a sender's old pool is in shared memory (its owner called
tiertp.kv.shared_pool.share_pool), the sender offers it in the handshake and
each receiver that can map it copies its heads straight into its new pool:
each byte is copied once, by the receiver, and the sender does nothing.
Pairs that cannot (a pool not shared, a peer whose memory cannot be opened)
use the segments.
"""

from __future__ import annotations

import itertools
import os
import uuid
from collections import OrderedDict

import torch

from tiertp.kv.channel import PeerPool, RecvChannel, SendChannel, Transport
from tiertp.kv.context import MigrationContext
from tiertp.kv.errors import KVMigrationError
from tiertp.kv.shared_pool import PoolMaps
from tiertp.kv.shm_segment import CONSUMED, FILLED, ShmSegment

_SHM_DIR = "/dev/shm"
# Segments kept per direction (one per peer process): peers that are gone
# (an instance restarted) age out instead of holding their memory forever.
_KEEP_PEERS = 8


class ShmSendChannel(SendChannel):
    def __init__(self, ctx: MigrationContext, peer: int, seg: ShmSegment):
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
        self.seg.clean = True


class ShmRecvChannel(RecvChannel):
    def __init__(self, ctx: MigrationContext, peer: int, sizes: list[int], seg: ShmSegment):
        self.ctx, self.peer, self.sizes, self.seg = ctx, peer, sizes, seg
        self.bytes_received = 0

    def wait(self, seq: int) -> torch.Tensor:
        self.seg.wait_flag(seq % self.seg.n, seq + 1, FILLED, self.ctx, f"receiving from GPU {self.peer}")
        self.bytes_received += self.sizes[seq]
        return self.seg.slots[seq % self.seg.n][: self.sizes[seq]]

    def release(self, seq: int) -> None:
        self.seg.set_flag(self.seg.n + seq % self.seg.n, seq + 1, CONSUMED)

    def finish(self) -> None:
        self.seg.clean = True


class ShmTransport(Transport):
    """Same-host, CPU tensors only. `offer` / `accept` (in the handshake):
    senders offer their shared old pools, receivers map what they can and
    pull those pairs. `open` is collective over ctx.group, for the rest:
    everyone says which process it is and which segments it still holds;
    each sender reuses its segment to a receiver process when both still
    hold it (clean, large enough) or creates a new one; everyone maps the
    new ones, and their files are unlinked at once (the mappings stay), so
    nothing is left in /dev/shm even if a process dies mid-migration.

    Keep one object per process for all its migrations: segments are reused
    between the same two objects only. `close` unmaps them all (so does the
    process's exit)."""

    name = "shm"

    def __init__(self, pull: bool = True) -> None:
        """pull=False: always stage through segments (e.g. to test or time them)."""
        # Unique per object: a new process (or object) never matches old segments.
        self.token = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self._pull = pull
        self._pools = PoolMaps()
        self._names = itertools.count()
        self._sent: OrderedDict[str, ShmSegment] = OrderedDict()  # receiver token -> segment created here
        self._received: OrderedDict[str, ShmSegment] = OrderedDict()  # sender token -> segment mapped here

    def offer(self, old_pool):
        """The old pool's export, if its owner shared it (tiertp.kv.shared_pool),
        and the cores this process runs on."""
        if not self._pull or old_pool is None or old_pool.shared is None:
            return None
        return old_pool.shared, tuple(sorted(os.sched_getaffinity(0)))

    def accept(self, ctx, plan, offers):
        pools = {}
        for src, dst in plan.remote_pairs():
            if dst == ctx.gpu and offers.get(src) is not None:
                export, cores = offers[src]
                view = self._pools.view(export)
                if view is not None:
                    pools[src] = PeerPool(view, cores)
        return pools

    def open(self, ctx, sends, recvs, capacity, slots, device):
        if torch.device(device).type != "cpu":
            raise KVMigrationError("ShmTransport moves CPU tensors only; use DistTransport (NCCL) on GPU")
        control = ctx.control
        held = {sender: seg.name for sender, seg in self._received.items() if seg.clean}
        tokens, holds = {}, {}
        for gpu, token, their_held in control.all_gather_object((ctx.gpu, self.token, held)):
            tokens[gpu], holds[gpu] = token, their_held
        fresh: list[str] = []
        try:
            out = {p: self._send_segment(tokens[p], holds[p], capacity, slots, fresh) for p in sends}
            announced = control.all_gather_object((ctx.gpu, {p: seg.name for p, seg in out.items()}))
            names = {gpu: theirs[ctx.gpu] for gpu, theirs in announced if ctx.gpu in theirs}
            inc = {p: self._recv_segment(tokens[p], names[p], capacity, slots) for p in recvs}
            control.barrier()  # every receiver has mapped the new files
        finally:
            for path in fresh:
                ShmSegment.unlink(path)
        for seg in (*out.values(), *inc.values()):
            seg.clean = False  # in use until its channel finishes
        return ({p: ShmSendChannel(ctx, p, seg) for p, seg in out.items()},
                {p: ShmRecvChannel(ctx, p, recvs[p], seg) for p, seg in inc.items()})

    def _send_segment(self, receiver: str, their_held: dict, capacity: int, slots: int,
                      fresh: list[str]) -> ShmSegment:
        """The segment to `receiver`: the kept one if both sides still hold it, else a new one."""
        seg = self._sent.get(receiver)
        if seg is not None and seg.clean and seg.fits(capacity, slots) and their_held.get(self.token) == seg.name:
            seg.reset()
            self._sent.move_to_end(receiver)
            return seg
        path = os.path.join(_SHM_DIR, f"tiertp-kv-{self.token}-{next(self._names)}")
        new = ShmSegment(path, capacity, slots, create=True)
        fresh.append(path)
        _keep(self._sent, receiver, new)
        return new

    def _recv_segment(self, sender: str, name: str, capacity: int, slots: int) -> ShmSegment:
        seg = self._received.get(sender)
        if seg is not None and seg.name == name:
            self._received.move_to_end(sender)
            return seg
        new = ShmSegment(os.path.join(_SHM_DIR, name), capacity, slots, create=False)
        _keep(self._received, sender, new)
        return new

    def close(self) -> None:
        for seg in (*self._sent.values(), *self._received.values()):
            seg.close()
        self._sent.clear()
        self._received.clear()


def _keep(cache: OrderedDict, peer: str, seg: ShmSegment) -> None:
    """Remember `seg` as the segment with `peer` (replacing and unmapping an
    older one), forgetting the least recently used peers beyond _KEEP_PEERS."""
    old = cache.pop(peer, None)
    if old is not None:
        old.close()
    cache[peer] = seg
    while len(cache) > _KEEP_PEERS:
        cache.popitem(last=False)[1].close()
