"""Moving KV through the controller, for layouts tiertp.kv cannot plan.

tiertp.kv plans power-of-two TP levels only; SmolLM2-135M's 3 KV heads make
TP3 a real level (each rank holds one head). For such a switch the
coordinator relays the KV itself: reserve the destination's slots (all or
nothing), read each source's slots (`TpInstance.read_kv`: per rank, its
heads), put the heads together, cut them as the destination's ranks hold
them (tiertp.execution.kv_view.kv_heads_of_rank: SGLang's even split) and
write them (`write_kv`). Every byte crosses the controller's pipes twice, so
this is the slow path; the coordinator uses it only when it must.
"""

from __future__ import annotations

import torch

from tiertp.execution.kv_view import kv_heads_of_rank
from tiertp.execution.records import RequestState
from tiertp.switching.participant import RelayParticipant


def plannable(tp: int) -> bool:
    """Whether tiertp.kv can plan a layout with this TP level (a power of two)."""
    return tp >= 1 and tp & (tp - 1) == 0


def relay(exported: list[tuple[RelayParticipant, list[RequestState]]], dest: RelayParticipant) -> tuple[dict, int]:
    """Copy every exported request's KV into freshly reserved slots of `dest`.
    Returns (request id -> destination slots, bytes relayed). On failure the
    reserved slots are freed and the error raised (the sources were only read)."""
    moving = [(src, s) for src, states in exported for s in states if s.kv_len]
    if not moving:
        return {}, 0
    reserved = dest.reserve_slots([s.kv_len for _, s in moving])  # KVOutOfSpace: nothing allocated
    pages = {s.rid: slots for (_, s), slots in zip(moving, reserved)}
    heads = dest.info.kv.shape.num_kv_heads
    cuts = [kv_heads_of_rank(heads, dest.spec.tp, r) for r in range(dest.spec.tp)]
    relayed = 0
    try:
        for src, states in exported:
            mine = [s for s in states if s.kv_len]
            if not mine:
                continue
            # Per source rank [layers, 2, tokens, its heads, head_dim]: ranks hold consecutive heads.
            full = _whole_heads(src, src.read_kv([slot for s in mine for slot in s.slots]), heads)
            slots = [slot for s in mine for slot in pages[s.rid]]
            dest.write_kv(slots, [full[:, :, :, c.start:c.stop].contiguous() for c in cuts])
            relayed += full.numel() * full.element_size()
    except BaseException:
        dest.free_slots([slot for slots in reserved for slot in slots])
        raise
    return pages, relayed


def _whole_heads(src: RelayParticipant, per_rank: list[torch.Tensor], heads: int) -> torch.Tensor:
    parts = [kv_heads_of_rank(heads, src.spec.tp, r) for r in range(src.spec.tp)]
    if [(p.start, p.stop) for p in parts] != [(r * heads // len(parts), (r + 1) * heads // len(parts))
                                            for r in range(len(parts))]:
        raise ValueError(f"TP{src.spec.tp} over {heads} KV heads replicates heads; the relay needs an even split")
    return torch.cat(per_rank, dim=3)
