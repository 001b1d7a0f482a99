"""Runs migration scenarios across local processes, one per simulated GPU.

Used by the acceptance tests (tests/test_kv_migration.py; a test helper, not
part of tiertp): each process joins a gloo
group, builds the pools its GPU has in the old and new layouts, fills the
old ones with random bits, migrates, and saves what it held before and
after, so the caller can check bit-identity and byte counts from outside.
Every process is joined with a deadline and killed if it overstays.

control="store" runs the processes with no torch.distributed world at all:
the handshake goes through a StoreControlGroup on a FileStore and the bytes
through shared memory, as between the execution processes of two TP levels
(each its own SGLang world) during a TP switch.

Each process keeps one transport object per kind for all its scenarios, as
an execution process does for all its switches (the shared-memory transport
reuses its staging segments from one migration to the next). A scenario
with `share_old` first puts the old pools in shared memory, so shm
receivers pull those pairs straight out of them.
"""

from __future__ import annotations

import contextlib
import faulthandler
import multiprocessing as mp
import os
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from tiertp.kv.context import MigrationContext
from tiertp.kv.control import StoreControlGroup
from tiertp.kv.dist_transport import DistTransport
from tiertp.kv.errors import MigrationAborted
from tiertp.kv.executor import migrate
from tiertp.kv.layout import Layout, heads_on
from tiertp.kv.plan import RequestKV
from tiertp.kv.planner import plan_migration
from tiertp.kv.pool import KVPool
from tiertp.kv.shape import KVShape
from tiertp.kv.shared_pool import share_pool
from tiertp.kv.shm_transport import ShmTransport

TRANSPORTS = {"dist": DistTransport, "shm": ShmTransport}


@dataclass
class Scenario:
    """One migration. `old_pages` / `new_pages`: usable pages of each GPU's
    old / new pool (GPUs not listed get `default_pages`). Requests' page ids
    refer to their old group's pool."""

    shape: KVShape
    old: Layout
    new: Layout
    requests: list[RequestKV]
    seed: int = 0
    old_pages: dict[int, int] = field(default_factory=dict)
    new_pages: dict[int, int] = field(default_factory=dict)
    default_pages: int = 64
    chunk_bytes: int = 4096
    slots: int = 2
    transport: str = "dist"
    share_old: bool = False


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def _fill_group(sc: Scenario, group_index: int, pool: KVPool) -> None:
    """Random bits, identical for every rank of the group for the heads they
    share (so replicated heads really are replicas): generate all heads from
    one seed, keep this rank's slice."""
    s = sc.shape
    gen = torch.Generator().manual_seed(sc.seed * 1000 + group_index)
    slots = (pool.num_pages + 1) * s.page_size
    full = torch.randint(-(2 ** 15), 2 ** 15, (s.num_layers, 2, slots, s.num_kv_heads, s.head_dim * s.itemsize // 2),
                         generator=gen, dtype=torch.int32).to(torch.int16).view(s.dtype)
    full = full.view(s.num_layers, 2, slots, s.num_kv_heads, s.head_dim)
    pool.block.copy_(full[:, :, :, pool.heads.start:pool.heads.stop])


def _worker(rank: int, world: int, store: str, scenarios: list[Scenario], outdir: str, timeout_s: float,
            control: str) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    # If we are about to be killed for overstaying, say where we were stuck.
    faulthandler.dump_traceback_later(max(1.0, timeout_s - 5), exit=False)
    torch.set_num_threads(1)
    transports = {name: make() for name, make in TRANSPORTS.items()}
    if control == "store":
        group = StoreControlGroup(dist.FileStore(store, world), rank, world, "kv-harness", timeout_s=60)
        ctx = MigrationContext(gpu=rank, group=group, gpu_to_rank={g: g for g in range(world)}, timeout_s=60)
        for i, sc in enumerate(scenarios):
            torch.save(_run_one(ctx, sc, transports[sc.transport]), Path(outdir) / f"{i}-{rank}.pt")
        return
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    group = dist.new_group(list(range(world)), backend="gloo")
    ctx = MigrationContext(gpu=rank, group=group, gpu_to_rank={g: g for g in range(world)}, timeout_s=60)
    try:
        for i, sc in enumerate(scenarios):
            torch.save(_run_one(ctx, sc, transports[sc.transport]), Path(outdir) / f"{i}-{rank}.pt")
    finally:
        dist.destroy_process_group()


def _run_one(ctx: MigrationContext, sc: Scenario, transport) -> dict:
    gpu, s = ctx.gpu, sc.shape
    out: dict = {"before": {}, "after": {}, "aborted": None}
    old_pool = new_pool = None
    for gi, g in enumerate(sc.old.groups):
        if gpu in g.gpus:
            old_pool = KVPool.allocate(s, heads_on(g, gpu, s.num_kv_heads), sc.old_pages.get(gpu, sc.default_pages), gpu)
            _fill_group(sc, gi, old_pool)
            mine = [r for r in sc.requests if r.src_group == gi]
            old_pool.allocator.take([p for r in mine for p in r.pages])
            out["before"] = {r.request_id: old_pool.read_pages(list(r.pages[:s.pages_for(r.context_len)]))
                             for r in mine}
            snapshot = old_pool.block.clone()
            if sc.share_old:
                share_pool(old_pool)
    for g in sc.new.groups:
        if gpu in g.gpus:
            new_pool = KVPool.allocate(s, heads_on(g, gpu, s.num_kv_heads), sc.new_pages.get(gpu, sc.default_pages), gpu)
    plan = plan_migration(s, sc.old, sc.new, sc.requests)
    free_before = new_pool.allocator.free_pages if new_pool else None
    try:
        res = migrate(ctx, plan, old_pool, new_pool, transport=transport, chunk_bytes=sc.chunk_bytes,
                      slots=sc.slots)
        out["after"] = {rid: new_pool.read_pages(pages) for rid, pages in res.pages.items()}
        out["pages"] = res.pages
        out["bytes_sent"], out["bytes_received"], out["bytes_local"] = (
            res.bytes_sent, res.bytes_received, res.bytes_local)
        out["pulled"] = res.pulled
    except MigrationAborted as e:
        out["aborted"] = dict(e.reasons)
        out["new_free_unchanged"] = new_pool is None or new_pool.allocator.free_pages == free_before
        out["new_pool_untouched"] = new_pool is None or not bool(_bits(new_pool.block).any())
    if old_pool is not None:
        out["old_pool_untouched"] = torch.equal(_bits(snapshot), _bits(old_pool.block))
    return out


def _entry(rank, world, store, scenarios, outdir, errq, timeout_s, control):
    try:
        _worker(rank, world, store, scenarios, outdir, timeout_s, control)
    except BaseException:
        errq.put((rank, traceback.format_exc()))
        raise


def run_world(world: int, scenarios: list[Scenario], timeout_s: float = 120.0,
              control: str = "torch") -> list[dict[int, dict]]:
    """Run every scenario on `world` processes (GPU ids 0..world-1); returns,
    per scenario, GPU -> what that process saved. Raises RuntimeError with
    the children's tracebacks if any failed or overstayed the deadline.
    control: "torch" (one gloo world) or "store" (no world; shm transport only)."""
    if control not in ("torch", "store"):
        raise ValueError(f"control {control!r}: expected 'torch' or 'store'")
    spawn = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="tiertp-kv-") as tmp:
        store = os.path.join(tmp, "store")
        errq = spawn.Queue()
        procs = [spawn.Process(target=_entry, args=(r, world, store, scenarios, tmp, errq, timeout_s, control), daemon=True)
                 for r in range(world)]
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout_s
        for p in procs:
            p.join(max(0.1, deadline - time.monotonic()))
        hung = [r for r, p in enumerate(procs) if p.is_alive()]
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(5)
        errors = []
        while not errq.empty():
            errors.append(errq.get_nowait())
        bad = [r for r, p in enumerate(procs) if p.exitcode != 0]
        if hung or bad or errors:
            detail = "\n".join(f"--- rank {r} ---\n{tb}" for r, tb in errors)
            raise RuntimeError(f"KV migration processes failed (hung: {hung}, exit != 0: {bad})\n{detail}")
        return [{g: torch.load(Path(tmp) / f"{i}-{g}.pt", weights_only=False) for g in range(world)}
                for i in range(len(scenarios))]


@contextlib.contextmanager
def one_rank_context(store_dir: Path, timeout_s: float = 30):
    """A MigrationContext of this process alone (a one-rank gloo group): migrations within one GPU."""
    dist.init_process_group("gloo", init_method=f"file://{store_dir / 'store'}", rank=0, world_size=1)
    try:
        yield MigrationContext(gpu=0, group=dist.group.WORLD, gpu_to_rank={0: 0}, timeout_s=timeout_s)
    finally:
        dist.destroy_process_group()
