"""The `call_on_ranks` targets a switch runs inside the ranks of its instances.

`run` is tiertp.kv.migrate in one rank process: every rank of every instance
taking part calls it at once (the coordinator's `begin_call` on each
instance), joined by a StoreControlGroup over the coordinator's TCPStore
(the instances are separate torch.distributed worlds) and moving the bytes
through shared memory (ShmTransport). A source rank only reads its KV; a
destination rank allocates the slots it receives into (they stay reserved
until the destination adopts the requests or the coordinator frees them).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from tiertp.kv import MigrationPlan

RUN = "tiertp.switching.rank_migrate:run"
FREE = "tiertp.switching.rank_migrate:free_reserved"
WARM = "tiertp.switching.rank_migrate:warm"

# One client connection per coordinator store and process, reused by every
# switch (a connection, not TP state: what a switch uses is all in its call).
_clients: dict[tuple[str, int], object] = {}


@dataclass(frozen=True)
class MigrationCall:
    """What one instance's ranks need: the plan, who they are in it, how to meet the others."""

    plan: MigrationPlan
    ids: tuple[int, ...]  # rank r's participant id in the plan
    role: str  # "old" (a source) or "new" (the destination)
    first_member: int  # rank r is member first_member + r of the control group
    members: int
    store: tuple[str, int]  # the coordinator's TCPStore (host, port)
    name: str  # the switch's unique key prefix in the store
    timeout_s: float
    chunk_bytes: int


def _client(address: tuple[str, int], timeout_s: float):
    import datetime

    import torch.distributed as dist

    client = _clients.get(address)
    if client is None:
        client = dist.TCPStore(address[0], address[1], is_master=False, wait_for_workers=False,
                               timeout=datetime.timedelta(seconds=timeout_s))
        _clients[address] = client
    return client


def run(handle, call: MigrationCall) -> dict:
    """Migrate this rank's part; its new slots per request (destination) and
    byte counts, or {"id", "error"}: every rank answers, so the coordinator
    knows which destination ranks hold slots to free (migrate frees a failed
    rank's own)."""
    try:
        return _run(handle, call)
    except Exception as e:  # noqa: BLE001 - reported to the coordinator, which rolls back
        return {"id": call.ids[handle.ctx.rank], "error": f"{type(e).__name__}: {e}"}


def _run(handle, call: MigrationCall) -> dict:
    from tiertp.kv import MigrationContext, ShmTransport, StoreControlGroup, migrate

    start = time.perf_counter()
    rank = handle.ctx.rank
    me = call.ids[rank]
    group = StoreControlGroup(_client(call.store, call.timeout_s), call.first_member + rank, call.members, call.name,
                              timeout_s=call.timeout_s)
    ctx = MigrationContext(gpu=me, group=group, gpu_to_rank={}, timeout_s=call.timeout_s)
    pool = handle.kv_pool()
    old_pool, new_pool = (pool, None) if call.role == "old" else (None, pool)
    result = migrate(ctx, call.plan, old_pool, new_pool, transport=ShmTransport(), chunk_bytes=call.chunk_bytes)
    return {"id": me, "pages": result.pages, "bytes_sent": sum(result.bytes_sent.values()),
            "bytes_received": sum(result.bytes_received.values()), "bytes_local": result.bytes_local,
            "ms": (time.perf_counter() - start) * 1e3}


def free_reserved(handle, per_rank: list[list[int]]) -> None:
    """Rollback: free the slots rank r reserved for a failed switch (`per_rank[r]`),
    those still reserved (a rank whose migration failed freed its own already)."""
    import torch

    slots = [s for s in per_rank[handle.ctx.rank] if bool(handle.kv.reserved[torch.tensor(s)])]
    handle.kv.free_reserved(slots)


def warm(handle, address: tuple[str, int]) -> None:
    """Pay a rank's one-off costs before its first switch: import the
    migration code, build the KV pool view, connect to the coordinator's store."""
    import tiertp.kv.executor  # noqa: F401 - the import is the point
    import tiertp.kv.shm_transport  # noqa: F401

    handle.kv_pool()
    _client(tuple(address), 60.0)
