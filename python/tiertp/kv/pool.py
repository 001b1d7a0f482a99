"""One GPU's paged KV pool for one TP level: the buffers migration reads and writes."""

from __future__ import annotations

import torch

from tiertp.kv.allocator import PageAllocator
from tiertp.kv.errors import LayoutError
from tiertp.kv.ids import id_tensor
from tiertp.kv.layout import HeadRange
from tiertp.kv.shape import KVShape


class KVPool:
    """Per-layer K and V buffers of shape [(num_pages + 1) * page_size,
    heads.count, head_dim] (SGLang's `[slots + page, kv_heads_per_rank,
    head_dim]`), holding the global heads `heads`, plus their page allocator.

    Page p covers slots [p * page_size, (p + 1) * page_size). The buffers may
    be SGLang's own (`from_buffers`) or allocated here in one block (`allocate`).
    """

    def __init__(self, shape: KVShape, heads: HeadRange, k_buffers: list[torch.Tensor],
                 v_buffers: list[torch.Tensor], gpu: int = -1):
        if len(k_buffers) != shape.num_layers or len(v_buffers) != shape.num_layers:
            raise LayoutError(f"pool needs {shape.num_layers} K and V buffers, "
                              f"got {len(k_buffers)} and {len(v_buffers)}")
        slots = k_buffers[0].shape[0]
        if slots % shape.page_size or slots < 2 * shape.page_size:
            raise LayoutError(f"{slots} slots is not a whole number (>= 2) of {shape.page_size}-token pages")
        want = (slots, heads.count, shape.head_dim)
        for b in (*k_buffers, *v_buffers):
            if tuple(b.shape) != want or b.dtype != shape.dtype or not b.is_contiguous():
                raise LayoutError(f"KV buffer {tuple(b.shape)} {b.dtype} does not match "
                                  f"{want} {shape.dtype} (contiguous)")
        self.shape, self.heads, self.gpu = shape, heads, gpu
        self.k_buffers, self.v_buffers = list(k_buffers), list(v_buffers)
        self.allocator = PageAllocator(slots // shape.page_size - 1, gpu)
        # Set by tiertp.kv.shared_pool.share_pool once the buffers live in
        # shared memory: what peer processes need to read them directly.
        self.shared = None

    @classmethod
    def allocate(cls, shape: KVShape, heads: HeadRange, num_pages: int, gpu: int = -1,
                 device: str | torch.device = "cpu") -> KVPool:
        """A zeroed pool with `num_pages` usable pages; one block, per-layer views."""
        slots = (num_pages + 1) * shape.page_size
        block = torch.zeros(shape.num_layers, 2, slots, heads.count, shape.head_dim,
                            dtype=shape.dtype, device=device)
        pool = cls(shape, heads, [block[l, 0] for l in range(shape.num_layers)],
                   [block[l, 1] for l in range(shape.num_layers)], gpu)
        pool.block = block
        return pool

    @property
    def device(self) -> torch.device:
        return self.k_buffers[0].device

    @property
    def num_pages(self) -> int:
        return self.allocator.num_pages

    def read_pages(self, pages: list[int]) -> torch.Tensor:
        """A copy of `pages` as [L, 2, n, page_size, heads.count, head_dim] (for checks)."""
        ids = id_tensor(pages, self.device)
        ps = self.shape.page_size
        return torch.stack([
            torch.stack([b.view(-1, ps, self.heads.count, self.shape.head_dim)[ids]
                         for b in (k, v)])
            for k, v in zip(self.k_buffers, self.v_buffers)
        ])
