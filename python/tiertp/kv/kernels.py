"""The gather/scatter kernel interface and how to pick an implementation.

Implementations: `CudaKernels` (the CUDA extension in kernels/kv_migrate/),
its CPU twin `CpuKernels` (kernels/kv_migrate/kv_migrate_cpu.cpp, memcpy per
contiguous run; what the tests and the benchmark run), and `TorchKernels`
(torch ops, the CPU fallback without a C++ compiler). `ReferenceKernels` is
the naive loop they are all checked against.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch


class KVKernels(ABC):
    """Copies selected heads of a list of pages between a KV pool and a
    contiguous staging tensor, all layers, K and V.

    Staging layout: `[num_layers, 2, n_pages, page_size, head_count, head_dim]`
    contiguous, index 0 of dim 1 being K. Pool buffers are per-layer tensors
    `[slots, heads_local, head_dim]` (see KVPool). `head_start` is the first
    head to copy, counted in the pool's local heads. Copies are bitwise:
    values are never converted. `scatter` requires distinct page ids (the
    migration allocates fresh pages, so they are).
    """

    name: str

    @abstractmethod
    def gather(self, k_buffers: list[torch.Tensor], v_buffers: list[torch.Tensor],
               page_ids: torch.Tensor, page_size: int, head_start: int, out: torch.Tensor) -> None:
        """out[l, 0|1, i] = K|V of layer l at page page_ids[i], heads
        [head_start, head_start + out.shape[4])."""

    @abstractmethod
    def scatter(self, k_buffers: list[torch.Tensor], v_buffers: list[torch.Tensor],
                page_ids: torch.Tensor, page_size: int, head_start: int, src: torch.Tensor) -> None:
        """The inverse of gather: write src into those pages and heads."""

    def copy_pages(self, src: tuple[list[torch.Tensor], list[torch.Tensor]], src_ids: torch.Tensor,
                   src_head_start: int, dst: tuple[list[torch.Tensor], list[torch.Tensor]], dst_ids: torch.Tensor,
                   dst_head_start: int, head_count: int, page_size: int) -> bool:
        """Pool to pool with no staging tensor: heads [src_head_start, +head_count)
        of pages src_ids[i] of the (K buffers, V buffers) `src` into heads
        [dst_head_start, +head_count) of pages dst_ids[i] of `dst`, every
        layer. True if done; False, with nothing written, when this
        implementation cannot do it in one pass (the caller then gathers
        into a staging tensor and scatters). Default: False."""
        return False


def check_pool(k_buffers: list[torch.Tensor], v_buffers: list[torch.Tensor], page_ids: torch.Tensor,
               page_size: int, head_start: int, head_count: int) -> None:
    """Checks of one pool's side of a copy (gather, scatter, copy_pages): the
    buffers, the heads [head_start, +head_count) and the page ids, so every
    implementation fails the same way."""
    if len(k_buffers) != len(v_buffers) or not k_buffers:
        raise ValueError("need the same non-zero number of K and V buffers")
    first = k_buffers[0]
    if first.dim() != 3 or any(b.shape != first.shape or b.dtype != first.dtype or b.device != first.device
                               for b in (*k_buffers, *v_buffers)):
        raise ValueError("K and V buffers must all be [slots, heads, head_dim] of one dtype and device")
    slots, heads, _ = first.shape
    if not 0 <= head_start or head_start + head_count > heads:
        raise ValueError(f"heads [{head_start}, {head_start + head_count}) outside the pool's {heads}")
    if page_ids.dtype != torch.long or page_ids.dim() != 1:
        raise ValueError("page_ids must be a 1-D int64 tensor")
    if slots % page_size:
        raise ValueError(f"{slots} slots is not a multiple of page size {page_size}")


def check_staging(k_buffers: list[torch.Tensor], v_buffers: list[torch.Tensor], page_ids: torch.Tensor,
                  page_size: int, head_start: int, staging: torch.Tensor) -> None:
    """Shared argument checks of gather and scatter, so every implementation fails the same way."""
    check_pool(k_buffers, v_buffers, page_ids, page_size, head_start, staging.shape[4] if staging.dim() == 6 else 0)
    first = k_buffers[0]
    want = (len(k_buffers), 2, page_ids.numel(), page_size, staging.shape[4] if staging.dim() == 6 else -1,
            first.shape[2])
    if staging.dim() != 6 or tuple(staging.shape) != want or not staging.is_contiguous():
        raise ValueError(f"staging must be contiguous {want}, got {tuple(staging.shape)}")
    if staging.dtype != first.dtype:
        raise ValueError(f"staging dtype {staging.dtype} != pool dtype {first.dtype}")


def kernels_for(device: torch.device | str) -> KVKernels:
    """The kernels for pools on `device`: the CUDA extension on GPU (NoGPUError
    without one), the native CPU twin otherwise (torch ops if it cannot build)."""
    if torch.device(device).type == "cuda":
        from tiertp.kv.cuda_kernels import CudaKernels

        return CudaKernels()
    from tiertp.kv.cpu_kernels import CpuKernels
    from tiertp.kv.errors import KVMigrationError

    try:
        return CpuKernels()
    except KVMigrationError as e:  # no compiler: slower, but correct
        import logging

        from tiertp.kv.torch_kernels import TorchKernels

        logging.getLogger(__name__).warning("native CPU KV kernels unavailable (%s); using torch ops", e)
        return TorchKernels()
