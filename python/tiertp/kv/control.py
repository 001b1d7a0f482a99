"""The control group a migration's small collectives run over.

A migration needs three collectives besides the KV bytes: all-gather of
small Python objects (the handshake's manifests and votes, the shared-memory
session id), a barrier, and the group size. `ControlGroup` is that much.

Two implementations:
- `TorchControlGroup`: a torch.distributed process group of the default
  world (gloo), e.g. SGLang's cpu_group when every participant is one world.
- `StoreControlGroup`: a torch.distributed Store (TCPStore, FileStore) and
  nothing else. This is what a TP switch needs: each TP level's execution
  processes are their own SGLang world (one default process group per
  process), so processes of *different* levels — the senders and receivers
  of a switch — share no process group. A store shared by every execution
  process of a node joins them without touching their worlds.
"""

from __future__ import annotations

import pickle
from abc import ABC, abstractmethod
from datetime import timedelta

import torch.distributed as dist

from tiertp.kv.errors import KVMigrationError


class ControlGroup(ABC):
    """Collectives over the participants of a migration; every member calls
    each one in the same order."""

    @abstractmethod
    def size(self) -> int: ...

    @abstractmethod
    def all_gather_object(self, obj) -> list:
        """Every member's `obj`, indexed by member rank."""

    def barrier(self) -> None:
        self.all_gather_object(None)


class TorchControlGroup(ControlGroup):
    def __init__(self, group: dist.ProcessGroup):
        self.group = group

    def size(self) -> int:
        return dist.get_world_size(self.group)

    def all_gather_object(self, obj) -> list:
        out: list = [None] * self.size()
        dist.all_gather_object(out, obj, group=self.group)
        return out

    def barrier(self) -> None:
        dist.barrier(group=self.group)


class StoreControlGroup(ControlGroup):
    """Members 0..size-1 exchanging pickled objects through `store` under
    keys `<name>/<call>/<rank>`. Calls are numbered per member, so members
    stay in step as long as they call in the same order (the ControlGroup
    contract). Keys of call n-2 are deleted at call n: by then every member
    has read them (it finished call n-1, which needs everyone's n-1 key,
    written after their n-2 read)."""

    def __init__(self, store: dist.Store, rank: int, size: int, name: str, timeout_s: float = 120.0):
        if not 0 <= rank < size:
            raise ValueError(f"rank {rank} outside a control group of {size}")
        self.store, self.rank, self._size, self.name = store, rank, size, name
        self.timeout = timedelta(seconds=timeout_s)
        self.calls = 0

    def size(self) -> int:
        return self._size

    def _key(self, call: int, rank: int) -> str:
        return f"{self.name}/{call}/{rank}"

    def all_gather_object(self, obj) -> list:
        call = self.calls
        self.calls += 1
        self.store.set(self._key(call, self.rank), pickle.dumps(obj))
        keys = [self._key(call, r) for r in range(self._size)]
        try:
            self.store.wait(keys, self.timeout)
        except RuntimeError as e:  # the store reports a timeout / lost server as RuntimeError
            raise KVMigrationError(f"control group {self.name!r} rank {self.rank}: peers did not all arrive "
                                   f"at call {call}: {e}") from e
        out = [pickle.loads(self.store.get(k)) for k in keys]
        if call >= 2:
            try:
                self.store.delete_key(self._key(call - 2, self.rank))
            except RuntimeError:  # FileStore and friends may not support deletion: only memory is lost
                pass
        return out


def as_control_group(group) -> ControlGroup:
    """A ControlGroup as is; a torch.distributed process group wrapped."""
    return group if isinstance(group, ControlGroup) else TorchControlGroup(group)
