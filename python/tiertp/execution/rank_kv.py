"""`RankKV`: one rank's requests and the paged KV they own (runs in a rank process).

This is the KV-owning part: SGLang's pools of this rank (`req_to_token_pool`:
request row x position -> slot; `token_to_kv_pool`: per-layer K/V buffers;
its allocator: free slots, page size 1) and, per request, SGLang's `Req`
holding its row. Forwards go through SGLang's ScheduleBatch path
(`sglang.benchmark.one_batch.extend` / `decode`, the same calls `tiertp
profile` times):

- an *extend* runs tokens [kv_len, end) of some requests (a prompt, a chunk
  of one, or the tail of an adopted request) on top of the KV they already
  hold; a request whose extend reaches its last token joins the running
  batch (SGLang's `filter_batch` + `merge_batch`, as its scheduler does);
- a *decode* feeds one token per request of the running batch;
- a request's KV is freed when it is released, whatever state it is in;
- a *parked* request (a prefill -> decode hand-off in flight) leaves the
  running batch (no decode step, no token) but keeps its row and slots
  untouched, so another instance may still read its KV, until it is
  released (it moved away) or unparked: it then re-enters like an adopted
  request, its unfed newest token extended on top of the KV it holds.

Every rank applies the same operations in the same order; the slots SGLang's
allocator hands out then agree across ranks. Nothing here decides anything:
the leader (tiertp.execution.leader) validates and plans first, so every
operation here is expected to succeed.

`kv_len(rid)` is SGLang's own count (`req.kv.kv_allocated_len`), the one
source of truth for how many tokens of KV a request holds.
"""

from __future__ import annotations

from array import array
from itertools import count

import torch

from tiertp.execution.records import RequestId
from tiertp.kv.ids import id_tensor


class RankKV:
    def __init__(self, model_runner):
        # Imported here: the controller imports this module too and never imports SGLang.
        from sglang.benchmark import one_batch
        from sglang.srt.managers.schedule_batch import Req
        from sglang.srt.sampling.sampling_params import SamplingParams

        self._one_batch, self._Req, self._SamplingParams = one_batch, Req, SamplingParams
        self.runner = model_runner
        self.req_to_token_pool = model_runner.req_to_token_pool
        self.allocator = model_runner.token_to_kv_pool_allocator
        self.kv_pool = model_runner.token_to_kv_pool
        if self.allocator.page_size != 1:
            raise ValueError(f"RankKV needs page size 1, SGLang's allocator has {self.allocator.page_size}")
        self.reqs: dict[RequestId, object] = {}  # rid -> sglang Req
        self.pending: list[RequestId] = []  # admitted/adopted, prefill not complete; admission order
        self.running: list[RequestId] = []  # the running batch, in batch order
        self._batch = None  # SGLang ScheduleBatch of `running` (None when empty)
        self.parked: set[RequestId] = set()  # in neither list; KV kept as it is
        # Slots allocated for KV someone else writes (imports), not yet adopted.
        self.reserved = torch.zeros(self.slot_rows, dtype=torch.bool)
        self._sglang_rid = count()

    # --- reading -------------------------------------------------------
    @property
    def slot_rows(self) -> int:
        """Rows of the K/V buffers (slot 0, SGLang's padding slot, included)."""
        return int(self.kv_pool.k_buffer[0].shape[0])

    @property
    def row_len(self) -> int:
        """Most tokens one request row can hold."""
        return int(self.req_to_token_pool.req_to_token.shape[1])

    def kv_len(self, rid: RequestId) -> int:
        return int(self.reqs[rid].kv.kv_allocated_len)

    def holds_row(self, rid: RequestId) -> bool:
        return self.reqs[rid].kv.holds_kv

    def fill_len(self, rid: RequestId) -> int:
        """Tokens known to this rank for `rid` (what an extend may reach)."""
        return len(self.reqs[rid].origin_input_ids)

    def slots_of(self, rid: RequestId) -> list[int]:
        """The slots holding `rid`'s KV, token i in slot [i]."""
        req = self.reqs[rid]
        if not req.kv.holds_kv:
            return []
        return self.req_to_token_pool.req_to_token[req.kv.req_pool_idx, : self.kv_len(rid)].tolist()

    # --- requests ------------------------------------------------------
    def _new_req(self, token_ids):
        req = self._Req(rid=f"tiertp-{next(self._sglang_rid)}", origin_input_text="",
                        origin_input_ids=array("q", token_ids),
                        # Greedy: SGLang's sampler runs but its choice is unused (the leader samples).
                        sampling_params=self._SamplingParams(temperature=0, max_new_tokens=1 << 30))
        # As one_batch's synthetic requests: fill ids are the input ids, no input logprobs.
        req.full_untruncated_fill_ids = req.origin_input_ids
        req.logprob_start_len = -1
        return req

    def admit(self, rid: RequestId, token_ids) -> None:
        self.reqs[rid] = self._new_req(token_ids)
        self.pending.append(rid)

    def adopt(self, rid: RequestId, token_ids, kv_len: int, slots) -> None:
        """`rid` holds tokens `token_ids`; reserved `slots` hold the KV of its first kv_len."""
        req = self._new_req(token_ids)
        if kv_len:
            [row] = self.req_to_token_pool.alloc_rows(1)
            req.kv.req_pool_idx = row
            ids = id_tensor(slots)
            self.req_to_token_pool.write((row, slice(0, kv_len)), ids.to(torch.int32))
            req.kv.kv_allocated_len = req.kv.kv_committed_len = kv_len
            self.reserved[ids] = False
        self.reqs[rid] = req
        self.pending.append(rid)

    def _leave_batch(self, gone: set) -> None:
        """Take `gone` out of the running batch and the pending list (their KV stays)."""
        keep = [i for i, rid in enumerate(self.running) if rid not in gone]
        if len(keep) != len(self.running):
            if keep:
                self._batch.filter_batch(keep_indices=keep)
            else:
                self._batch = None
            self.running = [self.running[i] for i in keep]
        self.pending = [rid for rid in self.pending if rid not in gone]

    def park(self, rids) -> None:
        """Stop stepping `rids`; their row and slots stay exactly as they are."""
        gone = set(rids)
        self._leave_batch(gone)
        self.parked |= gone

    def unpark(self, items) -> None:
        """(rid, token ids) per parked request, token ids as the leader knows
        them (prompt, then outputs; the newest not fed yet). Each becomes a
        fresh SGLang Req over the row it holds, as `adopt` builds one, first
        in the pending list: the next iteration extends its unfed tail (one
        token for a decoding request) and samples the token a decode step
        would have."""
        back = []
        for rid, token_ids in items:
            old = self.reqs[rid]
            req = self._new_req(token_ids)
            if old.kv.holds_kv:
                req.kv.req_pool_idx = old.kv.req_pool_idx
                req.kv.kv_allocated_len = req.kv.kv_committed_len = old.kv.kv_allocated_len
            self.reqs[rid] = req
            self.parked.discard(rid)
            back.append(rid)
        self.pending[:0] = back

    def release(self, rids) -> None:
        gone = set(rids)
        if not gone:
            return
        self._leave_batch(gone)
        self.parked -= gone
        for rid in rids:
            req = self.reqs.pop(rid)
            if req.kv.holds_kv:
                row = req.kv.req_pool_idx
                slots = self.req_to_token_pool.req_to_token[row, : req.kv.kv_allocated_len].to(torch.int64)
                self.allocator.free(slots)
                self.req_to_token_pool.free(req)

    # --- slots for imports --------------------------------------------
    def reserve(self, counts) -> list[list[int]]:
        out = []
        for n in counts:
            if n == 0:
                out.append([])
                continue
            ids = self.allocator.alloc(n)
            if ids is None:  # the leader checked the total; a mismatch is a bug
                raise RuntimeError(f"SGLang's allocator refused {n} slots after the leader's check")
            self.reserved[ids.cpu()] = True
            out.append(ids.tolist())
        return out

    def free_reserved(self, slots) -> None:
        if not slots:
            return
        ids = id_tensor(slots)
        self.reserved[ids] = False
        self.allocator.free(ids.to(self.allocator.device))

    # --- forwards ------------------------------------------------------
    def decode(self, tokens) -> torch.Tensor:
        """One decode step of the running batch; its logits [len(running), vocab]."""
        if len(tokens) != len(self.running):
            raise RuntimeError(f"decode got {len(tokens)} tokens for a running batch of {len(self.running)}")
        _, logits = self._one_batch.decode(torch.tensor(tokens, dtype=torch.int64, device=self.runner.device),
                                           self._batch, self.runner)
        return logits

    def extend(self, items) -> tuple[torch.Tensor, list[RequestId]]:
        """Extend each (rid, end) over tokens [kv_len, end). Returns the logits of
        the requests whose extend reached their last known token (in `items`
        order) and those requests, which now joined the running batch."""
        reqs = []
        for rid, end in items:
            req = self.reqs[rid]
            req.prefix_len = self.kv_len(rid)
            req.extend_end = end
            reqs.append(req)
        _, logits, batch = self._one_batch.extend(reqs, self.runner)
        done = [i for i, (rid, end) in enumerate(items) if end == self.fill_len(rid)]
        finished = [items[i][0] for i in done]
        if done:
            if len(done) != len(items):
                batch.filter_batch(keep_indices=done)
            if self._batch is None:
                self._batch = batch
            else:
                self._batch.merge_batch(batch)
            self.running.extend(finished)
            gone = set(finished)
            self.pending = [rid for rid in self.pending if rid not in gone]
        return logits[done], finished

    # --- accounting ----------------------------------------------------
    def free_slots(self) -> int:
        return int(self.allocator.available_size())

    def free_rows(self) -> int:
        return int(self.req_to_token_pool.available_size())

    def reserved_count(self) -> int:
        return int(self.reserved.sum())

