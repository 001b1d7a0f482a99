"""Migration planner: head splits, coverage, local vs moved, byte counts."""

import random

import pytest
import torch

from tiertp.kv import (HeadRange, KVShape, Layout, LayoutError, RequestKV, assign_destinations,
                       heads_of_rank, heads_on, plan_migration)


def test_heads_split_contiguously_like_sglang():
    assert [heads_of_rank(8, 2, r) for r in range(2)] == [HeadRange(0, 4), HeadRange(4, 8)]
    assert [heads_of_rank(8, 4, r).start for r in range(4)] == [0, 2, 4, 6]
    # TP > heads: SGLang replicates, rank r holds head r * H // TP.
    assert [heads_of_rank(2, 8, r).start for r in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]


@pytest.mark.parametrize("heads,tp", [(6, 4), (8, 3), (3, 2)])
def test_unsplittable_head_counts_are_rejected(heads, tp):
    with pytest.raises(LayoutError):
        heads_of_rank(heads, tp, 0)


def test_layout_rejects_overlapping_groups():
    with pytest.raises(LayoutError, match="two TP groups"):
        Layout.of((0, 1), (1, 2))
    with pytest.raises(LayoutError, match="power of two"):
        Layout.of((0, 1, 2))


def test_tp2_to_tp1_keeps_local_heads_and_moves_the_rest():
    shape = KVShape(num_layers=2, num_kv_heads=8, head_dim=4, page_size=4)
    plan = plan_migration(shape, Layout.of((0, 1)), Layout.of((0,), (1,)),
                          [RequestKV("a", (3, 5, 7), 9, 0, 0)])
    moves = {(m.src_gpu, m.dst_gpu): m.heads for m in plan.moves}
    assert moves == {(0, 0): HeadRange(0, 4), (1, 0): HeadRange(4, 8)}
    assert plan.bytes_to_move() == 3 * shape.page_bytes(4)
    assert plan.bytes_local() == 3 * shape.page_bytes(4)


def test_prefill_tp2_to_decode_tp1_on_a_disjoint_gpu():
    shape = KVShape(2, 8, 4, 4)
    plan = plan_migration(shape, Layout.of((0, 1)), Layout.of((2,)), [RequestKV("a", (3, 5), 8, 0, 0)])
    assert plan.remote_pairs() == [(0, 2), (1, 2)]
    assert plan.bytes_local() == 0
    assert plan.pages_needed(2) == {"a": 2}


def test_only_pages_holding_context_move():
    shape = KVShape(1, 2, 2, page_size=4)
    plan = plan_migration(shape, Layout.of((0,)), Layout.of((1,)), [RequestKV("a", (3, 5, 7, 9), 5, 0, 0)])
    assert [m.src_pages for m in plan.moves] == [(3, 5)]


@pytest.mark.parametrize("req", [RequestKV("a", (3,), 9, 0, 0), RequestKV("a", (3, 3), 8, 0, 0),
                                 RequestKV("a", (0, 1), 8, 0, 0), RequestKV("a", (1,), 1, 0, 5)])
def test_bad_requests_are_rejected(req):
    with pytest.raises(LayoutError):
        plan_migration(KVShape(1, 2, 2, 4), Layout.of((0,)), Layout.of((1,)), [req])


def _random_layout(rng, gpus):
    tp = rng.choice([t for t in (1, 2, 4, 8) if t <= len(gpus)])
    return Layout.of(*[tuple(gpus[i:i + tp]) for i in range(0, len(gpus), tp)])


@pytest.mark.parametrize("seed", range(40))
def test_every_new_rank_gets_exactly_its_heads_once(seed):
    rng = random.Random(seed)
    heads = rng.choice([1, 2, 4, 8])
    shape = KVShape(rng.randint(1, 4), heads, 8, rng.choice([1, 4, 16]))
    old = _random_layout(rng, list(range(8)))
    new = _random_layout(rng, list(range(8)) if rng.random() < 0.5 else list(range(8, 8 + rng.choice([1, 2, 4]))))
    reqs = [RequestKV(f"r{i}", tuple(rng.sample(range(1, 500), 20)), rng.randint(1, 20 * shape.page_size),
                      rng.randrange(len(old.groups)), 0) for i in range(rng.randint(1, 6))]
    reqs = assign_destinations(old, new, reqs)
    plan = plan_migration(shape, old, new, reqs)
    for r in reqs:
        src, dst = old.group(r.src_group), new.group(r.dst_group)
        for gpu in dst.gpus:
            got = sorted(h for m in plan.moves if m.request_id == r.request_id and m.dst_gpu == gpu
                         for h in range(m.heads.start, m.heads.stop))
            want = heads_on(dst, gpu, heads)
            assert got == list(range(want.start, want.stop))
        for m in plan.moves:
            if m.request_id == r.request_id:
                held = heads_on(src, m.src_gpu, heads)
                assert held.start <= m.heads.start and m.heads.stop <= held.stop
                # A head the destination already holds is never fetched from elsewhere.
                if m.dst_gpu in src.gpus and not m.local:
                    assert heads_on(src, m.dst_gpu, heads).intersect(m.heads) is None
    total = sum(m.nbytes(shape) for m in plan.moves)
    assert plan.bytes_to_move() + plan.bytes_local() == total
    assert sum(plan.bytes_between(s, d) for s, d in plan.remote_pairs()) == plan.bytes_to_move()


def test_assign_destinations_prefers_overlapping_groups():
    old, new = Layout.of((0, 1), (2, 3)), Layout.of((0,), (1,), (2,), (3,))
    reqs = [RequestKV(f"r{i}", (i + 1,), 10 + i, i % 2, 0) for i in range(4)]
    out = assign_destinations(old, new, reqs)
    for r in out:
        assert set(new.group(r.dst_group).gpus) <= set(old.group(r.src_group).gpus)
    assert len({r.dst_group for r in out}) == 4  # balanced over the four TP1 groups


def test_shape_counts_bytes_per_page():
    assert KVShape(32, 8, 128, 16, torch.bfloat16).page_bytes(8) == 32 * 2 * 16 * 8 * 128 * 2
