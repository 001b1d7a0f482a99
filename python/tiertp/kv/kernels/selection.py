"""Picking the kernels for a device."""

from __future__ import annotations

import logging

import torch

from tiertp.kv.errors import KVMigrationError
from tiertp.kv.kernels.base import KVKernels
from tiertp.kv.kernels.cpu import CpuKernels
from tiertp.kv.kernels.cuda import CudaKernels
from tiertp.kv.kernels.torch_ops import TorchKernels

log = logging.getLogger(__name__)


def kernels_for(device: torch.device | str) -> KVKernels:
    """The kernels for pools on `device`: the CUDA extension on GPU (NoGPUError
    without one), the native CPU twin otherwise (torch ops if it cannot build)."""
    if torch.device(device).type == "cuda":
        return CudaKernels()
    try:
        return CpuKernels()
    except KVMigrationError as e:  # no compiler: slower, but correct
        log.warning("native CPU KV kernels unavailable (%s); using torch ops", e)
        return TorchKernels()
