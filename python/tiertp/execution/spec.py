"""`InstanceSpec`: what one TP instance runs, validated once here.

Every default is written once, in this dataclass.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tiertp.engine import sglang_compat
from tiertp.execution.context import TpContext

# (model_runner, tp_context, weight_binder_arg) -> None
WeightBinder = Callable[[Any, TpContext, Any], None]


@dataclass(frozen=True)
class InstanceSpec:
    """One model replica at TP level `tp` on `tp` devices.

    - `model`: an embedded model name or an HF model directory
      (tiertp.engine.models.resolve_model).
    - `devices`: the device ids its ranks use (rank r on `devices[r]`); on
      CPU they are logical, and every rank binds its own core group. Defaults
      to 0..tp-1.
    - `max_total_tokens`: KV slots per rank (SGLang's token_to_kv pool size).
    - `prefill_chunk_tokens`: most prompt tokens prefilled per iteration over
      all admitted requests (chunked prefill); None prefills every admitted
      prompt whole in its first iteration.
    - `weight_binder`: a module-level function (it reaches the rank
      processes pickled by reference) called in every rank process after
      SGLang built the model and before the first forward, as
      ``weight_binder(model_runner, tp_context, weight_binder_arg)``; with a binder
      SGLang does not read weight files (``load_format="dummy"``), the binder
      provides the parameters (tiertp's shared weight store plugs in here).
    - `extra_server_args`: more SGLang ServerArgs keywords, overriding
      tiertp's CPU defaults (tiertp.engine.sglang_compat.engine_kwargs).
    """

    model: str
    tp: int = 1
    device: str = "cpu"
    devices: tuple[int, ...] | None = None
    max_total_tokens: int = sglang_compat.DEFAULT_CPU_MAX_TOTAL_TOKENS
    prefill_chunk_tokens: int | None = None
    cores_per_rank: int | None = None
    weight_binder: WeightBinder | None = None
    weight_binder_arg: object = None
    extra_server_args: dict = field(default_factory=dict)
    start_timeout_s: float = 600.0

    def __post_init__(self):
        sglang_compat.check_device(self.device)
        if self.tp < 1:
            raise ValueError(f"TP level must be >= 1, got {self.tp}")
        devices = tuple(self.devices) if self.devices is not None else tuple(range(self.tp))
        if len(devices) != self.tp or len(set(devices)) != self.tp or min(devices) < 0:
            raise ValueError(f"TP{self.tp} needs {self.tp} distinct device ids >= 0, got {list(devices)}")
        object.__setattr__(self, "devices", devices)
        if self.max_total_tokens < 16:
            raise ValueError(f"max_total_tokens must be >= 16, got {self.max_total_tokens}")
        if self.prefill_chunk_tokens is not None and self.prefill_chunk_tokens < 1:
            raise ValueError(f"prefill_chunk_tokens must be >= 1 or None, got {self.prefill_chunk_tokens}")
        if self.weight_binder is not None and not callable(self.weight_binder):
            raise ValueError(f"weight_binder must be a function (model_runner, tp_context, arg), "
                             f"got {self.weight_binder!r}")
