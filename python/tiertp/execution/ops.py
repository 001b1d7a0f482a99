"""The operations the leader broadcasts to every rank, one per command.

All ranks apply the same operations in the same order, so they run the same
forwards (the collectives need it) and SGLang's allocators hand out the same
slots on every rank (they are deterministic). Operations carry everything a
follower needs; followers never decide anything.
"""

from __future__ import annotations

from dataclasses import dataclass

from tiertp.execution.rank_call import RankCall
from tiertp.execution.records import RequestId


@dataclass(frozen=True)
class Iteration:
    """One iteration: release, admit, decode the running batch, extend.

    - `release`: requests whose KV is freed first;
    - `admit`: (rid, prompt token ids) of new requests (no KV yet);
    - `decode_tokens`: the input token of every request of the running
      batch, in batch order (empty: no decode forward);
    - `extend`: (rid, end) per request to extend over tokens [kv_len, end)
      (a prompt, a chunk of one, or the tail of an adopted request).
    """

    release: tuple[RequestId, ...] = ()
    admit: tuple[tuple[RequestId, tuple[int, ...]], ...] = ()
    decode_tokens: tuple[int, ...] = ()
    extend: tuple[tuple[RequestId, int], ...] = ()


@dataclass(frozen=True)
class Release:
    rids: tuple[RequestId, ...]


@dataclass(frozen=True)
class ReserveSlots:
    """Allocate `counts[i]` slots per entry (for KV someone else writes)."""

    counts: tuple[int, ...]


@dataclass(frozen=True)
class FreeSlots:
    """Give reserved (not adopted) slots back."""

    slots: tuple[int, ...]


@dataclass(frozen=True)
class Adopt:
    """(rid, token ids, kv_len, slots) per request: reserved slots holding
    the request's first kv_len tokens of KV become the request's."""

    requests: tuple[tuple[RequestId, tuple[int, ...], int, tuple[int, ...]], ...]


@dataclass(frozen=True)
class Call:
    """Run `call` on every rank; the results are gathered to the leader."""

    call: RankCall


@dataclass(frozen=True)
class Shutdown:
    pass


Operation = Iteration | Release | ReserveSlots | FreeSlots | Adopt | Call | Shutdown
