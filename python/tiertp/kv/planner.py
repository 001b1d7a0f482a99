"""The migration planner: old layout + new layout + requests -> moves."""

from __future__ import annotations

from tiertp.kv.errors import LayoutError
from tiertp.kv.layout import HeadRange, Layout, heads_on
from tiertp.kv.plan import MigrationPlan, Move, RequestKV
from tiertp.kv.shape import KVShape
from tiertp.tp_group import TpGroup


def plan_migration(shape: KVShape, old: Layout, new: Layout, requests: list[RequestKV]) -> MigrationPlan:
    """For every request and every rank of its new group, which old rank sends
    which heads. A head already on the destination GPU in the old layout is
    copied locally; otherwise it comes from a rank holding it (with replicated
    heads, TP > num_kv_heads, replicas are chosen round-robin by destination
    rank so senders share the load). Consecutive heads from one source merge
    into one move. Works for any TP change, including hand-off between
    disjoint GPU sets."""
    moves: list[Move] = []
    seen: set[str] = set()
    for req in requests:
        if req.request_id in seen:
            raise LayoutError(f"request {req.request_id!r} listed twice")
        seen.add(req.request_id)
        n = shape.pages_for(req.context_len)
        if req.context_len < 1 or len(req.pages) < n:
            raise LayoutError(f"request {req.request_id!r}: {len(req.pages)} pages cannot hold "
                              f"{req.context_len} tokens of page size {shape.page_size}")
        pages = req.pages[:n]
        if len(set(pages)) != n or min(pages) < 1:
            raise LayoutError(f"request {req.request_id!r}: page ids must be distinct and >= 1")
        src, dst = old.group(req.src_group), new.group(req.dst_group)
        for dst_rank, dst_gpu in enumerate(dst.gpus):
            want = heads_on(dst, dst_gpu, shape.num_kv_heads)
            for src_gpu, heads in _sources(shape.num_kv_heads, src, dst_gpu, dst_rank, want):
                moves.append(Move(src_gpu, dst_gpu, req.request_id, heads, pages))
    return MigrationPlan(shape, old, new, tuple(requests), tuple(moves))


def _sources(num_kv_heads: int, src: TpGroup, dst_gpu: int, dst_rank: int,
             want: HeadRange) -> list[tuple[int, HeadRange]]:
    """(source GPU, heads) covering `want`, merged into maximal runs."""
    runs: list[tuple[int, HeadRange]] = []
    held = [(g, heads_on(src, g, num_kv_heads)) for g in src.gpus]
    for head in range(want.start, want.stop):
        holders = [g for g, heads in held if heads.start <= head < heads.stop]
        gpu = dst_gpu if dst_gpu in holders else holders[dst_rank % len(holders)]
        if runs and runs[-1][0] == gpu and runs[-1][1].stop == head:
            runs[-1] = (gpu, HeadRange(runs[-1][1].start, head + 1))
        else:
            runs.append((gpu, HeadRange(head, head + 1)))
    return runs


def assign_destinations(old: Layout, new: Layout, requests: list[RequestKV]) -> list[RequestKV]:
    """A default choice of new group per request (the caller may choose its
    own): a request goes to a new group sharing GPUs with its old group,
    preferring the one sharing the most; ties and disjoint hand-offs go to the
    candidate with the fewest tokens assigned so far, to balance KV."""
    load = [0] * len(new.groups)
    out = []
    for req in sorted(requests, key=lambda r: -r.context_len):
        old_gpus = set(old.group(req.src_group).gpus)
        overlap = [len(old_gpus & set(g.gpus)) for g in new.groups]
        best = max(overlap)
        cands = [i for i, o in enumerate(overlap) if o == best]
        choice = min(cands, key=lambda i: (load[i] / new.groups[i].tp, i))
        load[choice] += req.context_len
        out.append(RequestKV(req.request_id, req.pages, req.context_len, req.src_group, choice))
    order = {r.request_id: i for i, r in enumerate(requests)}
    return sorted(out, key=lambda r: order[r.request_id])
