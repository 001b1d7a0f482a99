"""Gather/scatter in torch ops: runs on any device torch does, no compiler needed
(the CPU fallback when the native twin cannot be built)."""

from __future__ import annotations

import torch

from tiertp.kv.kernels.base import KVKernels, check_staging

# Copy through same-width integer views: a bitwise copy whatever the float
# type (no NaN canonicalisation), and index_select/index_copy_ run their
# plain-memory paths on integers.
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _heads_view(buf: torch.Tensor, page_size: int, head_start: int, head_count: int) -> torch.Tensor:
    """[pages, page_size, head_count, head_dim] strided view of one layer's buffer."""
    slots, heads, dim = buf.shape
    bits = buf.view(_BITS[buf.element_size()])
    return bits.view(slots // page_size, page_size, heads, dim)[:, :, head_start:head_start + head_count]


def _pairs(k_buffers, v_buffers, page_size: int, head_start: int, staging: torch.Tensor):
    """(pool pages view, staging slot) per (layer, K|V), both as integer views."""
    hc = staging.shape[4]
    bits = staging.view(_BITS[staging.element_size()])
    for layer, (k, v) in enumerate(zip(k_buffers, v_buffers)):
        for kv, buf in enumerate((k, v)):
            yield _heads_view(buf, page_size, head_start, hc), bits[layer, kv]


class TorchKernels(KVKernels):
    """One index_select / index_copy_ per (layer, K|V): the per-page loop runs
    inside torch, so the Python cost is 2 * num_layers calls per chunk."""

    name = "torch"

    def gather(self, k_buffers, v_buffers, page_ids, page_size, head_start, out):
        check_staging(k_buffers, v_buffers, page_ids, page_size, head_start, out)
        for pages, staged in _pairs(k_buffers, v_buffers, page_size, head_start, out):
            torch.index_select(pages, 0, page_ids, out=staged)

    def scatter(self, k_buffers, v_buffers, page_ids, page_size, head_start, src):
        check_staging(k_buffers, v_buffers, page_ids, page_size, head_start, src)
        for pages, staged in _pairs(k_buffers, v_buffers, page_size, head_start, src):
            pages.index_copy_(0, page_ids, staged)
