"""GPU types with measured kernel tables: the one list of them.

`data_dir` is the folder under `gpu-kernels/` in the public data;
`device` is the name the measurements record (checked on load);
`hbm_bytes` is the memory the driver reports (nvidia-smi), the budget that
weights, KV cache and activations share.
"""

from __future__ import annotations

from dataclasses import dataclass

MIB = 1 << 20


@dataclass(frozen=True)
class GpuSpec:
    name: str
    data_dir: str
    device: str
    hbm_bytes: int
    aliases: tuple[str, ...] = ()


GPUS: dict[str, GpuSpec] = {
    g.name: g
    for g in [
        GpuSpec("h100_sxm", "h100_sxm", "NVIDIA H100 80GB HBM3", 81559 * MIB, ("h100", "h100-sxm")),
        GpuSpec("a100_sxm", "a100_sxm", "NVIDIA A100-SXM4-80GB", 81920 * MIB, ("a100", "a100-sxm")),
        GpuSpec("h200_sxm", "h200_sxm", "NVIDIA H200", 143771 * MIB, ("h200", "h200-sxm")),
    ]
}


def get_gpu(name: str) -> GpuSpec:
    """The GPU named `name` (case-insensitive; e.g. h100, h100_sxm, h100-sxm)."""
    key = name.strip().lower()
    for g in GPUS.values():
        if key == g.name or key in g.aliases:
            return g
    valid = sorted([*GPUS, *(a for g in GPUS.values() for a in g.aliases)])
    raise ValueError(f"unknown GPU {name!r}; valid GPUs: {', '.join(valid)}")
