"""CPU twin of the CUDA kernels: kernels/kv_migrate/kv_migrate_cpu.cpp via ctypes.

Built with the system C++ compiler on first use (about a second; no torch
headers) into ~/.cache/tiertp/native (TIERTP_CACHE moves it), keyed by the
source's hash so an edited source rebuilds. ctypes drops the GIL during the
call, so the sender and receiver threads of one process copy in parallel.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile

import torch

from tiertp.kv.errors import KVMigrationError
from tiertp.kv.kernels.base import KVKernels, PoolCache, check_pool, check_staging
from tiertp.kv.kernels.paths import cache_dir, kernel_dir

_I64 = ctypes.c_int64
_ARGS = [ctypes.c_void_p, _I64, ctypes.c_void_p, _I64, _I64, _I64, _I64, _I64, _I64, _I64, ctypes.c_void_p]


@functools.cache
def load_library() -> ctypes.CDLL:
    """Build (first time) and load the native CPU kernels; KVMigrationError
    naming the problem if no C++ compiler is available or the build fails."""
    src = kernel_dir() / "kv_migrate_cpu.cpp"
    digest = hashlib.sha256(src.read_bytes()).hexdigest()[:16]
    lib = cache_dir() / "native" / f"kv_migrate_cpu-{digest}.so"
    if not lib.exists():
        cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
        if cxx is None:
            raise KVMigrationError("no C++ compiler (c++/g++/clang++) to build the CPU KV kernels")
        lib.parent.mkdir(parents=True, exist_ok=True)
        # Build beside the target and rename: concurrent first uses never load a half-written file.
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=lib.parent)
        os.close(fd)
        proc = subprocess.run([cxx, "-O3", "-shared", "-fPIC", "-std=c++17", str(src), "-o", tmp],
                              capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            os.unlink(tmp)
            raise KVMigrationError(f"building {src.name} failed:\n{proc.stderr}")
        os.replace(tmp, lib)
    dll = ctypes.CDLL(str(lib))
    for name in ("tiertp_kv_gather", "tiertp_kv_scatter"):
        fn = getattr(dll, name)
        fn.argtypes, fn.restype = _ARGS, None
    return dll


# copy_pages makes one kernel call per run of consecutive pages and buffer:
# shorter runs than this (on average) cost more in calls than staging does.
_MIN_RUN_PAGES = 16


class CpuKernels(KVKernels):
    """memcpy per contiguous run (one page of one layer's K or V when all
    heads move, else one token's heads): close to memcpy bandwidth.

    `copy_pages` copies pool to pool in one pass when one side's rows are
    whole (the pages carry all of that pool's heads) and its pages come in
    runs of consecutive ids: a run is then one contiguous block, the
    "staging" of a gather (or scatter) of the other side's pages."""

    name = "cpu"

    def __init__(self) -> None:
        self._lib = load_library()
        self._ptrs: dict[tuple[int, ...], torch.Tensor] = {}
        self._pools = PoolCache(self._checked_table)

    def _checked_table(self, buffers) -> torch.Tensor:
        """A pool's pointer table, once its buffers are known to be CPU and contiguous."""
        if buffers[0].device.type != "cpu":
            raise ValueError("CpuKernels copies CPU tensors only")
        if not all(b.is_contiguous() for b in buffers):
            raise ValueError("KV buffers must be contiguous")
        return self._pointer_table(buffers)

    def _pointer_table(self, buffers) -> torch.Tensor:
        key = tuple(b.data_ptr() for b in buffers)
        if key not in self._ptrs:  # a pool's buffers (almost) never move: build its pointer table once
            self._ptrs[key] = torch.tensor(key, dtype=torch.long)
        return self._ptrs[key]

    def _call(self, fn, k_buffers, v_buffers, page_ids, page_size, head_start, staging):
        ptrs = self._pools(k_buffers, v_buffers)
        check_staging(k_buffers, v_buffers, page_ids, page_size, head_start, staging, buffers_checked=True)
        if staging.device.type != "cpu":
            raise ValueError("CpuKernels copies CPU tensors only")
        ids = page_ids.contiguous()
        if ids.numel() == 0:
            return
        _, heads, dim = k_buffers[0].shape
        if int(ids.min()) < 0 or (int(ids.max()) + 1) * page_size > k_buffers[0].shape[0]:
            raise ValueError("page id outside the pool")
        fn(ptrs.data_ptr(), ptrs.numel(), ids.data_ptr(), ids.numel(), page_size, heads, dim, head_start,
           staging.shape[4], staging.element_size(), staging.data_ptr())

    def copy_pages(self, src, src_ids, src_head_start, dst, dst_ids, dst_head_start, head_count, page_size):
        (src_k, src_v), (dst_k, dst_v) = src, dst
        src_ids, dst_ids = src_ids.contiguous(), dst_ids.contiguous()
        n = src_ids.numel()
        if dst_ids.numel() != n:
            raise ValueError(f"copy_pages: {n} source pages but {dst_ids.numel()} destination pages")
        if n == 0:
            return True
        first_src, first_dst = src_k[0], dst_k[0]
        _, src_heads, dim = first_src.shape
        dst_heads = first_dst.shape[1]
        if first_src.dtype != first_dst.dtype or first_dst.shape[2] != dim:
            raise ValueError("copy_pages: the pools differ in dtype or head_dim")
        # Whole destination rows: gather into their runs; whole source rows: scatter out of theirs.
        options = [(dst_ids, True)] if head_count == dst_heads and dst_head_start == 0 else []
        options += [(src_ids, False)] if head_count == src_heads and src_head_start == 0 else []
        for runs_of, into_destination in options:
            starts = _run_starts(runs_of)
            if len(starts) * _MIN_RUN_PAGES <= n:
                break
        else:
            return False
        _check_side(src_k, src_v, src_ids, page_size, src_head_start, head_count)
        _check_side(dst_k, dst_v, dst_ids, page_size, dst_head_start, head_count)
        elem = first_src.element_size()
        block = page_size * head_count * dim * elem  # bytes of one page of whole rows
        if into_destination:  # a gather of the source's pages, the run of whole rows as its staging
            fn, ids, heads, start = self._lib.tiertp_kv_gather, src_ids, src_heads, src_head_start
            pairs = list(zip(src_k + src_v, dst_k + dst_v))
        else:  # a scatter into the destination's pages out of the source's run
            fn, ids, heads, start = self._lib.tiertp_kv_scatter, dst_ids, dst_heads, dst_head_start
            pairs = list(zip(dst_k + dst_v, src_k + src_v))
        bounds = starts + [n]
        for a, b in zip(bounds, bounds[1:]):
            for pooled, whole in pairs:  # the strided buffer, the buffer of whole rows
                run = whole.data_ptr() + int(runs_of[a]) * block
                fn(self._pointer_table([pooled]).data_ptr(), 1, ids[a:b].data_ptr(), b - a, page_size, heads, dim,
                   start, head_count, elem, run)
        return True

    def gather(self, k_buffers, v_buffers, page_ids, page_size, head_start, out):
        self._call(self._lib.tiertp_kv_gather, k_buffers, v_buffers, page_ids, page_size, head_start, out)

    def scatter(self, k_buffers, v_buffers, page_ids, page_size, head_start, src):
        self._call(self._lib.tiertp_kv_scatter, k_buffers, v_buffers, page_ids, page_size, head_start, src)


def _check_side(k_buffers, v_buffers, ids: torch.Tensor, page_size: int, head_start: int, head_count: int) -> None:
    """copy_pages' checks of one pool: check_pool's, and what the native
    copy needs besides (contiguous CPU buffers, page ids inside the pool)."""
    check_pool(k_buffers, v_buffers, ids, page_size, head_start, head_count)
    if k_buffers[0].device.type != "cpu" or not all(b.is_contiguous() for b in (*k_buffers, *v_buffers)):
        raise ValueError("CpuKernels copies contiguous CPU tensors only")
    if int(ids.min()) < 0 or (int(ids.max()) + 1) * page_size > k_buffers[0].shape[0]:
        raise ValueError("page id outside the pool")


def _run_starts(ids: torch.Tensor) -> list[int]:
    """Indexes where a run of consecutive ids (each one more than the last) begins."""
    breaks = torch.nonzero(ids[1:] - ids[:-1] != 1).flatten() + 1
    return [0] + breaks.tolist()
