"""`StepRunner`: one decoding iteration for a batch of requests.

The execution loop (tiertp.worker.executor) decides which requests run each
iteration (the Rust batch policy) and calls `step` once per iteration; the
runner returns one new token per request (or none yet, for a request whose
prompt is still being prefilled in chunks), and is told with `release` when
a request leaves (finished or cancelled).

Two runners, named in `RUNNERS` (`make_runner` builds one by name):

- ``instance`` (the default, `tiertp.execution.step_runner.InstanceStepRunner`):
  a KV-owning TP instance on SGLang's model runner (tiertp.execution); it
  keeps every request's KV across steps, prefills new requests and decodes
  the running ones, and frees a request's KV on `release`. This is the path
  KV migration and TP switching build on.
- ``engine`` (the fallback, `EngineStepRunner`): SGLang's `Engine`, one
  token at a time. `TIERTP_STEP_RUNNER=engine` (or the execution process's
  ``--runner engine``) selects it.

`EngineStepRunner` drives SGLang's `Engine` one token at a time: each
iteration is one `Engine.generate` call over the batch with
`max_new_tokens=1` and each request's prompt plus the tokens generated so
far. SGLang's radix cache matches everything but the newest token, so an
iteration extends one token per request instead of re-running the prompt.
It cannot migrate KV or switch TP; it stays as a reference and fallback.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from tiertp.worker.groups import TpGroup


@dataclass(frozen=True)
class StepInput:
    """One request's state at an iteration: all tokens so far (prompt + generated)."""

    rid: int
    token_ids: list[int]
    generated: int  # tokens generated before this step
    temperature: float
    top_p: float
    seed: int | None
    stop_token_ids: tuple[int, ...]


@dataclass(frozen=True)
class StepOutput:
    """The token a step produced; `stopped` when it is a stop token (EOS or one of
    the request's stop_token_ids). `token` is None when the request produced no
    token this step (its prompt is being prefilled in chunks, or waits for KV
    space); it stays in the batch and produces its first token in a later step."""

    rid: int
    token: int | None
    stopped: bool


@dataclass(frozen=True)
class ModelLimits:
    """What the agent checks submits against."""

    vocab_size: int
    max_request_tokens: int  # prompt + output tokens one request may hold
    kv_capacity_tokens: int


class RunnerDied(RuntimeError):
    """The runner's model processes died: the execution process must exit as
    a dead worker (the agent then fails its requests with worker_died and
    restarts it), not report a failed iteration."""


class StepRunner(ABC):
    """Runs a model replica on one TP group.

    Contract: `start` is called once in the execution process before any
    `step`; `step` returns one StepOutput per input, in input order, and may
    raise (the execution process then fails the batch and exits; RunnerDied
    when model processes died, so the agent sees a dead worker). A request
    appears in every step from its first until it is released: `release`
    (rids that finished or were cancelled) is called once per request that
    was ever stepped, after which its id is not stepped again; a runner
    holding per-request state (KV) frees it then. `close` releases everything
    `start` created and is safe to call twice.
    """

    @abstractmethod
    def start(self) -> ModelLimits: ...

    @abstractmethod
    def step(self, batch: list[StepInput]) -> list[StepOutput]: ...

    def release(self, rids: list[int]) -> None:
        """The requests left (finished or cancelled); default: nothing to free."""

    def set_prefill_chunk(self, tokens: int | None) -> bool:
        """Prefill at most `tokens` prompt tokens per step (None: whole prompts),
        splitting long prompts over steps, as the simulator does with a plan's
        token cap. Returns False where the runner cannot: the executor then
        keeps the cap as an admission limit of its batch policy instead."""
        return False

    @abstractmethod
    def close(self) -> None: ...


class EngineStepRunner(StepRunner):
    def __init__(self, model: str, group: TpGroup, max_total_tokens: int, extra_engine_args: dict | None = None):
        self.model = model
        self.group = group
        self.max_total_tokens = max_total_tokens
        self.extra = dict(extra_engine_args or {})
        self._engine = None

    def start(self) -> ModelLimits:
        from tiertp.engine.launch import EngineSpec, start_engine

        spec = EngineSpec(model=self.model, tp=self.group.tp, device="cpu",
                          max_total_tokens=self.max_total_tokens, extra=self.extra)
        self._engine = start_engine(spec)
        tm = self._engine.tokenizer_manager
        return ModelLimits(
            vocab_size=int(tm.model_config.vocab_size),
            max_request_tokens=min(int(tm.context_len), self.max_total_tokens),
            kv_capacity_tokens=self.max_total_tokens,
        )

    def step(self, batch: list[StepInput]) -> list[StepOutput]:
        params = []
        for r in batch:
            p = {"max_new_tokens": 1, "temperature": r.temperature, "top_p": r.top_p,
                 "stop_token_ids": list(r.stop_token_ids)}
            if r.seed is not None:
                # A fixed seed per step would repeat the same draw every step.
                p["sampling_seed"] = (r.seed + r.generated) % 2**63
            params.append(p)
        outs = self._engine.generate(input_ids=[r.token_ids for r in batch], sampling_params=params)
        if isinstance(outs, dict):
            outs = [outs]
        result = []
        for r, o in zip(batch, outs, strict=True):
            ids = o.get("output_ids") or []
            if len(ids) != 1:
                raise RuntimeError(f"request {r.rid}: SGLang returned {len(ids)} tokens for a 1-token step")
            reason = (o.get("meta_info") or {}).get("finish_reason") or {}
            result.append(StepOutput(r.rid, int(ids[0]), stopped=reason.get("type") == "stop"))
        return result

    def close(self) -> None:
        engine, self._engine = self._engine, None
        if engine is not None:
            engine.shutdown()


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
        from tiertp.execution.step_runner import InstanceStepRunner

        return InstanceStepRunner(model, group, max_total_tokens, extra_args, cores_per_rank=cores_per_device,
                                  weight_stores=weight_stores)
    if weight_stores:
        raise ValueError(f"step runner {name!r} cannot use shared weight stores; use 'instance'")
    if name == "engine":
        return EngineStepRunner(model, group, max_total_tokens, extra_args)
    raise ValueError(f"unknown step runner {name!r}; expected one of: {', '.join(RUNNERS)}")
