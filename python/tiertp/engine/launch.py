"""Start an SGLang `Engine` for a model at a TP level, on CPU or CUDA.

`start_engine` must run in a process dedicated to that engine (see
tiertp.engine.isolated for why): it applies the process-wide settings from
tiertp.engine.sglang_compat first, so it must also run before anything in
the process imports sglang.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tiertp.engine import sglang_compat
from tiertp.engine.models import resolve_model


@dataclass(frozen=True)
class EngineSpec:
    """What to run: `model` is an embedded model name or a model directory."""

    model: str
    tp: int = 1
    device: str = "cpu"
    max_total_tokens: int | None = None
    extra: dict = field(default_factory=dict)  # more Engine kwargs, override the defaults

    def __post_init__(self):
        sglang_compat.check_device(self.device)
        if self.tp < 1:
            raise ValueError(f"TP level must be >= 1, got {self.tp}")


def engine_args(spec: EngineSpec) -> dict:
    """The full Engine keyword arguments for `spec` (model resolved to a directory)."""
    path = str(resolve_model(spec.model))
    kw = sglang_compat.engine_kwargs(spec.device, spec.tp, max_total_tokens=spec.max_total_tokens)
    return {"model_path": path, **kw, **spec.extra}


def start_engine(spec: EngineSpec):
    """Create and return a started `sglang.Engine` for `spec` (call `.shutdown()` when done)."""
    if spec.device == "cuda":
        sglang_compat.check_cuda_available()
    args = engine_args(spec)  # resolve (and maybe build) the model before SGLang's imports
    sglang_compat.apply(spec.device, spec.tp)
    import sglang

    return sglang.Engine(**args)
