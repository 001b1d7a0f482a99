"""`TpContext`: who a rank is inside its TP instance, passed explicitly.

Nothing in tiertp reads TP state from a process global: every function that
needs the rank, the TP level or the group gets a TpContext. (SGLang itself
keeps its groups in module globals inside each rank process; `group` is the
GroupCoordinator SGLang created there, captured once at start.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TpContext:
    """Rank `rank` of a TP-`tp` instance, running on device `device`.

    `group` is SGLang's TP GroupCoordinator for this instance (its
    `cpu_group` is a gloo group of the instance's ranks, `ranks` their global
    ranks) or None at TP 1, where nothing is collective.
    """

    tp: int
    rank: int
    device: int
    device_kind: str  # "cpu" or "cuda"
    group: Any = None

    @property
    def is_leader(self) -> bool:
        return self.rank == 0

    @property
    def leader_global_rank(self) -> int:
        return self.group.ranks[0] if self.group is not None else 0
