"""`ExecRequest`: one request as the execution process's loop tracks it."""

from __future__ import annotations

from dataclasses import dataclass, field

from tiertp.execution.records import Sampling
from tiertp.worker.step_runner import StepInput


@dataclass
class ExecRequest:
    rid: int
    input_ids: list[int]
    max_tokens: int
    sampling: Sampling
    output: list[int] = field(default_factory=list)

    @property
    def kv_reserved(self) -> int:
        """KV tokens this request may hold by its end (prompt + max_tokens)."""
        return len(self.input_ids) + self.max_tokens

    def step_input(self) -> StepInput:
        return StepInput(self.rid, self.input_ids + self.output, len(self.output), self.sampling)
