"""What SwitchCoordinator needs of the instances it moves requests between.

Two kinds of object provide it: a tiertp.execution.TpInstance that the
coordinator's process controls, and the node agent's RemoteInstance
(tiertp.worker.remote_instance), a proxy of the TpInstance inside an
execution process.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from tiertp.execution.rank_call import RankCall
from tiertp.execution.records import InstanceInfo, RequestId, RequestState


class InstanceIdentity(Protocol):
    """Which model an instance runs, at which TP level, on which devices."""

    @property
    def model(self) -> str: ...

    @property
    def tp(self) -> int: ...

    @property
    def devices(self) -> tuple[int, ...]: ...


class PendingResult(Protocol):
    """A started call; `result` waits for it (and raises what it raised)."""

    def result(self) -> Any: ...


@runtime_checkable
class SwitchParticipant(Protocol):
    """A started TP instance that can give and take requests, KV included.

    Contract: every method runs at an iteration boundary of the instance and
    returns once the change is done there. `pause` stops iterations until
    `resume` (exports, parks, adopts, releases and calls still run while
    paused); `export` changes nothing; `park` exports the requests still
    running and takes them out of the batch, their KV untouched, until
    `unpark` (they continue) or `release` (they moved: their KV is freed);
    `adopt` makes requests whose KV was written into this instance's
    reserved slots (`RequestState.slots`) its own; `free_slots` returns
    reserved slots nobody adopted. `closed` is True once the instance died or
    was closed: every call then fails.
    """

    @property
    def spec(self) -> InstanceIdentity: ...

    @property
    def info(self) -> InstanceInfo | None: ...

    @property
    def closed(self) -> bool: ...

    @property
    def paused(self) -> bool: ...

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    def export(self, rids: list[RequestId]) -> list[RequestState]: ...

    def park(self, rids: list[RequestId]) -> list[RequestState]: ...

    def unpark(self, rids: list[RequestId]) -> None: ...

    def adopt(self, states: list[RequestState]) -> None: ...

    def release(self, rids: list[RequestId]) -> None: ...

    def free_slots(self, slots: list[int]) -> None: ...

    def call_on_ranks(self, call: RankCall, timeout_s: float | None = None) -> list:
        """`call` on every rank of the instance, the results in rank order."""

    def begin_call(self, call: RankCall, timeout_s: float | None = None) -> PendingResult:
        """`call_on_ranks` without waiting: calls collective over several instances start on each first."""


@runtime_checkable
class RelayParticipant(SwitchParticipant, Protocol):
    """An instance the relay (tiertp.switching.relay) can copy KV out of and into, through this process."""

    def reserve_slots(self, counts: list[int]) -> list[list[int]]: ...

    def read_kv(self, slots: list[int]) -> list: ...

    def write_kv(self, slots: list[int], per_rank: list) -> None: ...


Source = tuple[SwitchParticipant, Sequence[RequestId]]
