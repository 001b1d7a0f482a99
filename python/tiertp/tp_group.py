"""`TpGroup`: one TP group, the TP context passed explicitly (no process-global TP state).

Devices first .. first+tp-1, rank r on device first+r. What the planner
assigns is aligned inside one node (DESIGN.md §1 step 4): {0,1}, {2,3},
{0..3}, never {1,2} (`TpGroup.check`). KV migration (tiertp.kv.layout) takes
any contiguous power-of-two group: alignment is the planner's rule, not a
need of migration.
"""

from __future__ import annotations

from dataclasses import dataclass


class GroupError(ValueError):
    """A TP group that is not an aligned power-of-two set of known devices."""


@dataclass(frozen=True, order=True)
class TpGroup:
    """Devices first .. first+tp-1 running one model replica at TP level `tp`.

    Invariant (checked by `check`): tp is a power of two, first % tp == 0.
    """

    first: int
    tp: int

    @property
    def devices(self) -> range:
        return range(self.first, self.first + self.tp)

    @property
    def gpus(self) -> tuple[int, ...]:
        """The devices by rank: `gpus[r]` runs rank r."""
        return tuple(self.devices)

    def rank_of(self, gpu: int) -> int:
        """The rank `gpu` runs; ValueError if it is not in the group."""
        if gpu not in self.devices:
            raise ValueError(f"GPU {gpu} is not in TP group [{self.first}, {self.tp}]")
        return gpu - self.first

    def check(self, num_devices: int) -> None:
        """Raise GroupError naming the problem unless this group is valid on `num_devices` devices."""
        if self.tp < 1 or self.tp & (self.tp - 1):
            raise GroupError(f"TP group [{self.first}, {self.tp}]: TP level {self.tp} is not a power of two")
        if self.first < 0 or self.first % self.tp:
            raise GroupError(f"TP group [{self.first}, {self.tp}] is misaligned: its first device must be a "
                             f"multiple of {self.tp}")
        if self.first + self.tp > num_devices:
            raise GroupError(f"TP group [{self.first}, {self.tp}] names unknown device(s) "
                             f"{self.first + self.tp - 1}: this node has devices 0..{num_devices - 1}")

    def as_list(self) -> list[int]:
        return [self.first, self.tp]
