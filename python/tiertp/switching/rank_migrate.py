"""The `RankCall`s a switch runs inside the ranks of its instances.

`MigrationCall` runs tiertp.kv.migrate in one rank process (`run`): every
rank of every instance taking part runs it at once (the coordinator's
`begin_call` on each instance), joined by a StoreControlGroup over the coordinator's TCPStore
(the instances are separate torch.distributed worlds) and moving the bytes
through shared memory (ShmTransport). A source rank only reads its KV; a
destination rank allocates the slots it receives into (they stay reserved
until the destination adopts the requests or the coordinator frees them).

On CPU every rank's KV buffers are moved into shared memory once (`Warm`, or
a source's first switch; tiertp.execution.kv_view.share_kv_pool), so the
destination ranks copy each request's heads straight out of the source's
pool: one copy per byte, spread over the destination ranks' cores, and
nothing for the source ranks to do.
"""

from __future__ import annotations

import datetime
import hashlib
import time
from array import array
from dataclasses import dataclass

import torch.distributed as dist

from tiertp.execution.kv_view import share_kv_pool
from tiertp.execution.rank_call import RankCall
from tiertp.execution.rank_handle import RankHandle
from tiertp.kv import MigrationContext, MigrationPlan, ShmTransport, StoreControlGroup, migrate
from tiertp.kv.ids import id_tensor

# One client connection per coordinator store and process, reused by every
# switch (a connection, not TP state: what a switch uses is all in its call).
_clients: dict[tuple[str, int], object] = {}
# One shared-memory transport per process: it keeps its staging segments
# mapped between switches (the same processes switch back and forth).
_transport = None
# Slots this process reserved for its last few switches as a destination, by
# switch name: what `FreeReserved` gives back if the switch is rolled back.
_reserved: dict[str, list[int]] = {}
_KEEP_RESERVED = 4


@dataclass(frozen=True)
class MigrationCall(RankCall):
    """One instance's part of a migration: the plan, who its ranks are in it,
    how to meet the others. Each rank answers as `run` does."""

    plan: MigrationPlan
    ids: tuple[int, ...]  # rank r's participant id in the plan
    role: str  # "old" (a source) or "new" (the destination)
    first_member: int  # rank r is member first_member + r of the control group
    members: int
    store: tuple[str, int]  # the coordinator's TCPStore (host, port)
    name: str  # the switch's unique key prefix in the store
    timeout_s: float
    chunk_bytes: int
    # False when a source goes on iterating during the migration (an
    # overlapped hand-off): the destination must not copy on its cores.
    sources_idle: bool = True

    def run(self, handle: RankHandle) -> dict:
        return run(handle, self)


@dataclass(frozen=True)
class FreeReserved(RankCall):
    """Rollback of the switch `name` on a destination: `free_reserved` on every rank."""

    name: str

    def run(self, handle: RankHandle) -> None:
        free_reserved(handle, self.name)


@dataclass(frozen=True)
class Warm(RankCall):
    """`warm` on every rank, meeting the coordinator's store at `store`."""

    store: tuple[str, int]

    def run(self, handle: RankHandle) -> None:
        warm(handle, self.store)


def _client(address: tuple[str, int], timeout_s: float):
    client = _clients.get(address)
    if client is None:
        client = dist.TCPStore(address[0], address[1], is_master=False, wait_for_workers=False,
                               timeout=datetime.timedelta(seconds=timeout_s))
        _clients[address] = client
    return client


def run(handle: RankHandle, call: MigrationCall) -> dict:
    """Migrate this rank's part: byte counts and a digest of its new slots
    per request (a destination's ranks must agree), the slots themselves
    from rank 0 only (they are tens of thousands of ints), or {"id",
    "error"}: every rank answers, so the coordinator knows the switch
    failed (migrate frees a failed rank's own slots; `free_reserved` the
    others')."""
    try:
        return _run(handle, call)
    except Exception as e:  # noqa: BLE001 - reported to the coordinator, which rolls back
        return {"id": call.ids[handle.ctx.rank], "error": f"{type(e).__name__}: {e}"}


def _shm_transport():
    global _transport
    if _transport is None:
        _transport = ShmTransport()
    return _transport


def _run(handle: RankHandle, call: MigrationCall) -> dict:
    start = time.perf_counter()
    rank = handle.ctx.rank
    me = call.ids[rank]
    group = StoreControlGroup(_client(call.store, call.timeout_s), call.first_member + rank, call.members, call.name,
                              timeout_s=call.timeout_s)
    ctx = MigrationContext(gpu=me, group=group, gpu_to_rank={}, timeout_s=call.timeout_s)
    pool = handle.kv_pool()
    if call.role == "old":
        share_kv_pool(handle)  # once per process; a no-op after `warm`
    old_pool, new_pool = (pool, None) if call.role == "old" else (None, pool)
    result = migrate(ctx, call.plan, old_pool, new_pool, transport=_shm_transport(), chunk_bytes=call.chunk_bytes,
                     borrow_source_cores=call.sources_idle)
    if result.pages:
        _reserved[call.name] = [slot for pages in result.pages.values() for slot in pages]
        while len(_reserved) > _KEEP_RESERVED:
            del _reserved[next(iter(_reserved))]
    out = {"id": me, "pages_digest": pages_digest(result.pages), "bytes_sent": sum(result.bytes_sent.values()),
           "bytes_received": sum(result.bytes_received.values()), "bytes_local": result.bytes_local,
           "bytes_pulled": sum(result.bytes_received.get(src, 0) for src, dst in result.pulled if dst == me),
           "ms": (time.perf_counter() - start) * 1e3}
    if rank == 0:  # packed: a tenth of the pickling of as many Python ints
        out["pages"] = {rid: array("q", pages) for rid, pages in result.pages.items()}
    return out


def pages_digest(pages: dict[str, list[int]]) -> str:
    """The same on every rank that allocated the same slots for the same requests."""
    h = hashlib.blake2b(digest_size=16)
    for rid in sorted(pages):
        h.update(rid.encode() + b"\0" + array("q", pages[rid]).tobytes())
    return h.hexdigest()


def free_reserved(handle: RankHandle, name: str) -> None:
    """Rollback: free the slots this rank reserved for the switch `name`,
    those still reserved (a rank whose migration failed freed its own already)."""
    ids = id_tensor(_reserved.pop(name, []))
    handle.kv.free_reserved(ids[handle.kv.reserved[ids]].tolist())


def warm(handle: RankHandle, address: tuple[str, int]) -> None:
    """Pay a rank's one-off costs before its first switch: the migration code
    is imported with this module (when the rank unpickles the call), then
    build the KV pool view and share it, connect to the coordinator's store."""
    _shm_transport()
    share_kv_pool(handle)
    _client(tuple(address), 60.0)
