"""`Switcher`: the agent's TP switches and prefill -> decode hand-offs.

Where a split sends each running request is the plan's (its `moves`, the
core control loop's rule), or, for a request the plan does not name, the
destination with the least KV (`split_shares`).

It runs tiertp.switching.SwitchCoordinator over the execution processes'
`RemoteInstance`s and hosts the coordinator's control store (the ranks of
every instance meet there for each migration). The agent tells it what to
do (a `LayoutChange`, or requests to hand off) and learns where requests
went through two callbacks, called as soon as each step has happened, so
tokens that arrive mid-switch are attributed correctly:

- ``on_moved(rids, group)``: these running requests (KV included) now live
  in `group`'s process;
- ``on_dropped(rids, group)``: these waiting requests (not admitted yet, no
  KV) were taken off `group`'s process; the agent sends them again to where
  they belong (they move as metadata).

A change that fails is undone: a merge by the coordinator's own rollback, a
split by handing back what had already moved. `ChangeFailed` says why.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence

from tiertp.switching import SwitchCoordinator, SwitchError
from tiertp.tp_group import TpGroup
from tiertp.worker.layout_change import LayoutChange
from tiertp.worker.remote_instance import RemoteInstance, RemoteOpFailed

log = logging.getLogger(__name__)

Moved = Callable[[list[int], TpGroup], None]


def split_shares(rids: list[int], dests: list[TpGroup], placed: Mapping[int, TpGroup],
                 kv_tokens: Callable[[int], int]) -> list[list[int]]:
    """The running requests of a group a split stops, per destination: the plan's choice
    for those it names (the control loop's); the others (the plan did not know them: they
    came after it was made, or from a client without a control loop) where the KV is
    least, largest first."""
    shares: list[list[int]] = [[] for _ in dests]
    tokens = [0] * len(dests)
    rest = []
    for rid in rids:
        if (g := placed.get(rid)) in dests:
            i = dests.index(g)
            shares[i].append(rid)
            tokens[i] += kv_tokens(rid)
        else:
            rest.append(rid)
    for rid in sorted(rest, key=kv_tokens, reverse=True):
        i = min(range(len(dests)), key=lambda j: (tokens[j], j))
        shares[i].append(rid)
        tokens[i] += kv_tokens(rid)
    return shares


class ChangeFailed(RuntimeError):
    """A layout change or hand-off did not happen (everything is back where it was)."""


class Switcher:
    def __init__(self, on_moved: Moved, on_dropped: Moved, kv_tokens: Callable[[int], int],
                 timeout_s: float = 60.0):
        self.coordinator = SwitchCoordinator(timeout_s=timeout_s)
        self._on_moved, self._on_dropped, self._kv_tokens = on_moved, on_dropped, kv_tokens

    def close(self) -> None:
        self.coordinator.close()

    def warm(self, inst: RemoteInstance) -> None:
        """Connect the instance's ranks to the control store now, not in the first switch."""
        self.coordinator.warm(inst)

    # --- TP switches --------------------------------------------------------
    def apply(self, change: LayoutChange, instances: dict[TpGroup, RemoteInstance],
              placed: Mapping[int, TpGroup] | None = None) -> None:
        """Move every request of `change.sources` to `change.dests`; ChangeFailed if it could not.

        `placed`: the destination the plan names for a request (the control
        loop's, sent with the plan); a split sends each running request there."""
        sources = [(g, instances[g]) for g in change.sources if g in instances and not instances[g].closed]
        dests = [(g, instances[g]) for g in change.dests]
        held = {g: self._pause_and_list(g, inst) for g, inst in sources}
        if len(dests) == 1:
            self._merge(sources, held, dests[0])
        else:
            (src_group, src), = sources or [(change.sources[0], None)]
            self._split(src_group, src, held.get(src_group, []), dests, placed or {})

    def _pause_and_list(self, group: TpGroup, inst: RemoteInstance) -> list[int]:
        """Pause `inst`; its running requests. Its waiting ones are dropped for the agent to resend."""
        inst.pause()
        waiting = inst.held["waiting"]
        if waiting:
            inst.release(waiting)
            self._on_dropped(waiting, group)
        return list(inst.held["running"])

    def _merge(self, sources, held, dest) -> None:
        dest_group, dest_inst = dest
        if not sources:
            return
        try:
            self.coordinator.switch([(inst, held[g]) for g, inst in sources], dest_inst)
        except SwitchError as e:  # rolled back by the coordinator, or refused before it began
            raise ChangeFailed(str(e)) from e
        for g, _ in sources:
            if held[g]:
                self._on_moved(held[g], dest_group)

    def _split(self, src_group: TpGroup, src: RemoteInstance | None, running: list[int],
               dests: Sequence[tuple[TpGroup, RemoteInstance]], placed: Mapping[int, TpGroup]) -> None:
        if src is None or not running:
            return
        shares = split_shares(running, [g for g, _ in dests], placed, self._kv_tokens)
        done: list[tuple[TpGroup, RemoteInstance, list[int]]] = []
        try:
            for (g, inst), rids in zip(dests, shares):
                if not rids:
                    continue
                self.coordinator.hand_off(src, rids, inst, overlap=False)  # a split: the source stays paused
                self._on_moved(rids, g)
                done.append((g, inst, rids))
        except SwitchError as e:
            self._hand_back(done, src_group, src)
            raise ChangeFailed(str(e)) from e

    def _hand_back(self, done, src_group: TpGroup, src: RemoteInstance) -> None:
        for g, inst, rids in reversed(done):
            try:
                self.coordinator.hand_off(inst, rids, src, overlap=False)
                self._on_moved(rids, src_group)
            except (SwitchError, RemoteOpFailed) as e:  # they keep running where they are; the agent still knows where
                log.error("undoing a split: %d request(s) stay on TP%d%s: %s", len(rids), g.tp, list(g.devices), e)

    # --- prefill -> decode --------------------------------------------------
    def hand_off(self, src_group: TpGroup, src: RemoteInstance, rids: list[int], dest_group: TpGroup,
                 dest: RemoteInstance) -> list[int]:
        """Move those of `rids` still running on `src` to `dest`; both run after. The rids moved.

        Overlapped: `src` parks them (those that finished meanwhile stay and
        are skipped) and goes on iterating its other requests while their KV
        moves; it releases them once `dest` adopted them, or, if the hand-off
        fails, they continue decoding on `src`."""
        try:
            result = self.coordinator.hand_off(src, rids, dest)
        except SwitchError as e:
            raise ChangeFailed(str(e)) from e
        move = [*result.moved, *result.metadata_only]
        if move:
            self._on_moved(move, dest_group)
        return move
