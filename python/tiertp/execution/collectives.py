"""The rank processes' two collectives over their instance's gloo group (CPU objects)."""

from __future__ import annotations

import torch.distributed as dist

from tiertp.execution.context import TpContext


def broadcast(ctx: TpContext, op=None):
    """Leader: send `op` to the followers. Follower: receive it."""
    buf = [op]
    dist.broadcast_object_list(buf, src=ctx.leader_global_rank, group=ctx.group.cpu_group)
    return buf[0]


def gather(ctx: TpContext, value):
    """Every rank's `value`, in rank order, on the leader (None elsewhere)."""
    if ctx.group is None:
        return [value]
    out = [None] * ctx.tp if ctx.is_leader else None
    dist.gather_object(value, out, dst=ctx.leader_global_rank, group=ctx.group.cpu_group)
    return out
