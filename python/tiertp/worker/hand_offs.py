"""Prefill -> decode hand-offs the client tells the agent to make (`hand_off`).

The client decides every hand-off (the gateway's control loop: which
request moves, when, and to which group); the agent has no rule of its own
for it. It only checks that a move can be made now (`refusal`), and makes
the ones told during one pass of its loop together, one KV move per
(source, destination) pair (`by_pair`). A move it cannot make is answered
with a typed failure and the request keeps decoding where it is.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection
from dataclasses import dataclass

from tiertp.tp_group import TpGroup
from tiertp.worker import protocol as P
from tiertp.worker.requests import InFlight


@dataclass(frozen=True)
class Told:
    """One `hand_off` to make and answer: the client's request `id` (the agent's `rid`) to `dest`."""

    client: bytes
    id: int
    rid: int
    dest: TpGroup


def refusal(req: InFlight | None, told_id: int, dest: TpGroup, active: Collection[TpGroup],
            movable: Collection[TpGroup]) -> tuple[str, str] | None:
    """Why request `req` cannot move to `dest` now: a P.HAND_OFF_FAILURES code and a message
    naming the problem; None when it can. `movable`: the groups whose process takes part in KV moves."""
    where = f"hand_off {told_id} to group {dest.as_list()}"
    if req is None:
        return P.NOT_RUNNING, f"{where}: the request is not in flight here (finished, cancelled or never submitted)"
    if dest not in active:
        return P.UNKNOWN_GROUP, (f"{where}: the group is not active here (active: "
                                 f"{[g.as_list() for g in sorted(active)]})")
    if not req.sent:
        return P.NOT_RUNNING, f"{where}: the request is held here, not running on a process yet"
    for group, which in ((dest, "destination"), (req.group, "source")):
        if group not in movable:
            return P.GROUP_NOT_READY, (f"{where}: the {which} group {group.as_list()}'s process is not ready "
                                       "or cannot take part in KV moves")
    return None


def by_pair(told: list[tuple[InFlight, Told]]) -> dict[tuple[TpGroup, TpGroup], list[Told]]:
    """The hand-offs to make, grouped by (source group, destination group), in the order told."""
    pairs: dict[tuple[TpGroup, TpGroup], list[Told]] = defaultdict(list)
    for req, t in told:
        pairs[(req.group, t.dest)].append(t)
    return dict(pairs)
