"""`StepRunner`: what the execution process needs of a model replica, one iteration at a time.

The execution loop (tiertp.worker.executor) decides which requests run each
iteration (its RequestTable, over the Rust batch policy) and calls `step`
once per iteration; the runner returns one new token per request (or none
yet, for a request whose prompt is still being prefilled in chunks), and is
told with `release` when a request leaves (finished or cancelled).

`SwitchableStepRunner` is a runner that owns a TP instance (tiertp.execution)
and so can take part in TP switches and hand-offs: pause, park, unpark,
adopt, and give requests away (tiertp.worker.switch_ops).

The implementations are listed in tiertp.worker.runners.
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from tiertp.execution.instance import TpInstance
from tiertp.execution.records import RequestState, Sampling


@dataclass(frozen=True)
class StepInput:
    """One request's state at an iteration: all tokens so far (prompt + generated)."""

    rid: int
    token_ids: list[int]
    generated: int  # tokens generated before this step
    sampling: Sampling


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


@runtime_checkable
class StepRunner(Protocol):
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


@runtime_checkable
class SwitchableStepRunner(StepRunner, Protocol):
    """A StepRunner over a TP instance: its requests' KV can move to another instance and back.

    Contract, on top of StepRunner's: the caller (the execution process's
    RequestTable) is the one owner of which requests run, and calls these only
    between steps. A *parked* request is left out of the steps while its KV
    stays where it is (a hand-off reads it); `release` may also name a parked
    request (it frees its KV). Each method raises RunnerDied when the
    instance died.
    """

    # The TP instance, once started: for what does not change which requests
    # run (info, export, reserved slots, rank calls).
    instance: TpInstance | None

    @abstractmethod
    def pause(self) -> None:
        """No step runs until `resume`; the KV of released requests is freed now (a switch needs the room)."""

    @abstractmethod
    def resume(self) -> None:
        """Steps may run again."""

    @abstractmethod
    def park(self, rids: list[int]) -> list[RequestState]:
        """Take these stepped requests out of the steps, their KV kept; their states (as TpInstance.export)."""

    @abstractmethod
    def unpark(self, rids: list[int]) -> None:
        """Parked requests are stepped again; the next step gives each the token it was due."""

    @abstractmethod
    def adopt(self, states: list[RequestState]) -> None:
        """The instance takes these requests over, KV already in its reserved slots: from the next step
        on they are stepped (they decode, no prefill)."""

    @abstractmethod
    def moved_away(self, rids: list[int]) -> None:
        """These stepped or parked requests now live on another instance: free their KV now and forget them."""
