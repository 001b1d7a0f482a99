"""The shared-memory side of KV migration, in one process (two participants
as threads over a StoreControlGroup on a HashStore):

- staging segments are kept and reused between the same two transports,
  replaced when too small, and never left in /dev/shm;
- a pool shared with share_pool keeps every existing tensor and view working,
  and a receiver pulls from it straight into its new pool (no segment);
- a pool view refuses an fd that no longer is the exported file;
- id_tensor and RequestState.with_slots, the fast paths around them.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
import torch.distributed as dist

from tiertp.execution.records import RequestState, Sampling
from tiertp.kv import (HeadRange, KVPool, KVShape, Layout, MigrationContext, RequestKV, ShmTransport,
                       StoreControlGroup, heads_on, migrate, plan_migration)
from tiertp.kv.ids import id_tensor
from tiertp.kv.shared_pool import PoolMaps, share_pool

SHAPE = KVShape(num_layers=2, num_kv_heads=4, head_dim=8, page_size=1, dtype=torch.float32)
OLD, NEW = Layout.of((0,)), Layout.of((1, 2))  # TP1 -> TP2: each receiver takes half of the heads


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32)  # random bits hold NaNs: compare bitwise


def _filled(heads: HeadRange, pages: int, seed: int) -> KVPool:
    pool = KVPool.allocate(SHAPE, heads, pages)
    gen = torch.Generator().manual_seed(seed)
    pool.block.view(torch.int32).copy_(torch.randint(-(2 ** 31), 2 ** 31 - 1, pool.block.shape, generator=gen))
    return pool


class _World:
    """One sender (GPU 0) and two receivers (GPUs 1, 2), each with a transport
    kept for every migration, as execution processes keep theirs."""

    def __init__(self, old_pool: KVPool):
        self.old = old_pool
        self.transports = {gpu: ShmTransport() for gpu in (0, 1, 2)}
        self.store = dist.HashStore()
        self.calls = 0

    def migrate(self, reqs: list[RequestKV], chunk_bytes: int):
        plan = plan_migration(SHAPE, OLD, NEW, reqs)
        name, self.calls = f"m{self.calls}", self.calls + 1
        pools = {1: KVPool.allocate(SHAPE, HeadRange(0, 2), 64), 2: KVPool.allocate(SHAPE, HeadRange(2, 4), 64)}

        def run(gpu):
            group = StoreControlGroup(self.store, gpu, 3, name, timeout_s=30)
            ctx = MigrationContext(gpu=gpu, group=group, gpu_to_rank={}, timeout_s=30)
            return migrate(ctx, plan, self.old if gpu == 0 else None, pools.get(gpu),
                           transport=self.transports[gpu], chunk_bytes=chunk_bytes)

        with ThreadPoolExecutor(3) as ex:
            results = dict(zip((0, 1, 2), ex.map(run, (0, 1, 2))))
        for gpu in (1, 2):
            h = heads_on(NEW.groups[0], gpu, SHAPE.num_kv_heads)
            for r in reqs:
                want = self.old.read_pages(list(r.pages))[:, :, :, :, h.start:h.stop]
                got = pools[gpu].read_pages(results[gpu].pages[r.request_id])
                assert torch.equal(_bits(want), _bits(got)), (gpu, r.request_id)
        return results


def _requests(first_page: int = 1) -> list[RequestKV]:
    return [RequestKV("a", tuple(range(first_page, first_page + 9)), 9, 0, 0),
            RequestKV("b", (40, 3, 33, 12), 4, 0, 0)]


def _shm_files() -> set:
    return {f for f in os.listdir("/dev/shm") if f.startswith("tiertp-kv-")}


def test_staging_segments_are_kept_and_reused_between_the_same_transports():
    before = _shm_files()
    world = _World(_filled(HeadRange(0, 4), 64, seed=1))
    first = world.migrate(_requests(), chunk_bytes=256)
    assert all(r.pulled == frozenset() for r in first.values())
    segments = dict(world.transports[0]._sent)
    assert len(segments) == 2 and all(seg.clean for seg in segments.values())
    world.migrate(_requests(20), chunk_bytes=128)  # smaller chunks fit the kept segments
    assert {k: id(v) for k, v in world.transports[0]._sent.items()} == {k: id(v) for k, v in segments.items()}
    world.migrate(_requests(), chunk_bytes=4096)  # larger ones do not: new segments
    assert not set(map(id, world.transports[0]._sent.values())) & set(map(id, segments.values()))
    assert _shm_files() <= before  # every file was unlinked once mapped


def test_a_shared_old_pool_is_pulled_by_the_receivers_with_no_staging():
    old = _filled(HeadRange(0, 4), 64, seed=2)
    export = share_pool(old)
    assert export is not None and share_pool(old) is export  # once
    world = _World(old)
    results = world.migrate(_requests(), chunk_bytes=256)
    assert all(r.pulled == {(0, 1), (0, 2)} for r in results.values())
    assert results[0].bytes_sent == {1: results[1].bytes_received[0], 2: results[2].bytes_received[0]}
    assert world.transports[0]._sent == {}  # the sender staged nothing


def test_sharing_a_pool_keeps_its_tensors_and_views_and_peers_read_it():
    pool = _filled(HeadRange(0, 4), 16, seed=3)
    layer0, row5 = pool.k_buffers[0], pool.k_buffers[0][5]  # held across the move, as an engine holds its own
    before = pool.block.clone()
    export = share_pool(pool)
    assert pool.block.untyped_storage().is_shared() and torch.equal(_bits(pool.block), _bits(before))
    layer0[5].fill_(1.5)  # written through an old view, after the move
    assert torch.equal(row5, torch.full_like(row5, 1.5))
    view = PoolMaps().view(export)  # this process stands in for a peer: /proc/<pid>/fd works the same
    assert torch.equal(_bits(view.k_buffers[0]), _bits(pool.k_buffers[0]))
    assert torch.equal(_bits(view.v_buffers[1]), _bits(pool.v_buffers[1]))


def test_a_pool_view_refuses_an_fd_that_is_no_longer_the_shared_file():
    pool = _filled(HeadRange(0, 4), 8, seed=4)
    export = share_pool(pool)
    fd, size, (dev, ino) = export.files[0]
    stale = type(export)(**{**export.__dict__, "token": "stale", "files": ((fd, size, (dev, ino + 1)),)})
    assert PoolMaps().view(stale) is None


def test_id_tensor_matches_torch_tensor():
    for ids in ([], [5], list(range(3, 40, 3)), tuple(range(1000))):
        got = id_tensor(ids)
        assert got.dtype == torch.long and torch.equal(got, torch.tensor(list(ids), dtype=torch.long))


def test_with_slots_changes_only_the_slots_and_checks_them():
    s = RequestState("r", (1, 2, 3, 4), 2, 3, (7, 8, 9), Sampling(temperature=0.5))
    moved = s.with_slots([20, 21, 22])
    assert moved.slots == (20, 21, 22) and (moved.rid, moved.token_ids, moved.kv_len, moved.sampling) == \
        (s.rid, s.token_ids, s.kv_len, s.sampling)
    assert s.slots == (7, 8, 9)
    with pytest.raises(ValueError, match="2 slots for kv_len 3"):
        s.with_slots([1, 2])
