"""Migration ids of the processes taking part in a switch.

tiertp.kv plans moves between *participants* named by integer ids (its
"GPUs"). In a switch, a device runs one process per TP level, so the old
instance's rank on device d and the new instance's rank on device d are two
processes: they get distinct ids (d for the old layout, NEW_OFFSET + d for
the new), and a switch on the same devices is planned like a hand-off
between disjoint sets. A head that stays on device d then moves through
shared memory between that device's two processes (no byte leaves the
device's memory on GPU: CUDA IPC there).
"""

from __future__ import annotations

NEW_OFFSET = 1000


def old_id(device: int) -> int:
    _check(device)
    return device


def new_id(device: int) -> int:
    _check(device)
    return NEW_OFFSET + device


def _check(device: int) -> None:
    if not 0 <= device < NEW_OFFSET:
        raise ValueError(f"device id {device} outside [0, {NEW_OFFSET})")
