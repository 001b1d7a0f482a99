"""Migration inside one process (a one-rank gloo group): local copies, and the
handshake refusing pools that do not match the plan."""

import pytest
import torch
from kv_harness import one_rank_context

from tiertp.kv import HeadRange, KVPool, KVShape, Layout, MigrationAborted, RequestKV, migrate, plan_migration


@pytest.fixture
def ctx(tmp_path):
    with one_rank_context(tmp_path) as c:
        yield c


def _pool(shape, heads, pages, seed):
    pool = KVPool.allocate(shape, heads, pages)
    gen = torch.Generator().manual_seed(seed)
    pool.block.view(torch.int16).copy_(torch.randint(-(2 ** 15), 2 ** 15, pool.block.shape, generator=gen))
    return pool


def test_same_gpu_move_between_pools_is_local(ctx):
    shape = KVShape(num_layers=3, num_kv_heads=4, head_dim=8, page_size=2)
    old = _pool(shape, HeadRange(0, 4), 10, seed=1)
    new = KVPool.allocate(shape, HeadRange(0, 4), 10)
    reqs = [RequestKV("a", (7, 2, 9), 5, 0, 0), RequestKV("b", (4,), 1, 0, 0)]
    old.allocator.take([7, 2, 9, 4])
    plan = plan_migration(shape, Layout.of((0,)), Layout.of((0,)), reqs)
    res = migrate(ctx, plan, old, new, chunk_bytes=100)
    assert res.bytes_sent == {} and res.bytes_received == {}
    assert res.bytes_local == plan.bytes_local() == 4 * shape.page_bytes(4)
    for r in reqs:
        src = old.read_pages(list(r.pages))
        assert torch.equal(src.view(torch.int16), new.read_pages(res.pages[r.request_id]).view(torch.int16))


def test_pool_not_matching_the_plan_aborts_before_allocating(ctx):
    shape = KVShape(num_layers=1, num_kv_heads=4, head_dim=8, page_size=2)
    old = _pool(shape, HeadRange(0, 4), 4, seed=2)
    new = KVPool.allocate(shape, HeadRange(0, 2), 4)  # holds 2 heads, the TP1 plan wants 4
    plan = plan_migration(shape, Layout.of((0,)), Layout.of((0,)), [RequestKV("a", (1,), 2, 0, 0)])
    with pytest.raises(MigrationAborted, match="expects HeadRange") as err:
        migrate(ctx, plan, old, new)
    assert list(err.value.reasons) == [0]
    assert new.allocator.free_pages == 4 and not new.block.view(torch.int16).any()
