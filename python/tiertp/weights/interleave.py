"""The nested interleaved storage order, as pure tensor maths (no SGLang).

A fused column-parallel weight is the concatenation of `parts` along dim 0
(qkv_proj: [q | k | v]; gate_up_proj: [gate | up]). SGLang's rank r of TP k
holds, for each part, that part's r-th of k row chunks, concatenated in part
order: [q_r | k_r | v_r]. We store the fused weight instead in B blocks
(B a common multiple of every candidate TP level), block b being the b-th of
B row chunks of every part: [q_0 k_0 v_0 | q_1 k_1 v_1 | ...]. Rank r of TP k
then owns blocks r*(B/k) .. (r+1)*(B/k)-1: one contiguous row slice, holding
exactly the rows of SGLang's shard, in the order [q_b k_b v_b | q_b' ...].

So the fused layer's output must be split per block (`split_blocks`) rather
than per part; with one block per rank (k = B) both orders coincide and the
split is SGLang's own.

Row-parallel weights (o_proj, down_proj: [out, in], sharded on `in`) are
stored transposed, [in, out], so a shard is the row slice
`rows_of_rank(in, k, r)` and the parameter is its `.t()` (a view).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from tiertp.weights.errors import UnsupportedLevel


def block_count(levels: Sequence[int]) -> int:
    """B: the least common multiple of the candidate TP levels ({1,2,4} -> 4, {1,3} -> 3)."""
    levels = list(levels)
    if not levels:
        raise UnsupportedLevel("no candidate TP levels given")
    bad = [k for k in levels if not isinstance(k, int) or k < 1]
    if bad:
        raise UnsupportedLevel(f"TP levels must be integers >= 1, got {bad}")
    return math.lcm(*levels)


def interleave(parts: Sequence[torch.Tensor], blocks: int) -> torch.Tensor:
    """The storage order of the fused tensor cat(parts, dim 0), in `blocks` blocks."""
    for i, p in enumerate(parts):
        if p.shape[0] % blocks:
            raise UnsupportedLevel(f"fused part {i} has {p.shape[0]} rows, not divisible into {blocks} blocks")
    chunks = [p.chunk(blocks, dim=0) for p in parts]
    return torch.cat([c[b] for b in range(blocks) for c in chunks], dim=0)


def rows_of_rank(rows: int, tp: int, rank: int) -> tuple[int, int]:
    """[start, stop) of rank `rank`'s contiguous share of `rows` rows at TP `tp`."""
    if not 0 <= rank < tp:
        raise UnsupportedLevel(f"rank {rank} outside TP {tp}")
    if rows % tp:
        raise UnsupportedLevel(f"{rows} rows cannot be split over TP {tp}")
    per = rows // tp
    return rank * per, (rank + 1) * per


def split_blocks(y: torch.Tensor, part_sizes: Sequence[int], blocks: int) -> list[torch.Tensor]:
    """Split the output of a fused shard (last dim: `blocks` blocks of
    [part_0 | part_1 | ...], `part_sizes` per block) into its parts, each in
    SGLang's order (all of part i's blocks, concatenated).

    With one block the parts are plain views, as SGLang's own split; with
    more, each part is gathered into a contiguous tensor.
    """
    if blocks == 1:
        return list(y.split(list(part_sizes), dim=-1))
    per_block = sum(part_sizes)
    if y.shape[-1] != blocks * per_block:
        raise ValueError(f"fused output has {y.shape[-1]} features, expected {blocks} blocks x {per_block}")
    lead = y.shape[:-1]
    grouped = y.reshape(*lead, blocks, per_block)
    return [p.reshape(*lead, blocks * n) for p, n in zip(grouped.split(list(part_sizes), dim=-1), part_sizes)]


def deinterleave(y: torch.Tensor, part_sizes: Sequence[int], blocks: int) -> torch.Tensor:
    """The fused shard's output reordered to SGLang's [part_0 | part_1 | ...] order."""
    if blocks == 1:
        return y
    return torch.cat(split_blocks(y, part_sizes, blocks), dim=-1)
