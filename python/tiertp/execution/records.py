"""What callers hand to an instance and get back (plain data, picklable).

Request ids are any hashable, picklable value the caller chooses (the worker
uses ints); they must be unique among the requests an instance holds.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Hashable

from tiertp.kv.shape import KVShape

RequestId = Hashable

# SGLang treats temperatures below this as greedy; so do we.
GREEDY_BELOW = 1e-6


@dataclass(frozen=True)
class Sampling:
    """How one request picks its tokens; stop tokens end it (with EOS)."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW


@dataclass(frozen=True)
class NewRequest:
    """A request to prefill: its prompt token ids and how to sample."""

    rid: RequestId
    token_ids: tuple[int, ...]
    sampling: Sampling = field(default_factory=Sampling)

    def __post_init__(self):
        object.__setattr__(self, "token_ids", tuple(int(t) for t in self.token_ids))


@dataclass(frozen=True)
class TokenOut:
    """A token an iteration produced for `rid`; `stopped` when it is EOS or
    one of the request's stop tokens (the caller decides when to release)."""

    rid: RequestId
    token: int
    stopped: bool


@dataclass(frozen=True)
class RequestState:
    """Everything a request is, for migration: its tokens (prompt, then the
    outputs so far), how to sample, and where its KV lies.

    Invariants: 0 <= kv_len <= len(token_ids) - 1, and `slots[i]` holds the
    K/V of token i for i < kv_len (page size 1: a slot is one token). A
    decoding request has kv_len == len(token_ids) - 1: its newest token was
    sampled but not yet fed. A request still waiting for (or in the middle
    of a chunked) prefill has kv_len < prompt_len; kv_len == 0 is a request
    that moves as metadata only. From `export`, `slots` are the source
    instance's; for `adopt`, the destination's.
    """

    rid: RequestId
    token_ids: tuple[int, ...]
    prompt_len: int
    kv_len: int
    slots: tuple[int, ...]
    sampling: Sampling

    def __post_init__(self):
        object.__setattr__(self, "token_ids", tuple(map(int, self.token_ids)))
        object.__setattr__(self, "slots", tuple(map(int, self.slots)))
        if not 0 <= self.kv_len < len(self.token_ids):
            raise ValueError(f"request {self.rid!r}: kv_len {self.kv_len} outside [0, {len(self.token_ids) - 1}] "
                             f"for {len(self.token_ids)} tokens")
        if len(self.slots) != self.kv_len:
            raise ValueError(f"request {self.rid!r}: {len(self.slots)} slots for kv_len {self.kv_len}")
        if not 1 <= self.prompt_len <= len(self.token_ids):
            raise ValueError(f"request {self.rid!r}: prompt_len {self.prompt_len} outside [1, {len(self.token_ids)}]")

    @property
    def generated(self) -> int:
        """Output tokens so far (the index of the next one, for seeded sampling)."""
        return len(self.token_ids) - self.prompt_len

    def with_slots(self, slots) -> RequestState:
        """This request with its KV in `slots` instead (another instance's,
        after a migration). Only the slots are converted and checked: the
        rest was when this state was made (a long request's tokens are tens
        of thousands of ints)."""
        slots = tuple(map(int, slots))
        if len(slots) != self.kv_len:
            raise ValueError(f"request {self.rid!r}: {len(slots)} slots for kv_len {self.kv_len}")
        moved = copy.copy(self)
        object.__setattr__(moved, "slots", slots)
        return moved


@dataclass(frozen=True)
class KVGeometry:
    """The paged KV one rank holds: the model's KV shape (tiertp.kv.KVShape,
    all ranks' heads) and this rank's share of it, SGLang's
    MHATokenToKVPool per layer, k_buffer/v_buffer of shape
    [slots, kv_heads_per_rank, head_dim] (slot 0 is SGLang's padding slot,
    never a request's)."""

    shape: KVShape
    kv_heads_per_rank: int
    slots: int  # buffer rows, padding slot included


@dataclass(frozen=True)
class InstanceInfo:
    """What a started instance reports (the same on every rank)."""

    tp: int
    vocab_size: int
    context_len: int  # longest request (prompt + output) one row holds
    kv_capacity_tokens: int  # usable KV slots per rank
    max_running_requests: int  # request rows
    eos_token_ids: tuple[int, ...]
    kv: KVGeometry


@dataclass(frozen=True)
class InstanceStats:
    running: int  # requests in the decode batch
    pending: int  # admitted or adopted, still to (finish) prefill
    kv_used_slots: int  # held by requests or reserved by imports
    kv_free_slots: int
    reserved_slots: int  # allocated for imports, not adopted yet
