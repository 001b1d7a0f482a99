"""What a migration moves: its inputs (requests) and its result (moves)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from tiertp.kv.layout import HeadRange, Layout
from tiertp.kv.shape import KVShape


@dataclass(frozen=True)
class RequestKV:
    """One running request: its pages in the old layout and where it goes.

    `pages` is the request's page table, the same on every rank of its old TP
    group (SGLang keeps one table per group); the first
    ceil(context_len / page_size) pages hold its KV and are the ones moved.
    `src_group` / `dst_group` index the old / new Layout's groups.
    """

    request_id: str
    pages: tuple[int, ...]
    context_len: int
    src_group: int
    dst_group: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "pages", tuple(map(int, self.pages)))


@dataclass(frozen=True)
class Move:
    """Heads `heads` (global ids) of request `request_id`, every layer, K and
    V, for pages `src_pages` of the source GPU's old pool, go to `dst_gpu`'s
    new pool (into pages the receiver allocates). `src_gpu == dst_gpu` is a
    local copy: no byte crosses between GPUs."""

    src_gpu: int
    dst_gpu: int
    request_id: str
    heads: HeadRange
    src_pages: tuple[int, ...]

    @property
    def local(self) -> bool:
        return self.src_gpu == self.dst_gpu

    @property
    def num_pages(self) -> int:
        return len(self.src_pages)

    def nbytes(self, shape: KVShape) -> int:
        return self.num_pages * shape.page_bytes(self.heads.count)


@dataclass(frozen=True)
class MigrationPlan:
    """Every move of one migration, in a deterministic order (every process
    computing the plan from the same inputs gets the same plan, which the
    handshake checks). Invariant: for each request and each rank of its new
    group, the moves into that GPU cover exactly the heads the rank holds,
    each head once."""

    shape: KVShape
    old: Layout
    new: Layout
    requests: tuple[RequestKV, ...]
    moves: tuple[Move, ...]
    _by_pair: dict = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_pair: dict[tuple[int, int], list[Move]] = defaultdict(list)
        for m in self.moves:
            by_pair[(m.src_gpu, m.dst_gpu)].append(m)
        object.__setattr__(self, "_by_pair", dict(by_pair))

    @property
    def gpus(self) -> tuple[int, ...]:
        """Every GPU taking part (old and new layouts)."""
        return tuple(sorted(set(self.old.gpus) | set(self.new.gpus)))

    def pair(self, src_gpu: int, dst_gpu: int) -> list[Move]:
        """Moves from src_gpu to dst_gpu, in plan order."""
        return list(self._by_pair.get((src_gpu, dst_gpu), ()))

    def remote_pairs(self) -> list[tuple[int, int]]:
        return sorted(p for p in self._by_pair if p[0] != p[1])

    def bytes_between(self, src_gpu: int, dst_gpu: int) -> int:
        return sum(m.nbytes(self.shape) for m in self.pair(src_gpu, dst_gpu))

    def bytes_to_move(self) -> int:
        """Bytes crossing between GPUs (local copies excluded)."""
        return sum(m.nbytes(self.shape) for m in self.moves if not m.local)

    def bytes_local(self) -> int:
        return sum(m.nbytes(self.shape) for m in self.moves if m.local)

    def pages_needed(self, dst_gpu: int) -> dict[str, int]:
        """Per request, the pages dst_gpu must allocate in its new pool."""
        need: dict[str, int] = {}
        for m in self.moves:
            if m.dst_gpu == dst_gpu:
                need[m.request_id] = m.num_pages
        return need
