"""A rank process of a TP instance: load the model, then obey the leader.

Rank 0 (the leader) runs tiertp.execution.leader_loop; followers loop on
the leader's broadcast and `apply` each operation; they never decide
anything. Every rank applies the same operations in the same order, so all
run the same forwards (collectives included). A rank that fails exits at
once (the leader first tells the controller why); the controller sees it die.
"""

from __future__ import annotations

import os
import sys
import traceback
from dataclasses import dataclass
from typing import Any

from tiertp.execution import ops
from tiertp.execution.process_util import die_with_parent, set_title
from tiertp.execution.spec import InstanceSpec


@dataclass
class RankHandle:
    """What a `Call` target gets on each rank: its TP context, SGLang's
    ModelRunner, and the rank's requests/KV (tiertp.execution.rank_kv.RankKV);
    `kv_pool()` is the rank's KV as a tiertp.kv.KVPool for migration."""

    ctx: Any  # TpContext
    model_runner: Any
    kv: Any  # RankKV
    _pool: Any = None

    def kv_pool(self):
        """Built once (SGLang's buffers never move); see tiertp.execution.kv_view."""
        if self._pool is None:
            from tiertp.execution.kv_view import kv_pool_of

            self._pool = kv_pool_of(self)
        return self._pool


def apply(handle: RankHandle, op):
    """Apply one operation on this rank; what it returns is rank-local."""
    kv = handle.kv
    if isinstance(op, ops.Iteration):
        kv.release(op.release)
        for rid, tokens in op.admit:
            kv.admit(rid, tokens)
        decode_logits = kv.decode(op.decode_tokens) if op.decode_tokens else None
        extended = kv.extend(op.extend) if op.extend else None
        return decode_logits, extended
    if isinstance(op, ops.Release):
        return kv.release(op.rids)
    if isinstance(op, ops.ReserveSlots):
        return kv.reserve(op.counts)
    if isinstance(op, ops.FreeSlots):
        return kv.free_reserved(op.slots)
    if isinstance(op, ops.Adopt):
        for rid, tokens, kv_len, slots in op.requests:
            kv.adopt(rid, tokens, kv_len, slots)
        return None
    if isinstance(op, ops.Call):
        from tiertp.execution.loader import resolve_target

        try:
            return ("ok", resolve_target(op.target)(handle, op.arg))
        except Exception as e:  # the caller decides; the instance itself is unaffected
            return ("error", f"{type(e).__name__}: {e}")
    raise TypeError(f"unknown operation {op!r}")


def broadcast(ctx, op=None):
    """Leader: send `op` to the followers. Follower: receive it."""
    import torch.distributed as dist

    buf = [op]
    dist.broadcast_object_list(buf, src=ctx.leader_global_rank, group=ctx.group.cpu_group)
    return buf[0]


def gather(ctx, value):
    """Every rank's `value`, in rank order, on the leader (None elsewhere)."""
    import torch.distributed as dist

    if ctx.group is None:
        return [value]
    out = [None] * ctx.tp if ctx.is_leader else None
    dist.gather_object(value, out, dst=ctx.leader_global_rank, group=ctx.group.cpu_group)
    return out


def rank_main(spec: InstanceSpec, model_path: str, rank: int, dist_port: int, conn) -> None:
    """Entry point of rank `rank` (spawned by TpInstance); never returns."""
    set_title(f"tiertp::tp{spec.tp}_rank{rank}")
    # Dies with the thread that spawned it (PR_SET_PDEATHSIG): start instances
    # from a thread that outlives them, e.g. the main thread.
    die_with_parent()
    code = 0
    try:
        from tiertp.execution.loader import load_rank
        from tiertp.execution.rank_kv import RankKV

        runner, tokenizer, ctx = load_rank(spec, model_path, rank, dist_port)
        if spec.device == "cpu":
            # SGLang pins a CPU rank only with its native kernels; without this
            # the ranks of different devices share every core (docs/fidelity.md).
            from tiertp.engine.cpu_pinning import bind_rank

            bind_rank(rank)
        handle = RankHandle(ctx, runner, RankKV(runner))
        if ctx.is_leader:
            from tiertp.execution.leader_loop import LeaderLoop

            LeaderLoop(conn, handle, tokenizer, spec).run()
        else:
            _follow(handle)
    except BaseException as e:  # noqa: BLE001 - report whatever ended the rank, then exit
        code = 1
        message = f"rank {rank}: {type(e).__name__}: {e}"
        traceback.print_exc()
        if conn is not None:
            try:
                conn.send(("failed", message))
            except (OSError, EOFError):
                pass
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: SGLang's atexit hooks and threads can hang it.
    os._exit(code)


def _follow(handle: RankHandle) -> None:
    import torch

    with torch.no_grad():
        while True:
            op = broadcast(handle.ctx)
            if isinstance(op, ops.Shutdown):
                return
            result = apply(handle, op)
            if isinstance(op, ops.Call):
                gather(handle.ctx, result)
