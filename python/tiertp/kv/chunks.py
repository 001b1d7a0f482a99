"""How one (source, destination) pair's moves are cut into staging chunks."""

from __future__ import annotations

from dataclasses import dataclass

from tiertp.kv.plan import Move
from tiertp.kv.shape import KVShape


@dataclass(frozen=True)
class Segment:
    """Pages [page_lo, page_hi) of moves[move] at byte `offset` of the chunk,
    laid out as the kernels' staging tensor [L, 2, n, page_size, heads, dim]."""

    move: int
    page_lo: int
    page_hi: int
    offset: int
    nbytes: int


@dataclass(frozen=True)
class Chunk:
    segments: tuple[Segment, ...]
    nbytes: int


def split_chunks(moves: list[Move], shape: KVShape, chunk_bytes: int) -> list[Chunk]:
    """Greedy, in move order: whole pages, up to chunk_bytes per chunk. A page
    larger than chunk_bytes gets a chunk of its own (so the staging capacity
    is max(chunk_bytes, largest page)). Deterministic: sender and receiver
    compute the same chunks from the same plan."""
    chunks: list[Chunk] = []
    segs: list[Segment] = []
    used = 0
    for i, m in enumerate(moves):
        unit = shape.page_bytes(m.heads.count)
        page = 0
        while page < m.num_pages:
            room = max(0, chunk_bytes - used) // unit
            if room == 0 and used == 0:
                room = 1
            if room == 0:
                chunks.append(Chunk(tuple(segs), used))
                segs, used = [], 0
                continue
            n = min(room, m.num_pages - page)
            segs.append(Segment(i, page, page + n, used, n * unit))
            used += n * unit
            page += n
    if segs:
        chunks.append(Chunk(tuple(segs), used))
    return chunks
