"""What a completed switch or hand-off reports."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class SwitchResult:
    """`stop_ms`: from pausing the instances to resuming the destination (the
    time no iteration can run on the destination). `parts_ms`: export, plan,
    migrate (all instances' ranks, wall), adopt, `migrate_rank_max` (the
    slowest rank's own migrate call), and `release_after_resume` (the
    sources freeing their copies once the destination runs: not in stop_ms). Bytes are KV payload:
    `bytes_between` crossed between processes (shared memory on CPU),
    `bytes_local` were copied inside one process (none in a switch: old and
    new ranks are always different processes); `bytes_pulled`, of
    bytes_between, the destination's ranks copied themselves straight out of
    the sources' shared pools (on CPU; the rest was staged through shared
    memory segments); on the relay path `bytes_between` is what crossed the
    controller.

    `source_stop_ms`: how long the source(s) could not iterate. A switch
    leaves its sources paused (None); a plain transfer resumes them after
    the release (stop_ms plus that); an overlapped hand-off resumes its
    source as soon as the source's ranks finished their part of the
    migration (the handshake, when the destination pulls the KV itself),
    long before the destination adopts."""

    moved: tuple  # request ids that moved with their KV
    metadata_only: tuple  # request ids that moved without KV (waiting for prefill)
    kv_tokens: int
    bytes_between: int
    bytes_local: int
    stop_ms: float
    parts_ms: dict = field(default_factory=dict)
    path: str = "kv-migrate"  # or "relay": through the controller, for TP levels tiertp.kv cannot plan
    bytes_pulled: int = 0
    source_stop_ms: float | None = None
