"""`apply`: one operation (tiertp.execution.ops) on one rank; every rank applies the same ones in the same order."""

from __future__ import annotations

from tiertp.execution import ops
from tiertp.execution.rank_handle import RankHandle


def apply(handle: RankHandle, op: ops.Operation):
    """Apply `op` on this rank; what it returns is rank-local. A `Call` answers
    ("ok", result) or ("error", message): the caller decides, the instance is unaffected."""
    kv = handle.kv
    match op:
        case ops.Iteration():
            kv.release(op.release)
            for rid, tokens in op.admit:
                kv.admit(rid, tokens)
            decode_logits = kv.decode(op.decode_tokens) if op.decode_tokens else None
            extended = kv.extend(op.extend) if op.extend else None
            return decode_logits, extended
        case ops.Release():
            return kv.release(op.rids)
        case ops.ReserveSlots():
            return kv.reserve(op.counts)
        case ops.FreeSlots():
            return kv.free_reserved(op.slots)
        case ops.Adopt():
            for rid, tokens, kv_len, slots in op.requests:
                kv.adopt(rid, tokens, kv_len, slots)
            return None
        case ops.Call():
            try:
                return ("ok", op.call.run(handle))
            except Exception as e:  # the caller decides; the instance itself is unaffected
                return ("error", f"{type(e).__name__}: {e}")
    raise TypeError(f"unknown operation {op!r}")
