"""KV gather/scatter kernels on one device: GB/s of each, and of a whole in-process migration.

A Llama-8B-shaped KV (32 layers, 8 KV heads, head dim 128, bf16) of one
request with a random, fragmented page list. For each context length and
page size it times, on the device's own clock (CUDA events on GPU):
- gather: every page of the request, all layers, K and V, into a staging
  tensor, of all heads (a prefill -> decode hand-off) and of half the heads
  (TP1 -> TP2: each new rank takes half);
- scatter: the inverse, into a second pool;
- migrate: `tiertp.kv.migrate` moving the request between two pools of this
  device (a TP switch's local moves: handshake, then pool to pool);
- migrate_staged: the same through staging chunks (--chunk-mib)
  (gather a chunk, scatter it), the path of a move to another device minus
  the transport: what the executor's per-chunk work costs;
- copy: one contiguous device-to-device copy of the same bytes, the
  device's ceiling the fractions are relative to.
GB/s counts KV payload bytes once (not read + written). The fastest of
--repeat runs is reported. The kernels are the ones `kernels_for(device)`
picks: the CUDA extension on GPU, the native CPU twin on CPU.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="auto", help="cuda, cpu or auto (cuda when a GPU is visible)")
    p.add_argument("--tokens", type=lambda s: [int(x) for x in s.split(",")], default=None,
                   help="comma-separated context lengths (default: 4096,32768,65536 on GPU, 2048,8192 on CPU)")
    p.add_argument("--page-sizes", type=lambda s: [int(x) for x in s.split(",")], default=[1, 16],
                   help="tokens per KV page (default 1,16)")
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--repeat", type=int, default=10)
    p.add_argument("--chunk-mib", type=float, default=None,
                   help="staging chunk of the migrations (default: the executor's for the device)")


def run(args) -> dict:
    import torch

    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    tokens = args.tokens or ([4096, 32768, 65536] if device == "cuda" else [2048, 8192])
    rows = [_measure(args, torch.device(device), n, ps) for n in tokens for ps in args.page_sizes]
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    return {"device": name, "dtype": "bf16", "layers": args.layers, "kv_heads": args.kv_heads,
            "head_dim": args.head_dim, "results": rows}


class _Clock:
    """Elapsed milliseconds of `fn` on the device's clock."""

    def __init__(self, device):
        import torch

        self.torch, self.cuda = torch, device.type == "cuda"

    def time(self, fn) -> float:
        torch = self.torch
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end)
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3


def _best(clock: _Clock, fn, repeat: int) -> float:
    fn()  # warm-up (and the first-use build of the kernels)
    return min(clock.time(fn) for _ in range(repeat))


def _measure(args, device, n_tokens: int, page_size: int) -> dict:
    import random

    import torch
    import torch.distributed as dist

    from tiertp.kv import HeadRange, KVPool, KVShape, Layout, MigrationContext, RequestKV, kernels_for, migrate
    from tiertp.kv import plan_migration
    from tiertp.kv.executor import default_chunk_bytes

    shape = KVShape(num_layers=args.layers, num_kv_heads=args.kv_heads, head_dim=args.head_dim,
                    page_size=page_size, dtype=torch.bfloat16)
    n_pages = -(-n_tokens // page_size)
    total_pages = n_pages + n_pages // 4 + 1
    heads = HeadRange(0, args.kv_heads)
    old = KVPool.allocate(shape, heads, total_pages, device=device)
    new = KVPool.allocate(shape, heads, total_pages, device=device)
    old.block.view(torch.int16).random_()
    pages = random.Random(n_tokens).sample(range(1, total_pages + 1), n_pages)
    ids = torch.tensor(pages, dtype=torch.long, device=device)
    kernels, clock = kernels_for(device), _Clock(device)
    chunk_bytes = int(args.chunk_mib * (1 << 20)) if args.chunk_mib else default_chunk_bytes(device)
    row = {"tokens": n_tokens, "page_size": page_size, "kernels": kernels.name, "chunk_mib": chunk_bytes / (1 << 20)}
    full = torch.empty(args.layers, 2, n_pages, page_size, args.kv_heads, args.head_dim,
                       dtype=torch.bfloat16, device=device)
    nbytes = full.numel() * full.element_size()
    row["kv_mb"] = round(nbytes / 1e6, 1)

    def gbps(ms: float, b: int = nbytes) -> float:
        return round(b / (ms * 1e6), 1)

    ms = _best(clock, lambda: kernels.gather(old.k_buffers, old.v_buffers, ids, page_size, 0, full), args.repeat)
    row["gather_all_heads_gbps"] = gbps(ms)
    half = full[:, :, :, :, : args.kv_heads // 2].contiguous()
    ms = _best(clock, lambda: kernels.gather(old.k_buffers, old.v_buffers, ids, page_size, 0, half), args.repeat)
    row["gather_half_heads_gbps"] = gbps(ms, nbytes // 2)
    ms = _best(clock, lambda: kernels.scatter(new.k_buffers, new.v_buffers, ids, page_size, 0, full), args.repeat)
    row["scatter_all_heads_gbps"] = gbps(ms)
    flat = full.view(-1)
    dst = torch.empty_like(flat)
    ms = _best(clock, lambda: dst.copy_(flat), args.repeat)
    row["contiguous_copy_gbps"] = gbps(ms)
    del full, half, flat, dst, new

    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=0, world_size=1)
        try:
            ctx = MigrationContext(gpu=0, group=dist.group.WORLD, gpu_to_rank={0: 0})
            old.allocator.take(pages)
            plan = plan_migration(shape, Layout.of((0,)), Layout.of((0,)), [RequestKV("r", tuple(pages), n_tokens, 0, 0)])
            for name, with_kernels in (("migrate", kernels), ("migrate_staged", _Staged(kernels))):
                times = []
                for _ in range(max(3, args.repeat // 2)):
                    fresh = KVPool.allocate(shape, heads, total_pages, device=device)
                    times.append(clock.time(lambda fresh=fresh: migrate(ctx, plan, old, fresh, kernels=with_kernels,
                                                                        chunk_bytes=chunk_bytes)))
                    del fresh
                row[f"{name}_ms"] = round(min(times), 3)
                row[f"{name}_ms_median"] = round(statistics.median(times), 3)
                row[f"{name}_gbps"] = gbps(min(times))
        finally:
            dist.destroy_process_group()
    return row


class _Staged:
    """The kernels with pool-to-pool copies turned off: every move is staged."""

    def __init__(self, kernels):
        self._kernels = kernels
        self.name = f"{kernels.name}-staged"

    def gather(self, *args):
        self._kernels.gather(*args)

    def scatter(self, *args):
        self._kernels.scatter(*args)

    def copy_pages(self, *args) -> bool:
        return False
