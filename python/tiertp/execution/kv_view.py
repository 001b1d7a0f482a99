"""A rank's SGLang KV as tiertp.kv sees it: `KVGeometry` and a `KVPool` view.

`kv_pool_of(handle)` wraps SGLang's own per-layer k_buffer/v_buffer (no
copy) in a tiertp.kv.KVPool whose allocator is SGLang's (page size 1: a page
is a slot), so tiertp.kv.migrate can read a request's slots from an old
instance and allocate + scatter into a new one. Slots the migration
allocates are *reserved* on this rank (as `TpInstance.reserve_slots` does)
until `TpInstance.adopt` hands them to a request or `free_slots` returns them.

Head split: rank r of TP k holds KV heads [r*H/k, (r+1)*H/k) (SGLang's
QKVParallelLinear); tiertp.kv.heads_of_rank states it for power-of-two TP
(replication included); TP levels like 3 (SmolLM2's 3 KV heads) split evenly.
"""

from __future__ import annotations

from tiertp.execution.records import KVGeometry
from tiertp.kv.errors import OutOfKVSpace
from tiertp.kv.layout import HeadRange, heads_of_rank
from tiertp.kv.pool import KVPool
from tiertp.kv.shape import KVShape
from tiertp.kv.shared_pool import share_pool


def kv_heads_of_rank(num_kv_heads: int, tp: int, rank: int):
    """The global KV heads rank `rank` of TP `tp` holds (a tiertp.kv.HeadRange)."""
    if tp & (tp - 1) == 0:
        return heads_of_rank(num_kv_heads, tp, rank)
    if num_kv_heads % tp:
        raise ValueError(f"{num_kv_heads} KV heads cannot be split over TP {tp}")
    per = num_kv_heads // tp
    return HeadRange(rank * per, (rank + 1) * per)


def geometry_of(handle) -> KVGeometry:
    pool = handle.kv.kv_pool
    k0 = pool.k_buffer[0]
    cfg = handle.model_runner.model_config
    shape = KVShape(num_layers=len(pool.k_buffer), num_kv_heads=int(cfg.get_total_num_kv_heads()),
                    head_dim=int(k0.shape[2]), page_size=1, dtype=k0.dtype)
    return KVGeometry(shape, kv_heads_per_rank=int(k0.shape[1]), slots=int(k0.shape[0]))


class SglangSlotAllocator:
    """tiertp.kv's allocator interface (alloc/free/free_pages/num_pages) over
    SGLang's token_to_kv allocator; what it hands out is marked reserved."""

    def __init__(self, kv, gpu: int):
        self.kv, self.gpu = kv, gpu

    @property
    def num_pages(self) -> int:
        return self.kv.slot_rows - 1

    @property
    def free_pages(self) -> int:
        return self.kv.free_slots()

    def alloc(self, n: int) -> list[int]:
        if n > self.free_pages:
            raise OutOfKVSpace(self.gpu, n, self.free_pages)
        [slots] = self.kv.reserve([n])
        return slots

    def free(self, pages: list[int]) -> None:
        self.kv.free_reserved(list(pages))


def kv_pool_of(handle):
    """This rank's KV as a tiertp.kv.KVPool (views of SGLang's buffers)."""
    shape = geometry_of(handle).shape
    pool = handle.kv.kv_pool
    heads = kv_heads_of_rank(shape.num_kv_heads, handle.ctx.tp, handle.ctx.rank)
    view = KVPool(shape, heads, list(pool.k_buffer), list(pool.v_buffer), gpu=handle.ctx.device)
    view.allocator = SglangSlotAllocator(handle.kv, handle.ctx.device)
    return view


def share_kv_pool(handle):
    """Move this rank's KV buffers into shared memory (once; in place, see
    tiertp.kv.shared_pool), so a switch's receivers copy straight out of
    them. SGLang caches the buffers' addresses (for its slot-move kernels):
    they are recomputed. The pool's export, or None where it cannot be
    shared (GPU pools; a too small /dev/shm): migrations then stage."""
    view = handle.kv_pool()
    was_shared = view.shared is not None
    export = share_pool(view)
    if export is not None and not was_shared:
        refresh = getattr(handle.kv.kv_pool, "_init_data_ptrs_and_strides", None)
        if refresh is not None:
            refresh()
    return export

