"""GPU backing of a store: one device allocation, shared by CUDA IPC.

The owner process allocates the buffer and keeps it alive for as long as
any process uses it (CUDA IPC memory dies with its allocating process); the
handle carries torch's own IPC description of the buffer
(`torch.multiprocessing.reductions.reduce_tensor`), which other processes
open with `rebuild_cuda_tensor`. CUDA cannot open an IPC handle in the
process that made it, so the owner's own attach gets its buffer directly.
The GPU is identified by UUID, so a process whose CUDA_VISIBLE_DEVICES
numbers the GPUs differently fails with a clear error instead of mapping
the wrong device.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass

import torch

from tiertp.weights.errors import NoGPUError, WeightStoreError

# Buffers this process owns, by backing token: attach in the owner returns these.
_OWNED: dict[str, torch.Tensor] = {}


@dataclass(frozen=True)
class CudaIpcBacking:
    token: str
    owner_pid: int
    device_index: int
    device_uuid: str
    nbytes: int
    ipc: tuple  # reduce_tensor's (rebuild function, args)


def check_gpu(device: torch.device) -> None:
    if not torch.cuda.is_available():
        raise NoGPUError(
            f"a weight store on {device} needs CUDA, but torch sees no GPU here "
            f"(torch {torch.__version__}, CUDA build {torch.version.cuda}); use device 'cpu' on this host"
        )
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index >= torch.cuda.device_count():
        raise NoGPUError(f"{device}: only {torch.cuda.device_count()} GPU(s) visible")


def _uuid(index: int) -> str:
    return str(torch.cuda.get_device_properties(index).uuid)


def allocate(nbytes: int, device: torch.device) -> torch.Tensor:
    """The store's device buffer (zeroed); fill it, then `export` it."""
    check_gpu(device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    return torch.zeros(nbytes, dtype=torch.uint8, device=f"cuda:{index}")


def export(base: torch.Tensor) -> CudaIpcBacking:
    """Share the filled buffer. Waits for the fill first: the IPC description
    carries an event recorded now, which importers wait on."""
    from torch.multiprocessing.reductions import reduce_tensor

    torch.cuda.synchronize(base.device)
    token = uuid.uuid4().hex
    _OWNED[token] = base
    index = base.device.index
    return CudaIpcBacking(token, os.getpid(), index, _uuid(index), base.numel(), reduce_tensor(base))


def open_(backing: CudaIpcBacking) -> torch.Tensor:
    if backing.token in _OWNED:
        return _OWNED[backing.token]
    device = torch.device("cuda", backing.device_index)
    check_gpu(device)
    if _uuid(backing.device_index) != backing.device_uuid:
        raise WeightStoreError(
            f"cuda:{backing.device_index} in this process is not the GPU the weight store lives on "
            f"(UUID {backing.device_uuid}); give every process of a device the same CUDA_VISIBLE_DEVICES numbering"
        )
    rebuild, args = backing.ipc
    with torch.cuda.device(backing.device_index):
        base = rebuild(*args)
    if base.numel() != backing.nbytes:
        raise WeightStoreError(f"CUDA IPC buffer has {base.numel()} bytes, expected {backing.nbytes}")
    return base


def release(backing: CudaIpcBacking) -> None:
    """Drop the owner's reference (other processes' mappings must be gone first)."""
    _OWNED.pop(backing.token, None)
