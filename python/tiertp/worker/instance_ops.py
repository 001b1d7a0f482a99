"""The ops the agent sends an execution process for switches and hand-offs, one dataclass per op.

A RemoteInstance (tiertp.worker.remote_instance) sends each as one ``op``
message; tiertp.worker.switch_ops runs it between two iterations and
answers one ``op_done`` with the value documented here. `Export`, `Park`,
`Unpark`, `Release`, `FreeSlots` and `CallRanks` are the instance's own commands
(tiertp.execution.commands): the process runs them on its TpInstance (`Park`,
`Unpark` and `Release` through its request bookkeeping,
tiertp.worker.batch_state), which sends them on to its leader.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from tiertp.execution.commands import CallRanks, Export, FreeSlots, Park, Release, Unpark
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
class Adopt:
    """The requests join the running batch, their KV already written into the
    instance's slots; `max_tokens` per request id."""

    what: ClassVar[str] = "adopt"
    states: list[RequestState]
    max_tokens: dict[int, int]


InstanceOp = Info | Pause | Resume | Export | Park | Unpark | Adopt | Release | FreeSlots | CallRanks
