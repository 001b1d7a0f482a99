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

import torch

from tiertp.engine.cpu_pinning import bind_rank
from tiertp.execution import ops
from tiertp.execution.apply import apply
from tiertp.execution.collectives import broadcast, gather
from tiertp.execution.leader_loop import LeaderLoop
from tiertp.execution.loader import load_rank
from tiertp.execution.process_util import die_with_parent, set_title
from tiertp.execution.rank_handle import RankHandle
from tiertp.execution.rank_kv import RankKV
from tiertp.execution.spec import InstanceSpec


def rank_main(spec: InstanceSpec, model_path: str, rank: int, dist_port: int, conn) -> None:
    """Entry point of rank `rank` (started by TpInstance); never returns."""
    set_title(f"tiertp::tp{spec.tp}_rank{rank}")
    # Dies with its parent (PR_SET_PDEATHSIG): a CPU rank's is the forkserver,
    # which exits with the controller process; a CUDA rank's the thread that
    # spawned it, so start instances from a thread that outlives them.
    die_with_parent()
    code = 0
    try:
        runner, tokenizer, ctx = load_rank(spec, model_path, rank, dist_port)
        if spec.device == "cpu":
            # SGLang pins a CPU rank only with its native kernels; without this
            # the ranks of different devices share every core (docs/fidelity.md).
            bind_rank(rank)
        handle = RankHandle(ctx, runner, RankKV(runner))
        if ctx.is_leader:
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
    with torch.no_grad():
        while True:
            op = broadcast(handle.ctx)
            if isinstance(op, ops.Shutdown):
                return
            result = apply(handle, op)
            if isinstance(op, ops.Call):
                gather(handle.ctx, result)
