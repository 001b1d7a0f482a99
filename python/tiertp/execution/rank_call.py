"""`RankCall`: code every rank of a TP instance runs on request (`TpInstance.call_on_ranks`).

A call crosses two process boundaries (controller -> leader -> every rank)
as a pickled object: the rank processes import its class, never a name
given as a string, so every call's code is visible to readers and tools.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tiertp.execution.rank_handle import RankHandle


class RankCall(ABC):
    """One call, with its arguments as fields (a frozen dataclass defined at module level).

    Contract: `run` executes in every rank process of the instance, each with
    its own RankHandle, all at once (a call may use the ranks' collectives);
    what it returns must pickle, and reaches the caller in rank order. What it
    raises is reported per rank (`RankCallFailed`) while the instance keeps
    running, so a call that raises must leave its rank usable.
    """

    @abstractmethod
    def run(self, handle: RankHandle) -> Any:
        """This rank's part; its result."""

    def describe(self) -> str:
        """How errors name this call."""
        return type(self).__name__


@dataclass(frozen=True)
class RankFunction(RankCall):
    """`function(handle, arg)` on every rank: for checks and tools that need no class of their own.
    `function` must be defined at module level (it is pickled by reference)."""

    function: Callable[[RankHandle, Any], Any]
    arg: Any = None

    def run(self, handle: RankHandle) -> Any:
        return self.function(handle, self.arg)

    def describe(self) -> str:
        return f"{self.function.__module__}.{self.function.__qualname__}"
