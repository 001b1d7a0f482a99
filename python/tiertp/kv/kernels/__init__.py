"""The gather/scatter kernels of KV migration: one interface, one module per
implementation, and how to pick one.

- `base`: `KVKernels`, the interface and its contract, and the argument
  checks every implementation shares;
- `cuda`: `CudaKernels`, the CUDA extension in kernels/kv_migrate/;
- `cpu`: `CpuKernels`, its CPU twin (kernels/kv_migrate/kv_migrate_cpu.cpp,
  memcpy per contiguous run; what the tests and the benchmark run);
- `torch_ops`: `TorchKernels`, torch ops, the CPU fallback without a C++
  compiler;
- `selection`: `kernels_for(device)`;
- `paths`: where the kernel sources are and where their builds are cached.

The implementations import `base` (and `paths`), never `selection` or each
other: the interface has no import cycle with what implements it. The naive
reference they are all tested against is tests/kv_reference.py.
"""

from tiertp.kv.kernels.base import KVKernels, check_pool, check_staging
from tiertp.kv.kernels.cpu import CpuKernels
from tiertp.kv.kernels.cuda import CudaKernels
from tiertp.kv.kernels.selection import kernels_for
from tiertp.kv.kernels.torch_ops import TorchKernels

__all__ = ["CpuKernels", "CudaKernels", "KVKernels", "TorchKernels", "check_pool", "check_staging", "kernels_for"]
