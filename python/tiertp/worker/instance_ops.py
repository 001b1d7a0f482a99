"""The ops the agent sends an execution process for switches and hand-offs, one dataclass per op.

A RemoteInstance (tiertp.worker.remote_instance) sends each as one ``op``
message; tiertp.worker.switch_ops runs it between two iterations and
answers one ``op_done`` with the value documented here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from tiertp.execution.rank_call import RankCall
from tiertp.execution.records import RequestState


@dataclass(frozen=True)
class Info:
    """-> the instance's InstanceInfo."""

    what: ClassVar[str] = "info"


@dataclass(frozen=True)
class Pause:
    """Stop iterating -> {"running": [rid...], "waiting": [rid...]} (BatchState.pause)."""

    what: ClassVar[str] = "pause"


@dataclass(frozen=True)
class Resume:
    """Iterate again."""

    what: ClassVar[str] = "resume"


@dataclass(frozen=True)
class Export:
    """-> [RequestState...] of `rids` (nothing changes)."""

    what: ClassVar[str] = "export"
    rids: list[int]


@dataclass(frozen=True)
class Park:
    """Park those of `rids` still running -> their [RequestState...]; the
    process may iterate its other requests while the destination copies their
    KV; then `Release` (moved) or `Unpark`."""

    what: ClassVar[str] = "park"
    rids: list[int]


@dataclass(frozen=True)
class Unpark:
    """Parked requests rejoin the batch (the hand-off failed); the next
    iteration gives each the token it would have had."""

    what: ClassVar[str] = "unpark"
    rids: list[int]


@dataclass(frozen=True)
class Adopt:
    """The requests join the running batch, their KV already written into the
    instance's slots; `max_tokens` per request id."""

    what: ClassVar[str] = "adopt"
    states: list[RequestState]
    max_tokens: dict[int, int]


@dataclass(frozen=True)
class Release:
    """The requests moved away: free their KV, drop them."""

    what: ClassVar[str] = "release"
    rids: list[int]


@dataclass(frozen=True)
class FreeSlots:
    """Give reserved slots back (an import given up)."""

    what: ClassVar[str] = "free_slots"
    slots: list[int]


@dataclass(frozen=True)
class CallOnRanks:
    """-> TpInstance.call_on_ranks(call, timeout_s)."""

    what: ClassVar[str] = "call"
    call: RankCall
    timeout_s: float | None = None


InstanceOp = Info | Pause | Resume | Export | Park | Unpark | Adopt | Release | FreeSlots | CallOnRanks
