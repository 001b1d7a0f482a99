"""The TP groups a node agent keeps warm."""

from __future__ import annotations

from tiertp.tp_group import TpGroup


def aligned_groups(num_devices: int, tp_levels: list[int]) -> list[TpGroup]:
    """Every aligned group at each candidate level that fits on the node: the
    processes a node agent keeps warm (one per device per TP level)."""
    return [TpGroup(first, tp) for tp in sorted(tp_levels) for first in range(0, num_devices - tp + 1, tp)]
