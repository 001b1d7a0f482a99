"""`RankCall`s that copy KV slots out of and into a rank (tests, the relay of
tiertp.switching), and one that describes the rank's KV as a migration sees it.

They move bytes through the controller, so they suit small amounts and
checks; a real migration runs tiertp.kv.migrate inside the ranks (a
`RankCall` using `RankHandle.kv_pool()`), rank to rank.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tiertp.execution.rank_call import RankCall
from tiertp.execution.rank_handle import RankHandle


@dataclass(frozen=True)
class ReadSlots(RankCall):
    """A copy of this rank's K/V at `slots`: [layers, 2, len(slots), heads_per_rank, head_dim]."""

    slots: tuple[int, ...]

    def run(self, handle: RankHandle) -> torch.Tensor:
        pool = handle.kv.kv_pool
        ids = torch.tensor(self.slots, dtype=torch.int64, device=pool.k_buffer[0].device)
        return torch.stack([torch.stack([k[ids], v[ids]]) for k, v in zip(pool.k_buffer, pool.v_buffer)]).cpu()


@dataclass(frozen=True)
class WriteSlots(RankCall):
    """Write rank r's part `per_rank[r]` (as ReadSlots returns it) into `slots`,
    which must be reserved on this rank (nothing a request owns is overwritten)."""

    slots: tuple[int, ...]
    per_rank: tuple[torch.Tensor, ...]

    def run(self, handle: RankHandle) -> None:
        mine = self.per_rank[handle.ctx.rank]
        ids = torch.tensor(self.slots, dtype=torch.int64)
        if not bool(handle.kv.reserved[ids].all()):
            raise ValueError("write_slots: some slots are not reserved for an import on this rank")
        pool = handle.kv.kv_pool
        if mine.shape[0] != len(pool.k_buffer) or mine.shape[2] != len(self.slots):
            raise ValueError(f"write_slots: data of shape {tuple(mine.shape)} does not match "
                             f"{len(pool.k_buffer)} layers x {len(self.slots)} slots")
        ids = ids.to(pool.k_buffer[0].device)
        for layer, (k, v) in enumerate(zip(pool.k_buffer, pool.v_buffer)):
            k[ids] = mine[layer, 0].to(k.device, k.dtype)
            v[ids] = mine[layer, 1].to(v.device, v.dtype)


@dataclass(frozen=True)
class DescribeKV(RankCall):
    """What a migration sees on this rank (for checks and logs): the KV heads
    held, the KV shape signature, the free slots, and whether the view's
    buffers are SGLang's own (zero-copy)."""

    def run(self, handle: RankHandle) -> dict:
        view = handle.kv_pool()
        pool = handle.kv.kv_pool
        zero_copy = all(a.data_ptr() == b.data_ptr() for a, b in zip(view.k_buffers + view.v_buffers,
                                                                     list(pool.k_buffer) + list(pool.v_buffer)))
        return {"heads": (view.heads.start, view.heads.stop), "shape": view.shape.signature(),
                "free_slots": view.allocator.free_pages, "zero_copy": zero_copy}
