"""Runs a migration plan on this GPU: handshake, then the pipelined copy."""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field

import torch

from tiertp.kv.channel import RecvChannel, SendChannel, Transport
from tiertp.kv.chunks import Chunk, split_chunks
from tiertp.kv.context import MigrationContext
from tiertp.kv.dist_transport import DistTransport
from tiertp.kv.errors import KVMigrationError
from tiertp.kv.handshake import handshake
from tiertp.kv.kernels import KVKernels, kernels_for
from tiertp.kv.plan import MigrationPlan, Move
from tiertp.kv.pool import KVPool

DEFAULT_CHUNK_BYTES = 16 << 20


@dataclass
class MigrationResult:
    """`pages`: request id -> its page table in this GPU's new pool (the old
    pages are the caller's to free once every participant returned).
    Byte counts are KV payload, per peer GPU."""

    pages: dict[str, list[int]]
    bytes_sent: dict[int, int] = field(default_factory=dict)
    bytes_received: dict[int, int] = field(default_factory=dict)
    bytes_local: int = 0


def _staging_view(buf: torch.Tensor, plan: MigrationPlan, offset: int, nbytes: int, n: int, heads: int):
    s = plan.shape
    return buf[offset:offset + nbytes].view(s.dtype).view(s.num_layers, 2, n, s.page_size, heads, s.head_dim)


class _Copier:
    """Gathers chunks out of the old pool and scatters chunks into the new
    one. On GPU every copy runs on its own stream, ordered against the
    communication (current) stream with events, so a gather overlaps the
    previous chunk's send."""

    def __init__(self, plan: MigrationPlan, kernels: KVKernels, old_pool: KVPool | None,
                 new_pool: KVPool | None, new_pages: dict[str, list[int]]):
        self.plan, self.kernels = plan, kernels
        self.old_pool, self.new_pool, self.new_pages = old_pool, new_pool, new_pages
        pool = old_pool or new_pool
        self.device = pool.device if pool is not None else torch.device("cpu")
        self.cuda = self.device.type == "cuda"
        self._streams = threading.local()  # one copy stream per transfer thread

    def _ids(self, pages) -> torch.Tensor:
        return torch.tensor(list(pages), dtype=torch.long, device=self.device)

    def _stream(self):
        if not self.cuda:
            return None
        if not hasattr(self._streams, "s"):
            self._streams.s = torch.cuda.Stream(self.device)
        return self._streams.s

    def gather(self, moves: list[Move], chunk: Chunk, buf: torch.Tensor) -> None:
        pool = self.old_pool
        stream = self._stream()
        if stream is not None:
            stream.wait_stream(torch.cuda.current_stream(self.device))  # slot free (previous send done)
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            for seg in chunk.segments:
                m = moves[seg.move]
                out = _staging_view(buf, self.plan, seg.offset, seg.nbytes, seg.page_hi - seg.page_lo,
                                    m.heads.count)
                self.kernels.gather(pool.k_buffers, pool.v_buffers, self._ids(m.src_pages[seg.page_lo:seg.page_hi]),
                                    self.plan.shape.page_size, m.heads.start - pool.heads.start, out)
        if stream is not None:
            torch.cuda.current_stream(self.device).wait_stream(stream)  # send after gather

    def scatter(self, moves: list[Move], chunk: Chunk, buf: torch.Tensor) -> None:
        pool = self.new_pool
        for seg in chunk.segments:
            m = moves[seg.move]
            src = _staging_view(buf, self.plan, seg.offset, seg.nbytes, seg.page_hi - seg.page_lo, m.heads.count)
            pages = self.new_pages[m.request_id][seg.page_lo:seg.page_hi]
            self.kernels.scatter(pool.k_buffers, pool.v_buffers, self._ids(pages), self.plan.shape.page_size,
                                 m.heads.start - pool.heads.start, src)


def _send_pair(copier: _Copier, moves: list[Move], chunks: list[Chunk], ch: SendChannel) -> None:
    for seq, chunk in enumerate(chunks):
        buf = ch.acquire(seq)  # blocks while this slot's previous chunk is still in flight
        copier.gather(moves, chunk, buf)
        ch.post(seq, chunk.nbytes)
    ch.finish()


def _recv_pair(copier: _Copier, moves: list[Move], chunks: list[Chunk], ch: RecvChannel) -> None:
    for seq, chunk in enumerate(chunks):
        buf = ch.wait(seq)
        copier.scatter(moves, chunk, buf)
        if copier.cuda:
            torch.cuda.current_stream(copier.device).synchronize()  # slot reusable only after the scatter
        ch.release(seq)
    ch.finish()


def _copy_local(copier: _Copier, moves: list[Move], chunks: list[Chunk], capacity: int) -> int:
    buf = torch.empty(capacity, dtype=torch.uint8, device=copier.device)
    for chunk in chunks:
        copier.gather(moves, chunk, buf)
        copier.scatter(moves, chunk, buf)
    return sum(c.nbytes for c in chunks)


def capacity_for(plan: MigrationPlan, chunk_bytes: int) -> int:
    """Staging slot size: chunk_bytes, or one page of the widest move if larger."""
    widest = max((plan.shape.page_bytes(m.heads.count) for m in plan.moves), default=0)
    return max(chunk_bytes, widest)


def migrate(ctx: MigrationContext, plan: MigrationPlan, old_pool: KVPool | None, new_pool: KVPool | None, *,
            transport: Transport | None = None, chunk_bytes: int = DEFAULT_CHUNK_BYTES, slots: int = 2,
            kernels: KVKernels | None = None) -> MigrationResult:
    """Collective over ctx.group: every participant calls it with the same plan.

    Handshake first (may raise MigrationAborted with nothing written). Then
    one thread per outgoing and per incoming peer streams that pair's moves
    in chunks of at most chunk_bytes through `slots` alternating staging
    buffers (2 = double buffering); local moves are copied meanwhile. Old
    pools are only read, so any failure leaves the old layout intact; on a
    failure after the handshake this GPU's new pages are freed again and
    the error is raised.
    """
    if chunk_bytes < 1 or slots < 1:
        raise ValueError("chunk_bytes and slots must be >= 1")
    new_pages = handshake(ctx, plan, old_pool, new_pool)
    if not plan.moves:
        return MigrationResult(new_pages)
    try:
        return _run(ctx, plan, old_pool, new_pool, new_pages, transport or DistTransport(), chunk_bytes, slots,
                    kernels)
    except BaseException:
        for pages in new_pages.values():
            new_pool.allocator.free(pages)
        raise


def _run(ctx, plan, old_pool, new_pool, new_pages, transport, chunk_bytes, slots, kernels) -> MigrationResult:
    me = ctx.gpu
    pool = old_pool or new_pool
    device = pool.device if pool is not None else torch.device("cpu")  # an idle participant still joins open()
    copier = _Copier(plan, kernels or kernels_for(device), old_pool, new_pool, new_pages)
    capacity = capacity_for(plan, chunk_bytes)
    pairs = plan.remote_pairs()
    chunks = {p: split_chunks(plan.pair(*p), plan.shape, chunk_bytes) for p in pairs}
    sends = {d: [c.nbytes for c in chunks[(s, d)]] for s, d in pairs if s == me}
    recvs = {s: [c.nbytes for c in chunks[(s, d)]] for s, d in pairs if d == me}
    out, inc = transport.open(ctx, sends, recvs, capacity, slots, device)

    errors: list[BaseException] = []

    def guarded(fn, *args):
        try:
            fn(*args)
        except BaseException as e:  # surfaced in the calling thread below
            errors.append(e)

    threads = [threading.Thread(target=guarded, args=(_send_pair, copier, plan.pair(me, d), chunks[(me, d)], ch),
                                name=f"kv-send-{me}-{d}", daemon=True) for d, ch in out.items()]
    threads += [threading.Thread(target=guarded, args=(_recv_pair, copier, plan.pair(s, me), chunks[(s, me)], ch),
                                 name=f"kv-recv-{s}-{me}", daemon=True) for s, ch in inc.items()]
    for t in threads:
        t.start()
    local_moves = plan.pair(me, me)
    local = 0
    try:
        if local_moves:
            local = _copy_local(copier, local_moves, split_chunks(local_moves, plan.shape, chunk_bytes), capacity)
    finally:
        for t in threads:
            t.join(ctx.timeout_s * 2)
    if any(t.is_alive() for t in threads):
        errors.append(KVMigrationError(f"GPU {me}: a transfer thread did not finish in time"))
    if errors:
        raise errors[0]
    if copier.cuda:
        torch.cuda.synchronize(device)
    return MigrationResult(new_pages, {d: ch.bytes_sent for d, ch in out.items()},
                           {s: ch.bytes_received for s, ch in inc.items()}, local)
