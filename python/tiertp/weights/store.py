"""Create a device's weight store once; attach to it from every TP-level process.

`create_store` (in the process that owns the device's weights: the node
agent, or a test) reads the checkpoint into one buffer in storage order
(tiertp.weights.layout) and returns a `WeightStore` whose `handle` is small
and picklable (`encode`/`decode` give a string for argv or a message).
`attach(handle)` in any process of that device returns an `AttachedStore`
over the same memory: no copy is made, and `shard(name, tp, rank)` is a view.
"""

from __future__ import annotations

import base64
import os
import pickle
from dataclasses import dataclass
from pathlib import Path

import torch

from tiertp.weights import cuda_backing, shm_backing
from tiertp.weights.checkpoint import Checkpoint, read_config
from tiertp.weights.errors import UnsupportedModel, WeightStoreError
from tiertp.weights.layout import StoreLayout, dtype_name
from tiertp.weights.llama_plan import check_sources, plan


@dataclass(frozen=True)
class StoreHandle:
    """Everything another process needs to map the store: layout and backing."""

    model_dir: str
    layout: StoreLayout
    backing: shm_backing.ShmBacking | cuda_backing.CudaIpcBacking

    @property
    def device(self) -> str:
        if isinstance(self.backing, shm_backing.ShmBacking):
            return "cpu"
        return f"cuda:{self.backing.device_index}"

    def encode(self) -> str:
        """A text form (base64 pickle) for argv, environment or JSON."""
        return base64.b64encode(pickle.dumps(self)).decode("ascii")

    @staticmethod
    def decode(text: str) -> StoreHandle:
        handle = pickle.loads(base64.b64decode(text))
        if not isinstance(handle, StoreHandle):
            raise WeightStoreError(f"not a weight store handle: {type(handle).__name__}")
        return handle


class AttachedStore:
    """One process's mapping of a store. Keep it alive while views of it are in use
    (the views keep the buffer alive themselves, too)."""

    def __init__(self, handle: StoreHandle, base: torch.Tensor):
        self.handle = handle
        self.layout = handle.layout
        self.base = base  # uint8, the whole store

    @property
    def device(self) -> torch.device:
        return self.base.device

    def full(self, name: str) -> torch.Tensor:
        return self.layout.full(self.base, name)

    def shard(self, name: str, tp: int, rank: int) -> torch.Tensor:
        """Rank `rank` of TP `tp`'s zero-copy view of tensor `name`."""
        return self.layout.shard(self.base, name, tp, rank)

    def contains(self, t: torch.Tensor) -> bool:
        """Whether every byte `t` can address lies inside this mapping."""
        if t.device != self.base.device:
            return False
        if t.numel() == 0:
            return True
        lo = self.base.data_ptr()
        span = sum((s - 1) * st for s, st in zip(t.shape, t.stride())) + 1
        start = t.data_ptr()
        return lo <= start and start + span * t.element_size() <= lo + self.base.numel()

    def memory(self, pid: int | str = "self") -> dict[str, int] | None:
        """smaps accounting of this store's pages in process `pid` (CPU stores; None on GPU)."""
        if isinstance(self.handle.backing, shm_backing.ShmBacking):
            return shm_backing.mapping_memory(self.handle.backing.path, pid)
        return None


class WeightStore(AttachedStore):
    """The owner's store: `handle` for the other processes, `close()` to free it."""

    def __init__(self, handle: StoreHandle, base: torch.Tensor):
        super().__init__(handle, base)
        self.owner_pid = os.getpid()
        self.closed = False

    def close(self) -> None:
        """Free the store (CPU: unlink its file; mappings already made stay valid)."""
        if self.closed or os.getpid() != self.owner_pid:
            return
        self.closed = True
        if isinstance(self.handle.backing, shm_backing.ShmBacking):
            shm_backing.unlink(self.handle.backing)
        else:
            cuda_backing.release(self.handle.backing)

    def __enter__(self) -> WeightStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def create_store(model_dir: str | os.PathLike, levels, *, device: str = "cpu",
                 dtype: torch.dtype | str | None = None) -> WeightStore:
    """Load `model_dir` (HF safetensors) once into a store serving every TP level in `levels`.

    `dtype` must be the dtype the engine runs (SGLang's `dtype`); by default the
    checkpoint's own. `device`: "cpu" (shared memory) or "cuda[:N]" (CUDA IPC;
    NoGPUError without a GPU).
    """
    model_dir = Path(model_dir)
    cfg = read_config(model_dir)
    if dtype is None:
        dtype = cfg.get("torch_dtype") or cfg.get("dtype")
        if dtype is None:
            raise UnsupportedModel(f"{model_dir}/config.json names no dtype; pass dtype=")
    dtype = dtype_name(dtype)
    architecture, blocks, planned = plan(cfg, levels)
    dev = torch.device(device)
    if dev.type == "cuda":
        cuda_backing.check_gpu(dev)  # fail before reading gigabytes
    elif dev.type != "cpu":
        raise WeightStoreError(f"unknown store device {device!r}; expected 'cpu' or 'cuda[:N]'")
    ck = Checkpoint(model_dir)
    check_sources(planned, ck)
    layout = StoreLayout.pack(architecture, levels, blocks, dtype, [p.entry for p in planned])
    if dev.type == "cuda":
        base = cuda_backing.allocate(layout.nbytes, dev)
    else:
        shm, base = shm_backing.create(layout.nbytes)
    try:
        for p in planned:
            src = p.build(ck)
            dest = layout.full(base, p.entry.name)
            if tuple(src.shape) != tuple(dest.shape):
                raise UnsupportedModel(
                    f"{model_dir}: {p.entry.name} built with shape {tuple(src.shape)}, "
                    f"the config implies {tuple(dest.shape)}"
                )
            dest.copy_(src)
    except BaseException:
        if dev.type == "cpu":
            shm_backing.unlink(shm)
        raise
    # Shared only once filled: a CUDA IPC export carries an event recorded now.
    backing = cuda_backing.export(base) if dev.type == "cuda" else shm
    return WeightStore(StoreHandle(str(model_dir.resolve()), layout, backing), base)


def attach(handle: StoreHandle) -> AttachedStore:
    """Map `handle`'s store into this process (no copy)."""
    if isinstance(handle.backing, shm_backing.ShmBacking):
        return AttachedStore(handle, shm_backing.open_(handle.backing))
    return AttachedStore(handle, cuda_backing.open_(handle.backing))
