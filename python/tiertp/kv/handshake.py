"""The handshake before any KV byte moves: agree on the plan, allocate, vote.

It also settles which pairs the receiver pulls (Transport.offer / accept):
the offers travel with the manifests and the acceptances with the votes, so
that costs no extra round.
"""

from __future__ import annotations

from tiertp.kv.channel import Pulls, Transport
from tiertp.kv.context import MigrationContext
from tiertp.kv.errors import KVMigrationError, LayoutError, MigrationAborted, OutOfKVSpace
from tiertp.kv.layout import heads_on
from tiertp.kv.plan import MigrationPlan
from tiertp.kv.pool import KVPool


def _manifest(plan: MigrationPlan, gpu: int) -> dict:
    """What this GPU will send: per destination (request, heads, context
    length, page count), plus the KV shape. Page ids stay private to each
    side: the receiver writes into pages it allocates itself."""
    ctx_len = {r.request_id: r.context_len for r in plan.requests}
    sends = {}
    for src, dst in plan.remote_pairs():
        if src == gpu:
            sends[dst] = [(m.request_id, m.heads.start, m.heads.stop, ctx_len[m.request_id], m.num_pages)
                          for m in plan.pair(src, dst)]
    return {"gpu": gpu, "shape": plan.shape.signature(), "sends": sends}


def _check_pool(plan: MigrationPlan, gpu: int, pool: KVPool | None, which: str) -> None:
    layout = plan.old if which == "old" else plan.new
    group = next((g for g in layout.groups if gpu in g.gpus), None)
    if group is None:
        return
    if pool is None:
        raise LayoutError(f"GPU {gpu} is in the {which} layout but was given no {which} pool")
    want = heads_on(group, gpu, plan.shape.num_kv_heads)
    if pool.heads != want or pool.shape != plan.shape:
        raise LayoutError(f"{which} pool holds heads {pool.heads} of {pool.shape}; "
                          f"the plan expects {want} of {plan.shape}")


def handshake(ctx: MigrationContext, plan: MigrationPlan, old_pool: KVPool | None,
              new_pool: KVPool | None, transport: Transport | None = None) -> tuple[dict[str, list[int]], Pulls]:
    """Collective over ctx.group. Every participant checks that its peers'
    manifests match its own plan and that its pools fit the plan; each
    receiver allocates, in its new pool, the pages of every request it will
    hold, and accepts what it can of the senders' transport offers. Then
    all vote: if any failed (mismatch, or OutOfKVSpace), every participant
    frees what it allocated and raises MigrationAborted naming the
    failures, before any KV byte was written anywhere. Returns request id ->
    allocated pages on this GPU (empty if it receives nothing), and the
    pairs the receivers pull (the same on every participant)."""
    offer = transport.offer(old_pool) if transport is not None else None
    manifests = ctx.control.all_gather_object({**_manifest(plan, ctx.gpu), "offer": offer})

    allocated: dict[str, list[int]] = {}
    pools: dict = {}
    error = None
    try:
        _check_pool(plan, ctx.gpu, old_pool, "old")
        _check_pool(plan, ctx.gpu, new_pool, "new")
        for peer in manifests:
            if peer["shape"] != plan.shape.signature():
                raise LayoutError(f"GPU {peer['gpu']} has KV shape {peer['shape']}, "
                                  f"this GPU {plan.shape.signature()}")
            mine = _manifest(plan, peer["gpu"])["sends"].get(ctx.gpu, [])
            if peer["sends"].get(ctx.gpu, []) != mine:
                raise LayoutError(f"GPU {peer['gpu']} plans to send a different set of heads/pages "
                                  "than this GPU's plan says (stale or mismatched plan)")
        need = plan.pages_needed(ctx.gpu)
        if need:
            free = new_pool.allocator.free_pages
            total = sum(need.values())
            if total > free:
                raise OutOfKVSpace(ctx.gpu, total, free)
            for rid, n in need.items():
                allocated[rid] = new_pool.allocator.alloc(n)
        if transport is not None:
            pools = transport.accept(ctx, plan, {m["gpu"]: m["offer"] for m in manifests})
    except KVMigrationError as e:
        error = str(e)

    votes = ctx.control.all_gather_object((ctx.gpu, error, sorted(pools)))
    failed = {gpu: reason for gpu, reason, _ in votes if reason is not None}
    if failed:
        for pages in allocated.values():
            new_pool.allocator.free(pages)
        raise MigrationAborted(failed)
    return allocated, Pulls(frozenset((src, gpu) for gpu, _, srcs in votes for src in srcs), pools)
