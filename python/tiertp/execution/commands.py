"""The commands a TpInstance sends its leader (rank 0), one dataclass per command.

The leader answers each before the next is sent (tiertp.execution.leader_loop
says with what). `what` names a command in errors. The agent sends `Export`,
`Park`, `Unpark`, `Release`, `FreeSlots` and `CallRanks` to an execution process too, as
ops on its instance (tiertp.worker.instance_ops): what they answer is said here.
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
class OnRequests:
    """A command on some of the instance's requests, named by id."""

    rids: list[RequestId]


class Release(OnRequests):
    """Free the requests' KV now (sent by the agent: they moved away, and the
    process drops them too)."""

    what: ClassVar[str] = "release"


class Export(OnRequests):
    """-> each request's RequestState (nothing changes)."""

    what: ClassVar[str] = "export"


class Park(OnRequests):
    """Export the requests and take them out of the batch, KV kept -> their
    RequestStates. Sent by the agent, it parks those of `rids` still running
    (the states say which); the process may iterate its other requests while
    the destination copies their KV, then `Release` (moved) or `Unpark`."""

    what: ClassVar[str] = "park"


class Unpark(OnRequests):
    """Parked requests rejoin the batch (a hand-off failed); the next
    iteration gives each the token it would have had."""

    what: ClassVar[str] = "unpark"


@dataclass(frozen=True)
class ReserveSlots:
    """Allocate counts[i] KV slots for import i, all or nothing -> the slots
    of each import, in order; rejected with KVOutOfSpace, nothing allocated,
    when they do not all fit."""

    what: ClassVar[str] = "reserve"
    counts: list[int]


@dataclass(frozen=True)
class FreeSlots:
    """Give reserved slots back: an import given up, whose slots will never
    be adopted. Rejected, nothing freed, if a slot is not reserved."""

    what: ClassVar[str] = "free_slots"
    slots: list[int]


@dataclass(frozen=True)
class Adopt:
    """Requests whose KV was written into reserved slots (`state.slots`,
    token i in slots[i]) become this instance's: the next iteration
    continues them from there, with no prefill."""

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
    """Run `call` on every rank -> the results in rank order; the sender
    waits `timeout_s` at most (None: as long as the call may take)."""

    what: ClassVar[str] = "call"
    call: RankCall
    timeout_s: float | None = None


@dataclass(frozen=True)
class Shutdown:
    """Stop every rank, then answer."""

    what: ClassVar[str] = "shutdown"


Command = (Iterate | Release | Export | Park | Unpark | ReserveSlots | FreeSlots | Adopt | SetPrefillChunk | Stats
           | CallRanks | Shutdown)
