"""Replace every parameter of a model with its zero-copy view of an attached store.

Name-based and model-agnostic: parameter `name` becomes
`store.shard(name, tp, rank)`, a new `nn.Parameter` over the view carrying
the old parameter's attributes (SGLang's `weight_loader`, `output_dim`,
...), so names, shapes and dtypes stay what the model expects. The old
tensors are dropped (freed unless something else holds them). Any mismatch
(a parameter the store lacks, a store tensor the model lacks, shape, dtype,
device) raises BindError before anything is replaced.

The forward-pass side (splitting fused outputs per block) is model-specific:
see tiertp.weights.sglang_llama, which calls this.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from tiertp.weights.errors import BindError
from tiertp.weights.store import AttachedStore


@dataclass(frozen=True)
class BindStats:
    tp: int
    rank: int
    parameters: int  # parameters now viewing the store
    view_bytes: int  # bytes those views address (this rank's share of the store)
    released_bytes: int  # bytes of the parameters they replaced
    store_bytes: int  # the whole store (one copy per device)


def bind(model: nn.Module, store: AttachedStore, tp: int, rank: int) -> BindStats:
    """Make `model`'s parameters rank `rank` of TP `tp`'s views of `store`."""
    store.layout.check_level(tp, rank)
    params = dict(model.named_parameters())  # tied parameters appear once
    names = set(store.layout.names())
    unknown = sorted(set(params) - names)
    if unknown:
        raise BindError(f"{len(unknown)} model parameter(s) have no tensor in the weight store, e.g. {unknown[:3]}")
    unused = sorted(names - set(params))
    if unused:
        raise BindError(f"{len(unused)} weight-store tensor(s) have no model parameter, e.g. {unused[:3]}")
    views = {}
    for name, p in params.items():
        v = store.shard(name, tp, rank)
        if tuple(v.shape) != tuple(p.shape):
            raise BindError(
                f"{name}: the model expects shape {tuple(p.shape)} at TP {tp}, the store's shard is {tuple(v.shape)}"
            )
        if v.dtype != p.dtype:
            raise BindError(f"{name}: the model's dtype is {p.dtype}, the store's {v.dtype}")
        if v.device != p.device:
            raise BindError(f"{name}: the model is on {p.device}, the store on {v.device}")
        views[name] = v
    released = 0
    for name, v in views.items():
        old = params[name]
        module_name, _, leaf = name.rpartition(".")
        module = model.get_submodule(module_name)
        new = nn.Parameter(v, requires_grad=False)
        new.__dict__.update(old.__dict__)  # loader attributes SGLang set on the parameter
        released += old.numel() * old.element_size()
        setattr(module, leaf, new)
    return BindStats(
        tp=tp,
        rank=rank,
        parameters=len(views),
        view_bytes=sum(v.numel() * v.element_size() for v in views.values()),
        released_bytes=released,
        store_bytes=store.layout.nbytes,
    )


def parameters_outside(model: nn.Module, store: AttachedStore) -> list[str]:
    """Names of parameters whose memory is not inside `store` (empty after a full bind)."""
    return [n for n, p in model.named_parameters() if not store.contains(p.data)]


