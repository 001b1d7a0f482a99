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
from tiertp.kv.kernels import KVKernels, check_staging
from tiertp.kv.paths import cache_dir, kernel_dir

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


class CpuKernels(KVKernels):
    """memcpy per contiguous run (one page of one layer's K or V when all
    heads move, else one token's heads): close to memcpy bandwidth."""

    name = "cpu"

    def __init__(self) -> None:
        self._lib = load_library()
        self._ptrs: dict[tuple[int, ...], torch.Tensor] = {}

    def _buffer_ptrs(self, k_buffers, v_buffers) -> torch.Tensor:
        key = tuple(b.data_ptr() for pair in zip(k_buffers, v_buffers) for b in pair)
        if key not in self._ptrs:  # a pool's buffers never move: build its pointer table once
            self._ptrs[key] = torch.tensor(key, dtype=torch.long)
        return self._ptrs[key]

    def _call(self, fn, k_buffers, v_buffers, page_ids, page_size, head_start, staging):
        check_staging(k_buffers, v_buffers, page_ids, page_size, head_start, staging)
        if staging.device.type != "cpu" or k_buffers[0].device.type != "cpu":
            raise ValueError("CpuKernels copies CPU tensors only")
        if not all(b.is_contiguous() for b in (*k_buffers, *v_buffers)):
            raise ValueError("KV buffers must be contiguous")
        ids = page_ids.contiguous()
        if ids.numel() == 0:
            return
        _, heads, dim = k_buffers[0].shape
        if int(ids.min()) < 0 or (int(ids.max()) + 1) * page_size > k_buffers[0].shape[0]:
            raise ValueError("page id outside the pool")
        ptrs = self._buffer_ptrs(k_buffers, v_buffers)
        fn(ptrs.data_ptr(), ptrs.numel(), ids.data_ptr(), ids.numel(), page_size, heads, dim, head_start,
           staging.shape[4], staging.element_size(), staging.data_ptr())

    def gather(self, k_buffers, v_buffers, page_ids, page_size, head_start, out):
        self._call(self._lib.tiertp_kv_gather, k_buffers, v_buffers, page_ids, page_size, head_start, out)

    def scatter(self, k_buffers, v_buffers, page_ids, page_size, head_start, src):
        self._call(self._lib.tiertp_kv_scatter, k_buffers, v_buffers, page_ids, page_size, head_start, src)
