"""TP layouts: which GPUs form a TP group and which KV heads each rank holds.

KV heads are split over the ranks of a TP group contiguously, as SGLang's
QKVParallelLinear does: rank r of TP k holds heads [r*H/k, (r+1)*H/k). When
k > H (more ranks than KV heads) SGLang replicates: every rank holds one head,
rank r holds head r*H//k, so k/H ranks share each head. We follow that rule
exactly, so a pool allocated by SGLang can be migrated as is. TP must be a
power of two and H must divide k or be divisible by k; anything else is
rejected with LayoutError (SGLang itself rejects those shapes).
"""

from __future__ import annotations

from dataclasses import dataclass

from tiertp.kv.errors import LayoutError
from tiertp.tp_group import TpGroup


@dataclass(frozen=True)
class HeadRange:
    """Global KV head indices [start, stop)."""

    start: int
    stop: int

    def __post_init__(self) -> None:
        if not 0 <= self.start < self.stop:
            raise LayoutError(f"empty or negative head range [{self.start}, {self.stop})")

    @property
    def count(self) -> int:
        return self.stop - self.start

    def intersect(self, other: HeadRange) -> HeadRange | None:
        lo, hi = max(self.start, other.start), min(self.stop, other.stop)
        return HeadRange(lo, hi) if lo < hi else None


def heads_of_rank(num_kv_heads: int, tp: int, rank: int) -> HeadRange:
    """The global KV heads rank `rank` of a TP-`tp` group holds (SGLang's split)."""
    _check_tp(num_kv_heads, tp)
    if not 0 <= rank < tp:
        raise LayoutError(f"rank {rank} outside TP {tp}")
    if tp <= num_kv_heads:
        per = num_kv_heads // tp
        return HeadRange(rank * per, (rank + 1) * per)
    head = rank * num_kv_heads // tp
    return HeadRange(head, head + 1)


def _check_tp(num_kv_heads: int, tp: int) -> None:
    if tp < 1 or tp & (tp - 1):
        raise LayoutError(f"TP {tp} is not a power of two")
    if num_kv_heads < 1:
        raise LayoutError(f"num_kv_heads must be >= 1, got {num_kv_heads}")
    if num_kv_heads % tp and tp % num_kv_heads:
        raise LayoutError(f"{num_kv_heads} KV heads cannot be split over TP {tp}")


def heads_on(group: TpGroup, gpu: int, num_kv_heads: int) -> HeadRange:
    """Heads the rank on `gpu` holds; LayoutError if `gpu` is not in the group."""
    if gpu not in group.devices:
        raise LayoutError(f"GPU {gpu} is not in TP group {group.gpus}")
    return heads_of_rank(num_kv_heads, group.tp, group.rank_of(gpu))


def group_of(gpus: tuple[int, ...] | list[int]) -> TpGroup:
    """The TP group whose rank r runs on gpus[r]: contiguous ascending GPUs,
    a power-of-two count of them; LayoutError naming the problem otherwise."""
    gpus = tuple(gpus)
    if not gpus:
        raise LayoutError("a TP group needs at least one GPU")
    if len(set(gpus)) != len(gpus):
        raise LayoutError(f"TP group {gpus} repeats a GPU")
    if len(gpus) & (len(gpus) - 1):
        raise LayoutError(f"TP group {gpus}: TP {len(gpus)} is not a power of two")
    if gpus != tuple(range(gpus[0], gpus[0] + len(gpus))):
        raise LayoutError(f"TP group {gpus}: its GPUs must be contiguous, rank r on GPU {gpus[0]} + r")
    return TpGroup(gpus[0], len(gpus))


@dataclass(frozen=True)
class Layout:
    """A set of disjoint TP groups (one TP level each) over some GPUs.

    Alignment (groups being aligned power-of-two GPU ranges inside a node) is
    the planner's rule, not a need of migration: any disjoint contiguous runs
    of a power-of-two size migrate correctly, so only that is checked here
    (`group_of`).
    """

    groups: tuple[TpGroup, ...]

    def __post_init__(self) -> None:
        groups = tuple(group_of(g.gpus if isinstance(g, TpGroup) else g) for g in self.groups)
        object.__setattr__(self, "groups", groups)
        seen: set[int] = set()
        for g in groups:
            if seen & set(g.gpus):
                raise LayoutError(f"GPU(s) {sorted(seen & set(g.gpus))} in two TP groups")
            seen |= set(g.gpus)

    @classmethod
    def of(cls, *groups: tuple[int, ...] | list[int]) -> Layout:
        """Layout.of((0, 1), (2,)) is TP2 on GPUs 0-1 and TP1 on GPU 2."""
        return cls(tuple(group_of(g) for g in groups))

    @property
    def gpus(self) -> tuple[int, ...]:
        return tuple(sorted(g for grp in self.groups for g in grp.gpus))

    def group(self, index: int) -> TpGroup:
        if not 0 <= index < len(self.groups):
            raise LayoutError(f"TP group index {index} outside layout of {len(self.groups)} groups")
        return self.groups[index]
