"""The default profile tables shipped with the package, selected by name.

One file per (GPU, model) in `defaults/`, named `<gpu>--<model>.json` with
the canonical names from `gpus.GPUS` and `models.MODELS`; written by
`tiertp profile build-defaults`.
"""

from __future__ import annotations

from pathlib import Path

from tiertp.profiles.gpus import GpuSpec, get_gpu
from tiertp.profiles.models import ModelShape, get_model

DEFAULTS_DIR = Path(__file__).resolve().parent / "defaults"


def table_name(gpu: GpuSpec, model: ModelShape) -> str:
    return f"{gpu.name}--{model.name}.json"


def resolve(gpu: str, model: str) -> Path:
    """Path of the shipped table for `gpu` and `model` (e.g. "h100",
    "llama-3.1-8b"; case-insensitive, aliases accepted).

    Unknown names raise ValueError listing the valid ones; a known pair
    without a shipped file raises FileNotFoundError saying how to build it.
    """
    g, m = get_gpu(gpu), get_model(model)
    path = DEFAULTS_DIR / table_name(g, m)
    if not path.is_file():
        raise FileNotFoundError(
            f"no shipped profile {path.name} in {DEFAULTS_DIR}; "
            f"build it with `tiertp profile build-defaults --gpu {g.name} --model {m.name}`"
        )
    return path


def shipped() -> list[Path]:
    """Every shipped table, sorted by file name."""
    return sorted(DEFAULTS_DIR.glob("*--*.json"))
