"""Parking and unparking a hand-off's requests on every rank (the leader checked them first).

They run as `RankCall`s, not as plain operations, because their results are
gathered: the leader learns at once that a rank failed a change it had
checked (the ranks may then disagree, so the leader ends the instance).
"""

from __future__ import annotations

from dataclasses import dataclass

from tiertp.execution.rank_call import RankCall
from tiertp.execution.rank_handle import RankHandle
from tiertp.execution.records import RequestId


@dataclass(frozen=True)
class ParkOnRank(RankCall):
    """RankKV.park: the requests leave the batch, their KV stays."""

    rids: tuple[RequestId, ...]

    def run(self, handle: RankHandle) -> None:
        handle.kv.park(self.rids)


@dataclass(frozen=True)
class UnparkOnRank(RankCall):
    """RankKV.unpark: (rid, token ids as the leader knows them) per parked request."""

    items: tuple[tuple[RequestId, tuple[int, ...]], ...]

    def run(self, handle: RankHandle) -> None:
        handle.kv.unpark(self.items)
