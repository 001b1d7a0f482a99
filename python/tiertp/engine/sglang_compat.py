"""Everything tiertp does to make pinned SGLang (0.5.23) run on a CPU-only host.

This is the one place for CPU compatibility settings. Nothing here changes
SGLang's code; it only chooses settings SGLang already supports (the one
registration tiertp makes, the CPU attention backend behind the name
"torch_native", is tiertp.engine.cpu_attention):

- a stand-in ``sgl_kernel`` package (``_stubs/sgl_kernel``): PyPI ships only
  CUDA builds, which fail to import without a GPU driver, yet SGLang's CPU
  path imports a few names from it. Each stand-in raises a clear error if it
  is ever called. It reaches SGLang's spawned processes through PYTHONPATH
  (and ``sys.path``, which multiprocessing's spawn copies to children), and
  only for CPU engines, so it can never shadow the real package on a GPU host.
- environment: ``SGLANG_USE_CPU_ENGINE=1`` (without it ``device="cpu"`` fails
  importing vllm's rotary embedding), ``TORCHDYNAMO_DISABLE=1`` (else the
  first forward at TP>1 compiles for 20-30 s), ``SGLANG_CPU_OMP_THREADS_BIND``
  (one core group per TP rank; required for TP>1), ``OMP_NUM_THREADS`` (cores
  per rank, so ranks do not oversubscribe more than they must; `apply` also
  sets torch's thread count, since libgomp ignores the variable once torch is
  loaded), and
  ``SGLANG_NCCL_SO_PATH`` pointed at a path that does not exist: the PyPI torch
  brings libnccl, and SGLang would otherwise build a NCCL communicator for the
  CPU TP group and fail (``Expected a cuda device, but got: cpu``); with no
  loadable NCCL it falls back to gloo, as on a real CPU host.
- engine arguments that work on CPU (`engine_kwargs`).
- pinning: SGLang binds a rank to its core group only with the real CPU
  sgl_kernel, so a rank process pins itself (tiertp.engine.cpu_pinning).

SGLang's plugin mechanism (entry points ``sglang.srt.plugins``, the hook
registry) would be the supported way to patch code, but nothing here needs a
patch, and entry points would have to be declared in pyproject.toml; the
attention backend goes through SGLang's attention registry instead.

All of this is per process: call `apply` in the process that will own the
engine (a dedicated subprocess, see tiertp.engine.isolated), never in a
long-lived process that also does other work.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from tiertp.engine.cpu_pinning import BIND_ENV, set_intra_op_threads

# The one list of devices an engine can run on.
DEVICES = ("cpu", "cuda")

STUB_DIR = Path(__file__).resolve().parent / "_stubs"
_NO_NCCL = "/nonexistent/tiertp-cpu-host-has-no-nccl/libnccl.so.2"
# KV slots for a CPU engine unless the caller needs more: a CPU run never
# needs SGLang's default (sized from free memory, i.e. gigabytes of KV).
DEFAULT_CPU_MAX_TOTAL_TOKENS = 4096


def check_device(device: str) -> None:
    if device not in DEVICES:
        raise ValueError(f"unknown device {device!r}; expected one of: {', '.join(DEVICES)}")


def cpu_count() -> int:
    """Cores this process may use (the affinity mask, not the machine's total)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def cpu_threads_bind(tp_size: int, cores: list[int] | None = None, cores_per_rank: int | None = None,
                     devices: tuple[int, ...] | None = None) -> str:
    """The SGLANG_CPU_OMP_THREADS_BIND value: one core group per TP rank.

    By default the cores are split evenly over the ranks; `cores_per_rank`
    fixes the group size instead (1: one core stands in for one device). With
    more ranks than cores, ranks share cores round-robin.
    `devices` (rank r runs on logical device devices[r]) pins by device
    instead of by rank: device d owns core group d, whichever instance runs
    on it, so two instances on different devices never share cores (and the
    TP levels of one device use that device's cores).
    """
    if tp_size < 1:
        raise ValueError(f"TP size must be >= 1, got {tp_size}")
    if cores_per_rank is not None and cores_per_rank < 1:
        raise ValueError(f"cores per rank must be >= 1, got {cores_per_rank}")
    if cores is None:
        cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(cpu_count()))
    per = cores_per_rank or max(1, len(cores) // tp_size)
    if devices is not None:
        if len(devices) != tp_size:
            raise ValueError(f"TP size {tp_size} needs {tp_size} device ids, got {list(devices)}")
        per = min(per, len(cores))
        groups = [[cores[(d * per + i) % len(cores)] for i in range(per)] for d in devices]
    elif tp_size * per > len(cores):
        per = min(per, len(cores))
        groups = [[cores[(r * per + i) % len(cores)] for i in range(per)] for r in range(tp_size)]
    else:
        groups = [cores[r * per : (r + 1) * per] for r in range(tp_size)]
    return "|".join(",".join(str(c) for c in g) for g in groups)


def threads_per_rank(tp_size: int, cores_per_rank: int | None = None) -> int:
    """OMP threads each rank runs: its core group's size."""
    return cores_per_rank or max(1, cpu_count() // tp_size)


def process_env(device: str, tp_size: int, cores_per_rank: int | None = None,
                devices: tuple[int, ...] | None = None) -> dict[str, str]:
    """Environment variables an engine process (and its children) needs."""
    check_device(device)
    if device != "cpu":
        return {}
    return {
        "SGLANG_USE_CPU_ENGINE": "1",
        "TORCHDYNAMO_DISABLE": "1",
        BIND_ENV: cpu_threads_bind(tp_size, cores_per_rank=cores_per_rank, devices=devices),
        "OMP_NUM_THREADS": str(threads_per_rank(tp_size, cores_per_rank)),
        "SGLANG_NCCL_SO_PATH": _NO_NCCL,
        "PYTHONPATH": os.pathsep.join(p for p in (str(STUB_DIR), os.environ.get("PYTHONPATH", "")) if p),
    }


def apply(device: str, tp_size: int, cores_per_rank: int | None = None,
          devices: tuple[int, ...] | None = None) -> None:
    """Prepare this process to create an SGLang engine on `device` at `tp_size`.

    Must run before the first `import sglang`. Sets the environment (inherited
    by SGLang's spawned processes) and, on CPU, this process's torch thread
    count (OMP_NUM_THREADS) and the sgl_kernel stand-in on sys.path. It does
    not pin: a rank process calls tiertp.engine.cpu_pinning.bind_rank.
    """
    env = process_env(device, tp_size, cores_per_rank, devices)
    os.environ.update(env)
    if device == "cpu":
        set_intra_op_threads(int(env["OMP_NUM_THREADS"]))
        if "sglang" in sys.modules and not _imported_for_cpu():
            # SGLang caches is_cpu() and its sgl_kernel imports at import time.
            raise RuntimeError("tiertp.engine.sglang_compat.apply() must run before sglang is imported")
        _load_kernel_stand_in()


# What SGLang reads when it is first imported: the same for every CPU engine
# process, whatever its TP size, cores and devices.
_IMPORT_TIME_ENV = ("SGLANG_USE_CPU_ENGINE", "TORCHDYNAMO_DISABLE", "SGLANG_NCCL_SO_PATH")


def prepare_cpu_import() -> None:
    """The import-time part of `apply` on CPU, for a process that imports
    SGLang before it knows the TP size, cores and devices it will serve (the
    forkserver of CPU ranks, tiertp.engine.rank_preload). A process forked
    from it still calls `apply`, which then sets the rest."""
    env = process_env("cpu", 1)
    os.environ.update({k: env[k] for k in _IMPORT_TIME_ENV})
    _load_kernel_stand_in()


def _imported_for_cpu() -> bool:
    """Whether SGLang was imported after `prepare_cpu_import` (or `apply`) on
    CPU: the stand-in is its sgl_kernel and the CPU engine was asked for."""
    stand_in = sys.modules.get("sgl_kernel")
    return getattr(stand_in, "IS_TIERTP_STUB", False) and os.environ.get("SGLANG_USE_CPU_ENGINE") == "1"


def _load_kernel_stand_in() -> None:
    if str(STUB_DIR) not in sys.path:
        sys.path.insert(0, str(STUB_DIR))
    import sgl_kernel

    if not getattr(sgl_kernel, "IS_TIERTP_STUB", False):
        raise RuntimeError(f"expected tiertp's sgl_kernel stand-in, imported {sgl_kernel.__file__}")


def engine_kwargs(device: str, tp_size: int, *, max_total_tokens: int | None = None) -> dict:
    """SGLang Engine/ServerArgs keyword arguments for `device` at `tp_size`.

    CPU: float32 (the CPU path's tested dtype), torch_native attention and
    pytorch sampling (no sgl_kernel calls), no CUDA graphs, a small KV pool.
    CUDA: SGLang's defaults (CUDA graphs on), bfloat16.
    """
    check_device(device)
    common = {"tp_size": tp_size, "skip_server_warmup": True, "log_level": "warning"}
    if device == "cuda":
        kw = {**common, "device": "cuda", "dtype": "bfloat16"}
        if max_total_tokens is not None:
            kw["max_total_tokens"] = max_total_tokens
        return kw
    return {
        **common,
        "device": "cpu",
        "dtype": "float32",
        "attention_backend": "torch_native",
        "sampling_backend": "pytorch",
        "disable_cuda_graph": True,
        "max_total_tokens": max_total_tokens or DEFAULT_CPU_MAX_TOTAL_TOKENS,
    }


class DeviceUnavailable(RuntimeError):
    """The requested device is not present on this host."""


def check_cuda_available() -> None:
    """Raise DeviceUnavailable when `--device cuda` is asked for on a host without a GPU."""
    import torch

    if not torch.cuda.is_available():
        raise DeviceUnavailable(
            "device cuda requested but no CUDA GPU is visible to torch "
            f"(torch {torch.__version__}, CUDA build {torch.version.cuda}); "
            "use --device cpu on this host"
        )
