"""The shape of a model's paged KV cache, shared by every pool and plan."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tiertp.kv.errors import LayoutError


@dataclass(frozen=True)
class KVShape:
    """Model-wide KV geometry. `num_kv_heads` is the global head count (all
    ranks together); a pool holds a head range of it. K and V of every layer
    have the same shape, as in SGLang's MHATokenToKVPool."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    page_size: int
    dtype: torch.dtype = torch.bfloat16

    def __post_init__(self) -> None:
        for name in ("num_layers", "num_kv_heads", "head_dim", "page_size"):
            if getattr(self, name) < 1:
                raise LayoutError(f"KVShape.{name} must be >= 1, got {getattr(self, name)}")

    @property
    def itemsize(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()

    def page_bytes(self, head_count: int) -> int:
        """Bytes of one page of `head_count` heads over all layers, K and V."""
        return self.num_layers * 2 * self.page_size * head_count * self.head_dim * self.itemsize

    def pages_for(self, context_len: int) -> int:
        """Pages holding `context_len` tokens (the last one may be partial)."""
        return -(-context_len // self.page_size)

    def signature(self) -> tuple:
        """What two sides of a migration must agree on (sent in the handshake)."""
        return (self.num_layers, self.num_kv_heads, self.head_dim, self.page_size, str(self.dtype))
