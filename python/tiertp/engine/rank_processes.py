"""How TP rank processes start, for everything that starts them: a
TpInstance's ranks (tiertp.execution.instance) and the ranks of an isolated
measurement or weight check (`run_rank_processes`).

CPU ranks fork from a forkserver that has imported SGLang once
(tiertp.engine.rank_preload): a spawned rank spent about 14 s of CPU
importing it on a 2-core machine, every rank of every instance. The
forkserver is one per process that starts ranks, starts with the first rank,
inherits that process's environment as it is then, and exits with it. CUDA
ranks are spawned, as SGLang's one_batch starts them: a forked process cannot
use CUDA if its parent initialised it, and importing SGLang is not known to
leave CUDA alone.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from multiprocessing.context import BaseContext


def rank_context(device: str) -> BaseContext:
    """The multiprocessing context to start TP ranks on `device` with."""
    if device == "cpu":
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["tiertp.engine.rank_preload"])
        return ctx
    return multiprocessing.get_context("spawn")


def run_rank_processes(target: Callable[..., None], rank_args: list[tuple], what: str, device: str) -> None:
    """Run `target(*rank_args[r])` in one process per TP rank r on `device`
    and wait for all. Raises RuntimeError naming every rank that exited
    non-zero; `what` (e.g. "TP2 measurement") starts the message."""
    ctx = rank_context(device)
    procs = [ctx.Process(target=target, args=args) for args in rank_args]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    failed = [(r, p.exitcode) for r, p in enumerate(procs) if p.exitcode != 0]
    if failed:
        raise RuntimeError(f"{what}: rank processes failed (rank, exit code): {failed}")
