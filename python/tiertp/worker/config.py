"""`AgentConfig`: the node agent's settings, parsed once and validated here.

Every default is written once, in this dataclass; `tiertp worker` builds its
options from it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from tiertp.engine.models import resolve_model
from tiertp.engine.sglang_compat import cpu_count
from tiertp.profiles.models import DecoderShape

if TYPE_CHECKING:
    from tiertp.worker.seal import ControlKey


@dataclass(frozen=True)
class AgentConfig:
    """Settings of one node agent.

    `tp_levels` are the candidate TP levels: a warm process runs for every
    aligned group at each (tiertp.worker.agent). Times are seconds.
    """

    model: str = "tiny-llama"
    bind: str = "tcp://127.0.0.1:7100"
    devices: int = 1
    device_kind: str = "cpu"
    tp_levels: tuple[int, ...] = (1,)
    max_total_tokens: int = 4096  # KV slots per execution process
    batch_cap: int = 8  # per device until a plan sets it
    token_cap: int = 0  # prompt tokens per iteration; 0: no limit
    keepalive_s: float = 1.0  # how often idle processes are pinged
    hang_timeout_s: float = 120.0  # a started process silent this long is killed and restarted
    start_timeout_s: float = 300.0  # a process not ready after this long is killed and restarted
    max_start_failures: int = 3  # consecutive failed starts before held requests are failed
    log_dir: Path | None = None  # execution process logs; a temporary directory if None
    # Cores each logical device owns (CPU): device d runs on core group d, so
    # devices never share cores. None: the machine's cores split over the devices.
    cores_per_device: int | None = None
    extra_engine_args: dict = field(default_factory=dict)
    # The control-plane key (`--key-file`): the agent hears only clients holding it. Never printed.
    key: ControlKey | None = field(default=None, repr=False, compare=False)

    def __post_init__(self):
        if self.devices < 1:
            raise ValueError(f"--devices must be >= 1, got {self.devices}")
        if self.device_kind != "cpu":
            raise ValueError(f"device kind {self.device_kind!r} is not supported by the worker yet; expected: cpu")
        check_tp_levels(self.tp_levels)
        if max(self.tp_levels) > self.devices:
            raise ValueError(f"--tp-levels {max(self.tp_levels)} needs at least that many devices; "
                             f"--devices is {self.devices}")
        if self.cores_per_device is not None and self.cores_per_device < 1:
            raise ValueError(f"--cores-per-device must be >= 1, got {self.cores_per_device}")
        if self.batch_cap < 1:
            raise ValueError(f"batch cap must be >= 1, got {self.batch_cap}")
        if self.max_total_tokens < 16:
            raise ValueError(f"--max-total-tokens must be >= 16, got {self.max_total_tokens}")
        if not self.bind.startswith(("tcp://", "ipc://", "inproc://")):
            raise ValueError(f"--bind must be a ZeroMQ endpoint (tcp://host:port or ipc://path), got {self.bind!r}")

    def resolved_cores_per_device(self) -> int:
        return self.cores_per_device or max(1, cpu_count() // self.devices)

    def resolved_log_dir(self) -> Path:
        return self.log_dir or Path(os.environ.get("TMPDIR", "/tmp")) / f"tiertp-worker-{os.getpid()}"


def check_tp_levels(tp_levels: tuple[int, ...]) -> None:
    """ValueError unless the levels are powers of two including 1 (the agent's
    and the gateway's rule; how many devices they need is each one's own)."""
    if not tp_levels or any(t < 1 or t & (t - 1) for t in tp_levels):
        raise ValueError(f"--tp-levels must be powers of two, got {list(tp_levels)}")
    if 1 not in tp_levels:
        raise ValueError(f"--tp-levels must include 1 (every device starts at TP 1), got {list(tp_levels)}")


def check_model_fits_tp_levels(model: str, tp_levels: tuple[int, ...]) -> None:
    """ValueError unless the model's attention and KV heads split evenly at
    every level (a TP process of another level could never start)."""
    # Imported here: tiertp.weights imports torch, which `tiertp --help` should not wait for.
    from tiertp.weights.checkpoint import read_config

    shape = DecoderShape(**DecoderShape.fields_from_config(read_config(resolve_model(model))))
    bad = [t for t in tp_levels if not shape.tp_ok(t)]
    if bad:
        fits = [t for t in (1, 2, 3, 4, 6, 8) if shape.tp_ok(t)]
        raise ValueError(f"--tp-levels {','.join(map(str, tp_levels))}: model {model!r} has {shape.heads} attention "
                         f"heads and {shape.kv_heads} KV heads, which do not split evenly over TP "
                         f"{', '.join(map(str, bad))} (levels that fit: {fits})")
