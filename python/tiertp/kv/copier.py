"""Copying one migration's moves on this GPU: gather, scatter, or pool to pool.

`Copier` reads the old pool and writes the new one of one process (the old
one may be a peer's, mapped: a pulled pair): it gathers chunks into staging
buffers, scatters them out, or copies a move straight across when the
kernels can (KVKernels.copy_pages). Page tables become tensors once per
migration; chunks slice them.
"""

from __future__ import annotations

import contextlib
import threading

import torch

from tiertp.kv.chunks import Chunk, split_chunks
from tiertp.kv.ids import id_tensor
from tiertp.kv.kernels import KVKernels
from tiertp.kv.plan import MigrationPlan, Move
from tiertp.kv.pool import KVPool


def _staging_view(buf: torch.Tensor, plan: MigrationPlan, offset: int, nbytes: int, n: int, heads: int):
    s = plan.shape
    return buf[offset:offset + nbytes].view(s.dtype).view(s.num_layers, 2, n, s.page_size, heads, s.head_dim)


class Copier:
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
        # Page tables as tensors, built once per migration (chunks slice them).
        self._src_ids: dict[int, tuple] = {}
        self._new_ids: dict[str, torch.Tensor] = {}

    def _old_ids(self, m: Move) -> torch.Tensor:
        # The moves of one request share its page tuple: keyed by its identity (kept alive beside).
        hit = self._src_ids.get(id(m.src_pages))
        if hit is None:
            hit = self._src_ids[id(m.src_pages)] = (m.src_pages, id_tensor(m.src_pages, self.device))
        return hit[1]

    def _dest_ids(self, m: Move) -> torch.Tensor:
        ids = self._new_ids.get(m.request_id)
        if ids is None:
            ids = self._new_ids[m.request_id] = id_tensor(self.new_pages[m.request_id], self.device)
        return ids

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
                self.kernels.gather(pool.k_buffers, pool.v_buffers, self._old_ids(m)[seg.page_lo:seg.page_hi],
                                    self.plan.shape.page_size, m.heads.start - pool.heads.start, out)
        if stream is not None:
            torch.cuda.current_stream(self.device).wait_stream(stream)  # send after gather

    def scatter(self, moves: list[Move], chunk: Chunk, buf: torch.Tensor) -> None:
        pool = self.new_pool
        for seg in chunk.segments:
            m = moves[seg.move]
            src = _staging_view(buf, self.plan, seg.offset, seg.nbytes, seg.page_hi - seg.page_lo, m.heads.count)
            self.kernels.scatter(pool.k_buffers, pool.v_buffers, self._dest_ids(m)[seg.page_lo:seg.page_hi],
                                 self.plan.shape.page_size, m.heads.start - pool.heads.start, src)

    def copy_direct(self, m: Move) -> bool:
        """Move `m` from the old pool straight into the new one, when the
        kernels can do it without staging (KVKernels.copy_pages)."""
        old, new = self.old_pool, self.new_pool
        return self.kernels.copy_pages(
            (old.k_buffers, old.v_buffers), self._old_ids(m), m.heads.start - old.heads.start,
            (new.k_buffers, new.v_buffers), self._dest_ids(m), m.heads.start - new.heads.start,
            m.heads.count, self.plan.shape.page_size)


def copy_in_process(copier: Copier, moves: list[Move], chunk_bytes: int) -> int:
    """Copy `moves` in the calling thread (local moves, or pulled ones: the
    copier's old pool is then the sender's, mapped): straight from pool to
    pool where the kernels can, else a chunk at a time through a staging
    buffer. Bytes copied."""
    staged = [m for m in moves if not copier.copy_direct(m)]
    if staged:
        buf = torch.empty(capacity_for(copier.plan, chunk_bytes), dtype=torch.uint8, device=copier.device)
        for chunk in split_chunks(staged, copier.plan.shape, chunk_bytes):
            copier.gather(staged, chunk, buf)
            copier.scatter(staged, chunk, buf)
    return sum(m.nbytes(copier.plan.shape) for m in moves)


def capacity_for(plan: MigrationPlan, chunk_bytes: int) -> int:
    """Staging slot size: chunk_bytes, or one page of the widest move if larger."""
    widest = max((plan.shape.page_bytes(m.heads.count) for m in plan.moves), default=0)
    return max(chunk_bytes, widest)
