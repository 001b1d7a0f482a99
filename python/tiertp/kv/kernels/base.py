"""The gather/scatter kernel interface every implementation follows.

`KVKernels` states the contract; `check_pool` and `check_staging` are the
argument checks every implementation runs first, so they all reject bad
arguments the same way (ValueError). Implementations: `cuda.py`, `cpu.py`,
`torch_ops.py`; `selection.py` picks one for a device.
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
    head to copy, counted in the pool's local heads.

    The contract every implementation keeps (tests/test_kv_kernels.py checks
    the CPU ones against a naive reference):
    - copies are bitwise: values are never converted (NaN payloads survive);
    - only the pages in `page_ids` and the heads [head_start, +head_count)
      are written, nothing else of the pool or the staging tensor;
    - arguments are checked first with `check_pool` / `check_staging`, so
      every implementation rejects the same bad calls (ValueError);
    - `scatter` requires distinct page ids (the migration allocates fresh
      pages, so they are);
    - a call may only enqueue the copy on the device (the CUDA kernels
      launch on the current stream): callers order it with streams/events.
    """

    name: str  # short and stable ("cuda", "cpu", "torch"): which implementation runs

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
