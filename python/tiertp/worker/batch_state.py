"""`BatchState`: the execution process's requests, and the one place that changes them.

A request here is in exactly one state:

- *waiting*: queued in the Rust batch policy (`tiertp._scheduler.BatchPolicy`),
  holding nothing in the runner;
- *running*: in every step from the one that admitted it until it finishes,
  is cancelled or moves away; the runner holds its KV;
- *parked*: a prefill -> decode hand-off in flight (tiertp.worker.switch_ops
  ``park``): left out of the steps, its KV still held here for the
  destination to read, until it is released (moved, or cancelled) or
  unparked (the hand-off failed: it runs again).

Admission reserves each request's whole KV (prompt + max_tokens), parked
ones included, so a running batch can never outgrow the pool mid-decode: the
runner has no retraction, and a refused decode step would fail the whole
batch. While *paused* (a switch) no step runs.

The execution loop (tiertp.worker.executor) and the switch ops
(tiertp.worker.switch_ops) change requests only through these methods.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from tiertp import _scheduler
from tiertp.execution.records import RequestState
from tiertp.worker.exec_request import ExecRequest
from tiertp.worker.step_runner import StepRunner, SwitchableStepRunner


class BatchState:
    """Waiting, running and parked requests over `runner`, and the batch policy choosing who runs."""

    def __init__(self, runner: StepRunner, batch_cap: int, token_cap: int, kv_capacity_tokens: int | None = None):
        self.runner = runner
        self.kv_capacity = kv_capacity_tokens
        self._policy = _scheduler.BatchPolicy(batch_cap, 0)
        self._waiting: dict[int, ExecRequest] = {}
        self._running: dict[int, ExecRequest] = {}  # insertion order = batch order
        self._parked: dict[int, ExecRequest] = {}
        self._paused = False
        self.set_caps(batch_cap, token_cap)

    # --- reading ---------------------------------------------------------
    @property
    def waiting(self) -> Mapping[int, ExecRequest]:
        return MappingProxyType(self._waiting)

    @property
    def running(self) -> Mapping[int, ExecRequest]:
        """In batch order."""
        return MappingProxyType(self._running)

    @property
    def parked(self) -> Mapping[int, ExecRequest]:
        return MappingProxyType(self._parked)

    @property
    def paused(self) -> bool:
        return self._paused

    def has_work(self) -> bool:
        """Whether a step would run if not paused (something runs or waits)."""
        return bool(self._running or self._waiting)

    def queued(self) -> int:
        """Requests the batch policy queues: the waiting ones."""
        return len(self._policy)

    def load(self) -> dict:
        """{running, waiting, kv_used_tokens}, as the agent is told; parked
        requests count in the KV they still hold, not as running."""
        kv = sum(len(r.input_ids) + len(r.output) for r in (*self._running.values(), *self._parked.values()))
        return {"running": len(self._running), "waiting": len(self._waiting), "kv_used_tokens": kv}

    # --- the execution loop ----------------------------------------------
    def set_caps(self, batch_cap: int, token_cap: int) -> None:
        """The plan's caps. Its token cap is a per-iteration prefill budget (the
        simulator chunks long prompts over iterations under it): a runner that
        chunks takes it; otherwise the policy admits only prompts that fit it
        (a longer one only into an empty batch)."""
        chunked = self.runner.set_prefill_chunk(token_cap or None)
        self._policy.set_caps(batch_cap, 0 if chunked else token_cap)

    def add(self, request: ExecRequest, cls: str, deadline: float) -> None:
        """Queue a new request of class `cls` that must start by `deadline`
        (time.monotonic(); inf: none); the policy may refuse it (it is then dropped)."""
        if self._policy.enqueue_with_deadline(request.rid, cls, len(request.input_ids), deadline):
            self._waiting[request.rid] = request

    def cancel(self, rid: int) -> None:
        """Drop the request wherever it is; a running or parked one's KV is freed
        (a hand-off in flight then skips it). Unknown ids are ignored."""
        self._policy.remove(rid)
        self._waiting.pop(rid, None)
        held = self._running.pop(rid, None), self._parked.pop(rid, None)
        if any(r is not None for r in held):
            self.runner.release([rid])

    def shed_expired(self, now: float) -> list[int]:
        """Drop the waiting requests that can no longer start by their deadline;
        their ids. Waiting requests hold nothing in the runner, so this frees
        what a cancel of a waiting one frees."""
        expired = self._policy.take_expired(now)
        for rid in expired:
            del self._waiting[rid]
        return expired

    def admit(self) -> list[int]:
        """Move the requests the batch policy picks from waiting to running; their
        ids. FCFS within the KV left after the running and parked requests'
        reservations. A request alone always fits: the agent refuses any larger
        than max_request_tokens, which is at most the pool."""
        if self.kv_capacity is None:
            rids = self._policy.next_batch(len(self._running))
        else:
            held = (*self._running.values(), *self._parked.values())
            left = self.kv_capacity - sum(r.kv_reserved for r in held)
            rids = self._policy.next_batch_within(len(self._running), max(0, left),
                                                  {r.rid: r.kv_reserved for r in self._waiting.values()})
        for rid in rids:
            self._running[rid] = self._waiting.pop(rid)
        return rids

    def step(self) -> list[dict]:
        """One step of the running batch: per request that produced a token,
        {rid, token, finished, finish_reason}. Finished requests leave (the
        runner frees them); what `runner.step` raises propagates, nothing changed."""
        batch = list(self._running.values())
        outs = self.runner.step([r.step_input() for r in batch])
        items, finished = [], []
        for r, o in zip(batch, outs, strict=True):
            if o.token is None:  # still prefilling (chunked) or waiting for KV space
                continue
            r.output.append(o.token)
            reason = "stop" if o.stopped else "length" if len(r.output) >= r.max_tokens else None
            items.append({"rid": r.rid, "token": o.token, "finished": reason is not None, "finish_reason": reason})
            if reason is not None:
                del self._running[r.rid]
                finished.append(r.rid)
        if finished:
            self.runner.release(finished)
        return items

    # --- switches and hand-offs (tiertp.worker.switch_ops) -----------------
    def switching_runner(self) -> SwitchableStepRunner:
        """The runner, which must own a TP instance for requests to move."""
        if not isinstance(self.runner, SwitchableStepRunner) or self.runner.instance is None:
            raise RuntimeError("this execution process's step runner owns no TP instance (the 'engine' runner "
                               "cannot export KV or switch TP; use the default 'instance' runner)")
        return self.runner

    def pause(self) -> dict[str, list[int]]:
        """No step until `resume`; what is here: {"running": [rid...] (KV
        included), "waiting": [rid...] (not admitted: they move as metadata)}."""
        self._paused = True
        self.switching_runner().pause()
        return {"running": list(self._running), "waiting": list(self._waiting)}

    def resume(self) -> None:
        self._paused = False
        self.switching_runner().resume()

    def park(self, rids: list[int]) -> list[RequestState]:
        """Park those of `rids` still running (others finished meanwhile and are
        skipped); their states, which say which were parked."""
        rids = [rid for rid in rids if rid in self._running]
        if not rids:
            return []
        states = self.switching_runner().park(rids)
        for rid in rids:
            self._parked[rid] = self._running.pop(rid)
        return states

    def unpark(self, rids: list[int]) -> list[int]:
        """Parked requests of `rids` run again (a cancelled one is gone already); those."""
        back = [rid for rid in rids if rid in self._parked]
        if back:
            self.switching_runner().unpark(back)
            for rid in back:
                self._running[rid] = self._parked.pop(rid)
        return back

    def adopt(self, states: list[RequestState], max_tokens: Mapping[int, int]) -> None:
        """Requests moved here, KV already in the instance's reserved slots, join
        the running batch; each stops at `max_tokens[rid]` outputs."""
        self.switching_runner().adopt(list(states))
        for s in states:
            self._running[s.rid] = ExecRequest(s.rid, list(s.token_ids[:s.prompt_len]), max_tokens[s.rid], s.sampling,
                                               output=list(s.token_ids[s.prompt_len:]))

    def release_moved(self, rids: list[int]) -> None:
        """The requests moved to another process: running or parked ones' KV is
        freed now; waiting ones (moved as metadata) leave the policy's queue."""
        moved = [rid for rid in rids if rid in self._running or rid in self._parked]
        if moved:
            self.switching_runner().moved_away(moved)
        for rid in rids:
            self._running.pop(rid, None)
            self._parked.pop(rid, None)
            if self._waiting.pop(rid, None) is not None:
                self._policy.remove(rid)
