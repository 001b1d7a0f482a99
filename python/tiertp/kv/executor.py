"""Runs a migration plan on this GPU: handshake, then the pipelined copy."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field

import torch

from tiertp.kv.channel import PeerPool, RecvChannel, SendChannel, Transport
from tiertp.kv.chunks import Chunk, split_chunks
from tiertp.kv.context import MigrationContext
from tiertp.kv.copier import Copier, capacity_for, copy_in_process
from tiertp.kv.dist_transport import DistTransport
from tiertp.kv.errors import KVMigrationError
from tiertp.kv.handshake import handshake
from tiertp.kv.kernels import KVKernels, kernels_for
from tiertp.kv.plan import MigrationPlan, Move
from tiertp.kv.pool import KVPool

DEFAULT_CHUNK_BYTES = 16 << 20
# On a GPU each chunk costs the executor tens of microseconds of Python
# (stream ordering, kernel launches), as long as a 16 MiB chunk's copy: on an
# H100, a staged move of 8.6 GB ran at ~100 GB/s in 16 MiB chunks and
# 243-374 GB/s in 64 MiB ones (`tiertp bench kv-kernels`, kernels/kv_migrate/README.md).
CUDA_CHUNK_BYTES = 64 << 20
# On CPU, copies within this process (local moves, pulled pairs) that cannot
# go straight from pool to pool stage a chunk at a time: 4 MiB amortises the
# per-call costs and keeps the buffer small.
_CPU_COPY_CHUNK_BYTES = 4 << 20


@dataclass
class MigrationResult:
    """`pages`: request id -> its page table in this GPU's new pool (the old
    pages are the caller's to free once every participant returned).
    Byte counts are KV payload, per peer GPU. `pulled`: the (source,
    destination) pairs whose destination copied the KV itself out of the
    source's old pool (their bytes are counted as sent and received too)."""

    pages: dict[str, list[int]]
    bytes_sent: dict[int, int] = field(default_factory=dict)
    bytes_received: dict[int, int] = field(default_factory=dict)
    bytes_local: int = 0
    pulled: frozenset = frozenset()


def _send_pair(copier: Copier, moves: list[Move], chunks: list[Chunk], ch: SendChannel) -> None:
    for seq, chunk in enumerate(chunks):
        buf = ch.acquire(seq)  # blocks while this slot's previous chunk is still in flight
        copier.gather(moves, chunk, buf)
        ch.post(seq, chunk.nbytes)
    ch.finish()


def _recv_pair(copier: Copier, moves: list[Move], chunks: list[Chunk], ch: RecvChannel) -> None:
    for seq, chunk in enumerate(chunks):
        buf = ch.wait(seq)
        copier.scatter(moves, chunk, buf)
        if copier.cuda:
            torch.cuda.current_stream(copier.device).synchronize()  # slot reusable only after the scatter
        ch.release(seq)
    ch.finish()


def _run_on(cores: tuple[int, ...]) -> None:
    """Move the calling thread (only it) to `cores`, if this process may use them."""
    try:
        os.sched_setaffinity(0, cores)
    except OSError:  # outside this process's cpuset: copy where we are
        pass


def default_chunk_bytes(device: torch.device) -> int:
    """Staging chunk size for pools on `device` (every participant of a migration has pools on one kind)."""
    return CUDA_CHUNK_BYTES if device.type == "cuda" else DEFAULT_CHUNK_BYTES


def migrate(ctx: MigrationContext, plan: MigrationPlan, old_pool: KVPool | None, new_pool: KVPool | None, *,
            transport: Transport | None = None, chunk_bytes: int | None = None, slots: int = 2,
            kernels: KVKernels | None = None, borrow_source_cores: bool = True) -> MigrationResult:
    """Collective over ctx.group: every participant calls it with the same plan.

    Handshake first (may raise MigrationAborted with nothing written); it
    also settles which pairs the receiver pulls (copies itself out of the
    sender's old pool, see Transport.accept). For the other pairs one
    thread per outgoing and per incoming peer streams that pair's moves in
    chunks of at most chunk_bytes (default: 64 MiB on GPU, 16 MiB on CPU) through `slots` alternating staging
    buffers (2 = double buffering); meanwhile the calling thread copies the
    local moves and one thread per pulled source that source's (on that
    source's cores when there are several and `borrow_source_cores`: only
    right while the sources wait for the migration, not when one goes on
    running). Old pools are only read, so any failure leaves the old layout intact; on a
    failure after the handshake this GPU's new pages are freed again and
    the error is raised.
    """
    if chunk_bytes is None:
        pool = old_pool or new_pool
        chunk_bytes = default_chunk_bytes(pool.device if pool is not None else torch.device("cpu"))
    if chunk_bytes < 1 or slots < 1:
        raise ValueError("chunk_bytes and slots must be >= 1")
    transport = transport or DistTransport()
    new_pages, pulls = handshake(ctx, plan, old_pool, new_pool, transport)
    if not plan.moves:
        return MigrationResult(new_pages)
    try:
        return _run(ctx, plan, old_pool, new_pool, new_pages, pulls, transport, chunk_bytes, slots, kernels,
                    borrow_source_cores)
    except BaseException:
        for pages in new_pages.values():
            new_pool.allocator.free(pages)
        raise


def _run(ctx, plan, old_pool, new_pool, new_pages, pulls, transport, chunk_bytes, slots, kernels,
         borrow_source_cores) -> MigrationResult:
    me = ctx.gpu
    pool = old_pool or new_pool
    device = pool.device if pool is not None else torch.device("cpu")  # an idle participant still joins open()
    kernels = kernels or kernels_for(device)
    copier = Copier(plan, kernels, old_pool, new_pool, new_pages)
    pairs = [p for p in plan.remote_pairs() if p not in pulls.pairs]
    chunks = {p: split_chunks(plan.pair(*p), plan.shape, chunk_bytes) for p in pairs}
    sends = {d: [c.nbytes for c in chunks[(s, d)]] for s, d in pairs if s == me}
    recvs = {s: [c.nbytes for c in chunks[(s, d)]] for s, d in pairs if d == me}
    # Every participant knows `pairs`: with none left, nobody opens channels.
    out, inc = (transport.open(ctx, sends, recvs, capacity_for(plan, chunk_bytes), slots, device) if pairs
                else ({}, {}))

    errors: list[BaseException] = []
    copied: dict[int, int] = {}  # bytes copied in this process, by source

    def guarded(fn, *args):
        try:
            fn(*args)
        except BaseException as e:  # surfaced in the calling thread below
            errors.append(e)

    def pull(src: int, peer: PeerPool, spread: bool) -> None:
        if spread and peer.cores:
            _run_on(peer.cores)
        copied[src] = copy_in_process(Copier(plan, copier.kernels, peer.pool, new_pool, new_pages), plan.pair(src, me),
                                  in_process)

    in_process = chunk_bytes if copier.cuda else min(chunk_bytes, _CPU_COPY_CHUNK_BYTES)
    threads = [threading.Thread(target=guarded, args=(_send_pair, copier, plan.pair(me, d), chunks[(me, d)], ch),
                                name=f"kv-send-{me}-{d}", daemon=True) for d, ch in out.items()]
    threads += [threading.Thread(target=guarded, args=(_recv_pair, copier, plan.pair(s, me), chunks[(s, me)], ch),
                                 name=f"kv-recv-{s}-{me}", daemon=True) for s, ch in inc.items()]
    # Pulling from several sources: each copy on its source's cores (idle
    # while the sources wait), not all of them on this receiver's.
    spread = borrow_source_cores and len(pulls.pools) > 1
    threads += [threading.Thread(target=guarded, args=(pull, src, peer, spread),
                                 name=f"kv-pull-{src}-{me}", daemon=True) for src, peer in pulls.pools.items()]
    for t in threads:
        t.start()
    try:
        if plan.pair(me, me):
            copied[me] = copy_in_process(copier, plan.pair(me, me), in_process)
    finally:
        for t in threads:
            t.join(ctx.timeout_s * 2)
    if any(t.is_alive() for t in threads):
        errors.append(KVMigrationError(f"GPU {me}: a transfer thread did not finish in time"))
    if errors:
        raise errors[0]
    if copier.cuda:
        torch.cuda.synchronize(device)
    sent = {d: ch.bytes_sent for d, ch in out.items()}
    sent.update({d: plan.bytes_between(me, d) for s, d in pulls.pairs if s == me})
    received = {s: ch.bytes_received for s, ch in inc.items()}
    received.update({s: copied.get(s, 0) for s, d in pulls.pairs if d == me})
    return MigrationResult(new_pages, sent, received, copied.get(me, 0), pulls.pairs)
