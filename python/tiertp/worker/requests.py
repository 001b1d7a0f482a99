"""The agent's table of in-flight requests.

Client request ids are unique per client only, so the agent gives each
accepted request its own u64 (`rid`) for the execution processes and maps
back. The table is what enforces the protocol's guarantee: a request leaves
it exactly once, through `finish`, and only the caller of that `finish` sends
the terminal message; anything arriving later for a finished request (tokens
already in flight after a cancel, say) finds no entry and is dropped.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

from tiertp.tp_group import TpGroup
from tiertp.worker.messages import Submit


@dataclass
class InFlight:
    """One accepted request. `group` is the TP group serving it (a switch or a
    hand-off changes it); `sent` is False while the agent holds it (its
    process is not ready yet, or a switch moved it as metadata). `deadline`
    (time.monotonic(), fixed at its arrival) is when it must have started
    prefilling; it travels with every `add` to a process, so a request moved
    before it started keeps it."""

    rid: int
    client: bytes  # ROUTER identity of the submitting client
    submit: Submit
    group: TpGroup
    deadline: float = math.inf
    sent: bool = False
    generated: int = 0
    first_item_sent: bool = False
    process_generation: int = field(default=-1)  # which incarnation of the process got it


class RequestTable:
    def __init__(self) -> None:
        self._next = itertools.count(1)
        self._by_rid: dict[int, InFlight] = {}
        self._by_client: dict[tuple[bytes, int], int] = {}

    def add(self, client: bytes, submit: Submit, group: TpGroup, deadline: float = math.inf) -> InFlight:
        """Register an accepted submit; ValueError if the client already has that id in flight."""
        key = (client, submit.id)
        if key in self._by_client:
            raise ValueError(f"submit {submit.id}: a request with this id is already in flight for this client")
        req = InFlight(next(self._next), client, submit, group, deadline)
        self._by_rid[req.rid] = req
        self._by_client[key] = req.rid
        return req

    def get(self, rid: int) -> InFlight | None:
        return self._by_rid.get(rid)

    def lookup(self, client: bytes, request_id: int) -> InFlight | None:
        rid = self._by_client.get((client, request_id))
        return None if rid is None else self._by_rid[rid]

    def finish(self, rid: int) -> InFlight | None:
        """Remove and return the request; None if it already left (send nothing then)."""
        req = self._by_rid.pop(rid, None)
        if req is not None:
            del self._by_client[(req.client, req.submit.id)]
        return req

    def on_group(self, group: TpGroup) -> list[InFlight]:
        return [r for r in self._by_rid.values() if r.group == group]

    def held(self) -> list[InFlight]:
        """The requests the agent holds: not sent to any process."""
        return [r for r in self._by_rid.values() if not r.sent]

    def all(self) -> list[InFlight]:
        return list(self._by_rid.values())

    def __len__(self) -> int:
        return len(self._by_rid)
