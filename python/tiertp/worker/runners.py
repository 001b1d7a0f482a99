"""The step runners an execution process can use, by name (``--runner``, `TIERTP_STEP_RUNNER`).

- ``instance`` (the default, tiertp.worker.instance_runner.InstanceStepRunner):
  a KV-owning TP instance on SGLang's model runner (tiertp.execution); it
  keeps every request's KV across steps, prefills new requests and decodes
  the running ones, and frees a request's KV on `release`. This is the path
  KV migration and TP switching build on.
- ``engine`` (the fallback, tiertp.worker.engine_runner.EngineStepRunner):
  SGLang's `Engine`, one token at a time; it cannot switch TP.
"""

from __future__ import annotations

from tiertp.tp_group import TpGroup
from tiertp.worker.engine_runner import EngineStepRunner
from tiertp.worker.instance_runner import InstanceStepRunner
from tiertp.worker.step_runner import StepRunner

# The one list of runner names; the first is the default.
RUNNERS = ("instance", "engine")
DEFAULT_RUNNER = RUNNERS[0]


def make_runner(name: str, model: str, group: TpGroup, max_total_tokens: int,
                extra_args: dict | None = None, cores_per_device: int | None = None,
                weight_stores: dict | None = None) -> StepRunner:
    """The runner called `name` (one of RUNNERS); `extra_args` are more SGLang
    server/engine keyword arguments; `cores_per_device` pins each rank to its
    device's cores (the instance runner; the Engine runner splits all cores);
    `weight_stores` ({device: tiertp.weights.StoreHandle}) binds the instance's
    ranks to their devices' shared weights (the instance runner only)."""
    if name == "instance":
        return InstanceStepRunner(model, group, max_total_tokens, extra_args, cores_per_rank=cores_per_device,
                                  weight_stores=weight_stores)
    if weight_stores:
        raise ValueError(f"step runner {name!r} cannot use shared weight stores; use 'instance'")
    if name == "engine":
        return EngineStepRunner(model, group, max_total_tokens, extra_args)
    raise ValueError(f"unknown step runner {name!r}; expected one of: {', '.join(RUNNERS)}")
