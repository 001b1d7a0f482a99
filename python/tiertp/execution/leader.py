"""`Leader`: rank 0's side of the instance, the only place that decides.

Turns each command into one operation (tiertp.execution.ops) after checking
it can succeed, so a bad command is rejected (`CommandRejected`) before any
rank ran anything; samples the tokens; keeps what only the leader needs
(every request's token ids, prompt length, sampling).

Planning one iteration (`plan_iteration`):
1. release first (their KV and rows count as free from here on);
2. decode every request of the running batch (continuous batching: the
   caller controls membership by admitting and releasing);
3. extend pending requests in admission order (new prompts, chunks of long
   prompts, adopted requests' tails) while the prefill chunk budget, free KV
   slots and request rows last; a request that does not fit waits, and so do
   those behind it (first come, first served), producing no token this
   iteration.
A running batch whose decode does not fit the KV pool is rejected: SGLang
would retract a request; here the caller must release one.

Parked requests (a hand-off in flight, tiertp.execution.rank_kv) are in
neither the running batch nor the pending list, so iterations leave them
alone; their KV still counts as used until they are released.
"""

from __future__ import annotations

from dataclasses import dataclass

from tiertp.execution import ops
from tiertp.execution.errors import CommandRejected, DuplicateRequest, KVOutOfSpace, UnknownRequest
from tiertp.execution.rank_kv import RankKV
from tiertp.execution.records import NewRequest, RequestId, RequestState, Sampling, TokenOut
from tiertp.execution.sampling import Sampler
from tiertp.kv.ids import id_tensor


@dataclass
class _Book:
    token_ids: list[int]
    prompt_len: int
    sampling: Sampling


class Leader:
    def __init__(self, kv: RankKV, vocab_size: int, eos_token_ids: tuple[int, ...], prefill_chunk_tokens: int | None):
        self.kv = kv
        self.vocab_size = vocab_size
        self.eos = frozenset(eos_token_ids)
        self.chunk = prefill_chunk_tokens
        self.book: dict[RequestId, _Book] = {}
        self.sampler = Sampler()

    def set_chunk(self, tokens: int | None) -> None:
        """Most prompt tokens prefilled per iteration from now on (None: whole prompts).
        The executor follows the plan's token cap with it, as the simulator does."""
        if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1):
            raise CommandRejected(f"prefill chunk must be an int >= 1 or None, got {tokens!r}")
        self.chunk = tokens

    # --- checks ---------------------------------------------------------
    def _known(self, rids, what: str) -> None:
        seen = set()
        for rid in rids:
            if rid not in self.book:
                raise UnknownRequest(f"{what}: unknown request {rid!r}")
            if rid in seen:
                raise CommandRejected(f"{what}: request {rid!r} listed twice")
            seen.add(rid)

    def _check_tokens(self, rid: RequestId, token_ids, what: str) -> None:
        if not token_ids:
            raise CommandRejected(f"{what}: request {rid!r} has no tokens")
        # min/max run in C; the list is scanned in Python only to name the culprits.
        if min(token_ids) < 0 or max(token_ids) >= self.vocab_size:
            bad = [t for t in token_ids if not 0 <= t < self.vocab_size]
            raise CommandRejected(f"{what}: request {rid!r} has token ids outside the vocabulary "
                                  f"[0, {self.vocab_size}): {bad[:5]}")
        if len(token_ids) >= self.kv.row_len:
            raise CommandRejected(f"{what}: request {rid!r} has {len(token_ids)} tokens; a request holds at most "
                                  f"{self.kv.row_len} (prompt + output)")

    def _check_new(self, rids, releasing: set, what: str) -> None:
        seen = set()
        for rid in rids:
            if (rid in self.book and rid not in releasing) or rid in seen:
                raise DuplicateRequest(f"{what}: request {rid!r} is already held by this instance")
            seen.add(rid)

    # --- iteration ------------------------------------------------------
    def plan_iteration(self, admit: list[NewRequest], release: list[RequestId]) -> ops.Iteration:
        self._known(release, "release")
        releasing = set(release)
        self._check_new([r.rid for r in admit], releasing, "admit")
        for r in admit:
            self._check_tokens(r.rid, r.token_ids, "admit")
        kv = self.kv
        free_slots = kv.free_slots() + sum(kv.kv_len(rid) for rid in release)
        free_rows = kv.free_rows() + sum(kv.holds_row(rid) for rid in release)
        running = [rid for rid in kv.running if rid not in releasing]
        for rid in running:
            if kv.kv_len(rid) + 1 > kv.row_len:
                raise CommandRejected(f"request {rid!r} reached the longest context a request may hold "
                                      f"({kv.row_len} tokens); release it")
        if len(running) > free_slots:
            raise KVOutOfSpace(f"decoding {len(running)} running requests", len(running), free_slots)
        free_slots -= len(running)
        budget = self.chunk if self.chunk is not None else float("inf")
        lengths = {r.rid: len(r.token_ids) for r in admit}
        extend = []
        for rid in [p for p in kv.pending if p not in releasing] + [r.rid for r in admit]:
            has_row = rid not in lengths and kv.holds_row(rid)
            done = 0 if rid in lengths else kv.kv_len(rid)
            total = lengths[rid] if rid in lengths else len(self.book[rid].token_ids)
            n = int(min(total - done, budget, free_slots))
            if n <= 0 or (not has_row and free_rows < 1):
                break
            extend.append((rid, done + n))
            budget -= n
            free_slots -= n
            free_rows -= 0 if has_row else 1
        tokens = tuple(self.book[rid].token_ids[-1] for rid in running)
        return ops.Iteration(release=tuple(release), admit=tuple((r.rid, r.token_ids) for r in admit),
                             decode_tokens=tokens, extend=tuple(extend))

    def book_admitted(self, plan: ops.Iteration, admit: list[NewRequest]) -> None:
        """Leader-only bookkeeping, mirroring what `plan` does on the ranks."""
        for rid in plan.release:
            del self.book[rid]
        for r in admit:
            self.book[r.rid] = _Book(list(r.token_ids), len(r.token_ids), r.sampling)

    def sample(self, rids: list[RequestId], logits) -> list[TokenOut]:
        if not rids:
            return []
        rows = [(self.book[rid].sampling, len(self.book[rid].token_ids) - self.book[rid].prompt_len) for rid in rids]
        out = []
        for rid, token in zip(rids, self.sampler.sample(logits, rows), strict=True):
            b = self.book[rid]
            b.token_ids.append(token)
            out.append(TokenOut(rid, token, stopped=token in self.eos or token in b.sampling.stop_token_ids))
        return out

    # --- other commands -------------------------------------------------
    def plan_release(self, rids: list[RequestId]) -> ops.Release:
        self._known(rids, "release")
        return ops.Release(tuple(rids))

    def book_released(self, rids) -> None:
        for rid in rids:
            del self.book[rid]

    def plan_reserve(self, counts: list[int]) -> ops.ReserveSlots:
        if any(n < 0 for n in counts):
            raise CommandRejected(f"reserve: slot counts must be >= 0, got {counts}")
        need, free = sum(counts), self.kv.free_slots()
        if need > free:
            raise KVOutOfSpace(f"reserving KV for {len(counts)} imported requests", need, free)
        return ops.ReserveSlots(tuple(counts))

    def plan_free(self, slots: list[int]) -> ops.FreeSlots:
        self._check_reserved(slots, "free")
        return ops.FreeSlots(tuple(slots))

    def _check_reserved(self, slots, what: str) -> None:
        if not slots:
            return
        ids = id_tensor(slots)
        if ids.unique().numel() != ids.numel():
            raise CommandRejected(f"{what}: slots listed twice")
        inside = (ids > 0) & (ids < self.kv.slot_rows)
        ok = inside.clone()
        ok[inside] = self.kv.reserved[ids[inside]]
        if not bool(ok.all()):
            bad = ids[~ok][:8].tolist()
            raise CommandRejected(f"{what}: slots {bad} are not reserved for an import on this instance")

    def plan_adopt(self, states: list[RequestState]) -> ops.Adopt:
        self._check_new([s.rid for s in states], set(), "adopt")
        all_slots = [x for s in states for x in s.slots]
        self._check_reserved(all_slots, "adopt")
        for s in states:
            self._check_tokens(s.rid, s.token_ids, "adopt")
        rows = sum(1 for s in states if s.kv_len)
        if rows > self.kv.free_rows():
            raise CommandRejected(f"adopt: needs {rows} request rows, {self.kv.free_rows()} are free")
        return ops.Adopt(tuple((s.rid, s.token_ids, s.kv_len, s.slots) for s in states))

    def plan_park(self, rids: list[RequestId]) -> list[RequestState]:
        """Check `rids` can be parked; their states (as `export`: what a hand-off moves)."""
        states = self.export(rids)
        for rid in rids:
            if rid in self.kv.parked:
                raise CommandRejected(f"park: request {rid!r} is already parked")
        return states

    def plan_unpark(self, rids: list[RequestId]) -> tuple:
        """(rid, token ids) per request to unpark (the ranks rebuild them from those)."""
        self._known(rids, "unpark")
        for rid in rids:
            if rid not in self.kv.parked:
                raise CommandRejected(f"unpark: request {rid!r} is not parked")
        return tuple((rid, tuple(self.book[rid].token_ids)) for rid in rids)

    def book_adopted(self, states: list[RequestState]) -> None:
        for s in states:
            self.book[s.rid] = _Book(list(s.token_ids), s.prompt_len, s.sampling)

    def export(self, rids: list[RequestId]) -> list[RequestState]:
        self._known(rids, "export")
        out = []
        for rid in rids:
            b = self.book[rid]
            out.append(RequestState(rid, tuple(b.token_ids), b.prompt_len, self.kv.kv_len(rid),
                                    tuple(self.kv.slots_of(rid)), b.sampling))
        return out
