"""`RankHandle`: what code running inside a rank process is given (a `RankCall`, the weight binder's caller)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tiertp.execution.context import TpContext
from tiertp.execution.kv_view import kv_pool_of
from tiertp.execution.rank_kv import RankKV


@dataclass
class RankHandle:
    """One rank: its TP context, SGLang's ModelRunner, and the rank's requests
    and KV (RankKV); `kv_pool()` is the rank's KV as a tiertp.kv.KVPool for migration."""

    ctx: TpContext
    model_runner: Any
    kv: RankKV
    _pool: Any = None

    def kv_pool(self):
        """Built once (SGLang's buffers never move); see tiertp.execution.kv_view."""
        if self._pool is None:
            self._pool = kv_pool_of(self)
        return self._pool
