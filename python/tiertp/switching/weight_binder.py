"""The weight binder of a TP instance: bind the rank's model to its device's store.

`InstanceSpec(weight_binder=WEIGHT_BINDER, weight_binder_arg=handles)` makes
every rank of every TP-level instance map its device's one full copy (a
tiertp.weights store) instead of loading weights: SGLang builds the model
with ``load_format="dummy"``, then `bind_store` replaces each parameter with
the rank's zero-copy view of the store (tiertp.weights.bind_sglang_model).
So a device's TP1, TP2 and TP4 processes all share one copy.

`handles` is a tiertp.weights.StoreHandle (one store serving every device,
e.g. one CPU host) or a mapping device id -> StoreHandle (one store per
device: the node agent's case).
"""

from __future__ import annotations

from dataclasses import dataclass

from tiertp.execution.rank_call import RankCall
from tiertp.execution.rank_handle import RankHandle
from tiertp.weights import attach, bind_sglang_model, parameters_outside

# Attribute under which the rank keeps its store mapping (for checks; the
# parameter views keep the mapping alive by themselves).
_ATTR = "tiertp_weight_store"


def handle_for(handles, device: int):
    """The store handle of `device` from a handle or a device -> handle mapping."""
    if isinstance(handles, dict):
        if device not in handles:
            raise ValueError(f"no weight store for device {device}; stores are given for devices {sorted(handles)}")
        return handles[device]
    if handles is None:
        raise ValueError("weight_binder_arg must be a StoreHandle or a device -> StoreHandle mapping, got None")
    return handles


def bind_store(model_runner, ctx, handles) -> None:
    """`InstanceSpec.weight_binder` target, called in each rank process
    (TP context `ctx` passed explicitly by tiertp.execution.loader)."""
    store = attach(handle_for(handles, ctx.device))
    stats = bind_sglang_model(model_runner.model, store, ctx.tp, ctx.rank)
    setattr(model_runner, _ATTR, (store, stats))


# The binder tiertp's instances use (a module-level function: it reaches the
# rank processes pickled by reference).
WEIGHT_BINDER = bind_store


@dataclass(frozen=True)
class StoreSharing(RankCall):
    """Where this rank's parameters live.

    `store` is the backing file of the store the rank attached, `outside`
    the parameters not inside that mapping (empty when fully shared),
    `view_bytes` the bytes this rank's views address."""

    def run(self, handle: RankHandle) -> dict:
        bound = getattr(handle.model_runner, _ATTR, None)
        if bound is None:
            return {"store": None, "outside": ["<not bound to a weight store>"], "parameters": 0, "view_bytes": 0}
        store, stats = bound
        backing = store.handle.backing
        return {"store": getattr(backing, "path", repr(backing)),
                "outside": parameters_outside(handle.model_runner.model, store),
                "parameters": stats.parameters, "view_bytes": stats.view_bytes}


STORE_SHARING = StoreSharing()
