"""Pin a CPU rank process to its core group and size its thread pool to it.

`tiertp.engine.sglang_compat.apply` writes each TP rank's core group into
``SGLANG_CPU_OMP_THREADS_BIND`` and the group size into ``OMP_NUM_THREADS``.
Neither is enough on its own, for two reasons found on this project's CPU
hosts (docs/fidelity.md):

- SGLang binds a rank's OpenMP threads to its group only through
  ``sgl_kernel.init_cpu_threads_env``, i.e. only with the real CPU build of
  sgl_kernel (Intel AMX or arm64). With tiertp's stand-in it logs
  "init_cpu_threads_env ... is disabled" and binds nothing: every rank may
  run on every core.
- libgomp reads ``OMP_NUM_THREADS`` once, when torch is first imported. A
  rank process spawned from a parent whose main module imports torch (the
  execution process does) has torch loaded before `apply` runs, so the
  variable is ignored and the rank runs one OpenMP thread per core of the
  machine.

Together they made two busy TP1 devices on two cores run four spinning
OpenMP threads on two cores, each decode step 5-15x slower than the profile
(one single-threaded rank per core). `bind_rank` does the binding itself
and sets torch's thread count explicitly, whatever the import order was.
"""

from __future__ import annotations

import os

BIND_ENV = "SGLANG_CPU_OMP_THREADS_BIND"


def parse_core_group(text: str) -> list[int]:
    """Cores of one group of a bind string: "0,1", "4-7" or a mix ("0,2-3")."""
    cores: list[int] = []
    for part in text.split(","):
        part = part.strip()
        lo, sep, hi = part.partition("-")
        try:
            cores += list(range(int(lo), int(hi) + 1)) if sep else [int(lo)]
        except ValueError:
            raise ValueError(f"bad core group {text!r} in {BIND_ENV}: expected cores like '0,1' or '0-3'") from None
    if not cores:
        raise ValueError(f"empty core group in {BIND_ENV}")
    return sorted(set(cores))


def rank_cores(rank: int, bind: str | None = None) -> list[int]:
    """Rank `rank`'s cores from the bind string (default: this process's `BIND_ENV`)."""
    bind = os.environ.get(BIND_ENV) if bind is None else bind
    if not bind:
        raise RuntimeError(f"{BIND_ENV} is not set: call tiertp.engine.sglang_compat.apply first")
    groups = bind.split("|")
    if not 0 <= rank < len(groups):
        raise ValueError(f"rank {rank} has no core group in {BIND_ENV}={bind!r} ({len(groups)} groups)")
    return parse_core_group(groups[rank])


def set_intra_op_threads(n: int) -> None:
    """torch's (OpenMP and MKL) intra-op thread count, effective even after torch was imported."""
    import torch

    if torch.get_num_threads() != n:
        torch.set_num_threads(n)


def pin_process(cores: list[int]) -> None:
    """Restrict every thread of this process (and threads it starts later) to `cores`.

    `sched_setaffinity` sets one thread; threads that already exist (OpenMP,
    gloo, tqdm) are each set too.
    """
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cores)
        except ProcessLookupError:  # the thread ended meanwhile
            pass


def bind_rank(rank: int) -> list[int]:
    """Pin this rank process to its core group and run that many intra-op
    threads; the cores. A no-op where affinity cannot be set (not Linux)."""
    cores = rank_cores(rank)
    if hasattr(os, "sched_setaffinity"):
        pin_process(cores)
    set_intra_op_threads(len(cores))
    return cores
