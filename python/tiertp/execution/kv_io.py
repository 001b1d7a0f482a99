"""`Call` targets that copy KV slots out of and into a rank (tests, same-TP hand-off).

They move bytes through the controller, so they suit small amounts and
checks; a real migration runs tiertp.kv.migrate inside the ranks (a `Call`
target using `RankHandle.kv_pool()`), rank to rank.
"""

from __future__ import annotations

import torch


def read_slots(handle, slots: list[int]) -> torch.Tensor:
    """A copy of this rank's K/V at `slots`: [layers, 2, len(slots), heads_per_rank, head_dim]."""
    pool = handle.kv.kv_pool
    ids = torch.tensor(slots, dtype=torch.int64, device=pool.k_buffer[0].device)
    return torch.stack([torch.stack([k[ids], v[ids]]) for k, v in zip(pool.k_buffer, pool.v_buffer)]).cpu()


def write_slots(handle, arg: tuple[list[int], list[torch.Tensor]]) -> None:
    """Write rank r's part `data[r]` (as read_slots returns it) into `slots`,
    which must be reserved on this rank (nothing a request owns is overwritten)."""
    slots, data = arg
    mine = data[handle.ctx.rank]
    ids = torch.tensor(slots, dtype=torch.int64)
    if not bool(handle.kv.reserved[ids].all()):
        raise ValueError("write_slots: some slots are not reserved for an import on this rank")
    pool = handle.kv.kv_pool
    if mine.shape[0] != len(pool.k_buffer) or mine.shape[2] != len(slots):
        raise ValueError(f"write_slots: data of shape {tuple(mine.shape)} does not match "
                         f"{len(pool.k_buffer)} layers x {len(slots)} slots")
    ids = ids.to(pool.k_buffer[0].device)
    for layer, (k, v) in enumerate(zip(pool.k_buffer, pool.v_buffer)):
        k[ids] = mine[layer, 0].to(k.device, k.dtype)
        v[ids] = mine[layer, 1].to(v.device, v.dtype)
