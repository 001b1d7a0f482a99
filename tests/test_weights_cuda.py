"""The weight store on a GPU (CUDA IPC): the same bytes as the CPU store for
every TP level's shard, one allocation that processes of the device map
without a copy (a write through one is read through the other), and a
model bound to it computing on the GPU. Skipped where no GPU is visible
(CI); test_weights_store.py checks the CPU store and the no-GPU error."""

from __future__ import annotations

import multiprocessing

import pytest
import torch
from test_weights_store import write_llama
from weights_fixtures import skeleton

from tiertp.weights import attach, bind, create_store

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

LEVELS = (1, 2, 4)


def test_every_shard_on_the_gpu_equals_the_cpu_stores(tmp_path):
    write_llama(tmp_path)
    with create_store(tmp_path, LEVELS) as cpu, create_store(tmp_path, LEVELS, device="cuda:0") as gpu:
        assert gpu.device.type == "cuda" and gpu.handle.device == "cuda:0"
        assert gpu.base.numel() == cpu.base.numel()
        for name in cpu.layout.names():
            for tp in LEVELS:
                for rank in range(tp):
                    view = gpu.shard(name, tp, rank)
                    assert gpu.contains(view)
                    assert torch.equal(view.cpu(), cpu.shard(name, tp, rank)), (name, tp, rank)


def _device_process(conn, handle, tp: int, rank: int) -> None:
    """An execution process of the device: attach, bind on the GPU, then
    answer reads and writes of one parameter."""
    store = attach(handle)
    model = skeleton(store, tp, rank).to("cuda:0")
    bind(model, store, tp, rank)
    conn.send(all(store.contains(p) for p in model.parameters()))
    while True:
        cmd, *args = conn.recv()
        if cmd == "read":
            conn.send(float(model.get_parameter(args[0])[args[1]]))
        elif cmd == "write":
            name, index, value = args
            with torch.no_grad():
                model.get_parameter(name)[index] = value
            torch.cuda.synchronize()
            conn.send(None)
        else:
            conn.send(None)
            return


def test_processes_of_a_gpu_share_one_copy(tmp_path):
    write_llama(tmp_path)
    ctx = multiprocessing.get_context("spawn")
    with create_store(tmp_path, LEVELS, device="cuda:0") as store:
        conn, child = ctx.Pipe()
        proc = ctx.Process(target=_device_process, args=(child, store.handle, 2, 1))
        proc.start()
        try:
            assert conn.recv() is True  # every parameter of the TP2 rank-1 process lies in the store
            name = "model.layers.0.self_attn.o_proj.weight"
            mine = store.shard(name, 2, 1)
            conn.send(("read", name, (0, 0)))
            assert conn.recv() == pytest.approx(float(mine[0, 0]))
            conn.send(("write", name, (0, 0), 1234.5))
            conn.recv()
            assert float(mine[0, 0]) == 1234.5  # the child's write, read here: one copy
            with torch.no_grad():
                mine[0, 1] = -42.0
            torch.cuda.synchronize()
            conn.send(("read", name, (0, 1)))
            assert conn.recv() == -42.0
        finally:
            conn.send(("stop",))
            conn.recv()
            proc.join(timeout=60)
        assert proc.exitcode == 0
