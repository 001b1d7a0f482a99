"""The two processes of `tiertp bench kv-migration` (see tiertp.bench.kv_migration)."""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist

from tiertp.kv import (DistTransport, KVPool, KVShape, Layout, MigrationContext, RequestKV, ShmTransport,
                       heads_of_rank, migrate, plan_migration)

NOTES = [
    "per_page_s: one message (send, wait for the receiver's copy-out) per page region (page x layer x K|V). "
    "When the request has more than --per-page-sample pages, each round really sends only an evenly spread "
    "sample of per_page_measured_pages pages (a different one per round), through the same code path, and its "
    "time is scaled by per_page_total_pages / per_page_measured_pages: every page costs the same fixed number "
    "of equal-size messages (layers x 2) sent strictly one after another, so the cost is linear in the page "
    "count (per_page_extrapolated says when this was done; otherwise every page was sent).",
    "per-page, contiguous, aggregate and pipelined run interleaved in each of --repeat rounds (so a noisy "
    "neighbour hits all of them alike); *_s is the fastest round (repeat_stat: min), *_runs_s lists every "
    "round, pipelined_frac_median is the median over rounds of contiguous/pipelined from the same round and "
    "pipelined_vs_per_page_median the ratio of the two methods' median rounds. Per-page is latency-bound (a "
    "round trip between the processes per message), so it swings most with the neighbours' load.",
    "All methods share one transport; memcpy_gbps is an in-process one-thread copy, for reference only.",
]


def worker(rank: int, store: str, opts: dict, q) -> None:
    """Process `rank` (0 sends, 1 receives) of the benchmark; rank 0 puts
    ("ok", figures) on q, any failure puts ("error", traceback)."""
    try:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2,
                                timeout=timedelta(seconds=opts["timeout"]))
        try:
            out = _bench(rank, argparse.Namespace(**opts))
        finally:
            dist.destroy_process_group()
        if rank == 0:
            q.put(("ok", out))
    except BaseException:
        q.put(("error", traceback.format_exc()))
        raise


def _bench(rank: int, a) -> dict:
    t_start = time.perf_counter()
    shape = KVShape(a.layers, a.kv_heads, a.head_dim, a.page_size, getattr(torch, a.dtype_name))
    group = dist.new_group([0, 1], backend="gloo")
    ctx = MigrationContext(gpu=rank, group=group, gpu_to_rank={0: 0, 1: 1}, timeout_s=a.timeout)
    transport = {"shm": ShmTransport, "dist": DistTransport}[a.transport]()
    chunk = int(a.chunk_mib * (1 << 20))
    heads = heads_of_rank(shape.num_kv_heads, 1, 0)
    figures = {}
    memcpy = max(_memcpy_gbps() for _ in range(3))
    for tokens in a.tokens:
        n = shape.pages_for(tokens)
        rng = random.Random(tokens)
        pages = rng.sample(range(1, n + 1), n)  # every page of the pool, in a random order: fully fragmented
        req = RequestKV(f"req-{tokens}", tuple(pages), tokens, 0, 0)
        plan = plan_migration(shape, Layout.of((0,)), Layout.of((1,)), [req])
        pool = KVPool.allocate(shape, heads, n, gpu=rank)
        if rank == 0:
            _fill(pool.block)
            pool.allocator.take(pages)
        old, new = (pool, None) if rank == 0 else (None, pool)
        nbytes = plan.bytes_to_move()
        dist.barrier(group=group)
        runs = {"per_page_s": [], "contiguous_s": [], "aggregate_s": [], "pipelined_s": []}
        for r in range(a.repeat):  # interleaved: each round sees the same neighbours
            positions = _sample(n, a.per_page_sample, r, a.repeat)
            t = _timed(group, lambda: _per_page(ctx, transport, shape, pool, pages, positions))
            runs["per_page_s"].append(t * n / len(positions))  # exact when every page was sent
            _verify_per_page(group, pool, pages, positions)
            runs["contiguous_s"].append(_timed(group, lambda: _contiguous(ctx, transport, pool, nbytes, chunk)))
            for name, slots in (("aggregate_s", 1), ("pipelined_s", 2)):
                done = []
                runs[name].append(_timed(group, lambda slots=slots: done.append(
                    migrate(ctx, plan, old, new, transport=transport, chunk_bytes=chunk, slots=slots))))
                if new is not None:  # outside the timed region: check, then give the pages back
                    got = done[0].pages[req.request_id]
                    _verify(group, new, got)
                    new.allocator.free(got)
                else:
                    _verify(group, old, pages)
        figures[str(tokens)] = _figures(nbytes, n, len(positions), 2 * shape.num_layers, runs, memcpy)
        pool = old = new = None  # free this size's pools before allocating the next
    big = figures.get("40960")
    return {
        "transport": a.transport, "chunk_bytes": chunk, "page_size": a.page_size, "repeat": a.repeat,
        "repeat_stat": "min", "per_page_sample_pages": a.per_page_sample,
        "shape": {"layers": a.layers, "kv_heads": a.kv_heads, "head_dim": a.head_dim, "dtype": a.dtype},
        "memcpy_gbps": _sig(memcpy), "tokens": figures,
        # Judged on the fastest rounds (repeat_stat); the ratios are given to show the margin.
        "target_met_40k": None if big is None else {
            "pipelined_20x_per_page": big["pipelined_vs_per_page"] >= 20,
            "pipelined_50pct_contiguous": big["pipelined_frac"] >= 0.5,
            "pipelined_vs_per_page": big["pipelined_vs_per_page"],
            "pipelined_vs_per_page_median": big["pipelined_vs_per_page_median"],
            "pipelined_frac": big["pipelined_frac"], "pipelined_frac_median": big["pipelined_frac_median"]},
        "verified": "after every per-page, aggregate and pipelined run, up to 8 pages compared "
                    "bitwise between the processes (outside the timed regions)",
        "notes": NOTES, "wall_s": _sig(time.perf_counter() - t_start),
    }


def _figures(nbytes: int, n: int, measured: int, msgs_per_page: int, runs: dict, memcpy: float) -> dict:
    t = {k: min(v) for k, v in runs.items()}
    gb = nbytes / 1e9
    return {
        "bytes": nbytes, "pages": n, **{k: _sig(v) for k, v in t.items()},
        "per_page_measured_pages": measured, "per_page_total_pages": n, "per_page_extrapolated": measured < n,
        "per_page_message_us": _sig(t["per_page_s"] / (n * msgs_per_page) * 1e6),
        "per_page_gbps": _sig(gb / t["per_page_s"]), "aggregate_gbps": _sig(gb / t["aggregate_s"]),
        "pipelined_gbps": _sig(gb / t["pipelined_s"]), "contiguous_gbps": _sig(gb / t["contiguous_s"]),
        "per_page_frac": _sig(t["contiguous_s"] / t["per_page_s"]),
        "aggregate_frac": _sig(t["contiguous_s"] / t["aggregate_s"]),
        "pipelined_frac": _sig(t["contiguous_s"] / t["pipelined_s"]),
        "pipelined_frac_median": _sig(statistics.median(
            c / p for c, p in zip(runs["contiguous_s"], runs["pipelined_s"]))),
        "pipelined_vs_per_page": _sig(t["per_page_s"] / t["pipelined_s"]),
        "pipelined_vs_per_page_median": _sig(statistics.median(runs["per_page_s"]) /
                                             statistics.median(runs["pipelined_s"])),
        "pipelined_frac_of_memcpy": _sig(gb / t["pipelined_s"] / memcpy),
        **{k.replace("_s", "_runs_s"): [_sig(x) for x in v] for k, v in runs.items()},
    }


def _sig(x: float) -> float:
    """Four significant digits: small and large figures both stay readable."""
    return float(f"{x:.4g}")


def _sample(n: int, k: int, r: int, rounds: int) -> list[int]:
    """k positions evenly spread over range(n) (all of them when n <= k);
    round r shifts them by r/rounds of the stride, so rounds send different pages."""
    if n <= k:
        return list(range(n))
    return [(i * rounds + r) * n // (k * rounds) for i in range(k)]


def _timed(group, fn) -> float:
    dist.barrier(group=group)
    t0 = time.perf_counter()
    fn()
    dist.barrier(group=group)
    return time.perf_counter() - t0


def _memcpy_gbps() -> float:
    src = torch.ones(256 << 20, dtype=torch.uint8)
    dst = torch.empty_like(src)
    dst.copy_(src)  # touch the pages first
    t0 = time.perf_counter()
    dst.copy_(src)
    return src.numel() / (time.perf_counter() - t0) / 1e9


def _fill(block: torch.Tensor) -> None:
    """Random bits without paying for generating gigabytes of them: one
    random tile, copied over the block with a shift per copy."""
    flat = block.view(-1).view(torch.int16)
    tile = torch.randint(-(2 ** 15), 2 ** 15, (1 << 22,), dtype=torch.int32).to(torch.int16)
    for i, start in enumerate(range(0, flat.numel(), tile.numel())):
        part = flat[start:start + tile.numel()]
        part.copy_(tile[:part.numel()])
        part.add_(i)


def _contiguous(ctx, transport, pool, nbytes: int, chunk: int) -> None:
    """nbytes from a contiguous region of A's block to B's, double-buffered."""
    flat = pool.block.view(-1).view(torch.uint8)[:nbytes]
    sizes = [min(chunk, nbytes - o) for o in range(0, nbytes, chunk)]
    sends, recvs = ({1: sizes}, {}) if ctx.gpu == 0 else ({}, {0: sizes})
    out, inc = transport.open(ctx, sends, recvs, chunk, 2, pool.device)
    for seq, off in enumerate(range(0, nbytes, chunk)):
        if ctx.gpu == 0:
            out[1].acquire(seq)[:sizes[seq]].copy_(flat[off:off + sizes[seq]])
            out[1].post(seq, sizes[seq])
        else:
            flat[off:off + sizes[seq]].copy_(inc[0].wait(seq))
            inc[0].release(seq)
    (out[1] if ctx.gpu == 0 else inc[0]).finish()


def _page_buffers(shape, pool) -> list[torch.Tensor]:
    """Per layer, K then V: [pages, region bytes] views of the pool."""
    region = shape.page_size * pool.heads.count * shape.head_dim * shape.itemsize
    return [b.view(-1).view(torch.uint8).view(-1, region) for pair in zip(pool.k_buffers, pool.v_buffers)
            for b in pair]


def _per_page(ctx, transport, shape, pool, pages: list[int], positions: list[int]) -> None:
    """One message per page region (page x layer x K|V), sent and waited for
    one at a time, for the pages at `positions` of the request. B writes
    position i into its page i + 1 (its own allocation)."""
    bufs = _page_buffers(shape, pool)
    region = bufs[0].shape[1]
    count = len(positions) * len(bufs)
    sends, recvs = ({1: [region] * count}, {}) if ctx.gpu == 0 else ({}, {0: [region] * count})
    out, inc = transport.open(ctx, sends, recvs, region, 1, pool.device)
    seq = 0
    for i in positions:
        for buf in bufs:
            if ctx.gpu == 0:
                out[1].acquire(seq).copy_(buf[pages[i]])
                out[1].post(seq, region)
            else:
                buf[i + 1].copy_(inc[0].wait(seq))
                inc[0].release(seq)
            seq += 1
    (out[1] if ctx.gpu == 0 else inc[0]).finish()


def _verify_per_page(group, pool, pages: list[int], positions: list[int]) -> None:
    """Up to 8 of the pages the per-page run moved, compared across processes."""
    picked = random.Random(len(positions)).sample(positions, min(8, len(positions)))
    mine = [pages[i] for i in picked] if dist.get_rank(group) == 0 else [i + 1 for i in picked]
    _compare(group, pool.read_pages(mine))


def _verify(group, pool, pages: list[int]) -> None:
    """Compare 8 random pages (same positions in the request) across processes."""
    idx = random.Random(len(pages)).sample(range(len(pages)), min(8, len(pages)))
    _compare(group, pool.read_pages([pages[i] for i in idx]))


def _compare(group, mine: torch.Tensor) -> None:
    both: list = [None, None]
    dist.all_gather_object(both, mine.view(torch.int16), group=group)
    if not torch.equal(both[0], both[1]):
        raise RuntimeError("migrated KV differs from the source")
