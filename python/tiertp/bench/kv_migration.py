"""KV migration between two processes: per-page vs aggregate vs pipelined.

A Llama-8B-shaped KV (32 layers, 8 KV heads, head dim 128, bf16, 1-token
pages: SGLang 0.5.23's default page_size, which the CPU workers use; --page-size 16
for a coarser layout) of one request with a random, fragmented page list moves from process
A (GPU 0's pool, TP1) to process B (GPU 1's pool, TP1): the prefill -> decode
hand-off, every head moving. Methods, all through the same transport (gloo
by default, --transport shm for shared memory):
- per_page: copy one page of one layer's K or V (one contiguous region of
  the pool) into the staging slot, send it, wait until the receiver copied
  it out, next page: the naive way, one message per page region. Requests
  over --per-page-sample pages send an evenly spread sample of that many
  pages per round and scale linearly (each page is the same layers x 2
  messages, one after another).
- aggregate: the migration executor with one staging slot: gather a chunk
  (all layers, K and V, many pages), send, wait for the scatter, repeat.
- pipelined: the executor with two alternating slots: the next chunk is
  gathered while the previous one is in flight / being scattered.
- contiguous: the same byte count from one contiguous buffer to another
  through the same transport and slots (no gather/scatter): the transport's
  ceiling on this machine, the bandwidth fractions are relative to it.
- memcpy_gbps: one in-process contiguous copy (one thread), for reference.
Each process uses one torch thread (two processes on the machine's cores).
All four methods run interleaved in each of --repeat rounds, and the fastest
round of each is reported (every round is listed too). Outside the timed
regions, up to 8 pages are compared bitwise between the two processes after
every per-page, aggregate and pipelined run.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import tempfile
import time

# Names, not torch dtypes: torch is imported only by the workers
# (tiertp.kv.bench_worker), so the CLI and other benchmarks don't pay for it.
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tokens", type=lambda s: [int(x) for x in s.split(",")], default=[4096, 16384, 40960],
                   help="comma-separated context lengths (default 4096,16384,40960)")
    # SGLang 0.5.23 resolves page_size=None to 1 on every non-MUSA platform unless the attention
    # backend needs larger pages (server_args post-processing `_page_size_default`).
    p.add_argument("--page-size", type=int, default=1,
                   help="tokens per KV page (default 1: SGLang's default page_size)")
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    # 8 MiB: over gloo at 16K tokens (3 interleaved rounds, quiet machine) 8 MiB gave the best contiguous
    # (2.38 GB/s) and pipelined (2.21 GB/s) figures; 4 MiB lost on per-message overhead (pipelined 1.89),
    # 16-64 MiB on cache misses (~1.9-2.0 both); 2 MiB was clearly slower under load.
    p.add_argument("--chunk-mib", type=float, default=8.0, help="staging chunk size in MiB")
    # gloo by default: it is the real cross-process transport on CPU (the NCCL stand-in); shm's
    # per-message cost is so low that it understates what paging costs over a real link.
    p.add_argument("--transport", choices=["shm", "dist"], default="dist",
                   help="dist: torch.distributed gloo (TCP loopback, default); shm: shared memory")
    p.add_argument("--repeat", type=int, default=3,
                   help="interleaved rounds of contiguous/aggregate/pipelined per size, the fastest reported")
    # Per-page over gloo costs 0.2-1.7 ms a message (depending on how busy the cores are): all 163840
    # messages of 40K tokens would take up to minutes, per round.
    p.add_argument("--per-page-sample", type=int, default=64,
                   help="pages per round really sent one region at a time (evenly spread); larger requests "
                        "are scaled linearly from them (default 64 pages = 4096 messages, 1-7 s over gloo)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds before the workers are killed")


def run(args) -> dict:
    spawn = mp.get_context("spawn")
    from tiertp.kv.bench_worker import worker

    opts = {k: v for k, v in vars(args).items() if isinstance(v, (int, float, str, list, bool, type(None)))}
    opts["dtype_name"] = DTYPES[args.dtype]
    with tempfile.TemporaryDirectory(prefix="tiertp-bench-kv-") as tmp:
        q = spawn.Queue()
        procs = [spawn.Process(target=worker, args=(r, os.path.join(tmp, "store"), opts, q), daemon=True)
                 for r in range(2)]
        for p in procs:
            p.start()
        result, deadline = None, time.monotonic() + args.timeout
        try:
            while result is None and time.monotonic() < deadline:
                try:
                    kind, payload = q.get(timeout=1.0)
                except Exception:  # queue.Empty: check the workers are still alive
                    if any(p.exitcode not in (None, 0) for p in procs):
                        raise RuntimeError("a benchmark worker died") from None
                    continue
                if kind == "error":
                    raise RuntimeError(f"benchmark worker failed:\n{payload}")
                result = payload
        finally:
            for p in procs:
                p.join(10 if result is not None else 0.1)
                if p.is_alive():
                    p.kill()
                    p.join(5)
        if result is None:
            raise RuntimeError(f"benchmark did not finish in {args.timeout} s")
        return result
