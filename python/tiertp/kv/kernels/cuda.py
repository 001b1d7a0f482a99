"""The CUDA gather/scatter kernels (kernels/kv_migrate/), built on first use.

The extension is compiled with torch.utils.cpp_extension into
~/.cache/tiertp/torch_extensions (TIERTP_CACHE overrides ~/.cache/tiertp),
so only the first use on a machine pays the build (about a minute). nvcc comes
from the `nvidia-cuda-nvcc` wheel when no system CUDA toolkit is found.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
from pathlib import Path

import torch

from tiertp.kv.errors import KVMigrationError, NoGPUError
from tiertp.kv.kernels.base import KVKernels, PoolCache, check_pool, check_staging
from tiertp.kv.kernels.paths import cache_dir, kernel_dir

ARCHS = ("80", "90")  # A100, H100/H200


def pip_cuda_root() -> Path | None:
    """The CUDA 13 tree the nvidia-* wheels install (nvcc, headers, libcudart)."""
    try:
        import nvidia  # the optional nvidia-* wheels: absent is an answer, not an error
    except ImportError:
        return None
    for base in nvidia.__path__:
        root = Path(base) / "cu13"
        if (root / "bin" / "nvcc").exists():
            return root
    return None


def cuda_home() -> Path:
    """A CUDA_HOME for cpp_extension: the system toolkit, or a shim over the
    wheels' tree (cpp_extension wants lib64/libcudart.so; the wheel ships
    lib/libcudart.so.13)."""
    from torch.utils import cpp_extension  # pulls in setuptools (~0.1 s): only a build pays it

    if cpp_extension.CUDA_HOME:
        return Path(cpp_extension.CUDA_HOME)
    root = pip_cuda_root()
    if root is None:
        raise NoGPUError("no CUDA toolkit: install nvidia-cuda-nvcc (see requirements/python.txt)")
    # One shim per toolkit tree: checkouts with their own virtual
    # environments share the cache, and a removed one leaves dangling links.
    shim = cache_dir() / "cuda-home" / hashlib.sha256(str(root).encode()).hexdigest()[:16]
    (shim / "lib64").mkdir(parents=True, exist_ok=True)
    links = [(shim / name, root / name) for name in ("bin", "include", "nvvm") if (root / name).exists()]
    links.append((shim / "lib64" / "libcudart.so", root / "lib" / "libcudart.so.13"))
    for link, target in links:
        if link.is_symlink() and link.readlink() != target:
            link.unlink()
        if not link.is_symlink():
            link.symlink_to(target)
    return shim


@functools.cache
def load_extension():
    """Build (first time) and import the extension; NoGPUError without a GPU."""
    if not torch.cuda.is_available():
        raise NoGPUError("the CUDA KV kernels need a GPU and none is visible "
                         "(torch.cuda.is_available() is False); use CpuKernels on CPU")
    return build_extension()


def build_extension():
    """Compile (cached) and import the extension; needs nvcc, not a GPU."""
    from torch.utils import cpp_extension  # pulls in setuptools (~0.1 s): only a build pays it

    _ninja_on_path()
    home = cuda_home()
    cpp_extension.CUDA_HOME = str(home)
    os.environ.setdefault("CUDA_HOME", str(home))
    src = kernel_dir()
    build = cache_dir() / "torch_extensions" / "kv_migrate"
    build.mkdir(parents=True, exist_ok=True)
    gencode = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in ARCHS]
    return cpp_extension.load(
        name="tiertp_kv_migrate",
        sources=[str(src / "kv_migrate_binding.cpp"), str(src / "kv_migrate_kernels.cu")],
        extra_include_paths=[str(src)],
        extra_cflags=["-O2"],
        extra_cuda_cflags=["-O3", *gencode],
        build_directory=str(build),
        verbose=False,
    )


def _ninja_on_path() -> None:
    """cpp_extension runs `ninja` from PATH; a venv used without activation
    lacks it, so add the ninja wheel's bin directory."""
    if shutil.which("ninja"):
        return
    try:
        import ninja  # optional: only a build without ninja on PATH needs the wheel
    except ImportError:
        raise KVMigrationError("ninja is needed to build the CUDA KV kernels: pip install ninja") from None
    os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")


def _alignment(buffers: list[torch.Tensor]) -> int:
    """Largest power of two <= 16 dividing every buffer's address."""
    align = 16
    for b in buffers:
        while b.data_ptr() % align:
            align //= 2
    return align


class CudaKernels(KVKernels):
    """Launches on the current CUDA stream, so callers order copies with
    streams and events (the pipelined executor gathers on its own stream).
    `copy_pages` copies any move of one device pool to pool in one launch."""

    name = "cuda"

    def __init__(self) -> None:
        self._ext = load_extension()
        # Per pool: its buffers' addresses as a device array, and their alignment.
        self._pools = PoolCache(lambda bufs: (
            torch.tensor([b.data_ptr() for b in bufs], dtype=torch.long, device=bufs[0].device), _alignment(bufs)))

    def gather(self, k_buffers, v_buffers, page_ids, page_size, head_start, out):
        ptrs, align = self._pools(k_buffers, v_buffers)
        check_staging(k_buffers, v_buffers, page_ids, page_size, head_start, out, buffers_checked=True)
        _, heads, dim = k_buffers[0].shape
        self._ext.gather(ptrs, page_ids, page_size, heads, dim, head_start, min(align, _alignment([out])), out)

    def scatter(self, k_buffers, v_buffers, page_ids, page_size, head_start, src):
        ptrs, align = self._pools(k_buffers, v_buffers)
        check_staging(k_buffers, v_buffers, page_ids, page_size, head_start, src, buffers_checked=True)
        _, heads, dim = k_buffers[0].shape
        self._ext.scatter(ptrs, page_ids, page_size, heads, dim, head_start, min(align, _alignment([src])), src)

    def copy_pages(self, src, src_ids, src_head_start, dst, dst_ids, dst_head_start, head_count, page_size):
        (src_k, src_v), (dst_k, dst_v) = src, dst
        src_ptrs, src_align = self._pools(src_k, src_v)
        dst_ptrs, dst_align = self._pools(dst_k, dst_v)
        check_pool(src_k, src_v, src_ids, page_size, src_head_start, head_count, buffers_checked=True)
        check_pool(dst_k, dst_v, dst_ids, page_size, dst_head_start, head_count, buffers_checked=True)
        if src_ids.numel() != dst_ids.numel():
            raise ValueError(f"copy_pages: {src_ids.numel()} source pages but {dst_ids.numel()} destination pages")
        first_src, first_dst = src_k[0], dst_k[0]
        if first_src.dtype != first_dst.dtype or first_src.shape[2] != first_dst.shape[2]:
            raise ValueError("copy_pages: the pools differ in dtype or head_dim")
        if first_src.device != first_dst.device:
            return False  # another device's pool: staged through the transport instead
        if src_ids.numel() == 0:
            return True
        device = first_src.device
        self._ext.copy_pages(src_ptrs, dst_ptrs, src_ids.to(device).contiguous(), dst_ids.to(device).contiguous(),
                             page_size, first_src.shape[1], first_dst.shape[1], first_src.shape[2], src_head_start,
                             dst_head_start, head_count, first_src.element_size(), min(src_align, dst_align))
        return True
