"""`ExecRequest`: one request as the execution process's loop tracks it."""

from __future__ import annotations

from dataclasses import dataclass, field

from tiertp.worker.step_runner import StepInput


@dataclass
class ExecRequest:
    rid: int
    input_ids: list[int]
    max_tokens: int
    temperature: float
    top_p: float
    seed: int | None
    stop_token_ids: tuple[int, ...]
    output: list[int] = field(default_factory=list)

    @property
    def kv_reserved(self) -> int:
        """KV tokens this request may hold by its end (prompt + max_tokens)."""
        return len(self.input_ids) + self.max_tokens

    def step_input(self) -> StepInput:
        return StepInput(self.rid, self.input_ids + self.output, len(self.output), self.temperature,
                         self.top_p, self.seed, self.stop_token_ids)
