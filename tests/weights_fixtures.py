"""Helpers shared by the weight-store tests (tests/test_weights_*.py)."""

from __future__ import annotations

import torch


def skeleton(store, tp: int, rank: int, dtype: torch.dtype | None = None) -> torch.nn.Module:
    """A plain module tree with the store's parameter names at (tp, rank)'s shapes, for `bind` to fill.

    The parameters are unbacked (torch.empty: no page touched), so a process's
    memory accounting sees only what binding maps. `dtype` defaults to the store's.
    """
    root = torch.nn.Module()
    for name in store.layout.names():
        *path, leaf = name.split(".")
        mod = root
        for p in path:
            if not hasattr(mod, p):
                mod.add_module(p, torch.nn.Module())
            mod = getattr(mod, p)
        shape = store.shard(name, tp, rank).shape
        param = torch.empty(shape, dtype=dtype or store.layout.torch_dtype)
        mod.register_parameter(leaf, torch.nn.Parameter(param, requires_grad=False))
    return root
