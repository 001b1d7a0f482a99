"""`StepRunner`: one decoding iteration for a batch of requests.

The execution loop (tiertp.worker.executor) decides which requests run each
iteration (the Rust batch policy) and calls `step` once per iteration; the
runner returns one new token per request.

`EngineStepRunner` drives SGLang's `Engine` one token at a time: each
iteration is one `Engine.generate` call over the batch with
`max_new_tokens=1` and each request's prompt plus the tokens generated so
far. SGLang's radix cache matches everything but the newest token, so an
iteration extends one token per request instead of re-running the prompt.
Why not SGLang's model runner directly: the Engine is the supported API and
was fast to make right; the runner-level path (needed for KV migration and
TP switching, issue 6) replaces this class behind the same interface.
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
    the request's stop_token_ids)."""

    rid: int
    token: int
    stopped: bool


@dataclass(frozen=True)
class ModelLimits:
    """What the agent checks submits against."""

    vocab_size: int
    max_request_tokens: int  # prompt + output tokens one request may hold
    kv_capacity_tokens: int


class StepRunner(ABC):
    """Runs a model replica on one TP group.

    Contract: `start` is called once in the execution process before any
    `step`; `step` returns one StepOutput per input, in input order, and may
    raise (the execution process then fails the batch and exits); `close`
    releases everything `start` created and is safe to call twice.
    """

    @abstractmethod
    def start(self) -> ModelLimits: ...

    @abstractmethod
    def step(self, batch: list[StepInput]) -> list[StepOutput]: ...

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
