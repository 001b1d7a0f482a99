"""`TpInstance`: the controller's handle on one TP instance (no SGLang in this process).

`start` starts one process per rank (tiertp.execution.rank); rank 0, the
leader, is driven over a pipe, one command at a time, each answered before
the next is sent. Between two commands every rank sits at an iteration
boundary with its KV quiescent: that is what `pause` means, and why pausing
and resuming cost nothing (`pause` only makes `iterate` refuse to run until
`resume`; export, park, reserve, adopt, release and calls stay allowed, so a
migration runs while paused).

While waiting for an answer the controller watches every rank process: one
that dies (or a leader that reports a failure) closes the instance and
raises InstanceFailed naming the rank and its exit code.
"""

from __future__ import annotations

import time

from tiertp.engine.models import resolve_model
from tiertp.engine.rank_processes import rank_context
from tiertp.execution import commands
from tiertp.execution.errors import CommandRejected, ExecutionError, InstanceFailed
from tiertp.execution.kv_io import ReadSlots, WriteSlots
from tiertp.execution.rank import rank_main
from tiertp.execution.rank_call import RankCall
from tiertp.execution.records import (InstanceInfo, InstanceStats, NewRequest, RequestId, RequestState,
                                      TokenOut)
from tiertp.execution.spec import InstanceSpec
from tiertp.ports import free_port

_POLL_S = 0.1
_CLOSE_GRACE_S = 10.0


class RankCallFailed(ExecutionError):
    """A `call_on_ranks` call raised on some ranks; `errors` maps rank -> message.
    The instance itself is still running; the call decides what state it left."""

    def __init__(self, target: str, errors: dict[int, str]):
        detail = "; ".join(f"rank {r}: {m}" for r, m in sorted(errors.items()))
        super().__init__(f"{target} failed ({detail})")
        self.target, self.errors = target, errors

    def __reduce__(self):
        return (type(self), (self.target, self.errors))




class Pending:
    """A command sent to the leader whose answer has not been read yet."""

    def __init__(self, instance: TpInstance, what: str, timeout_s: float | None):
        self._instance, self._what, self._timeout_s = instance, what, timeout_s
        self._done, self._value = False, None

    def result(self):
        if not self._done:
            self._value = self._instance._receive(self._what, self._timeout_s)
            self._done = True
        return self._value


class TpInstance:
    """One model replica at TP `spec.tp`, owning its paged KV. See tiertp.execution."""

    def __init__(self, spec: InstanceSpec):
        self.spec = spec
        self.info: InstanceInfo | None = None
        self._procs: list = []
        self._conn = None
        self._in_flight: Pending | None = None
        self._paused = False
        self._closed = False

    # --- life cycle -----------------------------------------------------
    def start(self) -> InstanceInfo:
        """Spawn the ranks, load the model on each, return the instance's info."""
        if self._procs:
            raise RuntimeError("instance already started")
        model_path = str(resolve_model(self.spec.model))  # fail here, not in every rank
        mp = rank_context(self.spec.device)
        parent, child = mp.Pipe()
        port = free_port()
        for rank in range(self.spec.tp):
            p = mp.Process(target=rank_main, args=(self.spec, model_path, rank, port, child if rank == 0 else None),
                           name=f"tiertp-tp{self.spec.tp}-rank{rank}")
            p.start()
            self._procs.append(p)
        child.close()
        self._conn = parent
        self.info = self._receive("start", self.spec.start_timeout_s, expect="ready")
        return self.info

    def close(self) -> None:
        """Stop every rank (politely, then by force). Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        if self._conn is not None and self._in_flight is None and all(p.is_alive() for p in self._procs):
            try:
                self._conn.send(commands.Shutdown())
                deadline = time.monotonic() + _CLOSE_GRACE_S
                for p in self._procs:
                    p.join(max(0.0, deadline - time.monotonic()))
            except (OSError, EOFError):
                pass
        self._kill()

    def _kill(self) -> None:
        self._closed = True
        for p in self._procs:
            if p.is_alive():
                p.kill()
        for p in self._procs:
            p.join(5)
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> TpInstance:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        """True once `close` ran or a rank failure closed the instance."""
        return self._closed

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    # --- pause / resume -------------------------------------------------
    def pause(self) -> None:
        """Stop iterating. Takes effect at once: no forward runs between commands."""
        self._paused = True

    def resume(self) -> None:
        self._paused = False

    @property
    def paused(self) -> bool:
        return self._paused

    # --- commands -------------------------------------------------------
    def iterate(self, admit: list[NewRequest] = (), release: list[RequestId] = ()) -> list[TokenOut]:
        """One iteration: release `release` (their KV is freed), admit `admit`,
        decode the running batch, prefill (a chunk of) pending requests. One
        TokenOut per request that produced a token: every running request,
        and pending ones whose prefill completed; the rest produce none yet."""
        if self._paused:
            raise CommandRejected("iterate: the instance is paused")
        return self._command(commands.Iterate(list(admit), list(release)))

    def release(self, rids: list[RequestId]) -> None:
        """Free the requests' KV now (finished, cancelled, or migrated away)."""
        self._command(commands.Release(list(rids)))

    def export(self, rids: list[RequestId]) -> list[RequestState]:
        """Each request's tokens, sampling and KV slots, for migration (nothing changes)."""
        return self._command(commands.Export(list(rids)))

    def park(self, rids: list[RequestId]) -> list[RequestState]:
        """Export the requests (as `export`) and park them: iterations leave
        them out (no decode, no token) while their KV stays where it is, for
        a hand-off to read; then `release` (moved away) or `unpark`."""
        return self._command(commands.Park(list(rids)))

    def unpark(self, rids: list[RequestId]) -> None:
        """Parked requests continue here (a hand-off that failed): the next
        iteration gives each the token a decode step would have."""
        self._command(commands.Unpark(list(rids)))

    def reserve_slots(self, counts: list[int]) -> list[list[int]]:
        """Allocate counts[i] KV slots per import; KVOutOfSpace (nothing allocated) if they do not all fit."""
        return self._command(commands.ReserveSlots([int(n) for n in counts]))

    def free_slots(self, slots: list[int]) -> None:
        """Return reserved slots that will not be adopted (an import given up)."""
        self._command(commands.FreeSlots([int(s) for s in slots]))

    def adopt(self, states: list[RequestState]) -> None:
        """Take over requests whose KV someone wrote into reserved slots
        (`state.slots`, token i in slots[i]): the next iteration continues
        them from there (no prefill) with the same tokens and sampling."""
        self._command(commands.Adopt(list(states)))

    def stats(self) -> InstanceStats:
        return self._command(commands.Stats())

    def set_prefill_chunk(self, tokens: int | None) -> None:
        """Most prompt tokens prefilled per iteration from now on (None: whole prompts)."""
        self._command(commands.SetPrefillChunk(tokens))

    def call_on_ranks(self, call: RankCall, timeout_s: float | None = None) -> list:
        """Run `call` on every rank (RankCall.run with the rank's RankHandle);
        the results in rank order. RankCallFailed if it raised on any rank."""
        return self.begin_call(call, timeout_s).result()

    def begin_call(self, call: RankCall, timeout_s: float | None = None) -> Pending:
        """`call_on_ranks` without waiting: for collectives that span several
        instances (a migration), start the call on each, then wait on each."""
        return self._send(commands.CallRanks(call, timeout_s), timeout_s, what=call.describe())

    # convenience over call_on_ranks ----------------------------------------
    def read_kv(self, slots: list[int]) -> list:
        """Per rank, a copy of the K/V at `slots` ([layers, 2, n, heads_per_rank, head_dim])."""
        return self.call_on_ranks(ReadSlots(tuple(slots)))

    def write_kv(self, slots: list[int], per_rank: list) -> None:
        """Write per_rank[r] (as read_kv returns it) into reserved `slots` on rank r."""
        self.call_on_ranks(WriteSlots(tuple(slots), tuple(per_rank)))

    # --- plumbing -------------------------------------------------------
    def _command(self, command: commands.Command):
        return self._send(command, None).result()

    def _send(self, command: commands.Command, timeout_s: float | None, what: str | None = None) -> Pending:
        if self._closed or self._conn is None:
            raise InstanceFailed(f"{command.what}: the instance is not running")
        if self._in_flight is not None:
            raise RuntimeError(f"{command.what}: a command is still in flight; read its result first")
        self._conn.send(command)
        self._in_flight = Pending(self, what or command.what, timeout_s)
        return self._in_flight

    def _receive(self, what: str, timeout_s: float | None, expect: str = "ok"):
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        try:
            while not self._conn.poll(_POLL_S):
                if self._dead() and not self._conn.poll(0):
                    raise self._failed(what, self._dead_message())
                if deadline is not None and time.monotonic() > deadline:
                    raise self._failed(what, f"no answer from the TP{self.spec.tp} instance in {timeout_s:.0f} s")
            try:
                status, value = self._conn.recv()
            except (EOFError, OSError):  # the leader is gone; say which rank died first
                self._procs[0].join(1.0)
                raise self._failed(what, self._dead_message() or "lost the pipe to rank 0") from None
        finally:
            self._in_flight = None
        if status == expect:
            return value
        if status == "rejected":
            raise value
        if status == "call_failed":
            raise RankCallFailed(what, value)
        raise self._failed(what, value)

    def _dead(self) -> list[tuple[int, object]]:
        return [(r, p) for r, p in enumerate(self._procs) if p.exitcode is not None]

    def _dead_message(self) -> str:
        return "; ".join(f"TP{self.spec.tp} rank {r} (pid {p.pid}) exited with code {p.exitcode}"
                         for r, p in self._dead())

    def _failed(self, what: str, why: str) -> InstanceFailed:
        """Close the instance; the error to raise."""
        self._kill()
        return InstanceFailed(f"{what}: {why}")
