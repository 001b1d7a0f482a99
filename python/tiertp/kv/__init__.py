"""KV cache migration between TP layouts (DESIGN.md §3).

plan_migration turns (old layout, new layout, running requests) into moves;
migrate runs them on one GPU's process: a handshake that allocates the new
pages or aborts with nothing written, then double-buffered gather -> send ->
scatter through a Transport (DistTransport: gloo/NCCL; ShmTransport: shared
memory on one host), with the CUDA kernels or their CPU twin. On one host, a
receiver copies straight out of a sender's pool instead when its owner
shared it (share_pool): one copy per byte, none of it by the sender.
"""

from tiertp.kv.channel import RecvChannel, SendChannel, Transport
from tiertp.kv.context import MigrationContext
from tiertp.kv.control import ControlGroup, StoreControlGroup, TorchControlGroup
from tiertp.kv.dist_transport import DistTransport
from tiertp.kv.errors import (KVMigrationError, LayoutError, MigrationAborted, NoGPUError,
                              OutOfKVSpace)
from tiertp.kv.executor import MigrationResult, migrate
from tiertp.kv.kernels import KVKernels, kernels_for
from tiertp.kv.layout import HeadRange, Layout, heads_of_rank, heads_on
from tiertp.kv.plan import MigrationPlan, Move, RequestKV
from tiertp.kv.planner import assign_destinations, plan_migration
from tiertp.kv.pool import KVPool
from tiertp.kv.shape import KVShape
from tiertp.kv.shared_pool import PoolExport, share_pool
from tiertp.kv.shm_transport import ShmTransport

__all__ = [
    "ControlGroup", "DistTransport", "HeadRange", "KVKernels", "KVMigrationError", "KVPool", "KVShape", "Layout",
    "LayoutError", "MigrationAborted", "MigrationContext", "MigrationPlan", "MigrationResult", "Move",
    "NoGPUError", "OutOfKVSpace", "PoolExport", "RecvChannel", "RequestKV", "SendChannel", "ShmTransport",
    "StoreControlGroup", "TorchControlGroup", "Transport", "assign_destinations", "heads_of_rank", "heads_on",
    "kernels_for", "migrate", "plan_migration", "share_pool",
]
