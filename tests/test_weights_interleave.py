"""The interleaved storage order on small tensors (pure torch, no SGLang).

For every TP level of a candidate set and every rank, the rank's contiguous
row slice of the interleaved fused weight, with its output split per block,
must equal what SGLang's per-rank shard ([q_r | k_r | v_r], [gate_r | up_r])
computes; row-parallel weights stored transposed must give SGLang's input-dim
shard as a view.
"""

from __future__ import annotations

import pytest
import torch

from tiertp.weights.errors import UnsupportedLevel
from tiertp.weights.interleave import block_count, deinterleave, interleave, rows_of_rank, split_blocks

CASES = [  # (candidate levels, q heads, kv heads)
    ((1, 2, 4), 8, 8),
    ((1, 2, 4, 8), 16, 8),
    ((1, 2, 4), 8, 4),
    ((1, 3), 9, 3),
    ((1, 2), 4, 2),
]
HEAD_DIM, HIDDEN, TOKENS = 4, 12, 5


def _sglang_fused_shard(parts, tp, rank):
    """SGLang's rank shard of a fused weight: each part's rank-th chunk, in part order."""
    return torch.cat([p.chunk(tp, dim=0)[rank] for p in parts], dim=0)


def _levels(levels):
    return [(k, r) for k in levels for r in range(k)]


@pytest.mark.parametrize("levels,heads,kv_heads", CASES)
def test_qkv_shard_matches_sglang_after_block_split(levels, heads, kv_heads):
    torch.manual_seed(0)
    blocks = block_count(levels)
    q = torch.randn(heads * HEAD_DIM, HIDDEN)
    k = torch.randn(kv_heads * HEAD_DIM, HIDDEN)
    v = torch.randn(kv_heads * HEAD_DIM, HIDDEN)
    stored = interleave([q, k, v], blocks)
    per_block = (q.shape[0] // blocks, k.shape[0] // blocks, v.shape[0] // blocks)
    x = torch.randn(TOKENS, HIDDEN)
    for tp, rank in _levels(levels):
        start, stop = rows_of_rank(blocks, tp, rank)
        shard = stored[start * sum(per_block) : stop * sum(per_block)]
        assert shard.is_contiguous() and shard.data_ptr() == stored[start * sum(per_block)].data_ptr()
        ref = _sglang_fused_shard([q, k, v], tp, rank)
        # Same rows, reordered per block: exact.
        assert torch.equal(deinterleave(shard.t(), per_block, stop - start).t(), ref)
        # And the activation split gives SGLang's q, k, v.
        ref_q, ref_k, ref_v = (x @ ref.t()).split([q.shape[0] // tp, k.shape[0] // tp, v.shape[0] // tp], dim=-1)
        got_q, got_k, got_v = split_blocks(x @ shard.t(), per_block, stop - start)
        for got, want in ((got_q, ref_q), (got_k, ref_k), (got_v, ref_v)):
            assert got.shape == want.shape
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("levels", [(1, 2, 4), (1, 3), (1, 2, 4, 8), (2, 4)])
def test_gate_up_shard_matches_sglang_after_deinterleave(levels):
    torch.manual_seed(1)
    blocks = block_count(levels)
    inter = 24
    gate, up = torch.randn(inter, HIDDEN), torch.randn(inter, HIDDEN)
    stored = interleave([gate, up], blocks)
    per_block = (inter // blocks, inter // blocks)
    x = torch.randn(TOKENS, HIDDEN)
    for tp, rank in _levels(levels):
        start, stop = rows_of_rank(blocks, tp, rank)
        shard = stored[start * sum(per_block) : stop * sum(per_block)]
        ref = _sglang_fused_shard([gate, up], tp, rank)
        assert torch.equal(deinterleave(shard.t(), per_block, stop - start).t(), ref)
        got = deinterleave(x @ shard.t(), per_block, stop - start)
        torch.testing.assert_close(got, x @ ref.t(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("levels", [(1, 2, 4), (1, 3)])
def test_row_parallel_transposed_shard_is_sglang_input_shard(levels):
    torch.manual_seed(2)
    w = torch.randn(HIDDEN, 24)  # [out, in], sharded on `in` by SGLang
    stored = w.t().contiguous()
    for tp, rank in _levels(levels):
        start, stop = rows_of_rank(stored.shape[0], tp, rank)
        param = stored[start:stop].t()
        assert param.data_ptr() == stored[start].data_ptr()  # a view, not a copy
        per = w.shape[1] // tp
        assert torch.equal(param, w[:, rank * per : (rank + 1) * per])


def test_one_block_per_rank_is_sglang_order_without_copy():
    y = torch.randn(TOKENS, 12)
    q, k, v = split_blocks(y, (6, 3, 3), 1)
    assert q.data_ptr() == y.data_ptr()
    assert deinterleave(y, (6, 6), 1) is y


def test_block_count_is_lcm_of_levels():
    assert block_count([1, 2, 4]) == 4
    assert block_count([1, 3]) == 3
    assert block_count([2, 3]) == 6
    with pytest.raises(UnsupportedLevel):
        block_count([])
    with pytest.raises(UnsupportedLevel, match="rank 2 outside TP 2"):
        rows_of_rank(8, 2, 2)
    with pytest.raises(UnsupportedLevel, match="not divisible into 4 blocks"):
        interleave([torch.zeros(6, 2)], 4)
