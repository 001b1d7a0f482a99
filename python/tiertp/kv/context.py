"""The explicit parallel context a migration runs in (no process-global state)."""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist

from tiertp.kv.control import ControlGroup, as_control_group


@dataclass(frozen=True)
class MigrationContext:
    """Who this process is and how it reaches the other participants.

    `group` holds one process per GPU taking part (every GPU of the old and
    new layouts): the handshake's metadata and the shared memory set-up go
    over it. A gloo process group (SGLang's GroupCoordinator keeps one,
    cpu_group) or any ControlGroup, e.g. a StoreControlGroup joining
    processes of different torch.distributed worlds (a TP switch). `data_group`, same members and ranks, carries the KV bytes of
    DistTransport: NCCL on GPU; None means `group` (gloo, CPU pools).
    `gpu_to_rank` maps the GPU ids used in layouts to ranks in both groups.
    `timeout_s` bounds every wait on a peer.
    """

    gpu: int
    group: dist.ProcessGroup | ControlGroup
    gpu_to_rank: dict[int, int]
    timeout_s: float = 120.0
    data_group: dist.ProcessGroup | None = None

    @property
    def control(self) -> ControlGroup:
        return as_control_group(self.group)

    def rank(self, gpu: int) -> int:
        return self.gpu_to_rank[gpu]
