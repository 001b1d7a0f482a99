"""The gather/scatter kernel interface every implementation follows.

`KVKernels` states the contract; `check_pool` and `check_staging` are the
argument checks every implementation runs first, so they all reject bad
arguments the same way (ValueError). Implementations: `cuda.py`, `cpu.py`,
`torch_ops.py`; `selection.py` picks one for a device.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Generic, TypeVar

import torch

T = TypeVar("T")


class KVKernels(ABC):
    """Copies selected heads of a list of pages between a KV pool and a
    contiguous staging tensor, all layers, K and V.

    Staging layout: `[num_layers, 2, n_pages, page_size, head_count, head_dim]`
    contiguous, index 0 of dim 1 being K. Pool buffers are per-layer tensors
    `[slots, heads_local, head_dim]` (see KVPool). `head_start` is the first
    head to copy, counted in the pool's local heads.

    The contract every implementation keeps (tests/test_kv_kernels.py checks
    the CPU ones against a naive reference, tests/test_kv_kernels_cuda.py the
    CUDA ones where a GPU is visible):
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


def check_buffers(k_buffers: list[torch.Tensor], v_buffers: list[torch.Tensor]) -> None:
    """The per-buffer half of check_pool: as many K as V buffers, all
    [slots, heads, head_dim] of one dtype and device."""
    if len(k_buffers) != len(v_buffers) or not k_buffers:
        raise ValueError("need the same non-zero number of K and V buffers")
    first = k_buffers[0]
    if first.dim() != 3 or any(b.shape != first.shape or b.dtype != first.dtype or b.device != first.device
                               for b in (*k_buffers, *v_buffers)):
        raise ValueError("K and V buffers must all be [slots, heads, head_dim] of one dtype and device")


def check_pool(k_buffers: list[torch.Tensor], v_buffers: list[torch.Tensor], page_ids: torch.Tensor,
               page_size: int, head_start: int, head_count: int, *, buffers_checked: bool = False) -> None:
    """Checks of one pool's side of a copy (gather, scatter, copy_pages): the
    buffers (unless `buffers_checked`: see PoolCache), the heads
    [head_start, +head_count) and the page ids, so every implementation
    fails the same way."""
    if not buffers_checked:
        check_buffers(k_buffers, v_buffers)
    slots, heads, _ = k_buffers[0].shape
    if not 0 <= head_start or head_start + head_count > heads:
        raise ValueError(f"heads [{head_start}, {head_start + head_count}) outside the pool's {heads}")
    if page_ids.dtype != torch.long or page_ids.dim() != 1:
        raise ValueError("page_ids must be a 1-D int64 tensor")
    if slots % page_size:
        raise ValueError(f"{slots} slots is not a multiple of page size {page_size}")


def check_staging(k_buffers: list[torch.Tensor], v_buffers: list[torch.Tensor], page_ids: torch.Tensor,
                  page_size: int, head_start: int, staging: torch.Tensor, *, buffers_checked: bool = False) -> None:
    """Shared argument checks of gather and scatter, so every implementation fails the same way."""
    check_pool(k_buffers, v_buffers, page_ids, page_size, head_start, staging.shape[4] if staging.dim() == 6 else 0,
               buffers_checked=buffers_checked)
    first = k_buffers[0]
    want = (len(k_buffers), 2, page_ids.numel(), page_size, staging.shape[4] if staging.dim() == 6 else -1,
            first.shape[2])
    if staging.dim() != 6 or tuple(staging.shape) != want or not staging.is_contiguous():
        raise ValueError(f"staging must be contiguous {want}, got {tuple(staging.shape)}")
    if staging.dtype != first.dtype:
        raise ValueError(f"staging dtype {staging.dtype} != pool dtype {first.dtype}")


class PoolCache(Generic[T]):
    """What an implementation derives from a pool's buffers (a pointer
    table), built once per pool, after its buffers pass `check_buffers`.

    A pool's buffers never move, and a migration calls the kernels once per
    chunk: checking every buffer on every call costs more than a 16 MiB
    copy takes on a GPU. Pools are told apart by their buffers' addresses
    and the first one's shape, dtype and device."""

    def __init__(self, build: Callable[[list[torch.Tensor]], T]):
        self._build = build
        self._known: dict[tuple, T] = {}

    def __call__(self, k_buffers: list[torch.Tensor], v_buffers: list[torch.Tensor]) -> T:
        first = (k_buffers[0].shape, k_buffers[0].dtype, k_buffers[0].device) if k_buffers else ()
        key = (len(k_buffers), len(v_buffers), *map(torch.Tensor.data_ptr, k_buffers),
               *map(torch.Tensor.data_ptr, v_buffers), *first)
        hit = self._known.get(key)
        if hit is None:
            check_buffers(k_buffers, v_buffers)
            hit = self._known[key] = self._build([b for pair in zip(k_buffers, v_buffers) for b in pair])
        return hit
