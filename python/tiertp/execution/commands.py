"""The commands a TpInstance sends its leader (rank 0), one dataclass per command.

The leader answers each before the next is sent (tiertp.execution.leader_loop
says with what). `what` names a command in errors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from tiertp.execution.rank_call import RankCall
from tiertp.execution.records import NewRequest, RequestId, RequestState


@dataclass(frozen=True)
class Iterate:
    """Release `release`, admit `admit`, decode the running batch, extend pending requests."""

    what: ClassVar[str] = "iterate"
    admit: list[NewRequest]
    release: list[RequestId]


@dataclass(frozen=True)
class Release:
    """Free the requests' KV now."""

    what: ClassVar[str] = "release"
    rids: list[RequestId]


@dataclass(frozen=True)
class Export:
    """Each request's RequestState (nothing changes)."""

    what: ClassVar[str] = "export"
    rids: list[RequestId]


@dataclass(frozen=True)
class Park:
    """Export the requests and take them out of the batch, KV kept."""

    what: ClassVar[str] = "park"
    rids: list[RequestId]


@dataclass(frozen=True)
class Unpark:
    """Parked requests rejoin the batch."""

    what: ClassVar[str] = "unpark"
    rids: list[RequestId]


@dataclass(frozen=True)
class ReserveSlots:
    """Allocate counts[i] slots per import, all or nothing."""

    what: ClassVar[str] = "reserve"
    counts: list[int]


@dataclass(frozen=True)
class FreeSlots:
    """Give reserved slots back."""

    what: ClassVar[str] = "free"
    slots: list[int]


@dataclass(frozen=True)
class Adopt:
    """Requests whose KV was written into reserved slots become this instance's."""

    what: ClassVar[str] = "adopt"
    states: list[RequestState]


@dataclass(frozen=True)
class SetPrefillChunk:
    """Most prompt tokens prefilled per iteration (None: whole prompts)."""

    what: ClassVar[str] = "set_prefill_chunk"
    tokens: int | None


@dataclass(frozen=True)
class Stats:
    what: ClassVar[str] = "stats"


@dataclass(frozen=True)
class CallRanks:
    """Run `call` on every rank; the results in rank order."""

    what: ClassVar[str] = "call"
    call: RankCall


@dataclass(frozen=True)
class Shutdown:
    """Stop every rank, then answer."""

    what: ClassVar[str] = "shutdown"


Command = (Iterate | Release | Export | Park | Unpark | ReserveSlots | FreeSlots | Adopt | SetPrefillChunk | Stats
           | CallRanks | Shutdown)
