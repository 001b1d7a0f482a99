"""One weight copy per device, whatever the number of TP-level processes.

The test process creates the store of the tiny Llama (as a node agent
would); two spawned processes of the same device attach it: a TP1 process
and the rank-1 process of TP2. Sharing is asserted, not inferred from sizes:
- every parameter of both lies inside the one mapping, and TP2 rank 1's
  parameters address exactly the bytes TP1 uses for that rank's share;
- a write through one process's parameter is read through the other's;
- the kernel's page accounting (smaps): the rank-1 process maps no page
  privately, the processes' proportional shares (Pss) add up to one copy,
  the store file holds one copy, and binding grew neither process's private
  (anonymous) memory by more than a fraction of the weights it views.
"""

from __future__ import annotations

import multiprocessing
import os

import torch
from weights_fixtures import skeleton

from tiertp.engine.models import resolve_model
from tiertp.weights import attach, bind, create_store

_PAGE = 4096


def _rss_anon() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no RssAnon in /proc/self/status")


def _span(p: torch.Tensor, base: torch.Tensor) -> tuple[int, int]:
    """[first, last] byte offsets `p` addresses, relative to the mapping's start."""
    last = sum((s - 1) * st for s, st in zip(p.shape, p.stride()))
    start = p.data_ptr() - base.data_ptr()
    return start, start + (last + 1) * p.element_size() - 1


def _device_process(conn, handle, tp: int, rank: int) -> None:
    """One execution process of the device: attach, bind, touch, then serve commands."""
    anon_before = _rss_anon()
    store = attach(handle)
    model = skeleton(store, tp, rank)
    stats = bind(model, store, tp, rank)
    with torch.no_grad():
        for p in model.parameters():
            float(p.sum())  # fault in every page this rank reads
    conn.send({
        "spans": {n: _span(p, store.base) for n, p in model.named_parameters()},
        "inside": all(store.contains(p) for p in model.parameters()),
        "anon_growth": _rss_anon() - anon_before,
        "view_bytes": stats.view_bytes,
    })
    while True:
        cmd, *args = conn.recv()
        if cmd == "memory":
            conn.send(store.memory())
        elif cmd == "write":
            name, index, value = args
            with torch.no_grad():
                model.get_parameter(name)[index] = value
            conn.send(None)
        elif cmd == "read":
            name, index = args
            conn.send(float(model.get_parameter(name)[index]))
        else:
            conn.send(None)
            return


def test_two_tp_levels_of_a_device_share_one_copy():
    ctx = multiprocessing.get_context("spawn")
    with create_store(resolve_model("tiny-llama"), (1, 2, 4), dtype="float32") as store:
        layout = store.layout
        procs, conns = [], []
        try:
            for tp, rank in ((1, 0), (2, 1)):
                ours, theirs = ctx.Pipe()
                p = ctx.Process(target=_device_process, args=(theirs, store.handle, tp, rank))
                p.start()
                procs.append(p)
                conns.append(ours)
            tp1, tp2 = (c.recv() for c in conns)
            a, b = conns

            # Every parameter lies in the mapping; TP2 rank 1 addresses TP1's bytes for its share.
            assert tp1["inside"] and tp2["inside"]
            for name, (lo, hi) in tp2["spans"].items():
                full_lo, full_hi = tp1["spans"][name]
                assert full_lo <= lo <= hi <= full_hi, name
            qkv = "model.layers.0.self_attn.qkv_proj.weight"
            per_block = sum(layout.entry(qkv).block_parts)
            row_size = layout.entry(qkv).shape[1] * 4
            assert tp2["spans"][qkv][0] == tp1["spans"][qkv][0] + 2 * per_block * row_size  # blocks 2, 3 of 4

            # A write through one process is read through the other.
            a.send(("write", qkv, (2 * per_block + 3, 5), 1234.5))
            a.recv()
            b.send(("read", qkv, (3, 5)))
            assert b.recv() == 1234.5
            o_proj = "model.layers.1.self_attn.o_proj.weight"  # stored transposed: [out, in/tp] views
            a.send(("write", o_proj, (7, 130), -77.0))
            a.recv()
            b.send(("read", o_proj, (7, 130 - 128)))
            assert b.recv() == -77.0
            b.send(("write", "model.norm.weight", (3,), 42.0))
            b.recv()
            a.send(("read", "model.norm.weight", (3,)))
            assert a.recv() == 42.0

            # The kernel's accounting: one copy.
            a.send(("memory",))
            b.send(("memory",))
            mem_a, mem_b = a.recv(), b.recv()
            mem_owner = store.memory()
            file_bytes = os.stat(store.handle.backing.path).st_blocks * 512
            assert file_bytes <= layout.nbytes  # tmpfs holds one copy
            assert mem_b["Private_Clean"] + mem_b["Private_Dirty"] == 0  # all its pages mapped elsewhere too
            assert mem_b["Rss"] >= tp2["view_bytes"] - 64 * _PAGE
            assert mem_a["Rss"] >= tp1["view_bytes"] - 64 * _PAGE
            total_pss = mem_owner["Pss"] + mem_a["Pss"] + mem_b["Pss"]
            assert abs(total_pss - file_bytes) <= 16 * _PAGE, (total_pss, file_bytes)
            for r in (tp1, tp2):
                assert r["anon_growth"] < 0.25 * r["view_bytes"], r["anon_growth"]
        finally:
            for c in conns:
                try:
                    c.send(("exit",))
                except (BrokenPipeError, OSError):
                    pass
            for p in procs:
                p.join(timeout=30)
                if p.is_alive():
                    p.kill()
                    p.join()
        assert all(p.exitcode == 0 for p in procs)
