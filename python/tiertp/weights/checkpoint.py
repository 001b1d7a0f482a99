"""Read tensors by name from an HF safetensors model directory (one or many shards)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from tiertp.weights.errors import UnsupportedModel


def read_config(model_dir: Path) -> dict:
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise UnsupportedModel(f"{model_dir}: no config.json")
    return json.loads(path.read_text())


class Checkpoint:
    """Name -> tensor over every *.safetensors file of a model directory (lazily read)."""

    def __init__(self, model_dir: Path):
        self.model_dir = Path(model_dir)
        files = sorted(self.model_dir.glob("*.safetensors"))
        if not files:
            raise UnsupportedModel(f"{model_dir}: no *.safetensors weights")
        self._files = {}
        self._where: dict[str, object] = {}
        for f in files:
            handle = safe_open(str(f), framework="pt", device="cpu")
            self._files[f] = handle
            for name in handle.keys():
                if name in self._where:
                    raise UnsupportedModel(f"{model_dir}: tensor {name!r} appears in two safetensors files")
                self._where[name] = handle

    def names(self) -> set[str]:
        return set(self._where)

    def get(self, name: str) -> torch.Tensor:
        if name not in self._where:
            raise UnsupportedModel(f"{self.model_dir}: checkpoint has no tensor {name!r}")
        return self._where[name].get_tensor(name)
