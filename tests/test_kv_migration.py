"""KV migration across processes (one per simulated GPU, gloo + shared memory).

After every migration each request's K and V, all layers and all heads, must
be bit-identical to before; the bytes each pair sent must equal what the plan
says must move; an out-of-space receiver must abort the whole migration with
nothing written and the old layout intact.
"""

import os
import random

import pytest
import torch
from kv_harness import Scenario, run_world

from tiertp.kv import KVShape, Layout, RequestKV, assign_destinations, heads_on, plan_migration

pytestmark = pytest.mark.slow

WORLD = 4


def _bits(t):
    return t.view({2: torch.int16, 4: torch.int32}[t.element_size()])


def _layout(rng, gpus):
    tp = rng.choice([t for t in (1, 2, 4) if t <= len(gpus)])
    return Layout.of(*[tuple(gpus[i:i + tp]) for i in range(0, len(gpus), tp)])


def _random_scenario(seed: int, transport: str) -> Scenario:
    rng = random.Random(seed)
    shape = KVShape(num_layers=rng.randint(1, 3), num_kv_heads=rng.choice([1, 2, 4, 8]),
                    head_dim=rng.choice([2, 8]), page_size=rng.choice([1, 2, 4]),
                    dtype=rng.choice([torch.bfloat16, torch.float16, torch.float32]))
    if rng.random() < 0.6:  # TP change on the same GPUs: 1->2, 2->4, 4->1, ...
        old, new = _layout(rng, list(range(WORLD))), _layout(rng, list(range(WORLD)))
    else:  # hand-off between disjoint GPU sets (prefill group -> decode group)
        split = rng.choice([1, 2])
        old, new = _layout(rng, list(range(split))), _layout(rng, list(range(split, WORLD)))
    pages = 40
    reqs, used = [], {}
    for i in range(rng.randint(1, 6)):
        g = rng.randrange(len(old.groups))
        ctx = rng.randint(1, 6 * shape.page_size)
        free = [p for p in range(1, pages + 1) if p not in used.setdefault(g, set())]
        mine = rng.sample(free, shape.pages_for(ctx))  # a random, fragmented page list
        used[g].update(mine)
        reqs.append(RequestKV(f"r{seed}-{i}", tuple(mine), ctx, g, 0))
    reqs = assign_destinations(old, new, reqs)
    return Scenario(shape, old, new, reqs, seed=seed, default_pages=pages,
                    chunk_bytes=rng.choice([1, 256, 4096, 1 << 20]), slots=rng.choice([1, 2, 2]),
                    transport=transport, share_old=rng.random() < 0.5)


def _full_kv(sc: Scenario, layout: Layout, group_of: dict, side: str, res: dict) -> dict:
    """Per request, its whole K/V [L, 2, pages, page_size, H, dim] rebuilt from
    every rank of its group; replicated heads must agree between replicas."""
    out = {}
    for r in sc.requests:
        group = layout.group(group_of[r.request_id])
        full = None
        for gpu in group.gpus:
            part = res[gpu][side][r.request_id]
            h = heads_on(group, gpu, sc.shape.num_kv_heads)
            if full is None:
                full = torch.zeros(*part.shape[:4], sc.shape.num_kv_heads, sc.shape.head_dim, dtype=part.dtype)
                seen = torch.zeros(sc.shape.num_kv_heads, dtype=torch.bool)
            if seen[h.start:h.stop].all():
                assert torch.equal(_bits(full[:, :, :, :, h.start:h.stop]), _bits(part))
            full[:, :, :, :, h.start:h.stop] = part
            seen[h.start:h.stop] = True
        assert seen.all()
        out[r.request_id] = full
    return out


def _check_migrated(sc: Scenario, res: dict) -> None:
    plan = plan_migration(sc.shape, sc.old, sc.new, sc.requests)
    before = _full_kv(sc, sc.old, {r.request_id: r.src_group for r in sc.requests}, "before", res)
    after = _full_kv(sc, sc.new, {r.request_id: r.dst_group for r in sc.requests}, "after", res)
    for rid in before:
        assert torch.equal(_bits(before[rid]), _bits(after[rid])), f"request {rid} changed"
    for gpu, r in res.items():
        assert r["aborted"] is None
        assert r.get("old_pool_untouched", True)
        sent = {d: n for d, n in r["bytes_sent"].items()}
        want = {d: plan.bytes_between(gpu, d) for s, d in plan.remote_pairs() if s == gpu}
        assert sent == want
        assert r["bytes_received"] == {s: plan.bytes_between(s, gpu) for s, d in plan.remote_pairs() if d == gpu}
        assert r["bytes_local"] == plan.bytes_between(gpu, gpu)
    # Shared old pools are pulled by shm receivers (every remote pair); anything else streams.
    pulled = set(plan.remote_pairs()) if sc.share_old and sc.transport == "shm" else set()
    assert all(r["pulled"] == pulled for r in res.values() if r["aborted"] is None)
    # Ranks of one new group allocate the same requests in the same order: same page tables.
    for g in sc.new.groups:
        tables = [res[gpu]["pages"] for gpu in g.gpus]
        assert all(t == tables[0] for t in tables)


@pytest.mark.parametrize("transport", ["dist", "shm"])
def test_random_layouts_and_tp_changes_migrate_bit_identically(transport):
    base = 100 if transport == "dist" else 200
    scenarios = [_random_scenario(base + i, transport) for i in range(16)]
    shm_before = _shm_files()
    results = run_world(WORLD, scenarios, timeout_s=180)
    for sc, res in zip(scenarios, results):
        _check_migrated(sc, res)
    assert _shm_files() <= shm_before  # shared-memory segments are unlinked as soon as mapped


def _shm_files() -> set:
    return {f for f in os.listdir("/dev/shm") if f.startswith("tiertp-kv-")}


def test_named_tp_changes_and_handoffs():
    shape = KVShape(num_layers=2, num_kv_heads=8, head_dim=4, page_size=4)
    cases = [
        (Layout.of((0,), (1,)), Layout.of((0, 1))),          # 1 -> 2
        (Layout.of((0, 1), (2, 3)), Layout.of((0, 1, 2, 3))),  # 2 -> 4
        (Layout.of((0, 1, 2, 3)), Layout.of((0,), (1,), (2,), (3,))),  # 4 -> 1
        (Layout.of((0, 1)), Layout.of((2,))),                # prefill TP2 -> decode TP1 on GPU 2
        (Layout.of((0,)), Layout.of((2, 3))),                # prefill TP1 -> decode TP2
    ]
    scenarios = []
    for i, (old, new) in enumerate(cases):
        reqs = [RequestKV(f"c{i}-{j}", (3 * j + 3, 3 * j + 1, 20 - j), 9 + j, j % len(old.groups), 0) for j in range(3)]
        scenarios.append(Scenario(shape, old, new, assign_destinations(old, new, reqs), seed=i, default_pages=32,
                                  chunk_bytes=600))
    for sc, res in zip(scenarios, run_world(WORLD, scenarios, timeout_s=120)):
        _check_migrated(sc, res)


def test_tp_above_head_count_replicates_heads():
    shape = KVShape(num_layers=2, num_kv_heads=2, head_dim=4, page_size=2)
    old, new = Layout.of((0,), (1,)), Layout.of((0, 1, 2, 3))  # TP4 over 2 heads: 2 replicas each
    reqs = [RequestKV("a", (4, 2), 3, 0, 0), RequestKV("b", (1, 7, 5), 6, 1, 0)]
    sc = Scenario(shape, old, new, reqs, seed=7, default_pages=16, chunk_bytes=64)
    _check_migrated(sc, run_world(WORLD, [sc], timeout_s=120)[0])


@pytest.mark.parametrize("transport", ["dist", "shm"])
def test_out_of_space_receiver_aborts_with_old_layout_intact(transport):
    shape = KVShape(num_layers=2, num_kv_heads=4, head_dim=4, page_size=4)
    old, new = Layout.of((0, 1)), Layout.of((2,), (3,))
    reqs = [RequestKV("a", (5, 1, 3), 12, 0, 0), RequestKV("b", (2, 8), 7, 0, 1)]
    # GPU 3 has 1 free page, request b needs 2: nobody may write anything.
    bad = Scenario(shape, old, new, reqs, seed=3, default_pages=16, new_pages={3: 1}, transport=transport)
    ok = Scenario(shape, old, new, reqs, seed=3, default_pages=16, transport=transport)
    bad_res, ok_res = run_world(WORLD, [bad, ok], timeout_s=120)
    for gpu, r in bad_res.items():
        assert r["aborted"] == {3: "GPU 3: migration needs 2 free KV pages, pool has 1"}
        assert r["new_free_unchanged"] and r["new_pool_untouched"]
        assert r.get("old_pool_untouched", True)
    assert bad_res[0]["before"].keys() == {"a", "b"}
    # The same processes then migrate fine once there is room (nothing was left half-done).
    _check_migrated(ok, ok_res)


def test_store_control_group_joins_processes_without_a_shared_world():
    """A TP switch migrates between execution processes of different TP
    levels, each in its own torch.distributed world: no process group spans
    them. The handshake then runs over a store (StoreControlGroup) and the
    bytes over shared memory; results must be the same as over gloo,
    aborts included."""
    scenarios = [_random_scenario(300 + i, "shm") for i in range(8)]
    shape = KVShape(num_layers=2, num_kv_heads=4, head_dim=4, page_size=4)
    old, new = Layout.of((0, 1)), Layout.of((2,), (3,))
    reqs = [RequestKV("a", (5, 1, 3), 12, 0, 0), RequestKV("b", (2, 8), 7, 0, 1)]
    scenarios.append(Scenario(shape, old, new, reqs, seed=3, default_pages=16, new_pages={3: 1}, transport="shm"))
    results = run_world(WORLD, scenarios, timeout_s=180, control="store")
    for sc, res in zip(scenarios[:-1], results[:-1]):
        _check_migrated(sc, res)
    for r in results[-1].values():
        assert r["aborted"] == {3: "GPU 3: migration needs 2 free KV pages, pool has 1"}
        assert r["new_free_unchanged"] and r["new_pool_untouched"] and r.get("old_pool_untouched", True)
